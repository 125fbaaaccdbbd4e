// Causal self-attention on the CPU for every family: grouped-query attention, of which GPT-2's
// multi-head attention is the case of one query head per key/value head (NKV = NH). Templated
// on the element type as kernels.h is, with its rules: every output element computed by one
// thread in a fixed order (the same bits for any thread count), input gradients overwritten.
//
// qkv rows are [q (NH·hs), k (NKV·hs), v (NKV·hs)]; query head h reads key/value head
// h / (NH / NKV). With NKV = NH that is GPT-2's [q, k, v] of C = NH·hs each.
#pragma once

#include <cstdint>

namespace freeride::cpu {

// qkv [B, Tlen, (NH + 2·NKV)·hs], out [B, Tlen, NH·hs], att keeps the softmax probabilities
// [B, NH, Tlen, Tlen] for backward.
template <typename T>
void GqaAttentionForward(T* out, T* att, const T* qkv, int64_t B, int64_t Tlen, int64_t NH,
                         int64_t NKV, int64_t hs);
// dqkv = gradient of the attention inputs (overwritten).
template <typename T>
void GqaAttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B,
                          int64_t Tlen, int64_t NH, int64_t NKV, int64_t hs);

}  // namespace freeride::cpu

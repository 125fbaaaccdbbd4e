#include "models/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "models/cpu/parallel.h"
#include "models/cpu/vec_math.h"

namespace freeride::cpu {

template <typename T>
void GqaAttentionForward(T* out, T* att, const T* qkv, int64_t B, int64_t Tlen, int64_t NH,
                         int64_t NKV, int64_t hs) {
  const int64_t row = (NH + 2 * NKV) * hs, C = NH * hs, group = NH / NKV;
  const T scale = static_cast<T>(1) / std::sqrt(static_cast<T>(hs));
#pragma omp parallel for collapse(3) schedule(static) if (ParallelWorth(B * Tlen * Tlen * C))
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < Tlen; ++t) {
        const int64_t kv = h / group;
        const T* q = qkv + (b * Tlen + t) * row + h * hs;
        T* a = att + ((b * NH + h) * Tlen + t) * Tlen;
        T maxval = -std::numeric_limits<T>::infinity();
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const T* k = qkv + (b * Tlen + t2) * row + C + kv * hs;
          T dot = 0;
          for (int64_t i = 0; i < hs; ++i) dot += q[i] * k[i];
          a[t2] = dot * scale;
          maxval = std::max(maxval, a[t2]);
        }
        T sum = 0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          a[t2] = VecExp(a[t2] - maxval);
          sum += a[t2];
        }
        const T inv = static_cast<T>(1) / sum;
        for (int64_t t2 = 0; t2 < Tlen; ++t2) a[t2] = t2 <= t ? a[t2] * inv : 0;
        T* o = out + (b * Tlen + t) * C + h * hs;
        for (int64_t i = 0; i < hs; ++i) o[i] = 0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const T* v = qkv + (b * Tlen + t2) * row + C + NKV * hs + kv * hs;
          for (int64_t i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
        }
      }
    }
  }
}

template <typename T>
void GqaAttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B,
                          int64_t Tlen, int64_t NH, int64_t NKV, int64_t hs) {
  const int64_t row = (NH + 2 * NKV) * hs, C = NH * hs, group = NH / NKV;
  const int64_t koff = C, voff = C + NKV * hs;
  const T scale = static_cast<T>(1) / std::sqrt(static_cast<T>(hs));
  // One thread owns a (batch, key/value head): its dk and dv rows collect from every query
  // head of its group and every later t, in a fixed order.
#pragma omp parallel for collapse(2) schedule(static) if (ParallelWorth(B * Tlen * Tlen * C))
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kv = 0; kv < NKV; ++kv) {
      for (int64_t t = 0; t < Tlen; ++t) {
        T* d = dqkv + (b * Tlen + t) * row;
        for (int64_t i = 0; i < hs; ++i) d[koff + kv * hs + i] = d[voff + kv * hs + i] = 0;
        for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
          for (int64_t i = 0; i < hs; ++i) d[h * hs + i] = 0;
        }
      }
      std::vector<T> datt(Tlen);
      for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
        for (int64_t t = 0; t < Tlen; ++t) {
          const T* a = att + ((b * NH + h) * Tlen + t) * Tlen;
          const T* dy = dout + (b * Tlen + t) * C + h * hs;
          const T* q = qkv + (b * Tlen + t) * row + h * hs;
          T* dq = dqkv + (b * Tlen + t) * row + h * hs;
          T weighted = 0;
          for (int64_t t2 = 0; t2 <= t; ++t2) {
            const T* v = qkv + (b * Tlen + t2) * row + voff + kv * hs;
            T* dv = dqkv + (b * Tlen + t2) * row + voff + kv * hs;
            T dot = 0;
            for (int64_t i = 0; i < hs; ++i) {
              dot += dy[i] * v[i];
              dv[i] += a[t2] * dy[i];
            }
            datt[t2] = dot;
            weighted += a[t2] * dot;
          }
          for (int64_t t2 = 0; t2 <= t; ++t2) {
            const T dpre = a[t2] * (datt[t2] - weighted) * scale;
            const T* k = qkv + (b * Tlen + t2) * row + koff + kv * hs;
            T* dk = dqkv + (b * Tlen + t2) * row + koff + kv * hs;
            for (int64_t i = 0; i < hs; ++i) {
              dq[i] += dpre * k[i];
              dk[i] += dpre * q[i];
            }
          }
        }
      }
    }
  }
}

#define FR_INSTANTIATE_ATTENTION(T)                                                          \
  template void GqaAttentionForward<T>(T*, T*, const T*, int64_t, int64_t, int64_t, int64_t, \
                                       int64_t);                                             \
  template void GqaAttentionBackward<T>(T*, const T*, const T*, const T*, int64_t, int64_t,  \
                                        int64_t, int64_t, int64_t);

FR_INSTANTIATE_ATTENTION(float)
FR_INSTANTIATE_ATTENTION(double)
#undef FR_INSTANTIATE_ATTENTION

}  // namespace freeride::cpu

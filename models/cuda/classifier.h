// The fused classifier: one kernel reads each row of logits for its online softmax and writes
// the row's loss and log-sum-exp and, when asked, the logits gradient in place, so that a
// training step reads the logits once (llm.c's fused classifier). The arithmetic lives in
// classifier_math.h; the one-operation reference is CrossEntropyForward/Backward (kernels.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace freeride::cuda {

// Per row of logits [N, Vp]: losses[row] = logsumexp(logits[:V]) − logits[target] and
// logsumexp[row]; with `write_grad`, logits → grad_scale·(softmax − onehot(target)), padded
// columns 0 (what CrossEntropyBackward makes). Needs classifier::ShapeSupported and a 16-byte
// aligned `logits`.
template <typename T>
void FusedClassifier(float* losses, float* logsumexp, T* logits, const int32_t* targets,
                     float grad_scale, bool write_grad, int64_t N, int64_t V, int64_t Vp,
                     cudaStream_t stream);

}  // namespace freeride::cuda

#include "models/param_init.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace freeride {

template <typename T>
void InitDecoderParams(const ParamLayout& layout, uint64_t seed, T* params) {
  const GPT2Config& cfg = layout.config;
  const StageSpec& stage = layout.stage;
  const T residual_std = static_cast<T>(0.02 / std::sqrt(2.0 * static_cast<double>(cfg.n_layer)));
  for (int i = 0; i < kNumParamTensors; ++i) {
    const ParamTensor t = static_cast<ParamTensor>(i);
    const TensorSlot& slot = layout.slot(t);
    if (!slot.present) continue;
    const int64_t per = IsPerLayer(t) ? ParamElements(cfg, t) : slot.elements;
    const int64_t pieces = IsPerLayer(t) ? stage.num_layers() : 1;
    for (int64_t p = 0; p < pieces; ++p) {
      T* dst = params + slot.offset + p * per;
      const int64_t global_layer = IsPerLayer(t) ? stage.first_layer + p : 0;
      switch (t) {
        case ParamTensor::kLn1W:
        case ParamTensor::kLn2W:
        case ParamTensor::kLnfW:
          std::fill(dst, dst + per, static_cast<T>(1));
          continue;
        case ParamTensor::kLn1B:
        case ParamTensor::kLn2B:
        case ParamTensor::kLnfB:
        case ParamTensor::kQkvB:
        case ParamTensor::kAttProjB:
        case ParamTensor::kFcB:
        case ParamTensor::kFcProjB:
          std::fill(dst, dst + per, static_cast<T>(0));
          continue;
        default:
          break;
      }
      std::seed_seq seq{static_cast<uint64_t>(seed), static_cast<uint64_t>(i),
                        static_cast<uint64_t>(global_layer)};
      std::mt19937_64 rng(seq);
      std::normal_distribution<double> normal(0.0, 1.0);
      const bool residual = t == ParamTensor::kAttProjW || t == ParamTensor::kFcProjW;
      const T std = residual ? residual_std : static_cast<T>(0.02);
      // Padded vocabulary rows stay 0: no token indexes them and no softmax sees them.
      const bool vocab = t == ParamTensor::kWte || t == ParamTensor::kLmHead;
      const int64_t n = vocab ? cfg.vocab_size * cfg.n_embd : per;
      for (int64_t k = 0; k < n; ++k) dst[k] = static_cast<T>(normal(rng)) * std;
      std::fill(dst + n, dst + per, static_cast<T>(0));
    }
  }
}

template void InitDecoderParams<float>(const ParamLayout&, uint64_t, float*);
template void InitDecoderParams<double>(const ParamLayout&, uint64_t, double*);

}  // namespace freeride

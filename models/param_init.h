// The decoder families' initialisation of a stage's parameters, seeded per (tensor, layer) so
// that any stage initialises exactly its slice of the whole model, on any backend that fills
// its parameters through it: matrices and embeddings N(0, 0.02), the residual projections
// (attprojw, fcprojw) scaled by 1/sqrt(2·n_layer), biases 0, norm weights 1, padded vocabulary
// rows 0. A tensor a family lacks is absent from its layout and left alone.
#pragma once

#include <cstdint>

#include "models/gpt2_config.h"

namespace freeride {

template <typename T>
void InitDecoderParams(const ParamLayout& layout, uint64_t seed, T* params);

}  // namespace freeride

// Residual add: the skip connection of a pre-norm transformer block.
#pragma once

#include <cstdint>

namespace rlhf::model {

/// out = a + b, all (n) elements (out may alias a or b).
template <typename T>
void residual_forward_cpu(T* out, const T* a, const T* b, int64_t n);

/// da += dout, db += dout (both are residual-stream gradients: accumulate). da or db may be
/// nullptr to skip it; neither may alias dout.
template <typename T>
void residual_backward_cpu(T* da, T* db, const T* dout, int64_t n);

}  // namespace rlhf::model

// Residual add: the skip connection of a pre-norm transformer block.
#pragma once

#include <cstdint>

#include "model/ops/cuda_types.h"

namespace rlhf::model {

/// out = a + b, all (n) elements (out may alias a or b).
template <typename T>
void residual_forward_cpu(T* out, const T* a, const T* b, int64_t n);

/// da += dout, db += dout (both are residual-stream gradients: accumulate). da or db may be
/// nullptr to skip it; neither may alias dout.
template <typename T>
void residual_backward_cpu(T* da, T* db, const T* dout, int64_t n);

#ifdef RLHF_CUDA
/// CUDA forward: out = a + b over n bf16 elements, in fp32 with one bf16 rounding (out may alias
/// a or b). Throws rlhf::Error if n < 0.
void residual_forward_cuda(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream);

/// CUDA backward: da += dout, db += dout (bf16 residual-stream gradients, fp32 add, one rounding);
/// da or db may be nullptr; neither may alias dout.
void residual_backward_cuda(bf16* da, bf16* db, const bf16* dout, int64_t n, cudaStream_t stream);
#endif

}  // namespace rlhf::model

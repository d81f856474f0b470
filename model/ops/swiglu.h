// SwiGLU MLP activation (Shazeer 2020, eq. 6): h = silu(gate) * up, silu(x) = x·σ(x).
#pragma once

#include <cstdint>

#include "model/ops/cuda_types.h"

namespace rlhf::model {

/// h = silu(gate) ⊙ up. h, gate, up: (N, F) (h may not alias the inputs).
/// σ is evaluated from exp(−|x|), so any finite gate gives finite results (silu(100) = 100,
/// silu(−100) ≈ 0). The fp32 version uses a vectorisable exp (Taylor to r⁷ after ln2 range
/// reduction); against the fp64 version it is within 1e−6 relative (floor 0.1) for gate in [−100,
/// 100].
template <typename T>
void swiglu_forward_cpu(T* h, const T* gate, const T* up, int64_t N, int64_t F);

/// dgate = dh ⊙ up ⊙ silu'(gate), dup = dh ⊙ silu(gate) (both assigned). dh: (N, F).
template <typename T>
void swiglu_backward_cpu(T* dgate, T* dup, const T* dh, const T* gate, const T* up, int64_t N,
                         int64_t F);

#ifdef RLHF_CUDA
/// CUDA forward, same contract: h, gate, up (N, F) bf16 (h may alias gate or up: element-wise);
/// σ from expf(−|g|) in fp32 as on the CPU, one bf16 rounding. Throws rlhf::Error if N < 0 or
/// F < 0.
void swiglu_forward_cuda(bf16* h, const bf16* gate, const bf16* up, int64_t N, int64_t F,
                         cudaStream_t stream);

/// CUDA backward: dgate, dup (N, F) bf16 assigned; dh, gate, up (N, F) bf16. dgate/dup may alias
/// dh (element-wise: every input element is read before its outputs are written).
void swiglu_backward_cuda(bf16* dgate, bf16* dup, const bf16* dh, const bf16* gate, const bf16* up,
                          int64_t N, int64_t F, cudaStream_t stream);
#endif

}  // namespace rlhf::model

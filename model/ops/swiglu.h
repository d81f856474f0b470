// SwiGLU MLP activation (Shazeer 2020, eq. 6): h = silu(gate) * up, silu(x) = x·σ(x).
#pragma once

#include <cstdint>

namespace rlhf::model {

/// h = silu(gate) ⊙ up. h, gate, up: (N, F) (h may not alias the inputs).
template <typename T>
void swiglu_forward_cpu(T* h, const T* gate, const T* up, int64_t N, int64_t F);

/// dgate = dh ⊙ up ⊙ silu'(gate), dup = dh ⊙ silu(gate) (both assigned). dh: (N, F).
template <typename T>
void swiglu_backward_cpu(T* dgate, T* dup, const T* dh, const T* gate, const T* up, int64_t N,
                         int64_t F);

}  // namespace rlhf::model

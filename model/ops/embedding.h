// Token embedding lookup.
#pragma once

#include <cstdint>

namespace rlhf::model {

/// out[n, :] = wte[tokens[n], :]. out: (N, C); tokens: (N) int32 in [0, V); wte: (V, C).
/// Throws rlhf::Error naming the first bad id and its position n if a token id is outside [0, V).
template <typename T>
void embedding_forward_cpu(T* out, const int32_t* tokens, const T* wte, int64_t N, int64_t C,
                           int64_t V);

/// dwte[tokens[n], :] += dout[n, :] (parameter gradient, accumulates). dout: (N, C).
/// Deterministic (no atomics): threads own disjoint column ranges and add tokens in order n =
/// 0..N−1, so the result does not depend on thread count. Throws rlhf::Error, before writing
/// anything, if a token id is outside [0, V).
template <typename T>
void embedding_backward_cpu(T* dwte, const T* dout, const int32_t* tokens, int64_t N, int64_t C,
                            int64_t V);

}  // namespace rlhf::model

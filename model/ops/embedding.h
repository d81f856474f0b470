// Token embedding lookup.
#pragma once

#include <cstdint>

#include "model/ops/cuda_types.h"

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

#ifdef RLHF_CUDA
/// CUDA forward, same contract: out (N, C) bf16 = wte[tokens[n], :], wte (V, C) bf16, tokens (N)
/// int32 in device memory. Ids are not validated on the device (that would need a host round
/// trip): the row of a token outside [0, V) is filled with NaN, so the loss shows it; validate ids
/// on the host where they are produced. Throws rlhf::Error if N < 0, C <= 0 or V <= 0.
void embedding_forward_cuda(bf16* out, const int32_t* tokens, const bf16* wte, int64_t N, int64_t C,
                            int64_t V, cudaStream_t stream);

/// CUDA backward: dwte (V, C) fp32 += dout (N, C) bf16 rows (parameter gradient, accumulates, in
/// fp32). Deterministic and bit-identical to embedding_backward_cpu<float> on the same values: the
/// (token, n) pairs are sorted by token with a stable radix sort (CUB), then one block per distinct
/// token adds that token's rows in increasing n, without atomics. Tokens outside [0, V) are
/// skipped. Allocates its scratch (4·N ints + CUB's temp) stream-ordered (cudaMallocAsync) and
/// frees it before returning (also stream-ordered). Throws like forward.
void embedding_backward_cuda(float* dwte, const bf16* dout, const int32_t* tokens, int64_t N,
                             int64_t C, int64_t V, cudaStream_t stream);
#endif

}  // namespace rlhf::model

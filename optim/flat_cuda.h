// Element-wise operations on flat device buffers that the device training state needs around the
// optimizer: precision casts (fp32 master <-> bf16 working copy), gradient accumulation, and a
// deterministic sum of squares for the global gradient norm. Enqueued on the given stream
// (asynchronous). n = 0 is a no-op; n < 0 throws rlhf::Error.
#pragma once

#ifdef RLHF_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace rlhf::optim {

/// out[i] = bf16(in[i]), round to nearest even. out (n) bf16, in (n) fp32, device memory.
void cast_f32_to_bf16_cuda(__nv_bfloat16* out, const float* in, int64_t n, cudaStream_t stream);

/// out[i] = float(in[i]) (exact). out (n) fp32, in (n) bf16, device memory.
void cast_bf16_to_f32_cuda(float* out, const __nv_bfloat16* in, int64_t n, cudaStream_t stream);

/// acc[i] += x[i] (fp32, device memory; acc and x must not overlap unless equal).
void accumulate_f32_cuda(float* acc, const float* x, int64_t n, cudaStream_t stream);

/// Doubles of device workspace sum_squares_cuda needs (result included).
inline constexpr int64_t kSumSquaresWorkspace = 1 + 256;

/// out[0] = Σ x[i]² accumulated in double, deterministic (a fixed partition of [0, n) over 256
/// blocks, a fixed tree in each, the 256 partials summed in order by one block). out: device
/// workspace of kSumSquaresWorkspace doubles (out[1..] is scratch); x (n) fp32 device memory.
void sum_squares_cuda(double* out, const float* x, int64_t n, cudaStream_t stream);

}  // namespace rlhf::optim
#endif

// The LoRA adapter branch (model/lora.h) on the GPU: y += (α/r)·B·(A·d(x)) beside a projection's
// base GEMM, and its backward, in the CUDA backend's numerics (bf16 operands, fp32 accumulation
// through cuBLAS, one bf16 rounding per GEMM output, fp32 adapter gradients). The dropout mask
// d(·) is the CPU's (lora_dropout_keep: the same counter-based hash of (key, element)), so a
// training pass drops the same inputs on both backends. Kept C++17-clean: the .cu is built by
// nvcc and the emulator.
#pragma once

#ifdef RLHF_CUDA
#include <cstdint>

#include "model/ops/cuda_types.h"

namespace rlhf::model {

/// One projection's adapter on the device: A (r, in) bf16, Bs (out, r) bf16 = (α/r)·B (the scale
/// folded into the bf16 copy of B, so forward and the input gradient need no separate scale),
/// the fp32 gradients dA (r, in) and dB (out, r) (accumulated +=; nullptr: not wanted), the true
/// scale α/r (for dB), the dropout probability of this pass (0: none) and its mask key
/// (lora_dropout_key).
struct LoraDeviceAdapter {
  const bf16* A = nullptr;
  const bf16* Bs = nullptr;
  float* dA = nullptr;
  float* dB = nullptr;
  int64_t r = 0;
  float scale = 0.0f;
  double dropout = 0.0;
  uint64_t key = 0;
};

/// y (N, out) bf16 += Bs·(A·d(x)) for x (N, in) bf16: h = d(x)·Aᵀ (N, r, bf16), then y = y +
/// h·Bsᵀ (fp32 accumulation of the GEMM and of y, one rounding). d = PEFT's inverted dropout
/// (x·mask/(1−p)) when a.dropout > 0. Device scratch per (device, stream), grown on demand. No-op
/// when a.A is nullptr or N is 0. Throws rlhf::Error on a cuBLAS/CUDA failure.
void lora_forward_cuda(bf16* y, const bf16* x, const LoraDeviceAdapter& a, int64_t N, int64_t in,
                       int64_t out, cudaStream_t stream);

/// Backward of lora_forward_cuda for dy (N, out) bf16: with x' = d(x), h = x'·Aᵀ and g = dy·Bs
/// (N, r, bf16; = (α/r)·dy·B): dB += (α/r)·dyᵀ·h, dA += gᵀ·x' (fp32), and dx (N, in) bf16 += d(g·A)
/// (skipped when dx is nullptr). The base weight's gradient is not touched. No-op when a.A is
/// nullptr or N is 0.
void lora_backward_cuda(bf16* dx, const bf16* dy, const bf16* x, const LoraDeviceAdapter& a,
                        int64_t N, int64_t in, int64_t out, cudaStream_t stream);

/// y (N, in) = x·mask/(1−p), the dropout of lora_forward_cuda (mask from key as
/// lora_dropout_keep); y may be x. For tests against the host mask.
void lora_dropout_cuda(bf16* y, const bf16* x, double p, uint64_t key, int64_t N, int64_t in,
                       cudaStream_t stream);

}  // namespace rlhf::model
#endif  // RLHF_CUDA

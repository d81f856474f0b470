// Causal grouped-query attention on the CPU with bf16 products: the bf16 compute mode's attention
// (--attn_implementation onednn; model/layer_bf16.h). The same mathematics as
// attention_forward_varlen_cpu / attention_backward_varlen_cpu (model/ops/attention.h), with the
// numerics of a tensor-core attention (cuDNN's, FlashAttention-2's): every product of the two
// GEMMs of forward and the four of backward takes bf16 operands (q, k, v, dout, P and dS rounded to
// nearest-even bf16) with fp32 accumulation, through oneDNN (model/ops/matmul_bf16.h); the softmax,
// its backward and the saved probabilities are fp32.
//
// Why: on a CPU whose matrix unit computes bf16 (AMX) oneDNN's bf16 matmul runs 6-7x the fp32
// one, and the fp32 kernels' sgemm calls are then most of a bf16 step outside the projections.
//
// Tiling: per (sample, KV head), query rows come in blocks of kAttnBf16Block tokens × the G query
// heads of the group (G·kAttnBf16Block GEMM rows, token-major: row t·G + i is token t of head
// g·G + i), keys in chunks of kAttnBf16Block; a block only visits the chunks at or below its last
// token (the masked upper triangle is skipped chunk by chunk). Rows and keys past the sample's
// end are zero-padded, so every GEMM has one of three fixed shapes whatever the sample lengths:
// a handful of cached primitives serves every batch, packed or not.
//
// Determinism: one OpenMP thread owns a (sample, KV head) and adds its chunks in a fixed order;
// oneDNN runs single-threaded there (matmul_bf16_serial). The result does not depend on the
// thread count, and a sample's result does not depend on the other samples of the batch.
#pragma once

#include <cstdint>

namespace rlhf::model {

/// Tokens per query block and keys per key chunk of the bf16 attention (see above).
inline constexpr int64_t kAttnBf16Block = 64;

/// attention_forward_varlen_cpu<float>'s contract (q, out (N, H, D); k, v (N, Hkv, D) fp32;
/// cu_seqlens (n_seqs + 1) int32 from 0, strictly ascending; all outputs assigned) computed with
/// bf16 products: S = bf16(q)·bf16(k)ᵀ, P = softmax(S / sqrt(D)) causal in fp32,
/// out = bf16(P)·bf16(v), all accumulated in fp32; out is fp32 (not rounded). att receives P in
/// fp32 in this function's own layout, which only attention_backward_bf16_cpu reads: sample s's
/// block at offset H·Σ_{s'<s} n_s'² (the same total size as the fp32 kernels'), inside it KV head
/// g's (n_s·G, n_s) rows at g·G·n_s², row t·G + i holding query head g·G + i at token t
/// (zeros above the diagonal). Throws rlhf::Error on a dimension ≤ 0, H % Hkv != 0, bad
/// cu_seqlens, or in a build without oneDNN.
void attention_forward_bf16_cpu(float* out, float* att, const float* q, const float* k,
                                const float* v, const int32_t* cu_seqlens, int64_t n_seqs,
                                int64_t H, int64_t Hkv, int64_t D);

/// Backward of attention_forward_bf16_cpu, attention_backward_cpu's formulas with bf16 products:
///   dP = bf16(dout)·bf16(v)ᵀ,  dv = bf16(P)ᵀ·bf16(dout),  dS = P ⊙ (dP − rowsum(P ⊙ dP)) / sqrt(D)
///   (fp32), dq = bf16(dS)·bf16(k),  dk = bf16(dS)ᵀ·bf16(q),
/// fp32 accumulation, dk/dv summed over each group's query heads in a fixed order. dq (N, H, D),
/// dk, dv (N, Hkv, D) fp32 assigned; att from attention_forward_bf16_cpu of the same q, k, v and
/// cu_seqlens. Throws like forward.
void attention_backward_bf16_cpu(float* dq, float* dk, float* dv, const float* dout,
                                 const float* att, const float* q, const float* k, const float* v,
                                 const int32_t* cu_seqlens, int64_t n_seqs, int64_t H, int64_t Hkv,
                                 int64_t D);

/// Process-wide choice of the CPU bf16 compute mode's attention in training and experience passes
/// (parallel::use_cpu_attention_implementation sets it from --attn_implementation): true = the
/// functions above, false (the default) = the fp32 kernels of model/ops/attention.h on the
/// bf16-rounded q, k, v. The fp32 compute mode always uses the fp32 kernels.
void set_cpu_attention_bf16(bool on) noexcept;
bool cpu_attention_bf16() noexcept;

}  // namespace rlhf::model

// Fused log-softmax + gather over the vocabulary: token log-probabilities, cross-entropy and
// entropy, without materialising a probability matrix (the logits buffer is the only (N, V) array,
// and backward overwrites it in place with dlogits).
#pragma once

#include <cstdint>

#include "model/ops/cuda_types.h"
#include "model/ops/half.h"

namespace rlhf::model {

/// For each row n with z = scale · logits[n, :] (scale = 1/temperature):
///   lse[n] = log Σ_j exp(z_j),  lp[n] = z[targets[n]] − lse[n]  (log π(target)),
///   entropy[n] = lse[n] − Σ_j softmax(z)_j · z_j   (skipped when entropy is nullptr).
/// A target of −1 means "no target": lp[n] = 0 (lse and entropy are still computed).
/// lp, lse, entropy: (N), assigned; logits: (N, V); targets: (N) int32.
/// Throws rlhf::Error naming the row if a target is outside [0, V) and not −1, or if V ≤ 0.
/// CPU float: exp by exp_fast (model/ops/cpu/vec_math.h, ≤ 2 ulp); double: std::exp.
template <typename T>
void logprob_forward_cpu(T* lp, T* lse, T* entropy, const T* logits, const int32_t* targets,
                         int64_t N, int64_t V, T scale);

/// dlogits = scale · [ dlp[n] · (onehot(target) − p) + dentropy[n] · (−p ⊙ (log p + H)) ],
/// p = softmax(scale·logits), H = entropy (assigned). dlogits may alias logits (in place).
/// dentropy and entropy may be nullptr (no entropy term); dlp may be nullptr (no log-prob term).
/// Rows with target −1 get only the entropy term. dlp, dentropy: (N); lse, entropy from forward
/// (same scale). Throws on bad targets like forward.
template <typename T>
void logprob_backward_cpu(T* dlogits, const T* dlp, const T* dentropy, const T* logits,
                          const T* lse, const T* entropy, const int32_t* targets, int64_t N,
                          int64_t V, T scale);

/// logprob_backward_cpu<float>'s dlogits rounded to bf16 (nearest even) as they are stored, the
/// values bit for bit: the LM head's bf16 backward GEMMs read them without an (N, V) fp32 pass and
/// a rounding pass over it (CPU --param_dtype bf16; the CUDA backward writes bf16 the same way).
/// dlogits (N, V) bf16, assigned, must not alias logits; the rest as logprob_backward_cpu.
/// Throws on bad targets like forward.
void logprob_backward_bf16_cpu(bfloat16* dlogits, const float* dlp, const float* dentropy,
                               const float* logits, const float* lse, const float* entropy,
                               const int32_t* targets, int64_t N, int64_t V, float scale);

#ifdef RLHF_CUDA
/// CUDA forward, same contract with bf16 logits and fp32 results: lp, lse, entropy (N) fp32
/// (entropy may be nullptr), logits (N, V) bf16, targets (N) int32 device, scale fp32. One block
/// per row streams the row twice (max, then Σ exp and Σ exp·z) in fp32, so nothing of size (N, V)
/// besides the bf16 logits exists. Targets are not validated on the device: a target outside
/// [0, V) that is not −1 gives lp = NaN for its row. Throws rlhf::Error if N < 0 or V <= 0.
void logprob_forward_cuda(float* lp, float* lse, float* entropy, const bf16* logits,
                          const int32_t* targets, int64_t N, int64_t V, float scale,
                          cudaStream_t stream);

/// CUDA backward, same formula and contract: dlogits (N, V) bf16 assigned and may alias logits
/// (in place: each element is read, then written, by the same thread); dlp, dentropy (N) fp32 or
/// nullptr; lse, entropy (N) fp32 from forward. A row with an invalid target is filled with NaN.
void logprob_backward_cuda(bf16* dlogits, const float* dlp, const float* dentropy,
                           const bf16* logits, const float* lse, const float* entropy,
                           const int32_t* targets, int64_t N, int64_t V, float scale,
                           cudaStream_t stream);
#endif

}  // namespace rlhf::model

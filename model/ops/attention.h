// Causal grouped-query scaled-dot-product attention (Vaswani et al. 2017, eq. 1; GQA: Ainslie et
// al. 2023): query head h reads key/value head h / (H / Hkv).
#pragma once

#include <cstdint>

namespace rlhf::model {

/// out[b,t,h,:] = Σ_{s≤t} softmax_s(q[b,t,h]·k[b,s,g] / sqrt(D)) · v[b,s,g], g = h / (H/Hkv).
/// q, out: (B, T, H, D); k, v: (B, T, Hkv, D); att: (B, H, T, T) softmax probabilities saved for
/// backward (entries s > t are zero). All assigned (=). q/k/v are expected after RoPE.
/// CPU: OpenMP over (b, h), BLAS GEMMs per block of query rows (single-threaded inside the
/// parallel region), the masked upper triangle skipped block by block. Inputs must be finite:
/// inside a block of 64 query rows a non-finite v at a later position meets a zero probability,
/// and 0·NaN would reach the earlier rows. Throws rlhf::Error if a dimension is ≤ 0 or
/// H % Hkv != 0.
template <typename T>
void attention_forward_cpu(T* out, T* att, const T* q, const T* k, const T* v, int64_t B,
                           int64_t T_, int64_t H, int64_t Hkv, int64_t D);

/// Backward of attention_forward_cpu, with P = att, S = q·kᵀ/sqrt(D):
///   dv = Pᵀ·dout,  dP = dout·vᵀ,  dS = P ⊙ (dP − rowsum(P ⊙ dP)),
///   dq = dS·k / sqrt(D),  dk = dSᵀ·q / sqrt(D)
/// (all assigned (=); dk/dv sum over the H/Hkv query heads of each group, in a fixed order, so the
/// result is deterministic and independent of the thread count). dq, dout: (B, T, H, D);
/// dk, dv: (B, T, Hkv, D); att, q, k, v as in forward. Needs no scratch from the caller (allocates
/// one (64, T) block per thread per call). Throws like forward.
template <typename T>
void attention_backward_cpu(T* dq, T* dk, T* dv, const T* dout, const T* att, const T* q,
                            const T* k, const T* v, int64_t B, int64_t T_, int64_t H, int64_t Hkv,
                            int64_t D);

}  // namespace rlhf::model

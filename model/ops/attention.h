// Causal grouped-query scaled-dot-product attention (Vaswani et al. 2017, eq. 1; GQA: Ainslie et
// al. 2023): query head h reads key/value head h / (H / Hkv).
#pragma once

#include <cstdint>

namespace rlhf::model {

/// out[b,t,h,:] = Σ_{s≤t} softmax_s(q[b,t,h]·k[b,s,g] / sqrt(D)) · v[b,s,g], g = h / (H/Hkv).
/// q, out: (B, T, H, D); k, v: (B, T, Hkv, D); att: (B, H, T, T) softmax probabilities saved for
/// backward (entries s > t are zero).
template <typename T>
void attention_forward_cpu(T* out, T* att, const T* q, const T* k, const T* v, int64_t B,
                           int64_t T_, int64_t H, int64_t Hkv, int64_t D);

/// dq = , dk = , dv = (assigned; dk/dv sum over the H/Hkv query heads of each group).
/// dout: (B, T, H, D); att from forward. Needs no other scratch.
template <typename T>
void attention_backward_cpu(T* dq, T* dk, T* dv, const T* dout, const T* att, const T* q,
                            const T* k, const T* v, int64_t B, int64_t T_, int64_t H, int64_t Hkv,
                            int64_t D);

}  // namespace rlhf::model

// The per-token RL losses of PPO/GRPO as defined in docs/algorithms.md (OpenRLHF's defaults): the
// clipped policy surrogate, the KL estimators, the clipped value loss. Each forward gives per-token
// values; each backward gives the derivative w.r.t. the model output (log-prob or value), already
// multiplied by the caller's per-token weight (the aggregation weight m_t / N_tokens_global).
#pragma once

#include <cstdint>
#include <string>

namespace rlhf::rl {

/// PPO clipped surrogate (Schulman et al. 2017, eq. 7) with asymmetric clip (eps_low, eps_high)
/// and optional dual clip (Ye et al. 2020, eq. 5; dual_clip <= 1 disables it):
///   ρ = exp(clamp(lp − lp_old, −20, 20)),
///   ℓ = −min(ρA, clip(ρ, 1−eps_low, 1+eps_high)·A);  for A < 0 with dual clip c:
///   ℓ = −max(min(ρA, clip(ρ)A), c·A).
/// loss, clipped: (N) out (clipped[t] = 1 where the clipped branch was taken, i.e. clip(ρ)A < ρA,
/// or the dual-clip bound was taken); ratio: (N) out ρ (may be nullptr); lp, lp_old, adv: (N).
template <typename T>
void ppo_clip_loss_forward_cpu(T* loss, uint8_t* clipped, T* ratio, const T* lp, const T* lp_old,
                               const T* adv, int64_t N, double eps_low, double eps_high,
                               double dual_clip);

/// dlp[t] = weight[t] · ∂ℓ_t/∂lp_t  (assigned): −ρA where the unclipped branch is active, 0 where a
/// clip (or the ±20 log-ratio clamp) is active. weight: (N), e.g. m_t / N_tokens.
template <typename T>
void ppo_clip_loss_backward_cpu(T* dlp, const T* weight, const T* lp, const T* lp_old, const T* adv,
                                int64_t N, double eps_low, double eps_high, double dual_clip);

/// KL estimators of KL(π‖π_ref) per token (Schulman 2020, "Approximating KL divergence") on
/// δ = lp − lp_ref: k1 = δ, k2 = δ²/2, k3 = exp(−δ) − 1 + δ; every estimate clamped to [−10, 10].
enum class KlEstimator { kK1, kK2, kK3 };
/// "k1" | "k2" | "k3"; throws rlhf::Error otherwise.
KlEstimator kl_estimator_from_string(const std::string& s);
const char* to_string(KlEstimator k);

/// kl: (N) out; lp, lp_ref: (N).
template <typename T>
void kl_forward_cpu(T* kl, const T* lp, const T* lp_ref, int64_t N, KlEstimator est);

/// dlp[t] = weight[t] · ∂k/∂lp (assigned): k1 → 1, k2 → δ, k3 → 1 − exp(−δ); 0 where the [−10, 10]
/// clamp is active. (lp_ref is frozen: no gradient.)
template <typename T>
void kl_backward_cpu(T* dlp, const T* weight, const T* lp, const T* lp_ref, int64_t N,
                     KlEstimator est);

/// Clipped value loss (OpenRLHF / PPO2): V_c = V_old + clamp(V − V_old, −c, c),
/// ℓ = ½·max((V_c − R)², (V − R)²). value_clip <= 0 disables clipping (ℓ = ½(V − R)²).
/// loss: (N) out; clipped: (N) out or nullptr (1 where the clipped term is the larger);
/// v, v_old, ret: (N).
template <typename T>
void value_loss_forward_cpu(T* loss, uint8_t* clipped, const T* v, const T* v_old, const T* ret,
                            int64_t N, double value_clip);

/// dv[t] = weight[t] · ∂ℓ/∂V (assigned): (V − R) where the unclipped term wins, (V_c − R) where the
/// clipped term wins and |V − V_old| < c, else 0.
template <typename T>
void value_loss_backward_cpu(T* dv, const T* weight, const T* v, const T* v_old, const T* ret,
                             int64_t N, double value_clip);

/// `--policy_loss_type`: PPO's token ratio, or GSPO's sequence ratio.
enum class PolicyLossType { kPpo, kGspo };
/// "ppo" | "gspo"; throws rlhf::Error naming --policy_loss_type otherwise.
PolicyLossType policy_loss_type_from_string(const std::string& s);
const char* to_string(PolicyLossType t);

/// GSPO (Zheng et al. 2025, eq. 5–7), per token t of sequence seq[t]:
///   s_i = exp(clamp((1/|y_i|)·Σ_{t∈i} (lp_t − lp_old_t), −20, 20)), the sequence ratio;
///   s_{i,t} = sg[s_i]·exp(lp_t − sg[lp_t]) (= s_i in value);
///   ℓ_t = −min(s_{i,t}·A_t, clip(s_{i,t}, 1−eps_low, 1+eps_high)·A_t).
/// loss, clipped: (N) out (clipped[t] = 1 where the clipped branch was taken); seq_ratio: (n_seq)
/// out s_i or nullptr; lp, lp_old, adv: (N); seq: (N) the sequence index of each token in
/// [0, n_seq), or −1 for a position that is not a response token (loss 0). Throws rlhf::Error on a
/// sequence index out of range.
template <typename T>
void gspo_loss_forward_cpu(T* loss, uint8_t* clipped, T* seq_ratio, const T* lp, const T* lp_old,
                           const T* adv, const int32_t* seq, int64_t N, int64_t n_seq,
                           double eps_low, double eps_high);

/// dlp[t] = weight[t]·∂ℓ_t/∂lp_t (assigned): −s_i·A_t where the unclipped branch is active (the
/// gradient of s_{i,t} is s_i), 0 where the clip or the ±20 clamp is active or seq[t] = −1.
/// Arguments as the forward.
template <typename T>
void gspo_loss_backward_cpu(T* dlp, const T* weight, const T* lp, const T* lp_old, const T* adv,
                            const int32_t* seq, int64_t N, int64_t n_seq, double eps_low,
                            double eps_high);

/// `--loss_agg_mode` (veRL's names): how the per-token losses of one optimizer step become one.
enum class LossAggMode { kTokenMean, kSeqMeanTokenMean, kSeqMeanTokenSum, kSeqMeanTokenSumNorm };
/// "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum" | "seq-mean-token-sum-norm";
/// throws rlhf::Error naming --loss_agg_mode otherwise.
LossAggMode loss_agg_mode_from_string(const std::string& s);
const char* to_string(LossAggMode m);

/// The weight of each response token of sequence i in the loss of one optimizer step (the loss is
/// Σ_t weight·ℓ_t over every token of the step, all ranks and micro-batches):
///   token-mean:              1 / N_tokens              (N_tokens of the whole step)
///   seq-mean-token-mean:     1 / (N_seq · |y_i|)
///   seq-mean-token-sum:      1 / N_seq
///   seq-mean-token-sum-norm: 1 / (N_seq · L_max)       (Dr. GRPO; L_max = --generate_max_len)
/// Every denominator is global over the step, so N ranks train exactly like 1. Throws rlhf::Error
/// on a non-positive count.
double loss_agg_weight(LossAggMode mode, int64_t seq_len, int64_t step_tokens, int64_t step_seqs,
                       int64_t max_len);

/// Bradley–Terry pairwise loss of a reward model (Ouyang et al. 2022, eq. 1) on
/// Δ = r_chosen − r_rejected: loss = −log σ(Δ) = softplus(−Δ), computed without overflow; returns
/// the loss and writes dloss/dΔ = −σ(−Δ) to *dloss_ddelta.
double bradley_terry_loss(double delta, double* dloss_ddelta);

}  // namespace rlhf::rl

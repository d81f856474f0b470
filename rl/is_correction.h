// Off-policy correction of the policy loss for the gap between the generation engine and the
// trainer (docs/algorithms.md, "Off-policy correction"): per-token behaviour weights made from
// r_t = exp(lp_old_t − lp_rol_t), where lp_rol is the engine's sampling log-prob
// (rollout::Sample::gen_logprobs) and lp_old the trainer's log-prob before the update, and the
// mismatch metrics of one RL step.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace rlhf::rl {

/// Which behaviour weight multiplies the per-token policy loss (before aggregation).
///   kNone:       w = 1.
///   kTis:        w = clamp(r, lo, hi)  (Yao et al. 2025, truncated IS; --vllm_is_correction_type
///                tis).
///   kIcepop:     w = r if lo ≤ r ≤ hi, else 0 (IcePop, Ling team 2025: the token drops out).
///   kSeqMaskTis: ρ_i = exp(mean over the sample's action tokens of (lp_old − lp_rol)); every
///                token of sample i gets w = 0 when ρ_i ∉ [lo, hi], else w = r (unclamped, as
///                OpenRLHF's loss.py computes it).
///   kDecoupled:  w = r if r ≤ hi, else 0, with hi = --behav_imp_weight_cap (≤ 0: no cap, w = r)
///                (decoupled PPO: Hilton et al. 2021; AReaL, Fu et al. 2025, eq. 5, with AReaL's
///                filter on the cap).
/// The weight is a constant of the loss (stop-gradient): it depends on lp_old and lp_rol only.
enum class IsCorrection { kNone, kTis, kIcepop, kSeqMaskTis, kDecoupled };

/// "tis" | "icepop" | "seq-mask-tis" (the values of --vllm_is_correction_type); throws
/// rlhf::Error naming the flag otherwise.
IsCorrection is_correction_from_string(const std::string& s);
/// "none", "tis", "icepop", "seq-mask-tis" or "decoupled".
const char* to_string(IsCorrection c);

/// The log-ratio lp_old − lp_rol is clamped to [−20, 20] before exp (as the PPO ratio's).
inline constexpr double kIsLogRatioClamp = 20.0;

/// Behaviour weights of N token positions.
/// w: (N) out; masked: (N) out or nullptr (1 where an action token's weight was set to 0 by the
/// correction's mask); lp_old, lp_rol: (N) nats; seq: (N) the sample (row) of each action token in
/// [0, n_seq), or −1 for a position that is not an action token (w = 0, masked = 0). lo, hi: the
/// thresholds (--vllm_is_truncated_threshold; for kDecoupled only hi, the cap). Throws
/// rlhf::Error on a row index out of range.
void is_weights_cpu(float* w, uint8_t* masked, const float* lp_old, const float* lp_rol,
                    const int32_t* seq, int64_t N, int64_t n_seq, IsCorrection type, double lo,
                    double hi);

/// Sums of the mismatch metrics over action tokens (one rank's share, or all), merged across
/// ranks by sum (n, sums) and max (the maxima; the minimum is kept as a negated maximum).
/// With d_t = lp_old_t − lp_rol_t and r_t = exp(d_t):
///   mismatch_kl = mean(r − 1 − d)          (k3 estimate of KL(π_rol ‖ π_old); 0 iff d = 0)
///   mismatch_abs_logp_mean/max = mean/max |d|
///   vllm_kl = mean(lp_rol − lp_old) = −mean(d)  (OpenRLHF's name)
///   is_weight_mean/min/max: of the weights applied (1 without a correction)
///   is_masked_fraction: share of action tokens whose weight the correction set to 0.
struct MismatchSums {
  double n = 0, k3 = 0, abs = 0, neg_d = 0, w = 0, masked = 0;
  double abs_max = 0;
  double w_max = -std::numeric_limits<double>::infinity();
  double neg_w_min = -std::numeric_limits<double>::infinity();
  /// One action token: its log-probs, the weight applied and whether the mask zeroed it.
  void add(double lp_old, double lp_rol, double weight, bool was_masked);
  /// The sums as 6 values followed by the 3 maxima (abs_max, w_max, neg_w_min).
  void pack(double* sums6, double* max3) const;
  void unpack(const double* sums6, const double* max3);
};

/// The mismatch metrics of one step (all 0 when there were no action tokens).
struct MismatchStats {
  double mismatch_kl = 0, mismatch_abs_logp_mean = 0, mismatch_abs_logp_max = 0, vllm_kl = 0;
  double is_weight_mean = 0, is_weight_min = 0, is_weight_max = 0, is_masked_fraction = 0;
  static MismatchStats from(const MismatchSums& s);
};

}  // namespace rlhf::rl

// Advantage estimators, per-token rewards and the adaptive KL controller, exactly as
// docs/algorithms.md defines them (OpenRLHF's defaults).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rlhf::rl {

/// `--advantage_estimator`.
enum class AdvantageEstimator { kGae, kReinforce, kReinforceBaseline, kRloo, kGroupNorm, kDrGrpo };

/// "gae" | "reinforce" | "reinforce_baseline" | "rloo" | "group_norm" | "dr_grpo"; throws
/// rlhf::Error naming the flag otherwise.
AdvantageEstimator advantage_estimator_from_string(const std::string& s);
const char* to_string(AdvantageEstimator e);
/// Needs n_samples_per_prompt > 1 (uses the group of a prompt's samples).
bool needs_group(AdvantageEstimator e);
/// Uses a critic (values): only GAE.
bool uses_critic(AdvantageEstimator e);
/// The advantages are whitened over the rollout batch (gae, reinforce, reinforce_baseline).
bool whitens(AdvantageEstimator e);

/// A rollout batch in sample-major padded form: B samples (groups of `group_size` consecutive
/// samples share a prompt), each with resp_len[i] <= Tr response tokens; per-token arrays are
/// (B, Tr) row-major, entries at t >= resp_len[i] ignored (the action mask m).
struct AdvantageInput {
  int64_t B = 0, Tr = 0;
  int group_size = 1;                 ///< n = --n_samples_per_prompt
  const int32_t* resp_len = nullptr;  ///< (B)
  const double* score = nullptr;      ///< (B) raw scalar scores s_i
  const double* kl = nullptr;         ///< (B, Tr) per-token KL estimate, or nullptr (no KL reward)
  double kl_coef = 0;                 ///< β for the KL term in the reward
  const double* values = nullptr;     ///< (B, Tr) critic values V_t (GAE only)
  double gamma = 1.0, lambd = 1.0;    ///< --gamma, --lambd
  double score_clip = 10.0;           ///< s_i is clipped to [−clip, clip] first
  /// group_norm divides by the group's std; false: --no_advantage_std_norm (= dr_grpo's s − mean).
  bool std_norm = true;
  /// (B, Tr) action mask, or nullptr (every token below resp_len is an action). Multi-turn
  /// episodes: tokens with mask 0 (environment observations) are context, not steps — the
  /// estimators run over each row's action tokens only, in order (so the score lands on the last
  /// action token, GAE bootstraps from the next action token's value, whitening averages over
  /// action tokens), and the outputs are 0 at mask-0 tokens.
  const uint8_t* mask = nullptr;
};

/// Per-token results, (B, Tr) each (zero beyond each response).
struct AdvantageOutput {
  std::vector<double> reward;        ///< r_t = −β·KL_t + [t = last]·s'_i
  std::vector<double> advantages;    ///< A_t (whitened where the estimator says so)
  std::vector<double> returns;       ///< R_t = A_t + V_t (GAE, before whitening) or the return
  std::vector<double> shaped_score;  ///< (B) s'_i after clipping and the group transform
};

/// Computes rewards, advantages and returns (docs/algorithms.md):
///   s'_i: gae, reinforce: s_i; reinforce_baseline, dr_grpo: s_i − mean(group); rloo:
///   s_i − (Σ_j s_j − s_i)/(n−1); group_norm: (s_i − mean)/(std + 1e-9), std unbiased (n−1).
///   gae: δ_t = r_t + γV_{t+1} − V_t (V after the last token = 0), A_t = δ_t + γλA_{t+1},
///        R_t = A_t + V_t (Schulman et al. 2016, eq. 16).
///   others: A_t = R_t = Σ_{k≥t} γ^{k−t} r_k.
///   whitening (gae, reinforce, reinforce_baseline): A ← (A − mean)·rsqrt(max(var, 1e-8)) with
///   the masked mean and (biased) variance over every response token of the batch.
/// Throws rlhf::Error when a group estimator gets group_size < 2, B is not a multiple of the
/// group size, GAE gets no values, or a length is outside [0, Tr].
AdvantageOutput compute_advantages(const AdvantageInput& in, AdvantageEstimator est);

/// Adaptive KL coefficient (Ziegler et al. 2019, §2.2): β ← β·(1 + clip(KL/target − 1, −0.2, 0.2)
/// · n_steps/horizon). With target <= 0 the coefficient stays fixed.
class KlController {
 public:
  KlController(double init_kl_coef, double kl_target, double kl_horizon)
      : beta_(init_kl_coef), target_(kl_target), horizon_(kl_horizon) {}
  double value() const { return beta_; }
  /// current_kl: the mean KL of the last rollout; n_steps: samples in it (OpenRLHF passes the
  /// rollout batch size).
  void update(double current_kl, double n_steps);
  void set_value(double beta) { beta_ = beta; }

 private:
  double beta_, target_, horizon_;
};

}  // namespace rlhf::rl

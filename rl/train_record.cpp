#include "rl/train_record.h"

#include <algorithm>

namespace rlhf::rl {

nlohmann::json TrainRecord::to_json() const {
  const PpoStats& st = stats;
  const MismatchStats& mm = st.mismatch;
  return {{"logprob_s", logprob_s},
          {"logprob_comm_s", logprob_comm_s},
          {"logprob_comm_bytes", logprob_comm_bytes},
          {"logprob_old_skipped", logprob_old_skipped ? 1 : 0},
          {"trained_samples", trained_samples},
          {"kl_mean", st.kl},
          {"kl_coef", st.kl_coef},
          {"policy_loss", st.policy_loss},
          {"value_loss", st.value_loss},
          {"kl_loss", st.kl_loss},
          {"clip_frac", st.clip_frac},
          {"approx_kl", st.approx_kl},
          {"entropy", st.entropy},
          {"actor_grad_norm", st.actor_grad_norm},
          {"critic_grad_norm", st.critic_grad_norm},
          {"actor_lr", st.actor_lr},
          {"critic_lr", st.critic_lr},
          {"optimizer_steps", st.optimizer_steps},
          {"train_micro_batches", st.train_micro_batches},
          {"mismatch_kl", mm.mismatch_kl},
          {"mismatch_abs_logp_mean", mm.mismatch_abs_logp_mean},
          {"mismatch_abs_logp_max", mm.mismatch_abs_logp_max},
          {"vllm_kl", mm.vllm_kl},
          {"is_weight_mean", mm.is_weight_mean},
          {"is_weight_min", mm.is_weight_min},
          {"is_weight_max", mm.is_weight_max},
          {"is_masked_fraction", mm.is_masked_fraction},
          {"train_s", train_s},
          {"train_comm_s", st.comm_seconds},
          {"train_comm_bytes", st.comm_bytes},
          {"train_tokens", train_tokens},
          {"train_tokens_per_s", double(train_tokens) / std::max(train_s, 1e-9)}};
}

}  // namespace rlhf::rl

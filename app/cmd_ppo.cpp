// `rlhf ppo` and `rlhf grpo`: the flags of the RL loop turned into rl::RlRunConfig, and the run
// (rl/rl_run.h holds the loop; rl/rl_step.h one step).
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/runtime.h"
#include "rl/rl_run.h"

namespace rlhf::app {

rl::RlRunConfig rl_run_config(const PpoArgs& a, const char* cmd) {
  rl::RlRunConfig c;
  c.command = cmd;
  c.seed = a.common.seed;
  c.runtime = runtime_options(a.parallel, a.gen.vllm_tensor_parallel_size);
  c.zero = zero_options(a.zero);
  c.zero.lora = lora_options(a.lora);
  c.zero.lora.seed = uint64_t(a.common.seed);  // the LoRA dropout masks
  c.model_config = a.model.model_config;
  c.pretrain = a.model.pretrain;
  c.tokenizer = a.model.tokenizer;
  c.reward_pretrain = a.reward_pretrain;
  c.critic_pretrain = a.critic_pretrain;
  c.prompts.prompt_data = a.prompt_data;
  c.prompts.input_key = a.input_key;
  c.prompts.label_key = a.label_key;
  c.prompts.apply_chat_template = a.apply_chat_template;
  c.prompts.input_template = a.input_template;
  // --max_len: a prompt needs room for at least one new token.
  c.prompts.prompt_max_len =
      a.max_len > 0 ? std::min<int64_t>(a.prompt_max_len, a.max_len - 1) : a.prompt_max_len;
  c.step.max_len = a.max_len;
  c.prompts.max_samples = a.max_samples;
  c.prompts.save_dir = a.ckpt.save_path;
  c.reward = a.rewards.reward;
  c.reward_options = reward_options(a.rewards);
  rl::PpoOptions& po = c.ppo;
  po.estimator = rl::advantage_estimator_from_string(a.advantage_estimator);
  po.gamma = a.gamma;
  po.lambd = a.lambd;
  po.init_kl_coef = a.init_kl_coef;
  po.kl_estimator = rl::kl_estimator_from_string(a.kl_estimator);
  po.use_kl_loss = a.use_kl_loss;
  po.kl_target = a.kl_target;
  po.kl_horizon = a.kl_horizon;
  const bool asym = a.eps_clip_low_high[0] > 0 || a.eps_clip_low_high[1] > 0;
  po.eps_clip_low = asym ? a.eps_clip_low_high[0] : a.eps_clip;
  po.eps_clip_high = asym ? a.eps_clip_low_high[1] : a.eps_clip;
  po.dual_clip = a.dual_clip;
  po.value_clip = a.value_clip;
  po.entropy_loss_coef = a.entropy_loss_coef;
  po.n_samples_per_prompt = int(a.gen.n_samples_per_prompt);
  po.micro_rollout_batch_size = a.micro_rollout_batch_size;
  po.train_batch_size = a.train_batch_size;
  po.micro_train_batch_size = a.micro_train_batch_size;
  po.max_epochs = a.max_epochs;
  // Log-probs use logits / the sampling temperature (OpenRLHF); greedy and 0 mean 1.
  po.temperature = a.gen.greedy ? 1.0 : (a.gen.temperature > 0 ? a.gen.temperature : 1.0);
  po.freezing_actor_steps = a.freezing_actor_steps;
  po.normalize_reward = a.normalize_reward;
  po.max_norm = a.optim.max_norm;
  po.policy_loss = rl::policy_loss_type_from_string(a.policy_loss_type);
  po.loss_agg_mode = rl::loss_agg_mode_from_string(a.loss_agg_mode);
  po.generate_max_len = a.gen.generate_max_len;
  po.advantage_std_norm = !a.no_advantage_std_norm;
  if (a.enable_vllm_is_correction) {
    po.is_correction = rl::is_correction_from_string(a.vllm_is_correction_type);
    po.is_lo = a.vllm_is_truncated_threshold[0];
    po.is_hi = a.vllm_is_truncated_threshold[1];
  } else if (a.use_decoupled_loss) {
    po.is_correction = rl::IsCorrection::kDecoupled;
    po.is_lo = 0;
    po.is_hi = a.behav_imp_weight_cap;  // 0: no cap
  }
  po.dynamic_batch = a.use_dynamic_batch;
  po.packing = a.zero.packing_samples;
  po.train_max_tokens = a.train_max_tokens_per_gpu;
  po.rollout_max_tokens =
      a.rollout_max_tokens_per_gpu > 0 ? a.rollout_max_tokens_per_gpu : a.train_max_tokens_per_gpu;
  c.step.rollout_batch_size = a.rollout_batch_size;
  c.step.n_samples_per_prompt = a.gen.n_samples_per_prompt;
  c.step.generate_max_len = a.gen.generate_max_len;
  c.step.sampling.temperature = a.gen.temperature;
  c.step.sampling.top_p = a.gen.top_p;
  c.step.sampling.top_k = a.gen.top_k;
  c.step.sampling.greedy = a.gen.greedy;
  c.step.sampling.seed = uint64_t(a.common.seed);
  c.step.max_epochs = a.max_epochs;
  c.step.dynamic_filtering = a.dynamic_filtering;
  c.step.filter_lo = a.dynamic_filtering_reward_range[0];
  c.step.filter_hi = a.dynamic_filtering_reward_range[1];
  c.step.max_num_gen_batches = a.max_num_gen_batches;
  c.step.overlong_buffer_len = a.overlong_buffer_len;
  c.step.overlong_penalty_factor = a.overlong_penalty_factor;
  c.step.log_completions = a.log_completions;
  c.step.async_train = a.async_train;
  c.step.async_queue_size = a.async_queue_size;
  c.step.partial_rollout = a.partial_rollout;
  c.step.max_staleness = a.max_staleness;
  c.step.enable_sleep = a.vllm_enable_sleep;
  c.env_command = a.gen.env_command;
  c.env_timeout = a.gen.env_timeout;
  c.env_max_turns = a.gen.env_max_turns;
  c.stop_strings = a.gen.stop_strings;
  c.actor_adam = make_adamw(a.optim, a.actor_learning_rate);
  c.critic_adam = make_adamw(a.optim, a.critic_learning_rate);
  c.lr_scheduler = a.optim.lr_scheduler;
  c.lr_warmup_ratio = a.optim.lr_warmup_ratio;
  c.engine = engine_options(a.gen, parallel::Device::kCpu, nullptr, -1, c.runtime.bf16);
  c.engine.keep_interrupted_kv = a.partial_rollout && a.partial_rollout_kv == "keep";
  c.sync_bucket_mb = a.sync_bucket_mb;
  c.eval_dataset = a.eval_dataset;
  c.eval_steps = a.eval_steps;
  c.eval_temperature = a.eval_temperature;
  c.eval_n_samples_per_prompt = a.eval_n_samples_per_prompt;
  c.eval_before_training = a.eval_before_training;
  c.num_episodes = a.num_episodes;
  c.max_steps = a.max_steps;
  c.save_path = a.ckpt.save_path;
  c.save_steps = a.ckpt.save_steps;
  c.logging_steps = a.ckpt.logging_steps;
  c.ckpt_path = a.ckpt.ckpt_path;
  c.max_ckpt_num = a.ckpt.max_ckpt_num;
  c.save_hf_ckpt = a.ckpt.save_hf_ckpt;
  c.ckpt_format = a.ckpt.ckpt_format;
  c.load_checkpoint = a.ckpt.load_checkpoint;
  c.tracking = tracking_options(a.tracking);
  return c;
}

int run_ppo(const PpoArgs& args) {
  return rl::run_rl(rl_run_config(args, "ppo"));
}
int run_grpo(const GrpoArgs& args) {
  return rl::run_rl(rl_run_config(args, "grpo"));
}

}  // namespace rlhf::app

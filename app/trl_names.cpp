#include "app/trl_names.h"

#include <fmt/format.h>

#include <iterator>

namespace rlhf::app {

namespace {

// TRL names (1.9) (trl.GRPOConfig, SFTConfig, RewardConfig, transformers.TrainingArguments).
constexpr TrlName kTable[] = {
    {"model_name_or_path", "--pretrain"},
    {"dataset_name", "--prompt_data (grpo, ppo) or --dataset (sft, rm, eval)"},
    {"output_dir", "--save_path"},
    {"num_generations", "--n_samples_per_prompt"},
    {"max_completion_length", "--generate_max_len"},
    {"max_prompt_length", "--prompt_max_len"},
    {"max_length", "--max_len (sft, rm)"},
    {"max_seq_length", "--max_len (sft, rm)"},
    {"dataset_text_field", "--input_key"},
    {"beta", "--init_kl_coef (with --use_kl_loss for TRL's KL term in the loss)"},
    {"epsilon", "--eps_clip"},
    {"epsilon_high", "--eps_clip_low_high LOW HIGH"},
    {"num_iterations", "--max_epochs (optimizer passes over each rollout batch)"},
    {"num_train_epochs", "--num_episodes (grpo, ppo) or --max_epochs (sft, rm)"},
    {"per_device_train_batch_size", "--micro_train_batch_size"},
    {"gradient_accumulation_steps",
     "--train_batch_size (= micro_train_batch_size x training ranks x accumulation steps)"},
    {"generation_batch_size",
     "--rollout_batch_size (prompts per step: TRL's generation_batch_size / num_generations)"},
    {"loss_type",
     "--loss_agg_mode (grpo: seq-mean-token-mean, dapo and bnpo: token-mean, dr_grpo: "
     "seq-mean-token-sum-norm; cispo and sapo have no rlhf counterpart)"},
    {"scale_rewards",
     "--advantage_estimator group_norm (group, TRL's default) or --no_advantage_std_norm (none; "
     "batch has no rlhf counterpart)"},
    {"importance_sampling_level", "--policy_loss_type gspo (for sequence)"},
    {"vllm_importance_sampling_correction",
     "--enable_vllm_is_correction (TRL's truncated IS: --vllm_is_correction_type tis)"},
    {"vllm_importance_sampling_cap",
     "--vllm_is_truncated_threshold LO HI (TRL caps above only: e.g. 0 2)"},
    {"reward_funcs", "--reward (rule rewards, weighted sums) or --reward_command"},
    {"reward_weights", "--reward with weights, e.g. --reward 'math:1.0,format:0.2'"},
    {"learning_rate", "--actor_learning_rate (grpo, ppo; sft and rm take --learning_rate)"},
    {"lr_scheduler_type", "--lr_scheduler"},
    {"warmup_ratio", "--lr_warmup_ratio"},
    {"weight_decay", "--l2"},
    {"max_grad_norm", "--max_norm"},
    {"adam_beta1", "--adam_betas BETA1 BETA2"},
    {"adam_beta2", "--adam_betas BETA1 BETA2"},
    {"eval_strategy", "--eval_steps (with --eval_dataset)"},
    {"use_vllm", "nothing: rlhf always generates with its own engines (--gen_ranks_per_node)"},
    {"bf16", "--param_dtype bf16 (or --bf16, the same; the default auto is bf16 on GPUs)"},
    {"deepspeed", "--zero_stage and --adam_offload"},
    {"use_peft", "--lora_rank R (> 0 trains LoRA adapters)"},
    {"lora_r", "--lora_rank"},
    {"lora_target_modules", "--target_modules"},
    {"report_to",
     "--use_tensorboard DIR (tensorboard) and --use_wandb (wandb); metrics.jsonl is always "
     "written"},
    {"run_name", "--wandb_run_name"},
    {"logging_dir", "--use_tensorboard DIR"},
    {"num_generations_eval", "--eval_n_samples_per_prompt"},
    {"gradient_checkpointing_kwargs", "nothing: --gradient_checkpointing recomputes each layer"},
    {"resume_from_checkpoint", "--load_checkpoint (with --ckpt_path)"},
    {"save_total_limit", "--max_ckpt_num"},
};

}  // namespace

std::span<const TrlName> trl_names() {
  return {std::begin(kTable), std::end(kTable)};
}

std::string trl_hint(std::string_view name) {
  for (const TrlName& n : kTable)
    if (name == n.trl) return fmt::format("\nhint: TRL's --{} is {} in rlhf", n.trl, n.rlhf);
  return "";
}

}  // namespace rlhf::app

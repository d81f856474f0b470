#include "app/openrlhf_names.h"

#include <fmt/format.h>

#include <iterator>
#include <set>

#include "app/cli.h"

namespace rlhf::app {

namespace {

using F = OpenRlhfFallback;

// Why a name is refused or ignored (one line each, shown in the hint and docs/migrating.md).
constexpr const char* kPlacement =
    "placement: rlhf is one MPI job; ranks come from mpirun/srun -n, generation-only ranks from "
    "--gen_ranks_per_node (0 = every rank trains and generates), an engine's width from "
    "--vllm_tensor_parallel_size";
constexpr const char* kRing =
    "no ring attention (context parallelism): a sequence stays on one rank; for long sequences "
    "use --gradient_checkpointing and a smaller --micro_train_batch_size";
constexpr const char* kAgent =
    "no Python agent functions: multi-turn episodes talk to an environment program "
    "(--env_command, JSON lines) or builtin:toy";
constexpr const char* kRemote =
    "no HTTP reward server or Python reward_func file: use --reward command --reward_command "
    "PROGRAM (JSON lines), a rule --reward, or --reward_pretrain";
constexpr const char* k4bit = "no quantised (4-bit) training weights";
constexpr const char* kDsTp =
    "no tensor parallelism in training: ZeRO-3 shards the parameters (--zero_stage 3)";
constexpr const char* kDynBatch =
    "token-budget micro-batches are grpo and ppo's (--use_dynamic_batch); sft and rm use "
    "--micro_train_batch_size samples: the same gradients";
constexpr const char* kDsSleep =
    "no DeepSpeed sleep: the trainer keeps its weights, gradients and optimizer states while the "
    "engines generate; --adam_offload keeps the Adam states in host memory throughout, and "
    "--vllm_enable_sleep frees the engines' KV cache and weight copies while the trainer trains";
constexpr const char* kSync =
    "weights reach the engines over NCCL (colocated GPU ranks) or MPI / shared memory, chosen by "
    "the placement";
constexpr const char* kColocate =
    "every training rank holds all its models (actor, reference, critic, reward model)";
constexpr const char* kPrefix = "no prefix cache: the n samples of a prompt share one prefill";
constexpr const char* kParamDtype =
    "--device cuda trains in bf16 (fp32 master weights), the CPU in fp32";
constexpr const char* kIsCorr =
    "the importance-sampling correction of the engine/trainer mismatch is grpo and ppo's";
constexpr const char* kSplit =
    "prompt files are JSONL (or builtin:<task>); Hugging Face dataset splits are not read";
constexpr const char* kHub = "no model hub downloads: give --pretrain a local Hugging Face folder";
constexpr const char* kDs = "a DeepSpeed setting with no rlhf counterpart";
constexpr const char* kRewardClip = "no reward clipping: rule rewards are bounded by construction";

constexpr const char* kTrain = "sft rm grpo ppo";
constexpr const char* kRl = "grpo ppo";

#define ALIAS(name, key) \
  { name, key, F::kReject, 0, "", "" }
#define ALIAS_OR(name, key, note) \
  { name, key, F::kReject, 0, note, "" }
#define ALIAS_ELSE_IGNORE(name, key, nargs, note, cmds) \
  { name, key, F::kIgnore, nargs, note, cmds }
#define REJECT(name, note) \
  { name, "", F::kReject, 0, note, "" }
#define IGNORE(name, nargs, note, cmds) \
  { name, "", F::kIgnore, nargs, note, cmds }

constexpr OpenRlhfName kTable[] = {
    // actor / model (sft, rm) / critic / reward / ref
    ALIAS("actor.model_name_or_path", "pretrain"),
    ALIAS("model.model_name_or_path", "pretrain"),
    ALIAS("critic.model_name_or_path", "critic_pretrain"),
    ALIAS("reward.model_name_or_path", "reward_pretrain"),
    ALIAS("actor.adam.lr", "actor_learning_rate"),
    ALIAS("critic.adam.lr", "critic_learning_rate"),
    ALIAS("adam.lr", "learning_rate"),
    ALIAS("actor.adam.betas", "adam_betas"),
    ALIAS("adam.betas", "adam_betas"),
    ALIAS("actor.adam.weight_decay", "l2"),
    ALIAS("adam.weight_decay", "l2"),
    ALIAS("actor.lr_scheduler", "lr_scheduler"),
    ALIAS("actor.lr_warmup_ratio", "lr_warmup_ratio"),
    ALIAS("actor.max_norm", "max_norm"),
    ALIAS("actor.eps_clip", "eps_clip"),
    ALIAS("actor.eps_clip_low_high", "eps_clip_low_high"),
    ALIAS("actor.dual_clip", "dual_clip"),
    ALIAS("actor.policy_loss_type", "policy_loss_type"),
    ALIAS("actor.entropy_coef", "entropy_loss_coef"),
    ALIAS("actor.gradient_checkpointing_enable", "gradient_checkpointing"),
    ALIAS("model.gradient_checkpointing_enable", "gradient_checkpointing"),
    ALIAS("critic.value_clip", "value_clip"),
    ALIAS("critic.freezing_steps", "freezing_actor_steps"),
    ALIAS("reward.normalize_enable", "normalize_reward"),
    ALIAS("reward.overlong_buffer_len", "overlong_buffer_len"),
    ALIAS("reward.overlong_penalty_factor", "overlong_penalty_factor"),
    REJECT("reward.remote_url", kRemote),
    REJECT("reward.clip_range", kRewardClip),
    REJECT("actor.num_nodes", kPlacement),
    REJECT("actor.num_gpus_per_node", kPlacement),
    REJECT("critic.num_nodes", kPlacement),
    REJECT("critic.num_gpus_per_node", kPlacement),
    REJECT("reward.num_nodes", kPlacement),
    REJECT("reward.num_gpus_per_node", kPlacement),
    REJECT("ref.num_nodes", kPlacement),
    REJECT("ref.num_gpus_per_node", kPlacement),
    // data
    ALIAS("data.prompt_dataset", "prompt_data"),
    ALIAS("data.dataset", "dataset"),
    ALIAS("data.input_key", "input_key"),
    ALIAS("data.output_key", "output_key"),
    ALIAS("data.label_key", "label_key"),
    ALIAS("data.prompt_key", "prompt_key"),
    ALIAS("data.chosen_key", "chosen_key"),
    ALIAS("data.rejected_key", "rejected_key"),
    ALIAS("data.apply_chat_template", "apply_chat_template"),
    ALIAS("data.input_template", "input_template"),
    ALIAS("data.max_len", "max_len"),
    ALIAS("data.max_samples", "max_samples"),
    REJECT("data.prompt_split", kSplit),
    REJECT("data.dataset_split", kSplit),
    // rollout
    ALIAS("rollout.max_new_tokens", "generate_max_len"),
    ALIAS("rollout.n_samples_per_prompt", "n_samples_per_prompt"),
    ALIAS("rollout.batch_size", "rollout_batch_size"),
    ALIAS("rollout.micro_batch_size", "micro_rollout_batch_size"),
    ALIAS("rollout.temperature", "temperature"),
    ALIAS("rollout.top_p", "top_p"),
    ALIAS_ELSE_IGNORE("rollout.max_tokens_per_gpu", "rollout_max_tokens_per_gpu", 1, kDynBatch,
                      kRl),
    // train
    ALIAS("train.batch_size", "train_batch_size"),
    ALIAS("train.micro_batch_size", "micro_train_batch_size"),
    ALIAS("train.max_epochs", "max_epochs"),
    ALIAS("train.num_episodes", "num_episodes"),
    ALIAS("train.seed", "seed"),
    ALIAS("train.async_enable", "async_train"),
    ALIAS("train.async_queue_size", "async_queue_size"),
    ALIAS("train.colocate_all", "colocate_all_models"),
    IGNORE("train.colocate_actor_ref", 0, kColocate, kRl),
    IGNORE("train.colocate_critic_reward", 0, kColocate, kRl),
    ALIAS_ELSE_IGNORE("train.dynamic_batch_enable", "use_dynamic_batch", 0, kDynBatch, kTrain),
    ALIAS_ELSE_IGNORE("train.max_tokens_per_gpu", "train_max_tokens_per_gpu", 1, kDynBatch, kTrain),
    REJECT("train.agent_func_path", kAgent),
    ALIAS("train.partial_rollout_enable", "partial_rollout"),
    // algo
    ALIAS("algo.advantage.estimator", "advantage_estimator"),
    ALIAS("algo.advantage.gamma", "gamma"),
    ALIAS("algo.advantage.lambd", "lambd"),
    ALIAS("algo.advantage.no_std_norm", "no_advantage_std_norm"),
    ALIAS_OR("algo.advantage.is_correction_enable", "enable_vllm_is_correction", kIsCorr),
    ALIAS_OR("algo.advantage.is_correction_type", "vllm_is_correction_type", kIsCorr),
    ALIAS_OR("algo.advantage.is_correction_threshold", "vllm_is_truncated_threshold", kIsCorr),
    ALIAS("algo.kl.init_coef", "init_kl_coef"),
    ALIAS("algo.kl.estimator", "kl_estimator"),
    ALIAS("algo.kl.use_loss", "use_kl_loss"),
    ALIAS("algo.kl.target", "kl_target"),
    ALIAS("algo.kl.horizon", "kl_horizon"),
    ALIAS("algo.dynamic_filtering_enable", "dynamic_filtering"),
    ALIAS("algo.dynamic_filtering_range", "dynamic_filtering_reward_range"),
    // ds (DeepSpeed)
    ALIAS("ds.zero_stage", "zero_stage"),
    ALIAS("ds.adam_offload", "adam_offload"),
    ALIAS_ELSE_IGNORE("ds.param_dtype", "param_dtype", 1, kParamDtype, kTrain),
    ALIAS("ds.packing_samples", "packing_samples"),
    ALIAS("ds.attn_implementation", "attn_implementation"),
    IGNORE("ds.enable_sleep", 0, kDsSleep, kRl),
    REJECT("ds.ring_attn_size", kRing),
    REJECT("ds.ring_attn_head_stride", kRing),
    REJECT("ds.tensor_parallel_size", kDsTp),
    REJECT("ds.load_in_4bit", k4bit),
    ALIAS("ds.lora.rank", "lora_rank"),
    ALIAS("ds.lora.alpha", "lora_alpha"),
    ALIAS("ds.lora.target_modules", "target_modules"),
    ALIAS("ds.lora.dropout", "lora_dropout"),
    REJECT("ds.zpg", kDs),
    REJECT("ds.deepcompile", kDs),
    REJECT("ds.grad_accum_dtype", kDs),
    // vllm
    ALIAS("vllm.tensor_parallel_size", "vllm_tensor_parallel_size"),
    ALIAS("vllm.gpu_memory_utilization", "vllm_gpu_memory_utilization"),
    ALIAS("vllm.enforce_eager", "enforce_eager"),
    REJECT("vllm.num_engines", kPlacement),
    IGNORE("vllm.sync_backend", 1, kSync, kRl),
    ALIAS("vllm.enable_sleep", "vllm_enable_sleep"),
    IGNORE("vllm.enable_prefix_caching", 0, kPrefix, kRl),
    // ckpt
    ALIAS("ckpt.output_dir", "save_path"),
    ALIAS("ckpt.path", "ckpt_path"),
    ALIAS("ckpt.save_steps", "save_steps"),
    ALIAS("ckpt.max_num", "max_ckpt_num"),
    ALIAS("ckpt.load_enable", "load_checkpoint"),
    ALIAS("ckpt.save_hf", "save_hf_ckpt"),
    // logger
    ALIAS("logger.logging_steps", "logging_steps"),
    ALIAS("logger.tensorboard_dir", "use_tensorboard"),
    ALIAS("logger.wandb.key", "use_wandb"),
    ALIAS("logger.wandb.project", "wandb_project"),
    ALIAS("logger.wandb.group", "wandb_group"),
    ALIAS("logger.wandb.run_name", "wandb_run_name"),
    ALIAS("logger.wandb.org", "wandb_org"),
    // eval
    ALIAS("eval.dataset", "eval_dataset"),
    ALIAS("eval.steps", "eval_steps"),
    ALIAS("eval.temperature", "eval_temperature"),
    ALIAS("eval.n_samples_per_prompt", "eval_n_samples_per_prompt"),
    REJECT("eval.split", kSplit),
    // flat names of OpenRLHF < 0.10.2 that rlhf spells differently or does not have
    ALIAS("max_new_tokens", "generate_max_len"),
    ALIAS("agent_max_steps", "env_max_turns"),
    REJECT("ref_num_nodes", kPlacement),
    REJECT("ref_num_gpus_per_node", kPlacement),
    REJECT("actor_num_nodes", kPlacement),
    REJECT("actor_num_gpus_per_node", kPlacement),
    REJECT("critic_num_nodes", kPlacement),
    REJECT("critic_num_gpus_per_node", kPlacement),
    REJECT("reward_num_nodes", kPlacement),
    REJECT("reward_num_gpus_per_node", kPlacement),
    REJECT("vllm_num_engines", kPlacement),
    IGNORE("colocate_actor_ref", 0, kColocate, kRl),
    IGNORE("colocate_critic_reward", 0, kColocate, kRl),
    IGNORE("vllm_sync_backend", 1, kSync, kRl),
    IGNORE("deepspeed_enable_sleep", 0, kDsSleep, kRl),
    IGNORE("enable_prefix_caching", 0, kPrefix, kRl),
    IGNORE("use_dynamic_batch", 0, kDynBatch, kTrain),
    IGNORE("train_max_tokens_per_gpu", 1, kDynBatch, kTrain),
    IGNORE("rollout_max_tokens_per_gpu", 1, kDynBatch, kRl),
    REJECT("ring_attn_size", kRing),
    REJECT("ring_head_stride", kRing),
    REJECT("agent_func_path", kAgent),
    REJECT("remote_rm_url", kRemote),
    REJECT("load_in_4bit", k4bit),
    REJECT("ds_tensor_parallel_size", kDsTp),
    REJECT("prompt_split", kSplit),
    REJECT("eval_split", kSplit),
    REJECT("use_ms", kHub),
};

#undef ALIAS
#undef ALIAS_OR
#undef ALIAS_ELSE_IGNORE
#undef REJECT
#undef IGNORE

/// Whether the space-separated list `commands` holds `command`.
bool lists(std::string_view commands, std::string_view command) {
  size_t i = 0;
  while (i < commands.size()) {
    size_t j = commands.find(' ', i);
    if (j == std::string_view::npos) j = commands.size();
    if (commands.substr(i, j - i) == command) return true;
    i = j + 1;
  }
  return false;
}

}  // namespace

std::span<const OpenRlhfName> openrlhf_names() {
  return {std::begin(kTable), std::end(kTable)};
}

const OpenRlhfName* find_openrlhf_name(std::string_view name, const OptionSet* set) {
  const OpenRlhfName* first = nullptr;
  for (const OpenRlhfName& n : kTable) {
    if (name != n.name) continue;
    if (first == nullptr) first = &n;
    if (set != nullptr && *n.key != '\0' && set->find(n.key) != nullptr) return &n;
  }
  return first;
}

void add_openrlhf_names(OptionSet& set) {
  std::set<std::string> done;
  for (const OpenRlhfName& n : kTable) {
    if (done.count(n.name)) continue;
    // A flat OpenRLHF name that is rlhf's own flag on this command needs no entry.
    if (set.find(n.name) != nullptr) {
      done.insert(n.name);
      continue;
    }
    OptionSpec* spec = nullptr;
    if (*n.key != '\0')
      for (OptionSpec& s : set.specs())
        if (s.key == n.key) spec = &s;
    if (spec != nullptr) {
      spec->alias(n.name);
      done.insert(n.name);
    } else if (n.fallback == F::kIgnore && lists(n.commands, set.command())) {
      set.ignore(n.name, n.nargs, n.note);
      done.insert(n.name);
    }
  }
}

std::string openrlhf_hint(std::string_view name, const OptionSet& set) {
  const OpenRlhfName* n = find_openrlhf_name(name, &set);
  if (n == nullptr) return "";
  if (*n->key == '\0' || *n->note != '\0')
    return fmt::format("\nhint: OpenRLHF's --{}: {}", name, *n->note ? n->note : "not in rlhf");
  return fmt::format("\nhint: OpenRLHF's --{} is --{} in rlhf, which `rlhf {}` does not take", name,
                     n->key, set.command());
}

}  // namespace rlhf::app

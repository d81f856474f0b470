// A whole PPO/GRPO run, one mpirun for everything (docs/design.md, "One RL step"): builds the
// models (actor, and where the algorithm needs them the reference, critic and reward model), the
// generation engines, the weight sync, the prompts and the rewards from plain options; resumes from
// a checkpoint if asked; runs RlStep until done with a step line, metrics.jsonl and periodic
// checkpoints; saves the final policy. `rlhf ppo`, `rlhf grpo` and `rlhf bench rl` call it.
#pragma once

#include <cstdint>
#include <string>

#include "optim/adamw.h"
#include "parallel/runtime.h"
#include "parallel/train_model.h"
#include "rl/evaluate.h"
#include "rl/ppo_trainer.h"
#include "rl/prompts.h"
#include "rl/rewards.h"
#include "rl/rl_step.h"
#include "rl/tracking.h"
#include "rollout/engine.h"

namespace rlhf::rl {

/// Everything a run needs, as plain values (the CLI's flags: app/cli.h maps them one to one).
struct RlRunConfig {
  std::string command = "ppo";  ///< "ppo" | "grpo" | "bench": names the run in logs
  int64_t seed = 42;            ///< --seed
  parallel::RuntimeOptions runtime;
  parallel::ZeroOptions zero;
  // Models: the policy from model_config (random init) or pretrain; the others as OpenRLHF.
  std::string model_config, pretrain, tokenizer;  ///< --model_config, --pretrain, --tokenizer
  std::string reward_pretrain;  ///< --reward_pretrain: a reward model checkpoint ("" = none)
  std::string critic_pretrain;  ///< --critic_pretrain ("" = reward_pretrain, else the policy's)
  PromptOptions prompts;
  std::string reward;  ///< --reward: rule reward spec ("" = none; make_reward)
  RewardOptions reward_options;
  PpoOptions ppo;      ///< algorithm, batch sizes, epochs (ppo.seed, ppo.pad_id are set by the run)
  RlStepOptions step;  ///< rollout batch, samples per prompt, generation
  /// Multi-turn episodes: --env_command ("" = none; make_environment), --env_timeout (s),
  /// --env_max_turns, --stop_strings (parse_stop_strings).
  std::string env_command;
  double env_timeout = 60;
  int64_t env_max_turns = 4;
  std::string stop_strings;
  optim::AdamWConfig actor_adam, critic_adam;       ///< lr = --actor/critic_learning_rate
  std::string lr_scheduler = "cosine_with_min_lr";  ///< --lr_scheduler
  double lr_warmup_ratio = 0.03;                    ///< --lr_warmup_ratio
  /// Engine settings; the run fills cuda (from the device), tp_comm, eos_token_id, unit_room.
  rollout::EngineOptions engine;
  int64_t sync_bucket_mb = 64;  ///< --sync_bucket_mb
  /// Evaluation on held-out prompts (same --input_key/--label_key, the rule reward): every
  /// eval_steps steps (-1: at the end only), and before training if asked. "" = none.
  std::string eval_dataset;
  int64_t eval_steps = -1;                ///< --eval_steps
  double eval_temperature = 0.6;          ///< --eval_temperature (0 = greedy)
  int64_t eval_n_samples_per_prompt = 4;  ///< --eval_n_samples_per_prompt
  bool eval_before_training = false;      ///< --eval_before_training
  int64_t num_episodes = 1;               ///< --num_episodes
  int64_t max_steps = -1;            ///< --max_steps (> 0: the step count, cycling the prompts)
  std::string save_path = "./ckpt";  ///< --save_path: metrics.jsonl and the final model.h5
  int64_t save_steps = -1;           ///< --save_steps: a training checkpoint every N steps
  int64_t logging_steps = 1;         ///< --logging_steps: a step line every N steps
  std::string ckpt_path = "./ckpt/checkpoints_ppo";  ///< --ckpt_path
  int64_t max_ckpt_num = 3;                          ///< --max_ckpt_num
  bool save_hf_ckpt = false;     ///< --save_hf_ckpt: a Hugging Face folder with each checkpoint
  bool load_checkpoint = false;  ///< --load_checkpoint
  TrackingOptions tracking;      ///< --use_tensorboard, --use_wandb (rank 0)
  /// --ckpt_format: single | sharded | auto (rl/checkpoint.h sharded_checkpoints)
  std::string ckpt_format = "single";
};

/// Runs the whole RL job on every rank of MPI_COMM_WORLD (collective). Returns 0, or
/// parallel::kExitPreempted when SIGTERM/SIGUSR1 stopped it after a step and its checkpoint; throws
/// rlhf::Error with a message naming the flag, file or key at fault (batch sizes that do not
/// split, a missing prompt file, a checkpoint made with another seed, ...).
int run_rl(const RlRunConfig& config);

}  // namespace rlhf::rl

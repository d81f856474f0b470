// The `rlhf` command line: one argument struct per subcommand, built from reusable option groups,
// and the parser that fills them from argv (CLI11) and an optional TOML file (toml++).
//
// Precedence, highest first: command-line flag > `--config` TOML file > environment variable (only
// for options that name one, e.g. RLHF_RANKS_PER_NODE) > the default written in the struct.
//
// Adding an option: add the field to a group (or command) struct below and one line to its bind():
//     o.add("max_len", max_len, "Max tokens per sample").check(ge(1));
// That single registration makes `--max_len` a flag, a `max_len = ...` TOML key, a help line with
// its default, a row of the resolved-config table, and applies the check to whichever source won.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/error.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace rlhf::app {

/// A mistake in how the program was invoked (unknown flag, bad value, bad TOML, missing required
/// option). main() exits with status 2 for it (1 for every other error).
class UsageError : public Error {
 public:
  explicit UsageError(std::string message) : Error(std::move(message), "") {}
};

/// Throws UsageError with the formatted message (a bad flag or flag combination: exit 2).
template <class... Args>
[[noreturn]] void usage_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}

// -------------------------------------------------------------------------------------------------
// Option registry

/// The current value of one option, whatever its type (used by checks and the config table).
using OptionValue = std::variant<bool, int, int64_t, double, std::string, std::array<double, 2>>;

/// A value constraint: `text` is shown in --help ("> 0", "truncate|skip"); `fn` returns "" when the
/// value is acceptable, otherwise the reason (e.g. "must be > 0").
struct Check {
  std::string text;
  std::function<std::string(const OptionValue&)> fn;
};

/// Numeric checks: they apply to int, int64_t and double options, and to every element of an
/// array option. gt: x > v; ge: x >= v; le: x <= v; range: lo <= x <= hi; below: x < v.
Check gt(double v);
Check ge(double v);
Check le(double v);
Check below(double v);
Check range(double lo, double hi);
/// Integer option must be one of `allowed` (e.g. --zero_stage 0|3).
Check one_of_int(std::vector<int64_t> allowed);
/// String option must be one of `allowed` (e.g. --truncation truncate|skip).
Check one_of(std::vector<std::string> allowed);
/// Integer option is -1 ("off"/"derive it") or >= v (e.g. --save_steps).
Check minus_one_or_ge(int64_t v);

/// Where an option's final value came from.
enum class OptionSource { kDefault, kCommandLine, kConfigFile, kEnvironment };

/// One registered option. Created by OptionSet::add; chain .check()/.required()/.env() on it.
struct OptionSpec {
  std::string key;          ///< TOML key and flag name without dashes, e.g. "learning_rate"
  std::string description;  ///< one line, as given to add()
  std::variant<bool*, int*, int64_t*, double*, std::string*, std::array<double, 2>*> target;
  std::vector<Check> checks;
  bool is_required = false;  ///< string option that must end up non-empty
  std::string env_name;      ///< environment variable consulted when neither flag nor file set it
  CLI::Option* cli = nullptr;
  CLI::App* app = nullptr;              ///< the subcommand it belongs to
  std::vector<std::string> aliases;     ///< other names (flag and TOML key), e.g. OpenRLHF's
  std::vector<CLI::Option*> alias_cli;  ///< their (hidden) CLI options
  /// The value a bare `--key` (nothing after it, or another flag) stands for; "" = a value is
  /// required (bool options are switches anyway)
  std::string implicit_value;
  OptionSource source = OptionSource::kDefault;
  std::string origin;  ///< "--flag", "file.toml:3:1" or "environment variable X"

  /// Adds a value constraint (also shown in --help).
  OptionSpec& check(Check c);
  /// Marks a string option as required: after merging CLI, file and env it must be non-empty.
  OptionSpec& required();
  /// The option also reads `name` from the environment when not given by flag or file.
  OptionSpec& env(std::string name);
  /// `--name` (and TOML key `name`) sets the option too; hidden from --help (say so in the
  /// description).
  OptionSpec& alias(const std::string& name);
  /// A bare `--key` means `--key <value>` (e.g. `--log_completions` = every step).
  OptionSpec& implicit(std::string value);

  /// The current value of the bound field.
  OptionValue value() const;
};

/// The options of one subcommand. Groups register their fields with add(); the parser then fills
/// them from the command line, the TOML file and the environment, and runs the checks.
class OptionSet {
 public:
  OptionSet(CLI::App* app, std::string command);
  OptionSet(const OptionSet&) = delete;
  OptionSet& operator=(const OptionSet&) = delete;

  /// Registers `--<key>` bound to `field` (its current value is the default shown in --help).
  /// T is one of bool (a flag: `--key`, `--key=false`; TOML true/false), int, int64_t, double,
  /// std::string, std::array<double, 2> (`--key 0.9 0.95`; TOML [0.9, 0.95]).
  template <class T>
  OptionSpec& add(const std::string& key, T& field, std::string description);

  const std::string& command() const { return command_; }
  CLI::App* app() const { return app_; }
  std::deque<OptionSpec>& specs() { return specs_; }
  const std::deque<OptionSpec>& specs() const { return specs_; }
  /// The spec for `key`, or nullptr.
  const OptionSpec* find(const std::string& key) const;

  /// An option accepted on the command line and ignored with a notice (a peer's setting whose
  /// effect rlhf has anyway or does not need, app/openrlhf_names.h): `--name` takes `nargs`
  /// values (0 = a switch); `note` says why it is ignored.
  struct Ignored {
    std::string name, note;
    int nargs = 0;
    std::vector<std::string> values;
    bool flag = false;
    CLI::Option* cli = nullptr;
  };
  /// Registers an ignored option (hidden from --help).
  void ignore(const std::string& name, int nargs, std::string note);
  std::deque<Ignored>& ignored() { return ignored_; }
  const std::deque<Ignored>& ignored() const { return ignored_; }

 private:
  CLI::App* app_;
  std::string command_;
  std::deque<OptionSpec> specs_;  // deque: references stay valid as options are added
  std::deque<Ignored> ignored_;
};

// -------------------------------------------------------------------------------------------------
// Option groups (shared between subcommands; later subcommands extend or add groups)

/// Options every subcommand has.
struct CommonArgs {
  std::string config;              ///< --config: TOML file with option values (not a TOML key)
  int64_t seed = 42;               ///< --seed: RNG seed for data order, init and sampling
  std::string log_level = "info";  ///< --log_level: console level on rank 0
  /// --log_dir: per-rank log files; "" = <save_path>/logs for the training commands, none for the
  /// others
  std::string log_dir;
  bool disable_progress = false;  ///< --disable_progress: no progress lines

  void bind(OptionSet& o);
};

/// The model to train: random init from a config, or a checkpoint. Exactly one must be given.
struct ModelArgs {
  std::string model_config;  ///< --model_config: JSON/TOML ModelConfig for random init
  /// --pretrain: the model to start from: an rlhf HDF5 checkpoint, a Hugging Face folder
  /// (safetensors), a llama2.c .bin or a GGUF file (io/pretrained.h)
  std::string pretrain;
  /// --tokenizer: tokenizer file or folder when the model carries none (llama2.c), or to override
  /// it; "" = the model's own (else the byte tokenizer)
  std::string tokenizer;

  void bind(OptionSet& o);
  /// Throws UsageError unless exactly one of model_config / pretrain is set.
  void validate() const;
};

/// A JSONL dataset and how samples are cut to length.
struct DatasetArgs {
  std::string dataset;                  ///< --dataset: path (required)
  int64_t max_len = 512;                ///< --max_len: max tokens per sample
  std::string truncation = "truncate";  ///< --truncation: "truncate" | "skip" longer samples
  int64_t max_samples = 100000000;      ///< --max_samples: use at most this many samples

  void bind(OptionSet& o);
};

/// Batch sizes and the length of training (OpenRLHF semantics: train_batch_size is global).
struct TrainLoopArgs {
  int64_t micro_train_batch_size = 8;  ///< --micro_train_batch_size: per rank, per forward
  int64_t train_batch_size = 128;      ///< --train_batch_size: global, per optimizer step
  int64_t max_epochs = 1;              ///< --max_epochs
  int64_t max_steps = -1;              ///< --max_steps: -1 = derived from max_epochs

  void bind(OptionSet& o);
};

/// AdamW and the learning-rate schedule.
struct OptimArgs {
  double learning_rate = 5e-6;                      ///< --learning_rate: peak LR
  std::string lr_scheduler = "cosine_with_min_lr";  ///< --lr_scheduler
  double lr_warmup_ratio = 0.03;                    ///< --lr_warmup_ratio: of total steps
  std::array<double, 2> adam_betas = {0.9, 0.95};   ///< --adam_betas: beta1 beta2
  double l2 = 0.0;                                  ///< --l2: AdamW weight decay
  double max_norm = 1.0;  ///< --max_norm: global grad-norm clip; 0 = no clipping

  void bind(OptionSet& o);
};

/// LoRA adapters (OpenRLHF flag names; PEFT's conventions, model/lora.h).
struct LoraArgs {
  int lora_rank = 0;                          ///< --lora_rank: 0 = train every weight
  double lora_alpha = 16.0;                   ///< --lora_alpha: the adapter scale is alpha / rank
  std::string target_modules = "all-linear";  ///< --target_modules: all-linear | q_proj,v_proj,...
  double lora_dropout = 0.0;  ///< --lora_dropout: on the branch's input, training only
  std::string lora_path;      ///< --lora_path: a PEFT adapter folder to start from ("" = fresh)

  void bind(OptionSet& o);
};

/// ZeRO-3 training strategy (DeepSpeed/OpenRLHF flag names).
struct ZeroArgs {
  int zero_stage = 3;                   ///< --zero_stage: 0 (replicated) or 3 (sharded)
  bool adam_offload = false;            ///< --adam_offload: Adam state + step on the host
  bool gradient_checkpointing = false;  ///< --gradient_checkpointing: recompute activations
  bool zero_keep_params = false;        ///< --zero_keep_params: keep forward's gathers for backward
  bool packing_samples = false;         ///< --packing_samples: micro-batches packed into one row

  void bind(OptionSet& o);
};

/// Process placement and threading.
struct ParallelArgs {
  int ranks_per_node = 0;      ///< --ranks_per_node: 0 = detect (env RLHF_RANKS_PER_NODE)
  int gen_ranks_per_node = 0;  ///< --gen_ranks_per_node: 0 = colocated (every rank does both)
  int threads = 0;             ///< --threads: OpenMP threads per rank; 0 = cores / ranks on node
  std::string comm_backend = "auto";  ///< --comm_backend: auto | mpi | shm (env RLHF_COMM_KIND)
  /// --device: where the models train: auto (cuda when a GPU is visible), cpu, cuda (env
  /// RLHF_DEVICE)
  std::string device = "auto";
  /// --comm_timeout: seconds one blocking collective or wait may take before the watchdog ends
  /// the job on every rank (0 = none); also the NCCL timeout unless --nccl_timeout is given
  double comm_timeout = 1800;
  /// --nccl_timeout: seconds a GPU collective may take before the NCCL watchdog ends the job
  /// (0 = none; -1 = --comm_timeout)
  double nccl_timeout = -1;
  /// --attn_implementation: auto (GPU: cudnn where it runs; CPU bf16: onednn where bf16 GEMMs
  /// beat fp32) | flash (this project's kernels) | cudnn (GPU fused SDPA) | onednn (CPU bf16
  /// attention products); parallel::use_attention_implementation, use_cpu_attention_implementation
  std::string attn_implementation = "auto";
  /// --param_dtype: the models' compute precision, bf16 | fp32 | auto (app/param_dtype.h)
  std::string param_dtype = "auto";
  bool bf16 = false;  ///< --bf16: OpenRLHF's switch, = --param_dtype bf16

  void bind(OptionSet& o);
};

/// Experiment tracking of the training commands (rl/tracking.h): TensorBoard event files and
/// Weights & Biases, next to <save_path>/metrics.jsonl.
struct TrackingArgs {
  std::string use_tensorboard;  ///< --use_tensorboard DIR: TensorBoard event files ("" = off)
  /// --use_wandb: "" = off; bare or "true" = on (the environment's W&B login); another value is
  /// an API key (OpenRLHF's --use_wandb {token})
  std::string use_wandb;
  std::string wandb_project = "rlhf";  ///< --wandb_project
  std::string wandb_group;             ///< --wandb_group
  std::string wandb_run_name;          ///< --wandb_run_name ("" = W&B's generated name)
  std::string wandb_org;               ///< --wandb_org: the W&B entity

  void bind(OptionSet& o);
};

/// Checkpointing and logging cadence.
struct CheckpointArgs {
  std::string save_path = "./ckpt";  ///< --save_path: checkpoint directory
  int64_t save_steps = -1;           ///< --save_steps: -1 = only at the end
  int64_t logging_steps = 1;         ///< --logging_steps: step line every N steps
  /// --ckpt_path: resumable training checkpoints (every --save_steps, and on SIGTERM/SIGUSR1)
  std::string ckpt_path = "./ckpt/checkpoints_sft";
  int64_t max_ckpt_num = 3;      ///< --max_ckpt_num: keep the last K
  bool load_checkpoint = false;  ///< --load_checkpoint: resume from the newest valid one
  /// --save_hf_ckpt: also a Hugging Face folder <ckpt_path>/step_N_hf next to each checkpoint
  bool save_hf_ckpt = false;
  /// --ckpt_format: single (one file from rank 0) | sharded (a file per training rank + index) |
  /// auto (the default: sharded with more than one training rank, else single)
  std::string ckpt_format = "auto";

  void bind(OptionSet& o);
};

// -------------------------------------------------------------------------------------------------
// Subcommands

/// `rlhf sft`: supervised fine-tuning / pre-training on JSONL.
struct SftArgs {
  CommonArgs common;
  ModelArgs model;
  DatasetArgs data;
  std::string input_key = "input";    ///< --input_key: JSON key of the prompt
  std::string output_key = "output";  ///< --output_key: JSON key of the response
  bool apply_chat_template = false;   ///< --apply_chat_template
  TrainLoopArgs loop;
  OptimArgs optim;
  ZeroArgs zero;
  LoraArgs lora;
  ParallelArgs parallel;
  CheckpointArgs ckpt;
  TrackingArgs tracking;

  void bind(OptionSet& o);
  /// Cross-option checks; also resolves common.log_dir "" to <save_path>/logs.
  void validate();
};

/// `rlhf rm`: reward-model training on preference pairs (Bradley–Terry).
struct RmArgs {
  CommonArgs common;
  ModelArgs model;
  std::string dataset;                    ///< --dataset: JSONL of preference pairs (required)
  std::string chosen_key = "chosen";      ///< --chosen_key
  std::string rejected_key = "rejected";  ///< --rejected_key
  std::string prompt_key;                 ///< --prompt_key: "" = chosen/rejected are full texts
  bool apply_chat_template = false;       ///< --apply_chat_template
  int64_t max_len = 512;                  ///< --max_len: tokens per side
  int64_t max_samples = 100000000;        ///< --max_samples
  TrainLoopArgs loop;
  OptimArgs optim;
  ZeroArgs zero;
  LoraArgs lora;  ///< LoRA on the trunk; the score head trains fully (PEFT's modules_to_save)
  ParallelArgs parallel;
  CheckpointArgs ckpt;
  TrackingArgs tracking;

  RmArgs() { ckpt.ckpt_path = "./ckpt/checkpoints_rm"; }
  void bind(OptionSet& o);
  void validate();
};

/// Generation engine and sampling options (OpenRLHF / vLLM names), shared by `generate`, `grpo`
/// and `ppo`. Continuous batching replaces a micro-batch size: every prompt is queued at once and
/// an engine decodes as many sequences together as --gen_kv_cache_mb and --gen_max_num_seqs allow.
struct GenerationArgs {
  int64_t generate_max_len = 1024;   ///< --generate_max_len: max new tokens per sample
  double temperature = 1.0;          ///< --temperature: 0 = greedy
  double top_p = 1.0;                ///< --top_p: nucleus sampling, 1 = off
  int64_t top_k = -1;                ///< --top_k: -1 = off
  bool greedy = false;               ///< --greedy: argmax decoding
  int64_t n_samples_per_prompt = 1;  ///< --n_samples_per_prompt: completions per prompt
  int64_t gen_kv_cache_mb = 1024;    ///< --gen_kv_cache_mb: KV cache budget per engine (MiB)
  /// --kv_cache_dtype (vLLM's name) of CPU engines: auto = fp16 | fp16 | fp32 (exact, twice the
  /// bytes); GPU engines keep bf16
  std::string kv_cache_dtype = "auto";
  /// --kv_block_size: positions per KV block (0 = 256 on the CPU, 16 on a GPU)
  int64_t kv_block_size = 0;
  int64_t gen_max_num_seqs = 256;     ///< --gen_max_num_seqs: most sequences decoded at once
  int vllm_tensor_parallel_size = 1;  ///< --vllm_tensor_parallel_size: ranks per engine
  /// --vllm_gpu_memory_utilization: share of a GPU's memory a GPU engine may hold (weights,
  /// buffers, KV cache), capped by what is free when it starts
  double vllm_gpu_memory_utilization = 0.95;
  bool enforce_eager = false;  ///< --enforce_eager: no CUDA graphs for GPU decode steps
  /// --env_command: multi-turn episodes with an environment program (JSON lines, one per
  /// engine, on its first rank) or builtin:toy; "" = single-turn
  std::string env_command;
  double env_timeout = 60;    ///< --env_timeout: seconds per batch of turn ends
  int64_t env_max_turns = 4;  ///< --env_max_turns: model turns per episode
  /// --stop_strings (alias --vllm_stop_strings): comma-separated; a turn (or, without
  /// --env_command, the sample) ends when one appears
  std::string stop_strings;

  void bind(OptionSet& o);
  /// Throws UsageError for bad --stop_strings; warns when --env_command without --stop_strings
  /// can only give one-turn episodes.
  void validate() const;
};

/// The rule rewards (`--reward` and its options), shared by `ppo`, `grpo` and `eval`.
struct RewardArgs {
  std::string reward;          ///< --reward: math|countdown|format|length|keyword|command|sum
  std::string reward_command;  ///< --reward_command: external scorer (JSON lines in/out)
  double reward_command_timeout = 60;  ///< --reward_command_timeout (s)
  std::string reward_format_pattern = R"(<think>[\s\S]*</think>\s*<answer>[\s\S]*</answer>)";
  std::string reward_keywords;        ///< --reward_keywords: comma-separated
  int64_t reward_length_target = 64;  ///< --reward_length_target (tokens)

  void bind(OptionSet& o);
  /// Throws UsageError for --reward math or countdown without --label_key.
  void validate(const std::string& label_key) const;
};

/// `rlhf ppo`: PPO with a critic (GAE), reference model, reward model or rule reward; the RL loop
/// of docs/design.md, "One RL step". Flag names and defaults follow OpenRLHF's train_ppo.
struct PpoArgs {
  CommonArgs common;
  ModelArgs model;              ///< --pretrain / --model_config: the initial policy
  std::string reward_pretrain;  ///< --reward_pretrain: reward model checkpoint
  std::string critic_pretrain;  ///< --critic_pretrain: "" = reward_pretrain, else pretrain
  // prompts
  std::string prompt_data;           ///< --prompt_data: JSONL (or builtin:<task>), required
  std::string input_key = "input";   ///< --input_key
  std::string label_key;             ///< --label_key: reference answer for rule rewards
  bool apply_chat_template = false;  ///< --apply_chat_template
  int64_t prompt_max_len = 1024;     ///< --prompt_max_len: longer prompts are skipped, counted
  int64_t max_samples = 100000000;   ///< --max_samples: prompts used
  // rewards
  RewardArgs rewards;             ///< --reward, --reward_command, ... (rule rewards)
  bool normalize_reward = false;  ///< --normalize_reward: running mean/std of the scores
  // batches
  int64_t rollout_batch_size = 1024;     ///< --rollout_batch_size: prompts per RL step
  int64_t micro_rollout_batch_size = 8;  ///< --micro_rollout_batch_size: per rank, forward-only
  int64_t train_batch_size = 128;        ///< --train_batch_size: samples per optimizer step
  int64_t micro_train_batch_size = 4;    ///< --micro_train_batch_size: per rank per fwd/bwd
  int64_t max_epochs = 1;                ///< --max_epochs: passes over each rollout
  int64_t num_episodes = 1;              ///< --num_episodes: passes over the prompts
  int64_t max_steps = -1;                ///< --max_steps: RL steps (-1 = from episodes)
  // algorithm
  std::string advantage_estimator = "gae";           ///< --advantage_estimator
  double gamma = 1.0, lambd = 1.0;                   ///< --gamma, --lambd (GAE)
  double init_kl_coef = 0.01;                        ///< --init_kl_coef: β
  std::string kl_estimator = "k1";                   ///< --kl_estimator: k1|k2|k3
  bool use_kl_loss = false;                          ///< --use_kl_loss: KL as a loss term (GRPO)
  double kl_target = 0;                              ///< --kl_target: adaptive KL (0 = fixed β)
  double kl_horizon = 10000;                         ///< --kl_horizon
  double eps_clip = 0.2;                             ///< --eps_clip
  std::array<double, 2> eps_clip_low_high = {0, 0};  ///< --eps_clip_low_high (0 0 = eps_clip)
  double dual_clip = 0;                              ///< --dual_clip: c > 1 enables (0 = off)
  double value_clip = 0.5;                           ///< --value_clip
  double entropy_loss_coef = 0;                      ///< --entropy_loss_coef
  int64_t freezing_actor_steps = -1;                 ///< --freezing_actor_steps
  double actor_learning_rate = 1e-6;                 ///< --actor_learning_rate
  double critic_learning_rate = 9e-6;                ///< --critic_learning_rate
  // reasoning-RL additions (docs/algorithms.md "Reasoning-RL additions")
  bool dynamic_filtering = false;  ///< --dynamic_filtering: DAPO dynamic sampling
  /// --dynamic_filtering_reward_range lo hi: a group is kept iff lo < mean score < hi
  std::array<double, 2> dynamic_filtering_reward_range = {0.0, 1.0};
  int64_t max_num_gen_batches = 4;           ///< --max_num_gen_batches: rounds per step (veRL)
  int64_t overlong_buffer_len = 0;           ///< --overlong_buffer_len: DAPO L_c (0 = off)
  double overlong_penalty_factor = 1.0;      ///< --overlong_penalty_factor: DAPO f
  std::string policy_loss_type = "ppo";      ///< --policy_loss_type: ppo | gspo
  std::string loss_agg_mode = "token-mean";  ///< --loss_agg_mode (veRL's names)
  bool no_advantage_std_norm = false;        ///< --no_advantage_std_norm: group_norm without std
  // off-policy correction (docs/algorithms.md "Off-policy correction")
  bool enable_vllm_is_correction = false;       ///< --enable_vllm_is_correction (OpenRLHF)
  std::string vllm_is_correction_type = "tis";  ///< --vllm_is_correction_type: tis|icepop|...
  std::array<double, 2> vllm_is_truncated_threshold = {0.5, 5.0};  ///< lo hi
  bool use_decoupled_loss = false;  ///< --use_decoupled_loss: decoupled PPO (AReaL's name)
  double behav_imp_weight_cap = 0;  ///< --behav_imp_weight_cap: > 1, or 0 = none (AReaL)
  // token-budget micro-batches (OpenRLHF's names)
  bool use_dynamic_batch = false;            ///< --use_dynamic_batch
  int64_t train_max_tokens_per_gpu = 16192;  ///< --train_max_tokens_per_gpu
  int64_t rollout_max_tokens_per_gpu = 0;    ///< --rollout_max_tokens_per_gpu (0 = train's)
  // evaluation and sample logging
  std::string eval_dataset;               ///< --eval_dataset: held-out prompts ("" = none)
  int64_t eval_steps = -1;                ///< --eval_steps: every N steps (-1 = at the end)
  double eval_temperature = 0.6;          ///< --eval_temperature
  int64_t eval_n_samples_per_prompt = 4;  ///< --eval_n_samples_per_prompt
  bool eval_before_training = false;      ///< --eval_before_training: also at step 0
  bool async_train = false;               ///< --async_train: generate ahead while training
  int64_t async_queue_size = 1;           ///< --async_queue_size: most steps a rollout waits
  bool partial_rollout = false;  ///< --partial_rollout: stop a step's generation at its quota
  int64_t max_staleness = 8;     ///< --max_staleness (AReaL: max_head_offpolicyness)
  /// --partial_rollout_kv keep | recompute: whether a carried sample continues from the KV its
  /// engine kept, or is prefilled again under the new weights
  std::string partial_rollout_kv = "keep";
  bool vllm_enable_sleep = false;  ///< --vllm_enable_sleep: colocated engines sleep while training
  int64_t log_completions = 0;     ///< --log_completions N: samples.jsonl every N steps (0 = off)
  OptimArgs optim;                 ///< schedule, betas, l2, max_norm (not learning_rate)
  GenerationArgs gen;
  int64_t sync_bucket_mb = 64;  ///< --sync_bucket_mb: weight-sync bucket size
  ZeroArgs zero;
  LoraArgs lora;
  ParallelArgs parallel;
  /// --save_path (final model), --save_steps, --logging_steps, --ckpt_path, --max_ckpt_num,
  /// --load_checkpoint
  CheckpointArgs ckpt;
  TrackingArgs tracking;  ///< --use_tensorboard, --use_wandb, --wandb_*
  /// --max_len: prompt + response tokens per sample (OpenRLHF's --data.max_len); 0 = off. Caps
  /// each sample's new tokens at max_len - prompt length, skips prompts with no room, and, when
  /// --generate_max_len is not given, lets max_len alone decide
  int64_t max_len = 0;
  /// --input_template: OpenRLHF's prompt template without --apply_chat_template, "{}" = the prompt
  /// (e.g. "User: {}\nAssistant: "); "" = the prompt as is
  std::string input_template;
  /// --colocate_all_models (OpenRLHF's): every rank trains and generates, rlhf's default; it
  /// cannot be combined with --gen_ranks_per_node > 0
  bool colocate_all_models = false;

  PpoArgs() { ckpt.ckpt_path = "./ckpt/checkpoints_ppo"; }
  void bind(OptionSet& o);
  void validate();
};

/// `rlhf grpo`: `rlhf ppo` with GRPO's presets — --advantage_estimator group_norm, --use_kl_loss,
/// --kl_estimator k3, --n_samples_per_prompt 8 (TRL's num_generations) — and checkpoints under
/// ./ckpt/checkpoints_grpo.
struct GrpoArgs : PpoArgs {
  GrpoArgs() {
    gen.n_samples_per_prompt = 8;
    advantage_estimator = "group_norm";
    use_kl_loss = true;
    kl_estimator = "k3";
    ckpt.ckpt_path = "./ckpt/checkpoints_grpo";
  }
};

/// `rlhf generate`: sample completions of JSONL prompts from a checkpoint (OpenRLHF flag names).
struct GenerateArgs {
  CommonArgs common;
  std::string pretrain;              ///< --pretrain: any format ModelArgs::pretrain takes
  std::string tokenizer;             ///< --tokenizer: as ModelArgs::tokenizer
  std::string dataset;               ///< --dataset: prompts, JSONL (required)
  std::string input_key = "input";   ///< --input_key: JSON key of the prompt (text or messages)
  bool apply_chat_template = false;  ///< --apply_chat_template
  std::string output_path;           ///< --output_path: completions, JSONL (required)
  int64_t max_samples = 100000000;   ///< --max_samples: use at most this many prompts
  GenerationArgs gen;
  ParallelArgs parallel;  ///< --threads, --ranks_per_node, --gen_ranks_per_node

  void bind(OptionSet& o);
  void validate();
};

/// `rlhf eval`: sample completions of held-out prompts from a checkpoint, score them with a rule
/// reward (the answer checking of training) and report accuracy and pass@k. Generation flags and
/// placement as `rlhf generate`; prompt flags as `rlhf ppo`'s.
struct EvalArgs {
  CommonArgs common;
  std::string pretrain;             ///< --pretrain: any format ModelArgs::pretrain takes (required)
  std::string tokenizer;            ///< --tokenizer: as ModelArgs::tokenizer
  std::string dataset;              ///< --dataset: prompts, JSONL or builtin:<task> (required)
  std::string input_key = "input";  ///< --input_key
  std::string label_key;            ///< --label_key: the reference answer
  bool apply_chat_template = false;  ///< --apply_chat_template
  std::string input_template;        ///< --input_template: as PpoArgs::input_template
  int64_t prompt_max_len = 1024;     ///< --prompt_max_len: longer prompts are skipped, counted
  int64_t max_samples = 100000000;   ///< --max_samples: use at most this many prompts
  RewardArgs rewards;                ///< --reward (required) and its options
  std::string output_path;           ///< --output_path: per-sample JSONL + summary (required)
  GenerationArgs gen;
  ParallelArgs parallel;  ///< --threads, --ranks_per_node, --gen_ranks_per_node

  void bind(OptionSet& o);
  void validate();
};

/// `rlhf score`: teacher-forced log-probabilities of given responses (NLL per response token), or
/// the perplexity of a plain text, under a model. No sampling.
struct ScoreArgs {
  CommonArgs common;
  std::string pretrain;             ///< --pretrain: any format ModelArgs::pretrain takes (required)
  std::string tokenizer;            ///< --tokenizer: as ModelArgs::tokenizer
  std::string dataset;              ///< --dataset: JSONL records, or a plain-text file (required)
  std::string input_key = "input";  ///< --input_key: the prompt (string or chat messages)
  std::string output_key = "output";  ///< --output_key: the response to score
  bool apply_chat_template = false;   ///< --apply_chat_template: render the prompt with it
  int64_t max_len = 0;  ///< --max_len: tokens per sequence / window (0 = the model's context)
  int64_t stride = 0;   ///< --stride: plain text, tokens between windows (0 = max_len / 2)
  int64_t max_samples = 100000000;  ///< --max_samples: score at most this many records
  std::string output_path;  ///< --output_path: JSONL, a line per record + summary (required)
  ParallelArgs parallel;    ///< --threads, --ranks_per_node

  void bind(OptionSet& o);
  void validate();
};

/// `rlhf export`: any supported model → a Hugging Face folder (safetensors), our HDF5 checkpoint,
/// or a GGUF file.
struct ExportArgs {
  CommonArgs common;
  std::string pretrain;   ///< --pretrain: the model to export (any format --pretrain reads)
  std::string tokenizer;  ///< --tokenizer: tokenizer to ship with it ("" = the model's own)
  std::string format = "safetensors";  ///< --format: safetensors (alias hf) | hdf5 | gguf | peft
  std::string output_path;             ///< --output_path: folder (safetensors) or file
  std::string dtype = "float32";       ///< --dtype: float32 | bfloat16 | float16 (tensors written)
  std::string lora_path;               ///< --lora_path: a PEFT adapter to merge (with --merge_lora)
  bool merge_lora = false;             ///< --merge_lora: write base + adapter merged
  /// --max_shard_size: largest safetensors file ("5GB", transformers' default); bigger models are
  /// sharded as transformers shards them
  std::string max_shard_size = "5GB";
  void bind(OptionSet& o);
  /// Throws UsageError for a dtype the format cannot store (GGUF/HDF5 restrictions) or a
  /// --max_shard_size that is not a size.
  void validate();
};
/// `rlhf import`: any supported model → our HDF5 checkpoint (with its tokenizer).
struct ImportArgs {
  CommonArgs common;
  std::string pretrain;     ///< --pretrain: the model to import
  std::string tokenizer;    ///< --tokenizer: tokenizer to store ("" = the model's own)
  std::string output_path;  ///< --output_path: the .h5 file to write
  void bind(OptionSet& o);
  void validate() {}
};
/// `rlhf bench [suite...]`: benchmarks, JSON lines on stdout (rank 0) and a table in the log.
struct BenchArgs {
  CommonArgs common;
  std::vector<std::string>
      suites;                ///< positional: train|generate|comm|sync|gemm|rl|packing|partial|all
  std::string model_config;  ///< --model_config: "" = the stories15M shape
  int64_t tokens_per_step = 4096;       ///< --tokens_per_step: tokens per optimizer step (global)
  int64_t seq_len = 256;                ///< --seq_len: sequence length of the training benchmark
  int64_t micro_train_batch_size = 0;   ///< --micro_train_batch_size: 0 = whole step in one pass
  int64_t steps = 3;                    ///< --steps: timed steps
  int64_t warmup = 1;                   ///< --warmup: untimed steps first
  ZeroArgs zero;                        ///< --zero_stage, --adam_offload, --gradient_checkpointing
  ParallelArgs parallel;                ///< --threads, --ranks_per_node, ...
  std::string output;                   ///< --output: also append the JSON lines to this file
  int64_t min_bytes = 1024;             ///< --min_bytes: comm, smallest size (nccl-tests -b)
  int64_t max_bytes = 256ll << 20;      ///< --max_bytes: comm, largest size (-e)
  int64_t step_factor = 4;              ///< --step_factor: comm, size multiplier (-f)
  int64_t iters = 20;                   ///< --iters: comm, timed calls per size (-n)
  std::string kv_cache_dtype = "auto";  ///< --kv_cache_dtype: generate, the engine's KV cache
  int64_t kv_block_size = 0;  ///< --kv_block_size: generate, positions per KV block (0 = 256)
  std::string pretrain;       ///< --pretrain: generate, a real model instead of random weights
  std::string gen_batches = "1,8,64";  ///< --gen_batches: generate, the fixed runs' batch sizes
  int64_t gen_long_requests = 256;     ///< --gen_long_requests: generate, ragged run (0 = skip)
  int64_t gen_long_fixed_batch = 8;    ///< --gen_long_fixed_batch: generate, long run (0 = skip)
  int64_t rl_new_tokens = 128;         ///< --generate_max_len: rl, new tokens per sample
  int64_t rl_prompts = 8;              ///< --rollout_batch_size: rl, prompts per step
  int64_t rl_samples_per_prompt = 8;   ///< --n_samples_per_prompt: rl, completions per prompt
  int64_t rl_steps = 10;               ///< --max_steps: rl, GRPO steps
  int64_t packing_bench_samples = 32;  ///< --packing_bench_samples: packing, the global batch
  /// --packing_bench_lengths: packing, lo hi of the uniform sample lengths (tokens)
  std::array<double, 2> packing_bench_len = {64, 1024};
  void bind(OptionSet& o);
  void validate();
};

/// The arguments of the selected subcommand; the alternative's index is the subcommand's position
/// in kCommandNames.
using CommandArgs = std::variant<SftArgs, RmArgs, GrpoArgs, PpoArgs, GenerateArgs, EvalArgs,
                                 ScoreArgs, ExportArgs, ImportArgs, BenchArgs>;

/// Subcommand names, in CommandArgs order.
inline constexpr std::array<const char*, 10> kCommandNames = {
    "sft", "rm", "grpo", "ppo", "generate", "eval", "score", "export", "import", "bench"};

/// One row of the resolved configuration: option key, its value as text, and where it came from.
struct ConfigRow {
  std::string key;
  std::string value;
  OptionSource source;
};

/// The outcome of parsing argv.
struct ParsedCommand {
  enum class Action {
    kRun,           ///< run `command` with `args`
    kPrintHelp,     ///< print `text` (the help of the program or a subcommand) and exit 0
    kPrintVersion,  ///< print `text` and exit 0
  };
  Action action = Action::kRun;
  std::string text;               ///< help/version text for kPrintHelp/kPrintVersion
  std::string command;            ///< "sft", "rm", ... (kRun)
  CommandArgs args;               ///< filled and validated (kRun)
  std::vector<ConfigRow> config;  ///< every option of `command`, in registration order (kRun)
  /// Warnings for the log once it is set up: the ignored options given, and why (kRun)
  std::vector<std::string> notices;

  /// The CommonArgs of whichever command was parsed.
  const CommonArgs& common() const;
};

/// Parses a full argv (argv[0] is the program name) into the selected subcommand's struct:
/// command line, then the `--config` TOML file for options not given as flags, then environment
/// variables, then checks. Pure apart from reading the config file and the environment; no MPI.
/// Throws UsageError with a one-line (plus optional "hint:" line) message that names the flag, or
/// the file:line:column and key, at fault.
ParsedCommand parse_args(const std::vector<std::string>& argv);

/// The version line printed by `rlhf --version`.
std::string version_string();

/// Prints the resolved configuration of `cmd` as a two-column table on rank 0 (info).
void print_resolved_config(const ParsedCommand& cmd);

/// Renders an option value as text ("true", "5e-06", "0.9 0.95", "ckpt").
std::string to_string(const OptionValue& v);

}  // namespace rlhf::app

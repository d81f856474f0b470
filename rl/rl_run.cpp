#include "rl/rl_run.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "io/metrics.h"
#include "io/model_source.h"
#include "optim/schedule.h"
#include "parallel/lora_store.h"
#include "parallel/preemption.h"
#include "parallel/weight_sync.h"
#include "rl/checkpoint.h"
#include "rl/evaluate.h"
#include "rl/weights.h"

#ifdef RLHF_CUDA
#include "parallel/zero3_cuda.h"
#endif

namespace rlhf::rl {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The start-up log's memory plan of every engine rank (collective over `world`): one line per
// run of consecutive ranks with the same plan, in the memory each engine computes in.
void log_engine_memory(const rollout::Engine* engine, parallel::Comm& world, bool sleep) {
  constexpr int kFields = 7;
  const int R = world.size(), me = world.rank();
  std::vector<int64_t> mine(size_t(R * kFields), 0), all(mine.size(), 0);
  if (engine != nullptr) {
    const rollout::Engine::MemoryPlan p = engine->memory_plan();
    const int64_t v[kFields] = {1,
                                p.host_weights,
                                p.backend.weights,
                                p.backend.kv_cache,
                                p.backend.buffers,
                                p.backend.sleep_frees,
                                p.backend.device ? 1 : 0};
    std::copy(v, v + kFields, mine.begin() + me * kFields);
  }
  world.all_reduce(mine.data(), all.data(), int64_t(all.size()));
  if (me != 0) return;
  auto plan_of = [&](int r) {
    const int64_t* v = all.data() + r * kFields;
    rollout::Engine::MemoryPlan p;
    p.host_weights = v[1];
    p.backend = {v[6] != 0, v[2], v[3], v[4], v[5]};
    return rollout::Engine::describe(p, sleep);
  };
  for (int r = 0; r < R;) {
    if (all[size_t(r * kFields)] == 0) {
      ++r;
      continue;
    }
    const std::string line = plan_of(r);
    int end = r + 1;
    while (end < R && all[size_t(end * kFields)] != 0 && plan_of(end) == line) ++end;
    LOG_INFO("engine memory plan, rank{} {}: {}", end - r > 1 ? "s" : "",
             end - r > 1 ? fmt::format("{}-{}", r, end - 1) : fmt::to_string(r), line);
    r = end;
  }
}

// The models of a run (training ranks only).
struct Models {
  std::unique_ptr<parallel::TrainModel> actor, ref, critic, reward;
};

Models build_models(const RlRunConfig& c, parallel::TrainRuntime& rt, const io::ModelSource& src,
                    const model::ParamLayout& layout, bool with_ref, bool with_critic) {
  const uint64_t seed = uint64_t(c.seed);
  Models m;
  m.actor = parallel::make_train_model(layout, rt, c.zero);
  initialize_weights(m.actor->store(), src, seed);
  if (with_ref && m.actor->has_adapters()) {
    // LoRA: the reference policy is the actor's own base weights, adapters off — no copy.
    m.ref = parallel::adapters_off_view(*m.actor);
  } else if (with_ref) {
    m.ref = parallel::make_train_model(layout, rt, c.zero, /*frozen=*/true);
    initialize_weights(m.ref->store(), src, seed);
  }
  if (!c.reward_pretrain.empty()) {
    const io::ModelSource rsrc =
        io::resolve_model_source("", c.reward_pretrain, "", model::HeadKind::kReward);
    RLHF_CHECK(!rsrc.checkpoint.empty(), "--reward_pretrain {} is not a checkpoint",
               c.reward_pretrain);
    const model::ParamLayout rl(rsrc.config, model::HeadKind::kReward);
    m.reward = parallel::make_train_model(rl, rt, c.zero, /*frozen=*/true);
    initialize_weights(m.reward->store(), rsrc, seed);
  }
  if (with_critic) {
    // OpenRLHF: the critic starts from --critic_pretrain, else the reward model, else the policy.
    const std::string pre = !c.critic_pretrain.empty()   ? c.critic_pretrain
                            : !c.reward_pretrain.empty() ? c.reward_pretrain
                                                         : c.pretrain;
    const io::ModelSource csrc = io::resolve_model_source(pre.empty() ? c.model_config : "", pre,
                                                          "", model::HeadKind::kValue);
    const model::ParamLayout cl(csrc.config, model::HeadKind::kValue);
    // OpenRLHF applies the LoRA flags to the critic too: its trunk gets fresh adapters and its
    // value head trains fully (PEFT's modules_to_save); --lora_path is the actor's adapter.
    parallel::ZeroOptions cz = c.zero;
    cz.lora.path.clear();
    m.critic = parallel::make_train_model(cl, rt, cz);
    initialize_weights(m.critic->store(), csrc, seed + 1);
  }
  return m;
}

// The step counts of a run: checks that a step's samples split into optimizer steps and
// micro-batches over the training ranks. Returns {total steps, steps per episode}.
std::pair<int64_t, int64_t> step_arithmetic(const RlRunConfig& c, int64_t n_prompts, int n_train) {
  const int64_t RB = c.step.rollout_batch_size, n = c.step.n_samples_per_prompt;
  // Token-budget micro-batches (--use_dynamic_batch) need only whole samples per rank.
  const int64_t MB = c.ppo.dynamic_batch ? 1 : c.ppo.micro_train_batch_size;
  const int64_t TB = c.ppo.train_batch_size;
  RLHF_CHECK(RB <= n_prompts, "--rollout_batch_size {} is larger than the {} usable prompts of {}",
             RB, n_prompts, c.prompts.prompt_data);
  RLHF_CHECK((RB * n) % (int64_t(n_train) * MB) == 0 && TB % (int64_t(n_train) * MB) == 0,
             "--train_batch_size {} and the {} samples of a step must split into "
             "--micro_train_batch_size {} x {} training ranks",
             TB, RB * n, MB, n_train);
  RLHF_CHECK((RB * n) % n_train == 0,
             "the {} samples of a step do not split over {} training ranks", RB * n, n_train);
  const int64_t per_episode = n_prompts / RB;
  // --max_steps, when given, is the step count: more than the episodes hold cycles the prompts
  // again (a new permutation per pass), fewer stops early.
  const int64_t total = c.max_steps > 0 ? c.max_steps : per_episode * c.num_episodes;
  return {total, per_episode};
}

// --load_checkpoint on a training rank: the weights and moments of the newest valid checkpoint
// into the slots' stores; returns its RL state (null when there is none). Collective over the
// training ranks.
nlohmann::json resume(const RlRunConfig& c, const std::vector<CheckpointSlot>& slots,
                      const nlohmann::json& settings) {
  const std::string path = latest_valid_checkpoint(c.ckpt_path);
  if (path.empty()) {
    LOG0_WARN("--load_checkpoint: no checkpoint in {}; starting from step 0", c.ckpt_path);
    return nullptr;
  }
  nlohmann::json st = load_train_checkpoint(path, slots);
  RLHF_CHECK(st.value("seed", int64_t(-1)) == c.seed,
             "{} was made with --seed {}, this run has --seed {}", path,
             st.value("seed", int64_t(-1)), c.seed);
  LOG0_INFO("resumed from {} at step {}", path, st.at("step").get<int64_t>());
  warn_changed_settings(path, st, settings);
  return st;
}

// The settings a checkpoint records and a resumed run compares (changed_settings).
nlohmann::json run_settings(const RlRunConfig& c, int64_t total_steps) {
  return {{"prompt_data", c.prompts.prompt_data},
          {"rollout_batch_size", c.step.rollout_batch_size},
          {"n_samples_per_prompt", c.step.n_samples_per_prompt},
          {"train_batch_size", c.ppo.train_batch_size},
          {"micro_train_batch_size", c.ppo.micro_train_batch_size},
          {"max_epochs", c.ppo.max_epochs},
          {"total_steps", total_steps},
          {"actor_learning_rate", c.actor_adam.lr},
          {"critic_learning_rate", c.critic_adam.lr},
          {"dynamic_filtering", c.step.dynamic_filtering},
          {"async_train", c.step.async_train},
          {"async_queue_size", c.step.async_train ? c.step.async_queue_size : 0},
          {"generate_max_len", c.step.generate_max_len}};
}

// The held-out prompts and how they are evaluated (eval_dataset set).
struct Eval {
  std::vector<Prompt> prompts;
  EvalOptions options;
};

Eval load_eval(const RlRunConfig& c, const io::Tokenizer& tok, const model::ModelConfig& cfg,
               int world_rank) {
  Eval e;
  PromptOptions po = c.prompts;
  po.prompt_data = c.eval_dataset;
  e.prompts = load_prompts(po, tok, cfg, world_rank);
  e.options.n_samples_per_prompt = c.eval_n_samples_per_prompt;
  e.options.generate_max_len = c.step.generate_max_len;
  e.options.sampling = c.step.sampling;
  e.options.sampling.temperature = c.eval_temperature;
  e.options.sampling.greedy = c.eval_temperature == 0;
  return e;
}

// A number of a metrics record: rlhf::Error naming the key when it is missing or not a number
// (every step's record has the same keys: rl/train_record.h).
double num(const nlohmann::json& r, const char* key) {
  const auto it = r.find(key);
  RLHF_CHECK(it != r.end() && it->is_number(), "the metrics record has no number '{}': {}", key,
             r.dump());
  return it->get<double>();
}

// The step line on rank 0.
void log_step(const nlohmann::json& r, int64_t total_steps) {
  const double elapsed = num(r, "elapsed_s");
  const int64_t step = int64_t(num(r, "step"));
  // Multi-turn runs: the environment's phase (inside gen) and the episodes' turns.
  const std::string env = r.contains("env_s")
                              ? fmt::format(" | env {:.2f}s, {:.2f} turns, {} obs tokens",
                                            num(r, "env_s"), r.value("env_turns_mean", 0.0),
                                            r.value("env_observation_tokens", int64_t(0)))
                              : std::string();
  LOG0_INFO(
      "step {}/{} | reward {:.3f} | kl {:.4f} | loss {:.4f} | len {:.1f} | mismatch kl {:.2e} "
      "(IS w {:.3f}, masked {:.3f}) | gen {:.2f}s (comm {:.2f}s){} | reward {:.2f}s | logprob "
      "{:.2f}s (comm {:.2f}s) | train {:.2f}s (comm {:.2f}s) | sync {:.2f}s {} {} busbw {:.2f} "
      "GB/s | "
      "{:.0f} gen tok/s | {:.0f} train tok/s | {:.1f}s/step | elapsed {:.0f}s | eta {:.0f}s | "
      "peak RSS {}",
      step, total_steps, num(r, "reward_mean"), num(r, "kl_mean"), num(r, "policy_loss"),
      num(r, "response_length_mean"), num(r, "mismatch_kl"), num(r, "is_weight_mean"),
      num(r, "is_masked_fraction"), num(r, "gen_s"), num(r, "gen_comm_s"), env, num(r, "reward_s"),
      num(r, "logprob_s"), num(r, "logprob_comm_s"), num(r, "train_s"), num(r, "train_comm_s"),
      num(r, "sync_s"), format_bytes(num(r, "sync_bytes")), r.value("sync_path", std::string()),
      num(r, "sync_busbw_GBps"), num(r, "gen_tokens_per_s"), num(r, "train_tokens_per_s"),
      num(r, "step_s"), elapsed, elapsed / double(step) * double(total_steps - step),
      format_bytes(num(r, "peak_rss_bytes")));
  if (r.contains("eval_accuracy"))
    LOG0_INFO("eval after step {} | reward {:.3f} | accuracy {:.3f} | len {:.1f} | {:.1f}s", step,
              num(r, "eval_reward_mean"), num(r, "eval_accuracy"),
              num(r, "eval_response_length_mean"), num(r, "eval_seconds"));
}

// The start-up line of --partial_rollout: the quota, how carried samples continue (the KV their
// engine kept, or prefilled again), the staleness bound. sleep: colocated engines sleep.
std::string describe_partial_rollouts(const RlRunConfig& c, bool sleep) {
  const char* how =
      !c.engine.keep_interrupted_kv
          ? "are prefilled again under the new weights (--partial_rollout_kv recompute)"
      : sleep ? "are prefilled again: --vllm_enable_sleep frees the KV their engine kept"
              : "continue from the KV blocks their engine kept (prefilled again after a "
                "checkpoint)";
  return fmt::format(
      "partial rollouts: a step stops once {} groups finished; carried samples {} | "
      "--max_staleness {}",
      c.step.rollout_batch_size, how, c.step.max_staleness);
}

// One PPO/GRPO run on this rank (run_rl). The constructor builds it phase by phase, in the order
// the fields are declared: the runtime and world; the models, engine and weight sync; the prompts,
// rewards and trainer; the step with its weight sync; the resume, the start-up log and the
// metrics files. run() then trains to the end. Every phase is collective over the world in the
// same order on every rank. The fields are destroyed in reverse order of declaration (the metrics
// and the step before the tracker, trainer, engine and communicators they use).
struct RlRun {
  const RlRunConfig& c;
  parallel::TrainRuntime rt;
  const parallel::Topology& topo;
  const parallel::Placement& pl;
  const int n_train, world_rank;
  const int train_root;  // world rank of train rank 0
  const bool trains;
  const Clock::time_point t_start;
  std::unique_ptr<parallel::Comm> world;
  // --- models (build_models_and_engine)
  io::ModelSource src;
  std::shared_ptr<const io::Tokenizer> tokenizer;  // the model's own, else bytes
  std::optional<model::ParamLayout> layout;
  bool with_critic = false, with_ref = false;
  Models m;
  std::unique_ptr<parallel::Comm> tp_comm;
  std::unique_ptr<rollout::Engine> engine;
  std::unique_ptr<Environment> env;
  EpisodeOptions episodes;
  std::optional<parallel::WeightSync> sync;
  // --- prompts, step arithmetic, optimizers, rewards, trainer (build_prompts_and_trainer)
  std::optional<PromptSource> prompts;
  int64_t total_steps = 0, steps_per_episode = 0;
  int64_t RB = 0, n = 0;
  int64_t opt_steps_per_rl = 0;
  PpoOptimizers po;
  std::unique_ptr<RewardFn> reward;
  Eval eval;
  std::unique_ptr<PpoTrainer> trainer;
  // --- the step and its weight sync (build_step)
  RlStepParts parts;
  std::unique_ptr<io::MetricsWriter> samples_log;
  std::unique_ptr<RunTracker> tracker;  // rank 0, with --use_tensorboard / --use_wandb
  bool lora = false, device_sync = false, base_synced = false;
  int64_t lora_numel = 0;
  RlStepOptions so;
  std::optional<RlStep> step;
  // --- resume, start-up log, metrics files (resume_and_announce)
  std::vector<CheckpointSlot> slots;
  nlohmann::json settings;
  int64_t start_step = 0;
  std::unique_ptr<io::MetricsWriter> metrics;

  /// Sets the run up on this rank, every phase up to the first step (collective over the world).
  /// Throws rlhf::Error naming the flag, file or key at fault (--async_train on colocated ranks,
  /// batch sizes that do not split, a missing prompt file, a checkpoint of another seed, ...).
  explicit RlRun(const RlRunConfig& config);
  RlRun(const RlRun&) = delete;
  RlRun& operator=(const RlRun&) = delete;

  /// Trains to the end: the initial weight sync, the evaluation before training if asked, every
  /// step (end_step), then finish(). Returns 0, or parallel::kExitPreempted when a preemption
  /// signal stopped the run after a checkpoint. Throws rlhf::Error from any step.
  int run();

  /// The model source, tokenizer and layout, the models (training ranks), the tensor-parallel
  /// group, the engine and its environment (generation ranks) and the weight sync. Collective
  /// over the world. Throws rlhf::Error for a model, checkpoint or environment that cannot load.
  void build_models_and_engine();
  /// The prompts, the step counts, the optimizers' schedules, the rule reward, the held-out
  /// prompts and the trainer (training ranks). Throws rlhf::Error for batch sizes that do not
  /// split, missing prompts, or --eval_dataset without --reward.
  void build_prompts_and_trainer();
  /// The step's parts, the choice of weight-sync path (warns when GPU engines fall back to the
  /// host), the step options and the RlStep. Throws rlhf::Error for a bad env RLHF_WEIGHT_SYNC.
  void build_step();
  /// --load_checkpoint, the start-up log (engine memory plans: collective over the world) and,
  /// on rank 0, the metrics and sample logs and the tracker. Throws rlhf::Error for a checkpoint
  /// that does not fit this run.
  void resume_and_announce();
  /// The start-up log lines on rank 0 (model, LoRA, ranks and steps, partial rollouts) and the
  /// memory plans (collective over the training ranks, then over the world). Throws rlhf::Error
  /// only from a failed collective.
  void log_start() const;
  /// Rank 0: trims metrics.jsonl and samples.jsonl to the resumed step (or drops an old
  /// samples.jsonl), opens metrics.jsonl and the tracker. Throws rlhf::Error when they cannot open.
  void open_metrics();

  /// The trainer's weights into every engine (parts.sync_weights): device to device, LoRA's base
  /// once then its adapters, or through the engines' host buffers. Collective over the world.
  /// Throws rlhf::Error when a transfer fails.
  parallel::SyncStats sync_weights();
  /// The trained samples of a step into samples.jsonl and the tracker (parts.log_samples; train
  /// rank 0). Throws rlhf::Error when samples.jsonl cannot be written.
  void log_samples(const StepSamples& s);
  /// Evaluates the policy on the held-out prompts (collective over the world); the metrics
  /// record's eval_ fields. Throws rlhf::Error from the generation or the reward.
  nlohmann::json evaluate_now();
  /// --eval_before_training on a fresh run: evaluates step 0, logs it and writes its record (rank
  /// 0). Throws as evaluate_now, and rlhf::Error when the record cannot be written.
  void evaluate_before_training();
  /// The end of a step: its evaluation when due, the step line and metrics record (rank 0), the
  /// preemption agreement (collective over the world), a checkpoint when due. Returns the exit
  /// status when a preemption signal stops the run here, else nullopt. Throws as evaluate_now,
  /// and rlhf::Error when the record or the checkpoint cannot be written.
  std::optional<int> end_step(nlohmann::json rec);
  /// The training checkpoint after step `done` (training ranks; collective over them). Throws
  /// rlhf::Error when it cannot be written.
  void save_checkpoint(int64_t done);
  /// Saves the final policy (training ranks) with the done line, then a world barrier. Throws
  /// rlhf::Error when model.h5 cannot be written.
  void finish();
};

RlRun::RlRun(const RlRunConfig& config)
    : c(config),
      rt(parallel::setup_train_runtime(c.runtime, true)),
      topo(*rt.topology),
      pl(topo.placement()),
      n_train(int(pl.train_ranks.size())),
      world_rank(topo.rank()),
      train_root(pl.train_ranks.front()),
      trains(topo.trains()),
      t_start(Clock::now()),
      world(parallel::make_comm(topo.world(), "world")) {
  // Async training overlaps generation ranks with training ranks: they must be different ranks.
  RLHF_CHECK(!c.step.async_train || !pl.colocated(),
             "--async_train needs generation ranks apart from the training ranks: colocated, "
             "every rank both generates and trains, so there is nothing to overlap\nhint: add "
             "--gen_ranks_per_node 1 (or more)");
  build_models_and_engine();
  build_prompts_and_trainer();
  build_step();
  resume_and_announce();
}

void RlRun::build_models_and_engine() {
  src = io::resolve_model_source(c.model_config, c.pretrain, c.tokenizer, model::HeadKind::kLM);
  tokenizer = io::model_tokenizer(src);
  layout.emplace(src.config, model::HeadKind::kLM);
  with_critic = uses_critic(c.ppo.estimator);
  with_ref = c.ppo.init_kl_coef > 0;
  if (trains) m = build_models(c, rt, src, *layout, with_ref, with_critic);
  // Tensor-parallel engines: the engine's group (collective over engine_comm; TP 1: none).
  tp_comm = c.runtime.tensor_parallel > 1 ? parallel::make_comm(topo.engine_comm(), "engine_comm")
                                          : nullptr;
  if (topo.generates()) {
    rollout::EngineOptions eo = c.engine;
    eo.cuda = rt.device == parallel::Device::kCuda;
    eo.tp_comm = tp_comm.get();
    eo.eos_token_id = tokenizer->eos_id();
    eo.unit_room = parallel::WeightSync::engine_unit_room(*layout, n_train);
    engine = std::make_unique<rollout::Engine>(*layout, eo);
    if (c.zero.lora.enabled()) engine->set_lora(c.zero.lora);
  }
  // Multi-turn episodes: one environment per engine (a program started now on its TP rank 0).
  if (topo.generates() && !c.env_command.empty())
    env = make_environment(c.env_command, c.env_timeout, engine->tp_rank());
  episodes.env = env.get();
  episodes.stop_strings = parse_stop_strings(c.stop_strings);
  episodes.max_turns = c.env_max_turns;
  // bf16 trainer and bf16 CPU engines (--param_dtype bf16): the sync moves bf16 (half the bytes).
  sync.emplace(topo, rt.train_comm.get(), *layout, c.sync_bucket_mb * (int64_t(1) << 20),
               rt.bf16 && c.engine.bf16);
}

void RlRun::build_prompts_and_trainer() {
  prompts.emplace(load_prompts(c.prompts, *tokenizer, src.config, world_rank), uint64_t(c.seed));
  std::tie(total_steps, steps_per_episode) = step_arithmetic(c, prompts->size(), n_train);
  RB = c.step.rollout_batch_size;
  n = c.step.n_samples_per_prompt;
  opt_steps_per_rl = c.ppo.max_epochs * (RB * n / c.ppo.train_batch_size);
  po.actor_adam = c.actor_adam;
  po.critic_adam = c.critic_adam;
  po.actor_schedule = optim::LrSchedule::openrlhf(
      c.lr_scheduler, c.actor_adam.lr, total_steps * opt_steps_per_rl, c.lr_warmup_ratio);
  po.critic_schedule = optim::LrSchedule::openrlhf(
      c.lr_scheduler, c.critic_adam.lr, total_steps * opt_steps_per_rl, c.lr_warmup_ratio);
  reward = c.reward.empty() ? nullptr : make_reward(c.reward, c.reward_options);
  RLHF_CHECK(c.eval_dataset.empty() || reward != nullptr,
             "--eval_dataset {} needs a rule reward to score the answers\nhint: set --reward "
             "(e.g. math) and --label_key",
             c.eval_dataset);
  if (!c.eval_dataset.empty()) eval = load_eval(c, *tokenizer, src.config, world_rank);
  eval.options.episodes = episodes;
  if (trains) {
    PpoOptions o = c.ppo;
    o.pad_id = tokenizer->pad_id();
    o.seed = uint64_t(c.seed);
    o.pad_multiple = parallel::training_pad_multiple(rt.device);
    trainer = std::make_unique<PpoTrainer>(
        PpoModels{m.actor.get(), m.ref.get(), m.critic.get(), m.reward.get()}, o, po,
        *rt.train_comm);
  }
}

void RlRun::build_step() {
  parts.topology = &topo;
  parts.world = world.get();
  parts.trainer = trainer.get();
  parts.train_comm = rt.train_comm.get();
  parts.engine = engine.get();
  parts.reward = reward.get();
  parts.prompts = &*prompts;
  parts.tokenizer = tokenizer.get();
  parts.episodes = episodes;
  parts.log_samples = [this](const StepSamples& s) { log_samples(s); };
  // GPU ranks sync device to device: colocated, NCCL gathers of the bf16 shards straight into the
  // engines' device weights; disaggregated, the training ranks' gather plus a node-local NCCL
  // broadcast into the engine ranks' device weights (when every node with engines has a training
  // rank). Every other placement goes through the engines' host buffers, and so does LoRA on the
  // GPU (the frozen base once into the host buffers, then the adapters, which the GPU engine
  // merges into its device weights at each generate).
  const bool cuda = rt.device == parallel::Device::kCuda;
  lora = c.zero.lora.enabled();
  // Env RLHF_WEIGHT_SYNC=host (tests, debugging): GPU engines take the host path anyway.
  const char* path_env = std::getenv("RLHF_WEIGHT_SYNC");
  const std::string sync_path = path_env ? path_env : "";
  RLHF_CHECK(sync_path.empty() || sync_path == "auto" || sync_path == "host",
             "env RLHF_WEIGHT_SYNC={}: expected auto or host", sync_path);
  device_sync =
      cuda && sync_path != "host" && !lora && (pl.colocated() || sync->device_sync_node_local());
  if (cuda && !lora && sync_path != "host" && !device_sync)
    LOG0_WARN(
        "weight sync: a node holds generation ranks but no training rank; its GPU engines take "
        "the host path (fp32 over MPI, then an upload)");
  lora_numel = lora ? model::LoraLayout(model::layer_spec(layout->config()),
                                        int(layout->config().num_hidden_layers), c.zero.lora)
                          .numel()
                    : 0;
  parts.sync_weights = [this]() { return sync_weights(); };
  so = c.step;
  so.total_steps = total_steps;
  // OpenRLHF turns --vllm_enable_sleep off (with a message) when the engines are not colocated:
  // an engine on its own ranks has no trainer to make room for.
  if (c.step.enable_sleep && !pl.colocated())
    LOG0_WARN(
        "--vllm_enable_sleep has no effect: the engines run on their own ranks "
        "(--gen_ranks_per_node {}), so there is no colocated trainer to free memory for",
        pl.options.gen_ranks_per_node);
  so.enable_sleep = c.step.enable_sleep && pl.colocated();
  so.environment = !c.env_command.empty();
  step.emplace(parts, so, steps_per_episode);
}

void RlRun::resume_and_announce() {
  if (trains) {
    slots.push_back({"model", &m.actor->store(), true});
    if (m.critic) slots.push_back({"critic", &m.critic->store(), true});
  }
  nlohmann::json resumed;
  settings = run_settings(c, total_steps);
  if (c.step.partial_rollout) {  // only then: earlier checkpoints compare equal without them
    settings["partial_rollout"] = true;
    settings["max_staleness"] = c.step.max_staleness;
  }
  if (c.load_checkpoint && trains) resumed = resume(c, slots, settings);
  resumed = RlStep::broadcast_json(resumed, train_root, *world);
  if (!resumed.is_null()) step->load_state(resumed);
  start_step = step->steps_done();
  log_start();
  open_metrics();
}

void RlRun::log_start() const {
  LOG0_INFO("{}: {} | {} parameters | {} | critic {} | reference {} | reward {}{}", c.command,
            src.config.model_type, layout->num_parameters(), src.describe(),
            with_critic ? "yes" : "no", with_ref ? "yes" : "no", c.reward,
            c.reward_pretrain.empty() ? "" : " + model " + c.reward_pretrain);
  if (lora)
    LOG0_INFO(
        "{} (base frozen; the reference policy is the base, adapters off; engines get the "
        "adapters only)",
        model::LoraLayout(model::layer_spec(layout->config()),
                          int(layout->config().num_hidden_layers), c.zero.lora)
            .describe());
  if (auto* cs = m.critic ? dynamic_cast<parallel::LoraStore*>(&m.critic->store()) : nullptr)
    LOG0_INFO("critic: {} (base frozen)", cs->lora_layout().describe());
  LOG0_INFO(
      "{} engines, {} training ranks | {} prompts, {} per step x {} samples | {} steps "
      "({} per episode) | {} optimizer steps per RL step",
      pl.num_engines(), n_train, prompts->size(), RB, n, total_steps, steps_per_episode,
      opt_steps_per_rl);
  if (c.step.partial_rollout) LOG0_INFO("{}", describe_partial_rollouts(c, so.enable_sleep));
  if (trains) parallel::log_memory(m.actor->store(), 0, *rt.train_comm);
  log_engine_memory(engine.get(), *world, so.enable_sleep);
}

void RlRun::open_metrics() {
  if (world_rank != 0) return;
  if (start_step > 0) {
    io::trim_records(c.save_path, "metrics.jsonl", start_step);
    io::trim_records(c.save_path, "samples.jsonl", start_step);
  } else if (c.step.log_completions > 0) {  // a fresh run starts a fresh sample log
    std::filesystem::remove(std::filesystem::path(c.save_path) / "samples.jsonl");
  }
  metrics = std::make_unique<io::MetricsWriter>(c.save_path, start_step == 0);
  if (c.tracking.enabled()) {
    tracker = std::make_unique<RunTracker>(c.tracking, c.save_path, c.command, settings);
    metrics->set_mirror([this](const nlohmann::json& r) { tracker->record(r); });
  }
}

parallel::SyncStats RlRun::sync_weights() {
  if (device_sync) {
#ifdef RLHF_CUDA
    auto* store = m.actor ? dynamic_cast<parallel::Zero3StoreCuda*>(&m.actor->store()) : nullptr;
    RLHF_ASSERT(store != nullptr || !trains);
    RLHF_ASSERT(engine == nullptr || engine->on_gpu());
    const std::vector<model::bf16*> units =
        engine ? engine->device_unit_buffers() : std::vector<model::bf16*>();
    const parallel::SyncStats ss =
        pl.colocated() ? sync->sync_device(*store, units, rt.device_comm.get())
                       : sync->sync_device_disaggregated(store, units, rt.device_comm.get());
    if (engine) engine->device_weights_updated();
    return ss;
#endif
  }
  if (lora) {
    // LoRA: the frozen base once, then only the adapters (bytes ∝ r).
    parallel::SyncStats ss;
    if (!base_synced)
      ss = sync->sync(m.actor ? &m.actor->store() : nullptr,
                      engine ? engine->unit_buffers() : std::vector<float*>());
    base_synced = true;
    auto* ls = m.actor ? dynamic_cast<parallel::LoraStore*>(&m.actor->store()) : nullptr;
    const parallel::SyncStats as = sync->sync_adapters(
        ls ? ls->adapters() : nullptr, engine ? engine->lora_buffer() : nullptr, lora_numel);
    ss.mode = as.mode;
    ss.buckets += as.buckets;
    ss.bytes += as.bytes;
    ss.seconds += as.seconds;
    ss.algbw_GBps = ss.seconds > 0 ? double(ss.bytes) / ss.seconds / 1e9 : 0;
    ss.busbw_GBps = as.busbw_GBps;
    return ss;
  }
  return sync->sync(m.actor ? &m.actor->store() : nullptr,
                    engine ? engine->unit_buffers() : std::vector<float*>());
}

void RlRun::log_samples(const StepSamples& s) {
  if (tracker) tracker->text(s.step, completions_markdown(s.prompts, s.completions, s.scores));
  if (!samples_log)
    samples_log = std::make_unique<io::MetricsWriter>(c.save_path, false, "samples.jsonl");
  for (size_t i = 0; i < s.prompts.size(); ++i)
    samples_log->write({{"step", s.step},
                        {"prompt", s.prompts[i]},
                        {"completion", s.completions[i]},
                        {"score", s.scores[i]},
                        {"advantage", s.advantages[i]},
                        {"response_length", s.response_lengths[i]},
                        {"stopped", bool(s.stopped[i])}});
}

nlohmann::json RlRun::evaluate_now() {
  return evaluate(engine.get(), topo, *world, eval.prompts, *reward, *tokenizer, eval.options)
      .to_json("eval_");
}

void RlRun::evaluate_before_training() {
  nlohmann::json rec = evaluate_now();
  rec["step"] = 0;
  LOG0_INFO("eval before training | reward {:.3f} | accuracy {:.3f} | len {:.1f}",
            rec["eval_reward_mean"].get<double>(), rec["eval_accuracy"].get<double>(),
            rec["eval_response_length_mean"].get<double>());
  if (metrics) metrics->write(rec);
}

int RlRun::run() {
  parts.sync_weights();  // the initial (or resumed) policy into every engine
  if (!eval.prompts.empty() && c.eval_before_training && start_step == 0)
    evaluate_before_training();
  while (step->steps_done() < total_steps) {
    if (const std::optional<int> exit_status = end_step(step->step())) return *exit_status;
  }
  finish();
  return 0;
}

std::optional<int> RlRun::end_step(nlohmann::json rec) {
  const int64_t done = step->steps_done();
  if (!eval.prompts.empty() && ((c.eval_steps > 0 && done % c.eval_steps == 0) ||
                                (c.eval_steps <= 0 && done == total_steps)))
    rec.update(evaluate_now());
  rec["elapsed_s"] = since(t_start);
  if (world_rank == 0) {
    if (done % c.logging_steps == 0 || done == total_steps) log_step(rec, total_steps);
    metrics->write(rec);
  }
  // SIGTERM/SIGUSR1 on any rank: every rank stops after this step, with a checkpoint.
  const int signal = parallel::agree_preemption(*world);
  const bool stop = signal != 0 && done < total_steps;
  const bool checkpoint = (c.save_steps > 0 && done % c.save_steps == 0) || stop;
  if (checkpoint) step->release_kept_kv();  // the resumed run continues from the same state
  if (trains && checkpoint) save_checkpoint(done);
  if (!stop) return std::nullopt;
  world->barrier();
  LOG0_WARN(
      "{} received: stopped after step {}/{} with checkpoint {}\nresume with the same "
      "command and --load_checkpoint (exit status {})",
      parallel::signal_name(signal), done, total_steps, checkpoint_path(c.ckpt_path, done),
      parallel::kExitPreempted);
  return parallel::kExitPreempted;
}

void RlRun::save_checkpoint(int64_t done) {
  nlohmann::json state = step->state();
  state["seed"] = c.seed;
  state["train_ranks"] = n_train;
  state["settings"] = settings;
  const std::string path = checkpoint_path(c.ckpt_path, done);
  save_train_checkpoint(
      path, slots, state, rt.train_comm->rank() == 0, int(c.max_ckpt_num), tokenizer.get(),
      sharded_checkpoints(c.ckpt_format, n_train) ? rt.train_comm.get() : nullptr);
  if (c.save_hf_ckpt)
    save_hf_model(m.actor->store(), hf_checkpoint_dir(path), rt.train_comm->rank(),
                  tokenizer.get());
  LOG0_INFO("checkpoint {}", path);
}

void RlRun::finish() {
  if (trains) {
    const std::string path = (std::filesystem::path(c.save_path) / "model.h5").string();
    save_model(m.actor->store(), path, rt.train_comm->rank(), tokenizer.get());
    LOG0_INFO("done: {} steps in {:.1f}s | policy {} | metrics {}/metrics.jsonl", total_steps,
              since(t_start), path, c.save_path);
  }
  world->barrier();
}

}  // namespace

int run_rl(const RlRunConfig& c) {
  parallel::install_preemption_handlers();
  RlRun run(c);
  return run.run();
}

}  // namespace rlhf::rl

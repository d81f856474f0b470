#include "rl/rl_run.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

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

}  // namespace

int run_rl(const RlRunConfig& c) {
  parallel::install_preemption_handlers();
  parallel::TrainRuntime rt = parallel::setup_train_runtime(c.runtime, true);
  const parallel::Topology& topo = *rt.topology;
  const parallel::Placement& pl = topo.placement();
  const int n_train = int(pl.train_ranks.size()), world_rank = topo.rank();
  const int train_root = pl.train_ranks.front();  // world rank of train rank 0
  const bool trains = topo.trains();
  const auto t_start = Clock::now();
  std::unique_ptr<parallel::Comm> world = parallel::make_comm(topo.world(), "world");
  // Async training overlaps generation ranks with training ranks: they must be different ranks.
  RLHF_CHECK(!c.step.async_train || !pl.colocated(),
             "--async_train needs generation ranks apart from the training ranks: colocated, "
             "every rank both generates and trains, so there is nothing to overlap\nhint: add "
             "--gen_ranks_per_node 1 (or more)");

  // --- models
  const io::ModelSource src =
      io::resolve_model_source(c.model_config, c.pretrain, c.tokenizer, model::HeadKind::kLM);
  const auto tokenizer = io::model_tokenizer(src);  // the model's own, else bytes
  const model::ParamLayout layout(src.config, model::HeadKind::kLM);
  const bool with_critic = uses_critic(c.ppo.estimator), with_ref = c.ppo.init_kl_coef > 0;
  Models m;
  if (trains) m = build_models(c, rt, src, layout, with_ref, with_critic);
  // Tensor-parallel engines: the engine's group (collective over engine_comm; TP 1: none).
  const std::unique_ptr<parallel::Comm> tp_comm =
      c.runtime.tensor_parallel > 1 ? parallel::make_comm(topo.engine_comm(), "engine_comm")
                                    : nullptr;
  std::unique_ptr<rollout::Engine> engine;
  if (topo.generates()) {
    rollout::EngineOptions eo = c.engine;
    eo.cuda = rt.device == parallel::Device::kCuda;
    eo.tp_comm = tp_comm.get();
    eo.eos_token_id = tokenizer->eos_id();
    eo.unit_room = parallel::WeightSync::engine_unit_room(layout, n_train);
    engine = std::make_unique<rollout::Engine>(layout, eo);
    if (c.zero.lora.enabled()) engine->set_lora(c.zero.lora);
  }
  // Multi-turn episodes: one environment per engine (a program started now on its TP rank 0).
  std::unique_ptr<Environment> env;
  if (topo.generates() && !c.env_command.empty())
    env = make_environment(c.env_command, c.env_timeout, engine->tp_rank());
  EpisodeOptions episodes;
  episodes.env = env.get();
  episodes.stop_strings = parse_stop_strings(c.stop_strings);
  episodes.max_turns = c.env_max_turns;
  // bf16 trainer and bf16 CPU engines (--param_dtype bf16): the sync moves bf16 (half the bytes).
  parallel::WeightSync sync(topo, rt.train_comm.get(), layout,
                            c.sync_bucket_mb * (int64_t(1) << 20), rt.bf16 && c.engine.bf16);

  // --- prompts, step arithmetic, optimizers, rewards, trainer
  PromptSource prompts(load_prompts(c.prompts, *tokenizer, src.config, world_rank),
                       uint64_t(c.seed));
  const auto [total_steps, steps_per_episode] = step_arithmetic(c, prompts.size(), n_train);
  const int64_t RB = c.step.rollout_batch_size, n = c.step.n_samples_per_prompt;
  const int64_t opt_steps_per_rl = c.ppo.max_epochs * (RB * n / c.ppo.train_batch_size);
  PpoOptimizers po;
  po.actor_adam = c.actor_adam;
  po.critic_adam = c.critic_adam;
  po.actor_schedule = optim::LrSchedule::openrlhf(
      c.lr_scheduler, c.actor_adam.lr, total_steps * opt_steps_per_rl, c.lr_warmup_ratio);
  po.critic_schedule = optim::LrSchedule::openrlhf(
      c.lr_scheduler, c.critic_adam.lr, total_steps * opt_steps_per_rl, c.lr_warmup_ratio);
  std::unique_ptr<RewardFn> reward =
      c.reward.empty() ? nullptr : make_reward(c.reward, c.reward_options);
  RLHF_CHECK(c.eval_dataset.empty() || reward != nullptr,
             "--eval_dataset {} needs a rule reward to score the answers\nhint: set --reward "
             "(e.g. math) and --label_key",
             c.eval_dataset);
  Eval eval;
  if (!c.eval_dataset.empty()) eval = load_eval(c, *tokenizer, src.config, world_rank);
  eval.options.episodes = episodes;
  const auto evaluate_now = [&]() {
    return evaluate(engine.get(), topo, *world, eval.prompts, *reward, *tokenizer, eval.options)
        .to_json("eval_");
  };
  std::unique_ptr<PpoTrainer> trainer;
  if (trains) {
    PpoOptions o = c.ppo;
    o.pad_id = tokenizer->pad_id();
    o.seed = uint64_t(c.seed);
    o.pad_multiple = parallel::training_pad_multiple(rt.device);
    trainer = std::make_unique<PpoTrainer>(
        PpoModels{m.actor.get(), m.ref.get(), m.critic.get(), m.reward.get()}, o, po,
        *rt.train_comm);
  }

  // --- the step and its weight sync
  RlStepParts parts;
  parts.topology = &topo;
  parts.world = world.get();
  parts.trainer = trainer.get();
  parts.train_comm = rt.train_comm.get();
  parts.engine = engine.get();
  parts.reward = reward.get();
  parts.prompts = &prompts;
  parts.tokenizer = tokenizer.get();
  parts.episodes = episodes;
  std::unique_ptr<io::MetricsWriter> samples_log;
  std::unique_ptr<RunTracker> tracker;  // rank 0, with --use_tensorboard / --use_wandb
  parts.log_samples = [&](const StepSamples& s) {
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
  };
  // GPU ranks sync device to device: colocated, NCCL gathers of the bf16 shards straight into the
  // engines' device weights; disaggregated, the training ranks' gather plus a node-local NCCL
  // broadcast into the engine ranks' device weights (when every node with engines has a training
  // rank). Every other placement goes through the engines' host buffers, and so does LoRA on the
  // GPU (the frozen base once into the host buffers, then the adapters, which the GPU engine
  // merges into its device weights at each generate).
  const bool cuda = rt.device == parallel::Device::kCuda;
  const bool lora = c.zero.lora.enabled();
  // Env RLHF_WEIGHT_SYNC=host (tests, debugging): GPU engines take the host path anyway.
  const char* path_env = std::getenv("RLHF_WEIGHT_SYNC");
  const std::string sync_path = path_env ? path_env : "";
  RLHF_CHECK(sync_path.empty() || sync_path == "auto" || sync_path == "host",
             "env RLHF_WEIGHT_SYNC={}: expected auto or host", sync_path);
  const bool device_sync =
      cuda && sync_path != "host" && !lora && (pl.colocated() || sync.device_sync_node_local());
  if (cuda && !lora && sync_path != "host" && !device_sync)
    LOG0_WARN(
        "weight sync: a node holds generation ranks but no training rank; its GPU engines take "
        "the host path (fp32 over MPI, then an upload)");
  bool base_synced = false;
  const int64_t lora_numel =
      lora ? model::LoraLayout(model::layer_spec(layout.config()),
                               int(layout.config().num_hidden_layers), c.zero.lora)
                 .numel()
           : 0;
  parts.sync_weights = [&]() -> parallel::SyncStats {
    if (device_sync) {
#ifdef RLHF_CUDA
      auto* store = m.actor ? dynamic_cast<parallel::Zero3StoreCuda*>(&m.actor->store()) : nullptr;
      RLHF_ASSERT(store != nullptr || !trains);
      RLHF_ASSERT(engine == nullptr || engine->on_gpu());
      const std::vector<model::bf16*> units =
          engine ? engine->device_unit_buffers() : std::vector<model::bf16*>();
      const parallel::SyncStats ss =
          pl.colocated() ? sync.sync_device(*store, units, rt.device_comm.get())
                         : sync.sync_device_disaggregated(store, units, rt.device_comm.get());
      if (engine) engine->device_weights_updated();
      return ss;
#endif
    }
    if (lora) {
      // LoRA: the frozen base once, then only the adapters (bytes ∝ r).
      parallel::SyncStats ss;
      if (!base_synced)
        ss = sync.sync(m.actor ? &m.actor->store() : nullptr,
                       engine ? engine->unit_buffers() : std::vector<float*>());
      base_synced = true;
      auto* ls = m.actor ? dynamic_cast<parallel::LoraStore*>(&m.actor->store()) : nullptr;
      const parallel::SyncStats as = sync.sync_adapters(
          ls ? ls->adapters() : nullptr, engine ? engine->lora_buffer() : nullptr, lora_numel);
      ss.mode = as.mode;
      ss.buckets += as.buckets;
      ss.bytes += as.bytes;
      ss.seconds += as.seconds;
      ss.algbw_GBps = ss.seconds > 0 ? double(ss.bytes) / ss.seconds / 1e9 : 0;
      ss.busbw_GBps = as.busbw_GBps;
      return ss;
    }
    return sync.sync(m.actor ? &m.actor->store() : nullptr,
                     engine ? engine->unit_buffers() : std::vector<float*>());
  };
  RlStepOptions so = c.step;
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
  RlStep step(parts, so, steps_per_episode);

  // --- resume
  std::vector<CheckpointSlot> slots;
  if (trains) {
    slots.push_back({"model", &m.actor->store(), true});
    if (m.critic) slots.push_back({"critic", &m.critic->store(), true});
  }
  nlohmann::json resumed;
  nlohmann::json settings = run_settings(c, total_steps);
  if (c.step.partial_rollout) {  // only then: earlier checkpoints compare equal without them
    settings["partial_rollout"] = true;
    settings["max_staleness"] = c.step.max_staleness;
  }
  if (c.load_checkpoint && trains) resumed = resume(c, slots, settings);
  resumed = RlStep::broadcast_json(resumed, train_root, *world);
  if (!resumed.is_null()) step.load_state(resumed);
  const int64_t start_step = step.steps_done();

  LOG0_INFO("{}: {} | {} parameters | {} | critic {} | reference {} | reward {}{}", c.command,
            src.config.model_type, layout.num_parameters(), src.describe(),
            with_critic ? "yes" : "no", with_ref ? "yes" : "no", c.reward,
            c.reward_pretrain.empty() ? "" : " + model " + c.reward_pretrain);
  if (lora)
    LOG0_INFO(
        "{} (base frozen; the reference policy is the base, adapters off; engines get the "
        "adapters only)",
        model::LoraLayout(model::layer_spec(layout.config()),
                          int(layout.config().num_hidden_layers), c.zero.lora)
            .describe());
  if (auto* cs = m.critic ? dynamic_cast<parallel::LoraStore*>(&m.critic->store()) : nullptr)
    LOG0_INFO("critic: {} (base frozen)", cs->lora_layout().describe());
  LOG0_INFO(
      "{} engines, {} training ranks | {} prompts, {} per step x {} samples | {} steps "
      "({} per episode) | {} optimizer steps per RL step",
      pl.num_engines(), n_train, prompts.size(), RB, n, total_steps, steps_per_episode,
      opt_steps_per_rl);
  if (c.step.partial_rollout) LOG0_INFO("{}", describe_partial_rollouts(c, so.enable_sleep));
  if (trains) parallel::log_memory(m.actor->store(), 0, *rt.train_comm);
  log_engine_memory(engine.get(), *world, so.enable_sleep);
  std::unique_ptr<io::MetricsWriter> metrics;
  if (world_rank == 0) {
    if (start_step > 0) {
      io::trim_records(c.save_path, "metrics.jsonl", start_step);
      io::trim_records(c.save_path, "samples.jsonl", start_step);
    } else if (c.step.log_completions > 0) {  // a fresh run starts a fresh sample log
      std::filesystem::remove(std::filesystem::path(c.save_path) / "samples.jsonl");
    }
    metrics = std::make_unique<io::MetricsWriter>(c.save_path, start_step == 0);
    if (c.tracking.enabled()) {
      tracker = std::make_unique<RunTracker>(c.tracking, c.save_path, c.command, settings);
      metrics->set_mirror([&](const nlohmann::json& r) { tracker->record(r); });
    }
  }

  parts.sync_weights();  // the initial (or resumed) policy into every engine
  if (!eval.prompts.empty() && c.eval_before_training && start_step == 0) {
    nlohmann::json rec = evaluate_now();
    rec["step"] = 0;
    LOG0_INFO("eval before training | reward {:.3f} | accuracy {:.3f} | len {:.1f}",
              rec["eval_reward_mean"].get<double>(), rec["eval_accuracy"].get<double>(),
              rec["eval_response_length_mean"].get<double>());
    if (metrics) metrics->write(rec);
  }
  while (step.steps_done() < total_steps) {
    nlohmann::json rec = step.step();
    const int64_t done = step.steps_done();
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
    if (checkpoint) step.release_kept_kv();  // the resumed run continues from the same state
    if (trains && checkpoint) {
      nlohmann::json state = step.state();
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
    if (stop) {
      world->barrier();
      LOG0_WARN(
          "{} received: stopped after step {}/{} with checkpoint {}\nresume with the same "
          "command and --load_checkpoint (exit status {})",
          parallel::signal_name(signal), done, total_steps, checkpoint_path(c.ckpt_path, done),
          parallel::kExitPreempted);
      return parallel::kExitPreempted;
    }
  }
  if (trains) {
    const std::string path = (std::filesystem::path(c.save_path) / "model.h5").string();
    save_model(m.actor->store(), path, rt.train_comm->rank(), tokenizer.get());
    LOG0_INFO("done: {} steps in {:.1f}s | policy {} | metrics {}/metrics.jsonl", total_steps,
              since(t_start), path, c.save_path);
  }
  world->barrier();
  return 0;
}

}  // namespace rlhf::rl

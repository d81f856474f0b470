// `rlhf ppo` and `rlhf grpo`: the RL loop of DESIGN.md §3, one mpirun for everything.
//
// One RL step: draw --rollout_batch_size prompts; every generation engine samples its share
// (--n_samples_per_prompt each, continuous batching); the samples are gathered to every rank in a
// canonical order; the training ranks score them (rule reward, reward command, reward model),
// compute old and reference log-probs and values, advantages, and train the actor (and critic)
// for --max_epochs passes in optimizer steps of --train_batch_size; then the new weights are
// synced into every engine. Each phase is timed with its communication.
//
// Determinism: sampling uses a counter-based stream keyed by (--seed, the prompt's global
// position), the prompt order is a seeded permutation per episode, and the experience is put in a
// canonical order — so a run does not depend on how many engines there are, and resuming from a
// checkpoint continues bit for bit.
#include <mpi.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "app/checkpoint.h"
#include "app/commands.h"
#include "app/runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "io/builtin_tasks.h"
#include "io/chat_template.h"
#include "io/jsonl.h"
#include "io/metrics.h"
#include "io/tokenizer.h"
#include "model/transformer.h"
#include "optim/schedule.h"
#include "parallel/failure_injection.h"
#include "parallel/mpi_check.h"
#include "parallel/weight_sync.h"
#include "parallel/zero3.h"
#include "rollout/engine.h"
#include "rollout/ppo_trainer.h"
#include "rollout/rewards.h"

#ifdef RLHF_CUDA
#include "parallel/device_store.h"
#endif

namespace rlhf::app {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Prompt {
  std::string text;
  std::vector<int32_t> tokens;
  nlohmann::json label;   // null when --label_key is empty
  nlohmann::json record;  // the whole record
};

// The prompt records: a JSONL file, or a builtin task (also written to <save_path> on rank 0 so
// the data of the run can be looked at).
std::vector<nlohmann::json> prompt_records(const PpoArgs& a, int world_rank) {
  if (io::is_builtin_dataset(a.prompt_data)) {
    if (world_rank == 0) {
      const std::string path = io::materialize_builtin_dataset(a.prompt_data, a.ckpt.save_path);
      LOG0_INFO("prompts: {} written to {}", a.prompt_data, path);
    }
    return io::builtin_records(a.prompt_data);
  }
  RLHF_CHECK(std::filesystem::exists(a.prompt_data), "--prompt_data {}: no such file",
             a.prompt_data);
  return io::read_jsonl(a.prompt_data);
}

// The value at a dotted key path ("reward_model.ground_truth"), or nullptr.
const nlohmann::json* at_path(const nlohmann::json& j, const std::string& key) {
  const nlohmann::json* cur = &j;
  size_t pos = 0;
  while (pos <= key.size()) {
    const size_t dot = key.find('.', pos);
    const std::string part =
        key.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (!cur->is_object() || !cur->contains(part)) return nullptr;
    cur = &(*cur)[part];
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

std::vector<Prompt> load_prompts(const PpoArgs& a, const io::Tokenizer& tok,
                                 const model::ModelConfig& cfg, int world_rank) {
  const int64_t max_pos = cfg.max_position_embeddings;
  const io::ChatFormat chat = io::detect_chat_format(tok, cfg.model_type);
  const auto records = prompt_records(a, world_rank);
  std::vector<Prompt> out;
  int64_t line = 0, too_long = 0;
  for (const nlohmann::json& r : records) {
    ++line;
    if (int64_t(out.size()) >= a.max_samples) break;
    RLHF_CHECK(r.is_object(), "{}:{}: a prompt record must be a JSON object", a.prompt_data, line);
    const nlohmann::json* in = at_path(r, a.input_key);
    RLHF_CHECK(in != nullptr, "{}:{}: no key '{}'\nhint: set --input_key", a.prompt_data, line,
               a.input_key);
    // The prompt as chat messages (a string is one user turn) or plain text.
    std::vector<io::ChatMessage> messages;
    if (in->is_string()) {
      messages.push_back({"user", in->get<std::string>()});
    } else if (in->is_array()) {
      for (const auto& m : *in) {
        RLHF_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                       m.contains("content") && m["content"].is_string(),
                   "{}:{}: chat messages under '{}' must be objects with string role and content",
                   a.prompt_data, line, a.input_key);
        messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      }
    }
    RLHF_CHECK(!messages.empty() && !messages.front().content.empty(),
               "{}:{}: key '{}' must be a non-empty string (or chat messages)", a.prompt_data, line,
               a.input_key);
    std::string text;
    bool add_bos = true;
    if (a.apply_chat_template) {
      try {
        text = io::apply_chat_template(messages, chat, true);
      } catch (const Error& e) {
        RLHF_FAIL("{}:{}: --apply_chat_template: {}", a.prompt_data, line, e.what());
      }
      add_bos = false;  // the template writes its own BOS where the format has one
    } else {
      for (const auto& m : messages) {  // contents, one per line
        if (!text.empty()) text += '\n';
        text += m.content;
      }
    }
    Prompt p;
    p.text = text;
    p.record = r;
    if (!a.label_key.empty()) {
      const nlohmann::json* l = at_path(r, a.label_key);
      RLHF_CHECK(l != nullptr, "{}:{}: no label key '{}'\nhint: set --label_key", a.prompt_data,
                 line, a.label_key);
      p.label = *l;
    }
    p.tokens = tok.encode(text, add_bos, false);
    if (int64_t(p.tokens.size()) > a.prompt_max_len || int64_t(p.tokens.size()) >= max_pos) {
      ++too_long;
      continue;
    }
    out.push_back(std::move(p));
  }
  RLHF_CHECK(!out.empty(), "{}: no usable prompt ({} longer than --prompt_max_len {})",
             a.prompt_data, too_long, a.prompt_max_len);
  if (too_long > 0)
    LOG0_WARN("{} prompts longer than --prompt_max_len {} (or the model's context) skipped",
              too_long, a.prompt_max_len);
  return out;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t c = s.find(',', pos);
    if (c == std::string::npos) c = s.size();
    if (c > pos) out.push_back(s.substr(pos, c - pos));
    pos = c + 1;
  }
  return out;
}

// Broadcast a JSON value from world rank `root` to every rank.
nlohmann::json bcast_json(const nlohmann::json& j, int root, MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::string s = rank == root ? j.dump() : std::string();
  int64_t n = int64_t(s.size());
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, root, world));
  s.resize(size_t(n));
  MPI_CHECK(MPI_Bcast(s.data(), int(n), MPI_CHAR, root, world));
  return nlohmann::json::parse(s);
}

// A resumed run continues metrics.jsonl from the checkpoint's step: records after it (steps the
// interrupted run did after its last checkpoint, and a half-written last line) are dropped, so the
// file holds each step once. Rewritten through a temporary file and a rename.
void trim_metrics(const std::string& dir, int64_t last_step) {
  const std::filesystem::path path = std::filesystem::path(dir) / "metrics.jsonl";
  if (!std::filesystem::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    if (!r.is_discarded() && r.is_object() && r.value("step", int64_t(0)) <= last_step &&
        r.value("step", int64_t(0)) >= 1) {
      kept += line + "\n";
    } else {
      ++dropped;
    }
  }
  in.close();
  if (dropped == 0) return;
  const std::string tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    RLHF_CHECK(out.good(), "cannot write {}", tmp);
  }
  std::filesystem::rename(tmp, path);
  LOG0_INFO("{}: dropped {} records after step {} (the resumed run writes them again)",
            path.string(), dropped, last_step);
}

}  // namespace

int run_rl(const PpoArgs& args, const char* cmd) {
  TrainRuntime rt = setup_train_runtime(args.parallel, args.gen.vllm_tensor_parallel_size, true);
  const parallel::Topology& topo = *rt.topology;
  const parallel::Placement& pl = topo.placement();
  const MPI_Comm world = topo.world();
  const int world_rank = topo.rank();
  const int n_train = int(pl.train_ranks.size()), n_engines = pl.num_engines();
  const int train_root = pl.train_ranks.front();  // world rank of train rank 0
  const bool trains = topo.trains(), generates = topo.generates();
  parallel::Comm* comm = rt.train_comm.get();
  const uint64_t seed = static_cast<uint64_t>(args.common.seed);
  const auto t_start = Clock::now();

  // --- models
  const ModelSource src = resolve_model_source(args.model, model::HeadKind::kLM);
  const model::ModelConfig& cfg = src.config;
  const auto tokenizer = model_tokenizer(src);  // the model's own, else bytes
  const model::ParamLayout layout(cfg, model::HeadKind::kLM, n_train);
  const rollout::AdvantageEstimator est =
      rollout::advantage_estimator_from_string(args.advantage_estimator);
  const bool with_critic = rollout::uses_critic(est);
  const bool with_ref = args.init_kl_coef > 0;

  std::unique_ptr<parallel::TrainModel> actor, ref, critic, rm;
  std::unique_ptr<model::ParamLayout> critic_layout, rm_layout;
  if (trains) {
    actor = make_train_model(layout, rt, args.zero);
    initialize_weights(actor->store(), src, seed);
    if (with_ref) {
      ref = make_train_model(layout, rt, args.zero, /*frozen=*/true);
      initialize_weights(ref->store(), src, seed);
    }
    if (!args.reward_pretrain.empty()) {
      ModelArgs m;
      m.pretrain = args.reward_pretrain;
      const ModelSource rsrc = resolve_model_source(m, model::HeadKind::kReward);
      RLHF_CHECK(!rsrc.checkpoint.empty(), "--reward_pretrain {} is not a checkpoint",
                 args.reward_pretrain);
      rm_layout =
          std::make_unique<model::ParamLayout>(rsrc.config, model::HeadKind::kReward, n_train);
      rm = make_train_model(*rm_layout, rt, args.zero, /*frozen=*/true);
      initialize_weights(rm->store(), rsrc, seed);
    }
    if (with_critic) {
      ModelArgs m;
      m.pretrain = !args.critic_pretrain.empty()   ? args.critic_pretrain
                   : !args.reward_pretrain.empty() ? args.reward_pretrain
                                                   : args.model.pretrain;
      if (m.pretrain.empty()) m.model_config = args.model.model_config;
      const ModelSource csrc = resolve_model_source(m, model::HeadKind::kValue);
      critic_layout =
          std::make_unique<model::ParamLayout>(csrc.config, model::HeadKind::kValue, n_train);
      critic = make_train_model(*critic_layout, rt, args.zero);
      initialize_weights(critic->store(), csrc, seed + 1);
    }
  }
  // Tensor-parallel engines: the engine's group (collective over engine_comm; TP 1: none).
  const std::unique_ptr<parallel::Comm> tp_comm =
      args.gen.vllm_tensor_parallel_size > 1
          ? parallel::make_comm(topo.engine_comm(), "engine_comm")
          : nullptr;
  std::unique_ptr<rollout::Engine> engine;
  if (generates) {
    engine = std::make_unique<rollout::Engine>(
        layout, engine_options(args.gen, rt.device, tp_comm.get(), tokenizer->eos_id()));
  }
  parallel::WeightSync sync(topo, comm, layout, args.sync_bucket_mb * (int64_t(1) << 20));

  // --- prompts and step arithmetic
  const std::vector<Prompt> prompts = load_prompts(args, *tokenizer, cfg, world_rank);
  const int64_t n_prompts = int64_t(prompts.size()), RB = args.rollout_batch_size;
  const int64_t n = args.gen.n_samples_per_prompt;
  RLHF_CHECK(RB <= n_prompts, "--rollout_batch_size {} is larger than the {} usable prompts of {}",
             RB, n_prompts, args.prompt_data);
  RLHF_CHECK((RB * n) % (int64_t(n_train) * args.micro_train_batch_size) == 0 &&
                 args.train_batch_size % (int64_t(n_train) * args.micro_train_batch_size) == 0,
             "--train_batch_size {} and the {} samples of a step must split into "
             "--micro_train_batch_size {} x {} training ranks",
             args.train_batch_size, RB * n, args.micro_train_batch_size, n_train);
  RLHF_CHECK((RB * n) % n_train == 0,
             "the {} samples of a step do not split over {} training ranks", RB * n, n_train);
  const int64_t steps_per_episode = n_prompts / RB;
  // --max_steps, when given, is the step count: more than the episodes hold cycles the prompts
  // again (a new permutation per pass), fewer stops early.
  const int64_t total_steps =
      args.max_steps > 0 ? args.max_steps : steps_per_episode * args.num_episodes;
  const int64_t opt_steps_per_rl = args.max_epochs * (RB * n / args.train_batch_size);
  const optim::LrSchedule actor_sched =
      optim::LrSchedule::openrlhf(args.optim.lr_scheduler, args.actor_learning_rate,
                                  total_steps * opt_steps_per_rl, args.optim.lr_warmup_ratio);
  const optim::LrSchedule critic_sched =
      optim::LrSchedule::openrlhf(args.optim.lr_scheduler, args.critic_learning_rate,
                                  total_steps * opt_steps_per_rl, args.optim.lr_warmup_ratio);
  const optim::AdamWConfig actor_adam = make_adamw(args.optim, args.actor_learning_rate);
  const optim::AdamWConfig critic_adam = make_adamw(args.optim, args.critic_learning_rate);

  // --- rewards (computed on train rank 0)
  std::unique_ptr<rollout::RewardFn> reward_fn;
  if (!args.reward.empty()) {
    rollout::RewardOptions ro;
    ro.format_pattern = args.reward_format_pattern;
    ro.keywords = split_commas(args.reward_keywords);
    ro.length_target = args.reward_length_target;
    ro.command = args.reward_command;
    ro.command_timeout_s = args.reward_command_timeout;
    reward_fn = rollout::make_reward(args.reward, ro);
  }

  // --- the trainer
  rollout::PpoOptions po;
  po.estimator = est;
  po.gamma = args.gamma;
  po.lambd = args.lambd;
  po.init_kl_coef = args.init_kl_coef;
  po.kl_estimator = model::kl_estimator_from_string(args.kl_estimator);
  po.use_kl_loss = args.use_kl_loss;
  po.kl_target = args.kl_target;
  po.kl_horizon = args.kl_horizon;
  const bool asym = args.eps_clip_low_high[0] > 0 || args.eps_clip_low_high[1] > 0;
  po.eps_clip_low = asym ? args.eps_clip_low_high[0] : args.eps_clip;
  po.eps_clip_high = asym ? args.eps_clip_low_high[1] : args.eps_clip;
  po.dual_clip = args.dual_clip;
  po.value_clip = args.value_clip;
  po.entropy_loss_coef = args.entropy_loss_coef;
  po.n_samples_per_prompt = int(n);
  po.micro_rollout_batch_size = args.micro_rollout_batch_size;
  po.train_batch_size = args.train_batch_size;
  po.micro_train_batch_size = args.micro_train_batch_size;
  po.max_epochs = args.max_epochs;
  po.temperature = args.gen.greedy ? 1.0 : (args.gen.temperature > 0 ? args.gen.temperature : 1.0);
  po.freezing_actor_steps = args.freezing_actor_steps;
  po.normalize_reward = args.normalize_reward;
  po.max_norm = args.optim.max_norm;
  po.pad_id = tokenizer->pad_id();
  po.seed = seed;
  std::unique_ptr<rollout::PpoTrainer> trainer;
  if (trains) {
    rollout::PpoModels pm{actor.get(), ref.get(), critic.get(), rm.get()};
    trainer = std::make_unique<rollout::PpoTrainer>(pm, po, *comm);
  }

  // --- resume
  int64_t start_step = 0;
  std::vector<CheckpointSlot> slots;
  if (trains) {
    slots.push_back({"model", &actor->store(), true});
    if (critic) slots.push_back({"critic", &critic->store(), true});
  }
  if (args.load_checkpoint && trains) {
    const std::string path = latest_valid_checkpoint(args.ckpt_path);
    if (path.empty()) {
      LOG0_WARN("--load_checkpoint: no checkpoint in {}; starting from step 0", args.ckpt_path);
    } else {
      const nlohmann::json st = load_train_checkpoint(path, slots);
      RLHF_CHECK(st.value("seed", int64_t(-1)) == args.common.seed,
                 "{} was made with --seed {}, this run has --seed {}", path,
                 st.value("seed", int64_t(-1)), args.common.seed);
      start_step = st.at("step").get<int64_t>();
      trainer->kl_controller().set_value(st.at("kl_coef").get<double>());
      trainer->set_steps(st.at("actor_steps").get<int64_t>(), st.at("critic_steps").get<int64_t>());
      auto& rmo = trainer->reward_moments();
      rmo.count = st.at("reward_count").get<double>();
      rmo.mean = st.at("reward_mean").get<double>();
      rmo.m2 = st.at("reward_m2").get<double>();
      LOG0_INFO("resumed from {} at step {}", path, start_step);
    }
  }
  start_step = bcast_json(start_step, train_root, world).get<int64_t>();

  LOG0_INFO("{}: {} | {} parameters | {} | critic {} | reference {} | reward {}{}", cmd,
            cfg.model_type, layout.num_parameters(), src.describe(), with_critic ? "yes" : "no",
            with_ref ? "yes" : "no", args.reward.empty() ? "" : args.reward,
            args.reward_pretrain.empty() ? "" : " + model " + args.reward_pretrain);
  LOG0_INFO(
      "{} engines, {} training ranks | {} prompts, {} per step x {} samples | {} steps "
      "({} per episode) | {} optimizer steps per RL step",
      n_engines, n_train, n_prompts, RB, n, total_steps, steps_per_episode, opt_steps_per_rl);
  if (trains) log_memory(actor->store(), 0, *comm);

  std::unique_ptr<io::MetricsWriter> metrics;
  if (world_rank == 0) {
    if (start_step > 0) trim_metrics(args.ckpt.save_path, start_step);
    metrics = std::make_unique<io::MetricsWriter>(args.ckpt.save_path, start_step == 0);
  }
  std::vector<float*> engine_units = engine ? engine->unit_buffers() : std::vector<float*>();
  // Colocated GPU ranks sync device to device (NCCL gathers of the bf16 shards straight into the
  // engines' device weights); every other placement goes through the engines' host buffers.
  const bool device_sync = rt.device == Device::kCuda && pl.colocated();
  auto sync_weights = [&]() -> parallel::SyncStats {
#ifdef RLHF_CUDA
    if (device_sync) {
      auto* store = dynamic_cast<parallel::DeviceZero3Store*>(&actor->store());
      RLHF_ASSERT(store != nullptr && engine != nullptr && engine->on_gpu());
      const parallel::SyncStats ss =
          sync.sync_device(*store, engine->device_unit_buffers(), rt.device_comm.get());
      engine->device_weights_updated();
      return ss;
    }
#endif
    return sync.sync(actor ? &actor->store() : nullptr, engine_units);
  };
  sync_weights();  // the initial (or resumed) policy into every engine

  EpochOrder order(n_prompts, seed);
  for (int64_t step = start_step; step < total_steps; ++step) {
    const auto t_step = Clock::now();
    parallel::maybe_inject_failure("rl_step", world_rank);
    const int64_t episode = step / steps_per_episode;
    // 1. Generation: engine e samples prompts [e·RB/E, (e+1)·RB/E) of this step (all ranks of a
    //    tensor-parallel engine together; its rank 0 alone contributes the samples).
    auto t = Clock::now();
    std::vector<rollout::Sample> local;
    if (engine) {
      const int e = topo.me().engine;
      const int64_t lo = RB * e / n_engines, hi = RB * (e + 1) / n_engines;
      std::vector<rollout::GenerationRequest> reqs;
      for (int64_t i = lo; i < hi; ++i) {
        const int64_t pos = episode * n_prompts + (step % steps_per_episode) * RB + i;
        const Prompt& p = prompts[size_t(order.at(pos))];
        rollout::GenerationRequest r;
        r.id = uint64_t(pos);
        r.prompt = p.tokens;
        r.n_samples = n;
        r.max_new_tokens = std::min<int64_t>(
            args.gen.generate_max_len, cfg.max_position_embeddings - int64_t(p.tokens.size()));
        r.sampling.temperature = args.gen.temperature;
        r.sampling.top_p = args.gen.top_p;
        r.sampling.top_k = args.gen.top_k;
        r.sampling.greedy = args.gen.greedy;
        r.sampling.seed = seed;
        reqs.push_back(std::move(r));
      }
      const auto results = engine->generate(reqs);
      const bool contributes = engine->tp_rank() == 0;  // TP: the other ranks hold the same
      for (const auto& res : results) {
        if (!contributes) break;
        rollout::Sample s;
        s.prompt_pos = lo + res.request_index;
        s.sample_index = res.sample_index;
        s.prompt = reqs[size_t(res.request_index)].prompt;
        s.response = res.tokens;
        s.gen_logprobs = res.logprobs;
        s.stopped = res.finish == rollout::FinishReason::kStop;
        local.push_back(std::move(s));
      }
    }
    const double gen_compute_s = since(t);
    const auto t_gather = Clock::now();
    const std::vector<rollout::Sample> samples = rollout::allgather_samples(local, world);
    const double gen_comm_s = since(t_gather);
    int64_t gen_tokens = 0, gen_bytes = 0;
    for (const auto& s : samples) {
      gen_tokens += int64_t(s.response.size());
      gen_bytes += int64_t(s.response.size() * 8 + s.prompt.size() * 4);
    }
    const double gen_s = since(t);

    nlohmann::json rec;
    if (trains) {
      // 2. Rewards.
      t = Clock::now();
      const parallel::CommStats r0 = comm->stats();
      const int64_t B = int64_t(samples.size());
      std::vector<double> scores(static_cast<size_t>(B), 0.0), rule(size_t(B), 0.0);
      if (reward_fn) {
        if (comm->rank() == 0) {
          std::vector<std::string> completions(static_cast<size_t>(B));
          std::vector<rollout::RewardInput> in(static_cast<size_t>(B));
          for (int64_t i = 0; i < B; ++i) {
            const auto& s = samples[size_t(i)];
            const int64_t pos =
                episode * n_prompts + (step % steps_per_episode) * RB + s.prompt_pos;
            const Prompt& p = prompts[size_t(order.at(pos))];
            completions[size_t(i)] = tokenizer->decode(s.response, true);
            in[size_t(i)].prompt = p.text;
            in[size_t(i)].completion = completions[size_t(i)];
            in[size_t(i)].label = p.label.is_null() ? nullptr : &p.label;
            in[size_t(i)].record = &p.record;
            in[size_t(i)].completion_tokens = int64_t(s.response.size());
            in[size_t(i)].stopped = s.stopped;
          }
          rule = reward_fn->score(in);
        }
        comm->broadcast(rule.data(), B, 0);
        for (int64_t i = 0; i < B; ++i) scores[size_t(i)] += rule[size_t(i)];
      }
      if (rm) {
        const auto r = trainer->reward_model_scores(samples);
        for (int64_t i = 0; i < B; ++i) scores[size_t(i)] += r[size_t(i)];
      }
      const double reward_s = since(t);
      const double reward_comm_s = comm->stats().seconds - r0.seconds;
      const int64_t reward_comm_bytes = comm->stats().bytes - r0.bytes;
      double mean = 0, var = 0;
      for (double s : scores) mean += s / double(B);
      for (double s : scores) var += (s - mean) * (s - mean) / double(std::max<int64_t>(B - 1, 1));
      // 3. Experience.
      t = Clock::now();
      const parallel::CommStats c0 = comm->stats();
      const rollout::Experience exp = trainer->make_experience(samples, scores);
      const double logprob_s = since(t);
      const double logprob_comm_s = comm->stats().seconds - c0.seconds;
      const int64_t logprob_comm_bytes = comm->stats().bytes - c0.bytes;
      // 4. Training.
      t = Clock::now();
      const rollout::PpoStats st = trainer->train(exp, step, actor_adam, actor_sched, critic_adam,
                                                  critic ? &critic_sched : nullptr);
      const double train_s = since(t);
      int64_t len_max = 0, stops = 0, seq_tokens = 0;
      for (const auto& s : samples) {
        len_max = std::max<int64_t>(len_max, int64_t(s.response.size()));
        stops += s.stopped;
        seq_tokens += int64_t(s.prompt.size() + s.response.size());
      }
      // Tokens through forward+backward in the training phase (every epoch passes them all).
      const int64_t train_tokens = seq_tokens * args.max_epochs;
      rec = {{"step", step + 1},
             {"episode", episode},
             {"reward_mean", mean},
             {"reward_std", std::sqrt(var)},
             {"response_length_mean", double(gen_tokens) / double(B)},
             {"response_length_max", len_max},
             {"stop_fraction", double(stops) / double(B)},
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
             {"reward_s", reward_s},
             {"reward_comm_s", reward_comm_s},
             {"reward_comm_bytes", reward_comm_bytes},
             {"logprob_s", logprob_s},
             {"logprob_comm_s", logprob_comm_s},
             {"logprob_comm_bytes", logprob_comm_bytes},
             {"train_s", train_s},
             {"train_comm_s", st.comm_seconds},
             {"train_comm_bytes", st.comm_bytes},
             {"train_tokens", train_tokens},
             {"train_tokens_per_s", double(train_tokens) / std::max(train_s, 1e-9)}};
    }
    // 5. Weight sync into every engine.
    t = Clock::now();
    const parallel::SyncStats ss = sync_weights();
    const double sync_s = since(t);
    // 6. Metrics (train rank 0 knows them; world rank 0 prints and writes them).
    rec = bcast_json(rec, train_root, world);
    rec["gen_s"] = gen_s;
    rec["gen_compute_s"] = gen_compute_s;
    rec["gen_comm_s"] = gen_comm_s;
    rec["gen_comm_bytes"] = gen_bytes;
    rec["gen_tokens"] = gen_tokens;
    rec["gen_tokens_per_s"] = double(gen_tokens) / std::max(gen_s, 1e-9);
    rec["sync_s"] = sync_s;
    rec["sync_comm_s"] = ss.seconds;  // the sync is communication only
    rec["sync_bytes"] = ss.bytes;
    rec["sync_busbw_GBps"] = ss.busbw_GBps;
    const double step_s = since(t_step);
    rec["step_s"] = step_s;
    rec["elapsed_s"] = since(t_start);
    if (world_rank == 0) {
      LOG0_INFO(
          "step {}/{} | reward {:.3f} | kl {:.4f} | loss {:.4f} | len {:.1f} | gen {:.2f}s (comm "
          "{:.2f}s) | reward {:.2f}s | logprob {:.2f}s (comm {:.2f}s) | train {:.2f}s (comm "
          "{:.2f}s) | sync "
          "{:.2f}s busbw {:.2f} GB/s | {:.0f} gen tok/s | {:.0f} train tok/s",
          step + 1, total_steps, rec["reward_mean"].get<double>(), rec["kl_mean"].get<double>(),
          rec["policy_loss"].get<double>(), rec["response_length_mean"].get<double>(), gen_s,
          gen_comm_s, rec["reward_s"].get<double>(), rec["logprob_s"].get<double>(),
          rec["logprob_comm_s"].get<double>(), rec["train_s"].get<double>(),
          rec["train_comm_s"].get<double>(), sync_s, ss.busbw_GBps,
          rec["gen_tokens_per_s"].get<double>(), rec["train_tokens_per_s"].get<double>());
      metrics->write(rec);
    }
    // 7. Checkpoint.
    if (trains && args.ckpt.save_steps > 0 && (step + 1) % args.ckpt.save_steps == 0) {
      const auto& rmo = trainer->reward_moments();
      const nlohmann::json state = {{"step", step + 1},
                                    {"seed", args.common.seed},
                                    {"kl_coef", trainer->kl_controller().value()},
                                    {"actor_steps", trainer->actor_steps()},
                                    {"critic_steps", trainer->critic_steps()},
                                    {"reward_count", rmo.count},
                                    {"reward_mean", rmo.mean},
                                    {"reward_m2", rmo.m2},
                                    {"prompt_position", (step + 1) * RB},
                                    {"train_ranks", n_train},
                                    {"rng", "counter-based: (seed, prompt position); no state"}};
      const std::string path = checkpoint_path(args.ckpt_path, step + 1);
      save_train_checkpoint(path, slots, state, comm->rank() == 0, int(args.max_ckpt_num));
      LOG0_INFO("checkpoint {}", path);
    }
  }
  if (trains) {
    const std::string path = (std::filesystem::path(args.ckpt.save_path) / "model.h5").string();
    save_model(actor->store(), path, comm->rank(), tokenizer.get());
    LOG0_INFO("done: {} steps in {:.1f}s | policy {} | metrics {}/metrics.jsonl", total_steps,
              since(t_start), path, args.ckpt.save_path);
  }
  MPI_CHECK(MPI_Barrier(world));
  return 0;
}

int run_ppo(const PpoArgs& args) {
  return run_rl(args, "ppo");
}
int run_grpo(const GrpoArgs& args) {
  return run_rl(args, "grpo");
}

}  // namespace rlhf::app

#include "bench/bench_rl.h"

#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "bench/bench_generate.h"
#include "core/error.h"
#include "core/log.h"
#include "io/hdf5_ckpt.h"
#include "io/jsonl.h"
#include "model/flops.h"
#include "model/init.h"
#include "model/layout.h"
#include "parallel/comm.h"
#include "parallel/preemption.h"
#include "rl/rl_run.h"
#include "rl/sft.h"

namespace rlhf::bench {

namespace fs = std::filesystem;

namespace {

// An RL or SFT run of the bench (rl::run_rl, rl::run_sft). A run stopped by SIGTERM or SIGUSR1
// (Slurm's time limit, scancel) has finished its step, written its checkpoint and said so; the
// bench then ends on every rank (all of them get the same status) instead of going on with its
// other runs, each of which would stop after one step. Throws rlhf::Error naming the signal.
template <typename Run, typename Config>
void run_or_stop(const Run& run, const Config& config, const std::string& what) {
  if (run(config) != parallel::kExitPreempted) return;
  RLHF_FAIL("{}: stopped by {}; the benchmark's remaining runs are skipped", what,
            parallel::signal_name(parallel::preemption_signal()));
}

// Removes a folder (rank 0's, the one that made it) when the bench leaves its scope, on an error
// or a signal too: a 135M run leaves GBs of checkpoints behind.
struct RemoveOnExit {
  std::string path;
  bool owner;
  ~RemoveOnExit() {
    std::error_code ec;
    if (owner) fs::remove_all(path, ec);
  }
};

// A folder made on rank 0 and known to every rank.
std::string shared_temp_dir(const std::string& parent, parallel::Comm& comm) {
  std::string path;
  if (comm.rank() == 0) {
    std::string tmpl = (fs::path(parent) / "rlhf_bench_rl_XXXXXX").string();
    RLHF_CHECK(mkdtemp(tmpl.data()) != nullptr, "bench rl: cannot create a folder in {}", parent);
    path = tmpl;
  }
  int64_t n = int64_t(path.size());
  comm.broadcast(&n, 1, 0);
  path.resize(size_t(n));
  comm.broadcast(reinterpret_cast<uint8_t*>(path.data()), n, 0);
  return path;
}

// A randomly initialised model of `cfg` with a scalar reward head, as an rlhf checkpoint.
void write_random_reward_model(const model::ModelConfig& cfg, const std::string& path,
                               uint64_t seed) {
  const model::ParamLayout layout(cfg, model::HeadKind::kReward);
  std::vector<std::vector<float>> units(size_t(layout.num_units()));
  std::vector<const float*> ptrs;
  for (int u = 0; u < layout.num_units(); ++u) {
    units[size_t(u)].assign(size_t(layout.unit(u).numel), 0.0f);
    model::init_unit_params(units[size_t(u)].data(), layout.unit(u), seed);
    ptrs.push_back(units[size_t(u)].data());
  }
  io::CheckpointWriter w(path);
  io::write_model_hdf5(w, layout, ptrs);
  w.commit();
}

// `c` with the byte tokenizer's vocabulary (io/tokenizer.h: ids 0..255 are bytes, 256 = BOS,
// 257 = EOS, 258 = PAD), so that rule rewards can read the completions.
model::ModelConfig with_byte_vocab(model::ModelConfig c) {
  c.vocab_size = 259;
  c.bos_token_id = 256;
  c.eos_token_id = 257;
  c.pad_token_id = 258;
  return c;
}

// The byte-level tiny model of examples/models/tiny.toml (0.77M parameters).
model::ModelConfig tiny_config() {
  model::ModelConfig c;
  c.hidden_size = 128;
  c.intermediate_size = 352;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = true;
  return with_byte_vocab(c);
}

// DAPO's dynamic filtering against the plain step on a task where groups do go all-right or
// all-wrong: the tiny model warm-started by SFT on 1-digit additions, then GRPO with the math
// reward, the same seed with and without --dynamic_filtering. Emits one row per run.
void bench_filtering(const BenchRlOptions& opt, const std::string& dir, parallel::Comm& comm,
                     const Emit& emit) {
  const std::string task = "builtin:addition?n=2000&digits=1&seed=1";
  const std::string config_path = (fs::path(dir) / "tiny.json").string();
  if (comm.rank() == 0) std::ofstream(config_path) << tiny_config().to_json().dump(2) << "\n";
  comm.barrier();
  rl::SftConfig sft;
  sft.model_config = config_path;
  sft.dataset = task;
  sft.data.max_len = 16;
  sft.train.train_batch_size = 32;
  sft.train.micro_train_batch_size = 32 / comm.size();
  sft.train.max_steps = 150;
  sft.train.max_epochs = 100;
  sft.train.adam.lr = 3e-3;
  sft.train.seed = int64_t(opt.seed);
  sft.train.save_path = (fs::path(dir) / "sft").string();
  sft.train.ckpt_path = (fs::path(dir) / "sft" / "checkpoints").string();  // a signal's, not ./ckpt
  sft.train.logging_steps = 1000;
  run_or_stop(rl::run_sft, sft, "bench rl (warm start)");
  for (bool filter : {false, true}) {
    rl::RlRunConfig a;
    a.command = filter ? "bench rl (dynamic filtering)" : "bench rl (plain)";
    a.seed = int64_t(opt.seed);
    a.pretrain = (fs::path(sft.train.save_path) / "model.h5").string();
    a.prompts.prompt_data = task;
    a.prompts.label_key = "label";
    a.reward = "math";
    a.ppo.estimator = rl::AdvantageEstimator::kGroupNorm;
    a.ppo.use_kl_loss = true;
    a.ppo.kl_estimator = rl::KlEstimator::kK3;
    a.ppo.n_samples_per_prompt = 8;
    a.ppo.train_batch_size = 32;
    a.ppo.micro_train_batch_size = 8;
    a.ppo.micro_rollout_batch_size = 8;
    a.step.rollout_batch_size = 16;
    a.step.n_samples_per_prompt = 8;
    a.step.generate_max_len = 8;
    a.step.sampling.seed = opt.seed;
    a.step.dynamic_filtering = filter;
    a.max_steps = opt.filter_steps;
    a.actor_adam.lr = 3e-4;
    a.save_path = (fs::path(dir) / (filter ? "filtered" : "plain")).string();
    a.prompts.save_dir = a.save_path;
    a.ckpt_path = (fs::path(a.save_path) / "checkpoints").string();
    a.logging_steps = opt.filter_steps;
    run_or_stop(rl::run_rl, a, a.command);
    if (comm.rank() != 0) continue;
    const auto recs = io::read_jsonl((fs::path(a.save_path) / "metrics.jsonl").string());
    double step_s = 0, reward_first = 0, reward_last = 0;
    int64_t trained = 0, generated = 0;
    const size_t n = recs.size(), tenth = std::max<size_t>(1, n / 10);
    for (size_t i = 0; i < n; ++i) {
      step_s += recs[i].value("step_s", 0.0);
      trained += recs[i].value("trained_samples", int64_t(0));
      generated += int64_t(8 * recs[i].value("filter_groups_generated", int64_t(16)));
      if (i < tenth) reward_first += recs[i].value("reward_mean", 0.0) / double(tenth);
      if (i + tenth >= n) reward_last += recs[i].value("reward_mean", 0.0) / double(tenth);
    }
    emit({{"bench", "rl_filter"},
          {"dynamic_filtering", filter},
          {"steps", int64_t(n)},
          {"step_s", step_s / double(n)},
          {"samples_generated", generated},
          {"samples_trained", trained},
          {"seconds_per_trained_sample", step_s / double(std::max<int64_t>(trained, 1))},
          {"reward_first_tenth", reward_first},
          {"reward_last_tenth", reward_last}});
  }
}

// Mean of metric `key` over the records of steps 2..N of metrics.jsonl (all with one step).
double mean_after_first(const std::vector<nlohmann::json>& recs, const char* key) {
  const size_t first = recs.size() > 1 ? 1 : 0;
  double s = 0;
  for (size_t i = first; i < recs.size(); ++i) s += recs[i].value(key, 0.0);
  return s / double(std::max<size_t>(recs.size() - first, 1));
}

// The DAPO-style shape of the async comparison: `base` with the byte-level vocabulary (so that
// the math rule scores the completions), no reward model, no reference (β = 0), 1 prompt × 8
// samples × 512 new tokens.
rl::RlRunConfig rule_reward_config(const BenchRlOptions& opt, const rl::RlRunConfig& base,
                                   const std::string& dir, parallel::Comm& comm) {
  model::ModelConfig cfg = with_byte_vocab(opt.config);
  cfg.max_position_embeddings = std::max<int64_t>(cfg.max_position_embeddings, 1024);
  const std::string path = (fs::path(dir) / "config_bytes.json").string();
  if (comm.rank() == 0) std::ofstream(path) << cfg.to_json().dump(2) << "\n";
  comm.barrier();
  rl::RlRunConfig a = base;
  a.model_config = path;
  a.reward_pretrain.clear();
  a.reward = "math";
  a.prompts.label_key = "label";
  a.ppo.init_kl_coef = 0;
  a.ppo.n_samples_per_prompt = 8;
  a.ppo.train_batch_size = 8;
  a.step.rollout_batch_size = 1;
  a.step.n_samples_per_prompt = 8;
  a.step.generate_max_len = 512;
  return a;
}

// A configuration on 1 training + 1 generation rank, synchronous and with --async_train: the
// step time each way (2 ranks only), and the most overlap can give: the synchronous step over
// the longer of its generation and its trainer work.
void bench_async(const BenchRlOptions& opt, const rl::RlRunConfig& base, const char* shape,
                 const std::string& dir, parallel::Comm& comm, const Emit& emit) {
  double step_s[2] = {0, 0}, gen_s = 0, train_s = 0, wait_s = 0;
  for (bool async : {false, true}) {
    rl::RlRunConfig a = base;
    a.command = async ? "bench rl (async)" : "bench rl (sync, disaggregated)";
    a.runtime.gen_ranks_per_node = 1;
    a.step.async_train = async;
    a.step.async_queue_size = 1;
    a.max_steps = opt.async_steps;
    a.save_path = (fs::path(dir) / fmt::format("{}_{}", shape, async ? "async" : "sync")).string();
    a.prompts.save_dir = a.save_path;
    a.ckpt_path = (fs::path(a.save_path) / "checkpoints").string();
    a.logging_steps = opt.async_steps;
    run_or_stop(rl::run_rl, a, a.command);
    if (comm.rank() != 0) continue;
    const auto recs = io::read_jsonl((fs::path(a.save_path) / "metrics.jsonl").string());
    step_s[async] = mean_after_first(recs, "step_s");
    if (async) {
      wait_s = mean_after_first(recs, "async_wait_s");
    } else {
      gen_s = mean_after_first(recs, "gen_s");
      train_s = mean_after_first(recs, "logprob_s") + mean_after_first(recs, "train_s");
    }
  }
  if (comm.rank() == 0) {
    const double trainer_s = step_s[0] - gen_s;  // reward, log-probs, training, weight sync
    emit({{"bench", "rl_async"},
          {"shape", shape},
          {"steps", opt.async_steps},
          {"sync_step_s", step_s[0]},
          {"async_step_s", step_s[1]},
          {"speedup", step_s[0] / std::max(step_s[1], 1e-12)},
          {"speedup_full_overlap", step_s[0] / std::max({gen_s, trainer_s, 1e-12})},
          {"async_wait_s", wait_s},
          {"sync_gen_s", gen_s},
          {"sync_train_s", train_s},
          {"sync_trainer_s", trainer_s}});
  }
}

}  // namespace

void run_bench_rl(const BenchRlOptions& opt, const Emit& emit) {
  const auto comm = parallel::make_comm(MPI_COMM_WORLD, "bench_world");
  const int rank = comm->rank(), world = comm->size();
  // Room for the prompt and every new token (stories15M's shape has 256 positions; the weights
  // are random, so positions past the model's own are as good as any).
  model::ModelConfig cfg = opt.config;
  cfg.max_position_embeddings = std::max(cfg.max_position_embeddings, 16 + opt.new_tokens);
  const std::string dir = shared_temp_dir(opt.work_dir, *comm);
  const RemoveOnExit remove_dir{dir, rank == 0};
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const std::string rm_path = (fs::path(dir) / "reward_model.h5").string();
  if (rank == 0) {
    std::ofstream(config_path) << cfg.to_json().dump(2) << "\n";
    write_random_reward_model(cfg, rm_path, opt.seed + 1);
  }
  comm->barrier();

  // The same run's sgemm reference on the training GEMM shapes of one micro-batch, every rank at
  // once (as in the step), mean over ranks.
  const int64_t T_est = 8 + opt.new_tokens;  // prompt ("12+34=" with BOS) + response
  const double sgemm_local =
      bench_sgemm_model_shapes(cfg, opt.micro_batch * T_est, Emit([](const nlohmann::json&) {}));
  double sgemm = 0;
  comm->all_reduce(&sgemm_local, &sgemm, 1);
  sgemm /= world;
  // The bytes model's bandwidth: the triad on every rank at once, summed (the node's, on one node).
  comm->barrier();
  const double triad_local = bench_triad(int64_t(256) << 20, 5, Emit([](const nlohmann::json&) {}));
  double triad = 0;
  comm->all_reduce(&triad_local, &triad, 1);

  // `rlhf grpo`'s defaults and presets (group_norm advantages, KL as a loss with k3).
  rl::RlRunConfig a;
  a.command = "bench rl";
  a.seed = int64_t(opt.seed);
  a.model_config = config_path;
  a.reward_pretrain = rm_path;
  a.prompts.prompt_data = fmt::format("builtin:addition?n={}&digits=2&seed=1",
                                      std::max<int64_t>(100, opt.prompts_per_step * opt.steps));
  a.prompts.input_key = "input";
  a.ppo.estimator = rl::AdvantageEstimator::kGroupNorm;
  a.ppo.use_kl_loss = true;
  a.ppo.kl_estimator = rl::KlEstimator::kK3;
  a.ppo.n_samples_per_prompt = int(opt.samples_per_prompt);
  a.ppo.train_batch_size = opt.prompts_per_step * opt.samples_per_prompt;
  a.ppo.micro_train_batch_size = opt.micro_batch;
  a.ppo.micro_rollout_batch_size = opt.micro_batch;
  a.step.rollout_batch_size = opt.prompts_per_step;
  a.step.n_samples_per_prompt = opt.samples_per_prompt;
  a.step.generate_max_len = opt.new_tokens;
  a.step.sampling.seed = opt.seed;
  // `rlhf grpo`'s --kv_cache_dtype auto: an fp16 cache on a CPU engine (GPU engines keep bf16).
  a.engine.kv_cache_dtype = rollout::KvDtype::kFloat16;
  a.max_steps = opt.steps;
  a.actor_adam.lr = 1e-5;
  a.critic_adam.lr = 9e-6;
  a.save_path = (fs::path(dir) / "run").string();
  a.prompts.save_dir = a.save_path;
  a.ckpt_path = (fs::path(dir) / "run" / "checkpoints").string();
  LOG0_INFO("bench rl: {} GRPO steps | {} ranks | {} prompts x {} samples x {} new tokens",
            opt.steps, world, opt.prompts_per_step, opt.samples_per_prompt, opt.new_tokens);
  run_or_stop(rl::run_rl, a, a.command);

  if (rank == 0) {
    const auto recs = io::read_jsonl((fs::path(a.save_path) / "metrics.jsonl").string());
    RLHF_CHECK(!recs.empty(), "bench rl: the run wrote no metrics");
    // Mean over steps 2..N (all of them with a single step).
    const size_t first = recs.size() > 1 ? 1 : 0;
    auto mean = [&](const char* key) {
      double s = 0;
      for (size_t i = first; i < recs.size(); ++i) s += recs[i].value(key, 0.0);
      return s / double(recs.size() - first);
    };
    const double B = double(opt.prompts_per_step * opt.samples_per_prompt);
    const double S = mean("train_tokens") / double(a.ppo.max_epochs);  // tokens of all sequences
    const int64_t T = std::max<int64_t>(1, int64_t(S / B + 0.5));
    const double f_fwd = model::forward_flops_per_token(cfg, T);
    const double f_rm = model::forward_flops_per_token(cfg, T, model::HeadKind::kReward);
    const double f_train = model::training_flops_per_token(cfg, T);
    const double ref = a.ppo.init_kl_coef > 0 ? 1.0 : 0.0;
    // The old-log-prob pass is skipped where it equals the update's own (logprob_old_skipped).
    const double old = 1.0 - mean("logprob_old_skipped");
    struct Phase {
      const char* name;
      double seconds, comm_s, flop;
    };
    const std::vector<Phase> phases = {
        {"gen", mean("gen_s"), mean("gen_comm_s"), S * f_fwd},
        {"reward", mean("reward_s"), mean("reward_comm_s"), S * f_rm},
        {"logprob", mean("logprob_s"), mean("logprob_comm_s"), S * f_fwd * (old + ref)},
        {"train", mean("train_s"), mean("train_comm_s"), S * f_train * double(a.ppo.max_epochs)},
        {"sync", mean("sync_s"), mean("sync_comm_s"), 0.0}};
    const double step_s = mean("step_s");
    double flop = 0;
    for (const Phase& p : phases) flop += p.flop;
    for (const Phase& p : phases)
      emit({{"bench", "rl_phase"},
            {"phase", p.name},
            {"seconds", p.seconds},
            {"share", p.seconds / step_s},
            {"comm_s", p.comm_s},
            {"gflops_per_s_per_rank", p.flop / std::max(p.seconds, 1e-12) / 1e9 / world}});
    emit({{"bench", "rl_phase"},
          {"phase", "step"},
          {"seconds", step_s},
          {"share", 1.0},
          {"comm_s", mean("gen_comm_s") + mean("reward_comm_s") + mean("logprob_comm_s") +
                         mean("train_comm_s") + mean("sync_comm_s")},
          {"gflops_per_s_per_rank", flop / step_s / 1e9 / world}});
    // Generation against its bytes model: a decode step reads the weights and the K/V cache; at
    // the triad's bandwidth that takes bytes / triad (docs/benchmarks.md).
    const double dec_s = mean("gen_decode_s"), dec_steps = mean("gen_decode_steps");
    const double dec_bytes = mean("gen_decode_read_bytes");
    const double model_s = dec_bytes / (triad * 1e9);
    emit({{"bench", "rl_decode"},
          {"new_tokens", opt.new_tokens},
          {"decode_steps", dec_steps},
          {"step_ms", dec_s / std::max(dec_steps, 1.0) * 1e3},
          {"read_bytes_per_step", dec_bytes / std::max(dec_steps, 1.0)},
          {"read_GBps", dec_bytes / std::max(dec_s, 1e-12) / 1e9},
          {"triad_GBps", triad},
          {"bytes_model_step_ms", model_s / std::max(dec_steps, 1.0) * 1e3},
          {"ratio_to_bytes_model", dec_s / std::max(model_s, 1e-12)}});
    const double tps_first = recs.front().value("gen_tokens_per_s", 0.0);
    const double tps_last = recs.back().value("gen_tokens_per_s", 0.0);
    emit({{"bench", "rl"},
          {"ranks", world},
          {"model_params", model::ParamLayout(cfg, model::HeadKind::kLM).num_parameters()},
          {"samples", int64_t(B)},
          {"new_tokens", opt.new_tokens},
          {"mean_seq_len", T},
          {"steps", int64_t(recs.size())},
          {"step_s", step_s},
          {"gflop_per_step", flop / 1e9},
          {"gflops_per_s_per_rank", flop / step_s / 1e9 / world},
          {"sgemm_gflops_per_s", sgemm},
          {"ratio_to_sgemm", flop / step_s / 1e9 / world / sgemm},
          {"gen_tokens_per_s_first", tps_first},
          {"gen_tokens_per_s_last", tps_last},
          {"gen_tokens_per_s_ratio", tps_last / std::max(tps_first, 1e-12)}});
  }
  comm->barrier();
  if (opt.filter_steps > 0) bench_filtering(opt, dir, *comm, emit);
  if (opt.async_steps > 0 && world == 2) {
    bench_async(opt, a, "main", dir, *comm, emit);
    bench_async(opt, rule_reward_config(opt, a, dir, *comm), "rule_reward", dir, *comm, emit);
  }
  comm->barrier();  // every rank done with the folder before rank 0 removes it (remove_dir)
}

}  // namespace rlhf::bench

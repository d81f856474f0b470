#include "bench/bench_train.h"

#include <mpi.h>

#include <cblas.h>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/openblas_core.h"
#include "model/flops.h"
#include "model/init.h"
#include "model/op_clock.h"
#include "model/ops/attention_bf16.h"
#include "model/ops/matmul_bf16.h"
#include "parallel/param_store.h"
#include "parallel/train_model.h"
#include "parallel/zero3.h"

namespace rlhf::bench {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

model::ModelConfig stories15m_config() {
  model::ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = 288;
  c.intermediate_size = 768;
  c.num_hidden_layers = 6;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 6;
  c.vocab_size = 32000;
  c.max_position_embeddings = 256;
  c.rope_style = model::RopeStyle::kInterleaved;
  c.tie_word_embeddings = true;
  return c;
}

double bench_sgemm_model_shapes(const model::ModelConfig& cfg, int64_t rows, const Emit& emit) {
  return bench_gemm_model_shapes(cfg, rows, emit, false);
}

double bench_gemm_model_shapes(const model::ModelConfig& cfg, int64_t rows, const Emit& emit,
                               bool bf16) {
  const int64_t C = cfg.hidden_size, F = cfg.intermediate_size, D = cfg.D();
  const int64_t Q = cfg.num_attention_heads * D, KV = cfg.num_key_value_heads * D;
  const int64_t L = cfg.num_hidden_layers;
  // (in, out) -> number of such linears in the model.
  std::map<std::pair<int64_t, int64_t>, int64_t> linears;
  linears[{C, Q}] += L;
  linears[{C, KV}] += 2 * L;
  linears[{Q, C}] += L;
  linears[{C, F}] += 2 * L;
  linears[{F, C}] += L;
  linears[{C, cfg.vocab_size}] += 1;
  double total_flops = 0, total_time = 0;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  for (const auto& [shape, count] : linears) {
    const auto [IC, OC] = shape;
    std::vector<float> x(size_t(rows * IC)), w(size_t(OC * IC)), y(size_t(rows * OC));
    for (auto& v : x) v = d(rng);
    for (auto& v : w) v = d(rng);
    for (auto& v : y) v = d(rng);
    std::vector<model::bfloat16> xb, wb, yb;  // bf16: the operands, rounded once (not timed)
    if (bf16) {
      xb.resize(x.size());
      wb.resize(w.size());
      yb.resize(y.size());
      model::float_to_bf16_n(xb.data(), x.data(), int64_t(x.size()));
      model::float_to_bf16_n(wb.data(), w.data(), int64_t(w.size()));
      model::float_to_bf16_n(yb.data(), y.data(), int64_t(y.size()));
    }
    // The three GEMMs of a linear: forward, dx, dW (same flop count 2·rows·IC·OC each).
    auto run = [&](int which) {
      if (bf16) {  // oneDNN: the bf16 operands, fp32 results
        if (which == 0)
          model::matmul_bf16_cpu(false, true, rows, OC, IC, xb.data(), IC, wb.data(), IC, nullptr,
                                 y.data(), OC, false);
        else if (which == 1)
          model::matmul_bf16_cpu(false, false, rows, IC, OC, yb.data(), OC, wb.data(), IC, nullptr,
                                 x.data(), IC, false);
        else
          model::matmul_bf16_cpu(true, false, OC, IC, rows, yb.data(), OC, xb.data(), IC, nullptr,
                                 w.data(), IC, true);
      } else if (which == 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(OC), int(IC), 1.0f,
                    x.data(), int(IC), w.data(), int(IC), 0.0f, y.data(), int(OC));
      else if (which == 1)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(IC), int(OC), 1.0f,
                    y.data(), int(OC), w.data(), int(IC), 0.0f, x.data(), int(IC));
      else
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(OC), int(IC), int(rows), 1.0f,
                    y.data(), int(OC), x.data(), int(IC), 1.0f, w.data(), int(IC));
    };
    const double flops = 2.0 * double(rows) * double(IC) * double(OC);
    for (int which = 0; which < 3; ++which) {
      run(which);  // warm-up
      const int reps = std::max(2, int(2e9 / flops));
      const auto t0 = Clock::now();
      for (int r = 0; r < reps; ++r) run(which);
      const double t = since(t0) / reps;
      total_flops += flops * double(count);
      total_time += t * double(count);
      static const char* kNames[] = {"forward", "backward_dx", "backward_dw"};
      emit({{"bench", bf16 ? "gemm_bf16" : "sgemm"},
            {"gemm", kNames[which]},
            {"M", which == 2 ? OC : rows},
            {"N", which == 1 ? IC : (which == 0 ? OC : IC)},
            {"K", which == 0 ? IC : (which == 1 ? OC : rows)},
            {"count_per_step", count},
            {"time_us", t * 1e6},
            {"gflops_per_s", flops / t / 1e9}});
    }
  }
  return total_flops / total_time / 1e9;
}

TrainStepTime time_train_steps(parallel::TrainModel& net, const model::ModelConfig& cfg, int64_t T,
                               int64_t seqs, int64_t per_rank, int64_t mb, int64_t warmup,
                               int64_t steps, double lr, uint64_t seed, parallel::Comm& comm,
                               const std::function<void()>& finish_step) {
  std::mt19937_64 rng(seed * 7919 + uint64_t(comm.rank()));
  std::uniform_int_distribution<int32_t> tok(0, int32_t(cfg.vocab_size - 1));
  const int64_t Nt = mb * T;
  std::vector<int32_t> tokens(static_cast<size_t>(Nt)), targets(static_cast<size_t>(Nt));
  std::vector<float> lp(static_cast<size_t>(Nt)),
      dlp(static_cast<size_t>(Nt), -1.0f / float(seqs * T));
  optim::AdamWConfig adam;
  adam.lr = lr;
  std::vector<double> times, comm_times;
  std::vector<std::array<double, 4>> parts;  // gemm, attention, round, optimizer of each step
  const auto op_clocks = [] {
    return std::array<double, 3>{model::op_seconds(model::OpKind::kGemm),
                                 model::op_seconds(model::OpKind::kAttention),
                                 model::op_seconds(model::OpKind::kBf16Round)};
  };
  for (int64_t s = 0; s < warmup + steps; ++s) {
    comm.barrier();
    const double c0 = comm.stats().seconds;
    const std::array<double, 3> o0 = op_clocks();
    const auto t0 = Clock::now();
    net.store().zero_grads();
    for (int64_t m = 0; m < per_rank / mb; ++m) {
      for (auto& t : tokens) t = tok(rng);
      for (int64_t n = 0; n < Nt; ++n)
        targets[size_t(n)] = (n % T == T - 1) ? -1 : tokens[size_t(n + 1)];
      net.forward_lm(tokens.data(), targets.data(), mb, T, lp.data(), nullptr, true);
      net.backward_lm(dlp.data(), nullptr);
    }
    const auto t_opt = Clock::now();
    parallel::clip_and_step(net.store(), adam, adam.lr, s + 1, 1.0);
    const double opt_s = since(t_opt);
    if (finish_step) finish_step();
    if (s >= warmup) {
      times.push_back(since(t0));
      comm_times.push_back(comm.stats().seconds - c0);
      const std::array<double, 3> o1 = op_clocks();
      parts.push_back({o1[0] - o0[0], o1[1] - o0[1], o1[2] - o0[2], opt_s});
    }
  }
  // The slowest rank sets the step time; the median step is reported.
  std::vector<double> tmax(times.size()), cmax(comm_times.size());
  comm.all_reduce(times.data(), tmax.data(), int64_t(times.size()), parallel::ReduceOp::kMax);
  comm.all_reduce(comm_times.data(), cmax.data(), int64_t(cmax.size()), parallel::ReduceOp::kMax);
  std::vector<size_t> idx(tmax.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return tmax[a] < tmax[b]; });
  const size_t med = idx[idx.size() / 2];
  const std::array<double, 4>& p = parts[med];
  return {tmax[med], cmax[med], p[0], p[1], p[2], p[3]};
}

namespace {

// One variant of the training benchmark on `comm`; returns its result row.
nlohmann::json bench_train_variant(const BenchTrainOptions& opt, parallel::Comm& comm,
                                   int zero_stage, double sgemm, bool bf16 = false) {
  const model::ModelConfig& cfg = opt.config;
  const int N = comm.size();
  const int64_t T = opt.seq_len;
  const int64_t seqs = std::max<int64_t>(1, opt.tokens_per_step / T);
  RLHF_CHECK(seqs % N == 0,
             "--tokens_per_step {} / --seq_len {} = {} sequences do not split over {} ranks",
             opt.tokens_per_step, T, seqs, N);
  const int64_t per_rank = seqs / N;
  const int64_t mb = opt.micro_batch > 0 ? std::min(opt.micro_batch, per_rank) : per_rank;
  RLHF_CHECK(per_rank % mb == 0,
             "--micro_train_batch_size {} must divide the {} sequences per rank", mb, per_rank);
  model::ParamLayout layout(cfg, model::HeadKind::kLM);
  std::unique_ptr<parallel::ParamStore> store;
  if (zero_stage == 3 && (N > 1 || opt.adam_offload)) {
    parallel::Zero3Options z;
    z.adam_offload = opt.adam_offload;
    z.bf16_gather = bf16;  // as training runs it: bf16 shards gathered
    store = std::make_unique<parallel::Zero3Store>(layout, comm, z);
  } else if (N > 1) {
    store = std::make_unique<parallel::ReplicatedStore>(layout, comm, bf16);
  } else {
    store = std::make_unique<parallel::LocalParamStore>(layout, bf16);  // bf16: weight copies
  }
  const std::unique_ptr<parallel::TrainModel> net = parallel::make_cpu_train_model(
      std::move(store), opt.gradient_checkpointing, nullptr, parallel::kSweepResidualBytes, bf16);
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<float> full(size_t(layout.unit(u).numel));
    model::init_unit_params(full.data(), layout.unit(u), opt.seed);
    net->store().load_unit(u, full.data());
  }
  const TrainStepTime t = time_train_steps(*net, cfg, T, seqs, per_rank, mb, opt.warmup, opt.steps,
                                           1e-4, opt.seed, comm);
  const double step_s = t.step_s, comm_s = t.comm_s;
  const auto mem = net->store().memory();
  int64_t bytes[3] = {mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes, mem.gather_bytes,
                      net->activation_bytes()};
  int64_t bytes_max[3];
  comm.all_reduce(bytes, bytes_max, 3, parallel::ReduceOp::kMax);
  const double tokens_per_step = double(seqs * T);
  const double gflops = model::training_flops_per_token(cfg, T) * tokens_per_step / step_s / 1e9;
  return {
      {"bench", "train"},
      {"param_dtype", bf16 ? "bf16" : "fp32"},
      // The training attention this step ran (--attn_implementation, model/ops/attention_bf16.h).
      {"attention", bf16 && model::cpu_attention_bf16() ? "onednn_bf16" : "fp32_kernels"},
      {"model_params", layout.num_parameters()},
      {"ranks", N},
      {"zero_stage", zero_stage},
      {"adam_offload", opt.adam_offload},
      {"tokens_per_step", tokens_per_step},
      {"seq_len", T},
      {"micro_batch", mb},
      {"gradient_checkpointing", opt.gradient_checkpointing},
      {"step_s", step_s},
      {"comm_s", comm_s},
      {"comm_share", comm_s / step_s},
      {"gemm_s", t.gemm_s},
      {"attention_s", t.attention_s},
      {"bf16_round_s", t.round_s},
      {"optimizer_s", t.optimizer_s},
      {"other_s", step_s - t.gemm_s - t.attention_s - t.round_s - t.optimizer_s},
      {"tokens_per_s", tokens_per_step / step_s},
      {"flops_per_token", model::training_flops_per_token(cfg, T)},
      {"gflops_per_s", gflops},
      {"gflops_per_s_per_rank", gflops / N},
      {"sgemm_gflops_per_s", sgemm},
      {"ratio_to_sgemm", gflops / N / sgemm},
      {"openblas_core", openblas_core_name()},
      {"sharded_state_bytes_per_rank", bytes_max[0]},
      {"gather_buffer_bytes_per_rank", bytes_max[1]},
      {"activation_bytes_per_rank", bytes_max[2]},
      {"peak_rss_bytes", 0}};
}

}  // namespace

namespace {

// The bf16 training step next to the fp32 one (run_bench_train's bf16 option): the same model and
// batch in bf16, against the same run's oneDNN bf16 matmul on the model's shapes.
void bf16_rows(const BenchTrainOptions& opt, parallel::Comm& comm, const Emit& emit,
               const nlohmann::json& fp32_row, double sgemm, int64_t mb) {
  const double local = bench_gemm_model_shapes(opt.config, mb * opt.seq_len,
                                               comm.rank() == 0 ? emit : Emit([](auto&) {}), true);
  double gemm = 0;
  comm.all_reduce(&local, &gemm, 1);
  gemm /= comm.size();
  auto row = bench_train_variant(opt, comm, opt.zero_stage, sgemm, true);
  const double per_rank = row["gflops_per_s_per_rank"].get<double>();
  row["bf16_gemm_gflops_per_s"] = gemm;
  row["ratio_to_gemm"] = per_rank / gemm;
  row["isa"] = cpu_isa_string(cpu_features());
  row["onednn_impl"] = model::onednn_matmul_impl(true, mb * opt.seq_len, opt.config.hidden_size,
                                                 opt.config.hidden_size);
  row["peak_rss_bytes"] = peak_rss_bytes();
  emit(row);
  emit({{"bench", "train_bf16_vs_fp32"},
        {"ranks", comm.size()},
        {"isa", row["isa"]},
        {"fp32_tokens_per_s", fp32_row["tokens_per_s"]},
        {"bf16_tokens_per_s", row["tokens_per_s"]},
        {"speedup", row["tokens_per_s"].get<double>() / fp32_row["tokens_per_s"].get<double>()},
        {"bf16_gemm_vs_sgemm", gemm / sgemm}});
}

}  // namespace

void run_bench_train(const BenchTrainOptions& opt, parallel::Comm& comm, const Emit& emit) {
  const model::ModelConfig& cfg = opt.config;
  RLHF_CHECK(opt.seq_len <= cfg.max_position_embeddings,
             "--seq_len {} exceeds max_position_embeddings {}", opt.seq_len,
             cfg.max_position_embeddings);
  // The reference: sgemm on the GEMM shapes of one rank's micro-batch, one rank at a time would
  // be unfair to a shared machine; every rank runs it with its own threads, at the same time, as
  // the training step does.
  const int64_t seqs = std::max<int64_t>(1, opt.tokens_per_step / opt.seq_len);
  const int64_t per_rank = std::max<int64_t>(1, seqs / comm.size());
  const int64_t mb = opt.micro_batch > 0 ? std::min(opt.micro_batch, per_rank) : per_rank;
  const double sgemm_local =
      bench_sgemm_model_shapes(cfg, mb * opt.seq_len, comm.rank() == 0 ? emit : Emit([](auto&) {}));
  double sgemm = 0;
  comm.all_reduce(&sgemm_local, &sgemm, 1);
  sgemm /= comm.size();  // mean per-rank sgemm GFLOP/s
  auto row = bench_train_variant(opt, comm, opt.zero_stage, sgemm);
  row["peak_rss_bytes"] = peak_rss_bytes();
  emit(row);
  if (opt.bf16) bf16_rows(opt, comm, emit, row, sgemm, mb);
  if (comm.size() > 1 && opt.compare_zero0 && opt.zero_stage == 3) {
    auto base = bench_train_variant(opt, comm, 0, sgemm);
    emit(base);
    auto b = [](const nlohmann::json& r, const char* k) { return double(r[k].get<int64_t>()); };
    const double z3_state = b(row, "sharded_state_bytes_per_rank");
    const double z0_state = b(base, "sharded_state_bytes_per_rank");
    const double z3_buf = b(row, "gather_buffer_bytes_per_rank");
    const double z0_buf = b(base, "gather_buffer_bytes_per_rank");
    const double z3_act = b(row, "activation_bytes_per_rank");
    const double z0_act = b(base, "activation_bytes_per_rank");
    emit({{"bench", "train_zero3_vs_zero0"},
          {"ranks", comm.size()},
          {"step_time_ratio", row["step_s"].get<double>() / base["step_s"].get<double>()},
          {"sharded_state_ratio", z3_state / z0_state},
          {"state_with_gather_buffers_ratio", (z3_state + z3_buf) / (z0_state + z0_buf)},
          {"total_memory_ratio", (z3_state + z3_buf + z3_act) / (z0_state + z0_buf + z0_act)},
          {"zero3_comm_share", row["comm_share"]},
          {"zero0_comm_share", base["comm_share"]}});
  }
}

}  // namespace rlhf::bench

#include "bench/bench_train.h"

#include <mpi.h>

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "model/flops.h"
#include "model/transformer.h"
#include "parallel/param_store.h"

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
    // The three GEMMs of a linear: forward, dx, dW (same flop count 2·rows·IC·OC each).
    auto run = [&](int which) {
      if (which == 0)
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
      emit({{"bench", "sgemm"},
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

void run_bench_train(const BenchTrainOptions& opt, const Emit& emit) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  RLHF_CHECK(world == 1, "bench train on {} ranks needs the ZeRO-3 trainer (not built yet)", world);
  const model::ModelConfig& cfg = opt.config;
  const int64_t T = opt.seq_len;
  RLHF_CHECK(T <= cfg.max_position_embeddings, "--seq_len {} exceeds max_position_embeddings {}", T,
             cfg.max_position_embeddings);
  const int64_t seqs = std::max<int64_t>(1, opt.tokens_per_step / T);
  const int64_t mb = opt.micro_batch > 0 ? std::min(opt.micro_batch, seqs) : seqs;
  RLHF_CHECK(seqs % mb == 0, "--micro_train_batch_size {} must divide the {} sequences of a step",
             mb, seqs);
  model::ParamLayout layout(cfg, model::HeadKind::kLM, world);
  parallel::LocalParamStore store(layout);
  store.local().init(opt.seed);
  model::Transformer<float> net(layout, opt.gradient_checkpointing);
  std::mt19937_64 rng(opt.seed);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(cfg.vocab_size - 1));
  const int64_t N = mb * T;
  std::vector<int32_t> tokens(static_cast<size_t>(N)), targets(static_cast<size_t>(N));
  std::vector<float> lp(static_cast<size_t>(N)),
      dlp(static_cast<size_t>(N), -1.0f / float(seqs * T));
  optim::AdamWConfig adam;
  adam.lr = 1e-4;

  const double sgemm = bench_sgemm_model_shapes(cfg, N, emit);
  std::vector<double> times;
  for (int64_t s = 0; s < opt.warmup + opt.steps; ++s) {
    const auto t0 = Clock::now();
    store.zero_grads();
    for (int64_t m = 0; m < seqs / mb; ++m) {
      for (auto& t : tokens) t = tok(rng);
      for (int64_t n = 0; n < N; ++n)
        targets[size_t(n)] = (n % T == T - 1) ? -1 : tokens[size_t(n + 1)];
      net.forward_lm(store.provider(), tokens.data(), targets.data(), mb, T, lp.data(), nullptr,
                     true);
      net.backward_lm(store.provider(), dlp.data(), nullptr);
    }
    parallel::clip_and_step(store, adam, adam.lr, s + 1, 1.0);
    if (s >= opt.warmup) times.push_back(since(t0));
  }
  std::sort(times.begin(), times.end());
  const double step_s = times[times.size() / 2];  // median
  const double tokens_per_step = double(seqs * T);
  const double flops = model::training_flops_per_token(cfg, T) * tokens_per_step;
  const double gflops = flops / step_s / 1e9;
  emit({{"bench", "train"},
        {"model_params", layout.num_parameters()},
        {"ranks", world},
        {"zero_stage", opt.zero_stage},
        {"tokens_per_step", tokens_per_step},
        {"seq_len", T},
        {"micro_batch", mb},
        {"gradient_checkpointing", opt.gradient_checkpointing},
        {"step_s", step_s},
        {"tokens_per_s", tokens_per_step / step_s},
        {"flops_per_token", model::training_flops_per_token(cfg, T)},
        {"gflops_per_s", gflops},
        {"sgemm_gflops_per_s", sgemm},
        {"ratio_to_sgemm", gflops / sgemm},
        {"activation_bytes", net.activation_bytes()}});
}

}  // namespace rlhf::bench

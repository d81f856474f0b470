#include "bench/bench_packing.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/init.h"
#include "model/layout.h"
#include "parallel/param_store.h"
#include "parallel/train_model.h"
#include "rl/packing.h"
#include "rl/token_budget.h"

namespace rlhf::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Forward (for backward) and backward of one micro-batch: dlp = 1 on every target.
void train_micro_batch(parallel::TrainModel& m, const std::vector<int32_t>& tokens,
                       const std::vector<int32_t>& targets, int64_t B, int64_t T,
                       model::SeqLens seqs) {
  std::vector<float> lp(size_t(B * T)), dlp(size_t(B * T));
  for (size_t n = 0; n < dlp.size(); ++n) dlp[n] = targets[n] >= 0 ? 1.0f : 0.0f;
  m.forward_lm(tokens.data(), targets.data(), B, T, lp.data(), nullptr, true, 1.0f, seqs);
  m.backward_lm(dlp.data(), nullptr);
}

}  // namespace

void run_bench_packing(const BenchPackingOptions& opt, const Emit& emit) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  // The shape's positions are raised to the longest sample (RoPE tables only: random weights).
  model::ModelConfig cfg = opt.config;
  cfg.max_position_embeddings = std::max(cfg.max_position_embeddings, opt.len_hi);
  RLHF_CHECK(opt.len_lo >= 2 && opt.len_lo <= opt.len_hi,
             "bench packing: lengths [{}, {}] must satisfy 2 <= lo <= hi", opt.len_lo, opt.len_hi);
  const model::ParamLayout layout(cfg, model::HeadKind::kLM);
  auto store = std::make_unique<parallel::LocalParamStore>(layout);
  for (int u = 0; u < layout.num_units(); ++u) {
    std::vector<float> w(size_t(layout.unit(u).numel), 0.0f);
    model::init_unit_params(w.data(), layout.unit(u), opt.seed);
    store->load_unit(u, w.data());
  }
  const auto net = parallel::make_cpu_train_model(std::move(store), false);

  // The global batch: random lengths and tokens; targets are the next tokens.
  std::mt19937_64 rng(opt.seed);
  std::uniform_int_distribution<int64_t> len_d(opt.len_lo, opt.len_hi);
  std::uniform_int_distribution<int32_t> tok_d(0, int32_t(cfg.vocab_size - 1));
  std::vector<int64_t> len(size_t(opt.samples));
  std::vector<std::vector<int32_t>> seq(size_t(opt.samples));
  int64_t real = 0;
  for (int64_t i = 0; i < opt.samples; ++i) {
    len[size_t(i)] = len_d(rng);
    for (int64_t t = 0; t < len[size_t(i)]; ++t) seq[size_t(i)].push_back(tok_d(rng));
    real += len[size_t(i)];
  }
  // A micro-batch [a, b) right-padded: (b − a) rows of the longest.
  struct Padded {
    std::vector<int32_t> tokens, targets;
    int64_t B = 0, T = 0;
  };
  auto padded = [&](int64_t a, int64_t b) {
    Padded p;
    p.B = b - a;
    for (int64_t i = a; i < b; ++i) p.T = std::max(p.T, len[size_t(i)]);
    p.tokens.assign(size_t(p.B * p.T), 0);
    p.targets.assign(size_t(p.B * p.T), -1);
    for (int64_t r = 0; r < p.B; ++r)
      for (int64_t t = 0; t < len[size_t(a + r)]; ++t) {
        p.tokens[size_t(r * p.T + t)] = seq[size_t(a + r)][size_t(t)];
        if (t > 0) p.targets[size_t(r * p.T + t - 1)] = seq[size_t(a + r)][size_t(t)];
      }
    return p;
  };
  const auto padded_runs = rl::count_runs(opt.samples, opt.micro_batch);
  const int64_t budget = opt.token_budget > 0 ? opt.token_budget : opt.micro_batch * opt.len_hi;
  const auto packed_runs = rl::token_budget_runs(len, budget, 1, /*packed=*/true);
  std::vector<Padded> pad_mb, pack_src;
  std::vector<rl::PackedRows> pack_mb;
  int64_t padded_tokens = 0;
  for (const auto& [a, b] : padded_runs) {
    pad_mb.push_back(padded(a, b));
    padded_tokens += pad_mb.back().B * pad_mb.back().T;
  }
  for (const auto& [a, b] : packed_runs) {
    const Padded p = padded(a, b);
    const std::vector<int64_t> l(len.begin() + a, len.begin() + b);
    pack_mb.push_back(rl::pack_rows(p.tokens.data(), p.targets.data(), p.B, p.T, l));
  }
  // Seconds per pass over the global batch: one warm-up pass, then the mean of opt.steps.
  auto time_passes = [&](bool packed) {
    double total = 0;
    for (int64_t s = 0; s <= opt.steps; ++s) {
      net->store().zero_grads();
      const auto t0 = Clock::now();
      if (packed)
        for (const rl::PackedRows& p : pack_mb)
          train_micro_batch(*net, p.tokens, p.targets, 1, p.T, p.seqs());
      else
        for (const Padded& p : pad_mb) train_micro_batch(*net, p.tokens, p.targets, p.B, p.T, {});
      if (s > 0) total += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    return total / double(opt.steps);
  };
  const double padded_s = time_passes(false), packed_s = time_passes(true);
  emit({{"bench", "packing"},
        {"samples", opt.samples},
        {"len_lo", opt.len_lo},
        {"len_hi", opt.len_hi},
        {"real_tokens", real},
        {"padded_micro_batches", int64_t(padded_runs.size())},
        {"padded_tokens", padded_tokens},
        {"padded_s", padded_s},
        {"padded_tokens_per_s", double(real) / padded_s},
        {"packed_micro_batches", int64_t(packed_runs.size())},
        {"packed_budget", budget},
        {"packed_s", packed_s},
        {"packed_tokens_per_s", double(real) / packed_s},
        {"speedup", padded_s / packed_s}});
}

}  // namespace rlhf::bench

#include "bench/bench_partial.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "model/init.h"
#include "rl/partial_rollout.h"
#include "rollout/engine.h"

namespace rlhf::bench {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Prompt k of the stream: random ordinary tokens; every `samples`-th one is the straggler,
// marked by token 1 at position 1 (max_new reads the mark).
std::vector<int32_t> prompt_of(const BenchPartialOptions& o, int64_t k) {
  std::vector<int32_t> p(size_t(o.prompt_len));
  uint64_t x = o.seed * 0x9E3779B97F4A7C15ull + uint64_t(k) * 0xBF58476D1CE4E5B9ull;
  for (auto& t : p) {
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    t = int32_t(2 + x % uint64_t(o.config.vocab_size - 2));
  }
  p[1] = k % o.samples == 0 ? 1 : 2;
  return p;
}

}  // namespace

void run_bench_partial(const BenchPartialOptions& opt, const Emit& emit) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  RLHF_CHECK(opt.samples >= 2 && opt.short_tokens >= 2 && opt.long_factor >= 1 &&
                 opt.prompt_len >= 2 && opt.steps >= 2,
             "bench partial: bad shape");
  const int64_t long_tokens = opt.short_tokens * opt.long_factor;
  model::ModelConfig cfg = opt.config;  // positions raised to the straggler (RoPE tables only)
  cfg.max_position_embeddings = std::max(cfg.max_position_embeddings, opt.prompt_len + long_tokens);
  const model::ParamLayout layout(cfg, model::HeadKind::kLM);
  rollout::EngineOptions eo;
  eo.ignore_eos = true;
  eo.kv_cache_bytes = int64_t(2) << 30;
  rollout::Engine engine(layout, eo);
  for (int u = 0; u < layout.num_units(); ++u)
    model::init_unit_params(engine.unit_buffer(u), layout.unit(u), opt.seed);
  const auto max_new = [&](const std::vector<int32_t>& p) {
    return p[1] == 1 ? long_tokens : opt.short_tokens;
  };
  rollout::SamplingParams sp;
  sp.seed = opt.seed;
  sp.temperature = 1.0;

  // Synchronous: the step's groups generated to the end (the straggler holds the step).
  double sync_s = 0;
  int64_t sync_tokens = 0;
  for (int64_t s = 0; s < opt.sync_steps; ++s) {
    std::vector<rollout::GenerationRequest> reqs;
    for (int64_t i = 0; i < opt.samples; ++i) {
      rollout::GenerationRequest r;
      r.id = uint64_t(s * opt.samples + i);
      r.prompt = prompt_of(opt, s * opt.samples + i);
      r.max_new_tokens = max_new(r.prompt);
      r.sampling = sp;
      reqs.push_back(std::move(r));
    }
    const auto t = Clock::now();
    engine.generate(reqs);
    sync_s += since(t);
    sync_tokens += engine.stats().generated_tokens;
  }
  sync_s /= double(opt.sync_steps);

  // Partial: the pool topped up each step, one round to the quota, the step's groups taken.
  rl::PartialPool pool(1, opt.max_staleness);
  double partial_s = 0;
  int64_t carried = 0, interrupted = 0, dropped = 0, partial_tokens = 0;
  for (int64_t step = 0; step < opt.steps; ++step) {
    const auto t = Clock::now();
    dropped += pool.drop_stale(step);
    std::vector<int64_t> pos;
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t k = pool.fresh_needed(opt.samples); k > 0; --k, ++pool.drawn) {
      pos.push_back(pool.drawn);
      prompts.push_back(prompt_of(opt, pool.drawn));
    }
    pool.add_fresh(pos, prompts);
    int64_t tokens = 0;
    while (pool.complete_groups() < opt.samples) {
      const std::vector<int64_t> pending = pool.pending_groups();
      auto reqs = pool.requests(pending, 0, 1, sp, max_new);
      auto res = engine.generate(reqs, {}, nullptr, opt.samples - pool.complete_groups());
      tokens += engine.stats().generated_tokens;
      const int64_t cut = pool.merge(pool.to_samples(reqs, std::move(res), pending, step), pending);
      if (step > 0) interrupted += cut;
    }
    rl::PartialStats st;
    (void)pool.take(opt.samples, step, st);
    const double s = since(t);
    if (step > 0) {
      partial_s += s;
      carried += st.carried;
      partial_tokens += tokens;
    }
    LOG_DEBUG("bench partial: step {} {:.3f}s | {} carried | age max {}", step + 1, s, st.carried,
              st.age_max);
  }
  const double n = double(opt.steps - 1);
  partial_s /= n;
  emit({{"bench", "partial"},
        {"samples", opt.samples},
        {"short_tokens", opt.short_tokens},
        {"long_tokens", long_tokens},
        {"sync_step_s", sync_s},
        {"partial_step_s", partial_s},
        {"ratio", partial_s / sync_s},
        {"carried_mean", double(carried) / n},
        {"interrupted_mean", double(interrupted) / n},
        {"dropped", dropped},
        {"gen_tokens_sync", sync_tokens / opt.sync_steps},
        {"gen_tokens_partial", int64_t(double(partial_tokens) / n)}});
}

}  // namespace rlhf::bench

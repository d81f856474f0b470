#include "bench/bench_partial.h"

#include <mpi.h>
#include <sys/resource.h>

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

// CPU seconds of the whole process (every thread), user + system.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double median(std::vector<double> v) {
  RLHF_CHECK(!v.empty(), "bench partial: no timed step");
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// GPU engines: the device copies of the weights stay current from now on, as after the RL loop's
// device weight sync (rl_run.cpp), so that a timed generate() does not upload the host weights
// again (at 135M that upload is ~0.25 s, once per call, on either side of the ratio).
void mark_weights_on_device(std::unique_ptr<rollout::Engine> (&engines)[3]) {
#ifdef RLHF_CUDA
  for (auto& e : engines)
    if (e->options().cuda) e->device_weights_updated();
#else
  (void)engines;
#endif
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
  eo.cuda = opt.cuda;
  eo.gpu_memory_utilization = 0.25;  // a quarter of the device each: the three fit side by side
  // Three engines with the same weights: partial steps keeping the interrupted samples' KV,
  // partial steps prefilling them again, and synchronous steps (a generate() call on an engine
  // that kept samples would free them).
  std::unique_ptr<rollout::Engine> engines[3];
  for (int i = 0; i < 3; ++i) {
    eo.keep_interrupted_kv = i == 0;
    engines[i] = std::make_unique<rollout::Engine>(layout, eo);
    for (int u = 0; u < layout.num_units(); ++u)
      model::init_unit_params(engines[i]->unit_buffer(u), layout.unit(u), opt.seed);
  }
  rollout::Engine& engine = *engines[2];
  const auto max_new = [&](const std::vector<int32_t>& p) {
    return p[1] == 1 ? long_tokens : opt.short_tokens;
  };
  rollout::SamplingParams sp;
  sp.seed = opt.seed;
  sp.temperature = 1.0;

  // Steps alternate — a partial-rollout step of each kind, then (from the second on) a
  // synchronous one — so that a shared machine's load weighs on all alike; each side's median is
  // reported, in wall time and in process CPU time.
  struct Side {  // one kind of partial step: its pool and what its steps measured
    explicit Side(int64_t max_staleness) : pool(1, max_staleness) {}
    rl::PartialPool pool;
    std::vector<double> wall, cpu;
    double prefill_s = 0;
    int64_t carried = 0, interrupted = 0, dropped = 0, tokens = 0, prefill_tokens = 0;
    int64_t resumed = 0;
  };
  Side sides[2] = {Side(opt.max_staleness), Side(opt.max_staleness)};
  std::vector<double> sync_wall, sync_cpu, sync_tail;
  double sync_prefill_s = 0;
  int64_t sync_tokens = 0;
  int64_t decode_steps = 0, device_sampled_steps = 0;  // every generate() call's
  const auto count_steps = [&](const rollout::EngineStats& s) {
    decode_steps += s.decode_steps;
    device_sampled_steps += s.device_sampled_steps;
  };
  // Partial: the pool topped up, one round to the quota, the step's groups taken.
  const auto partial_step = [&](rollout::Engine& e, Side& side, int64_t step) {
    rl::PartialPool& pool = side.pool;
    const auto t = Clock::now();
    const double c = cpu_seconds();
    const int64_t dropped = pool.drop_stale(step);
    std::vector<int64_t> pos;
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t k = pool.fresh_needed(opt.samples); k > 0; --k, ++pool.drawn) {
      pos.push_back(pool.drawn);
      prompts.push_back(prompt_of(opt, pool.drawn));
    }
    pool.add_fresh(pos, prompts);
    int64_t tokens = 0, prefill_tokens = 0, cut = 0, resumed = 0;
    double prefill_s = 0;
    while (pool.complete_groups() < opt.samples) {
      pool.deal(1);
      const std::vector<int64_t> pending = pool.pending_groups();
      auto reqs = pool.requests(pending, 0, sp, max_new);
      auto res = e.generate(reqs, {}, nullptr, opt.samples - pool.complete_groups());
      tokens += e.stats().generated_tokens;
      count_steps(e.stats());
      prefill_tokens += e.stats().prefill_tokens;
      prefill_s += e.stats().prefill_s;
      resumed += e.stats().resumed;
      cut += pool.merge(pool.to_samples(reqs, std::move(res), pending, step), pending);
    }
    rl::PartialStats st;
    (void)pool.take(opt.samples, step, st);
    const double wall = since(t), cpu = cpu_seconds() - c;
    LOG_DEBUG("bench partial: step {} {:.3f}s | {} carried | age max {} | {} resumed", step + 1,
              wall, st.carried, st.age_max, resumed);
    if (step == 0) return;  // nothing carried yet
    side.wall.push_back(wall);
    side.cpu.push_back(cpu);
    side.carried += st.carried;
    side.interrupted += cut;
    side.dropped += dropped;
    side.tokens += tokens;
    side.prefill_tokens += prefill_tokens;
    side.prefill_s += prefill_s;
    side.resumed += resumed;
  };
  for (int64_t step = 0; step < opt.steps; ++step) {
    partial_step(*engines[0], sides[0], step);
    partial_step(*engines[1], sides[1], step);
    // Synchronous: the same shape of step generated to the end (the straggler holds it).
    std::vector<rollout::GenerationRequest> reqs;
    for (int64_t i = 0; i < opt.samples; ++i) {
      rollout::GenerationRequest r;
      const int64_t k = (1 << 20) + step * opt.samples + i;  // prompts apart from the pool's
      r.id = uint64_t(k);
      r.prompt = prompt_of(opt, k);  // the straggler is i = 0
      r.max_new_tokens = max_new(r.prompt);
      r.sampling = sp;
      reqs.push_back(std::move(r));
    }
    const auto t = Clock::now();
    const double c = cpu_seconds();
    // When every sample but the straggler has finished: the rest of the step is its tail.
    Clock::time_point others_done = Clock::now();
    bool seen = false;
    const rollout::ProgressFn progress = [&](const rollout::EngineStats&, int64_t done,
                                             int64_t total) {
      if (!seen && done >= total - 1) {
        others_done = Clock::now();
        seen = true;
      }
    };
    engine.generate(reqs, progress);
    if (step == 0) {  // the untimed first step: the GPU engines' weights uploaded, graphs captured
      mark_weights_on_device(engines);
      continue;
    }
    sync_tail.push_back(std::chrono::duration<double>(Clock::now() - others_done).count());
    sync_wall.push_back(since(t));
    sync_cpu.push_back(cpu_seconds() - c);
    sync_tokens += engine.stats().generated_tokens;
    count_steps(engine.stats());
    sync_prefill_s += engine.stats().prefill_s;
  }
  const double n = double(opt.steps - 1);
  const double sw = median(sync_wall), sc = median(sync_cpu);
  const Side& keep = sides[0];
  const Side& re = sides[1];
  const double pw = median(keep.wall), pc = median(keep.cpu), rw = median(re.wall);
  emit({{"bench", "partial"},
        {"device", opt.cuda ? "cuda" : "cpu"},
        {"samples", opt.samples},
        {"short_tokens", opt.short_tokens},
        {"long_tokens", long_tokens},
        {"steps", opt.steps - 1},
        {"sync_step_s", sw},
        {"partial_step_s", pw},
        {"ratio", pw / sw},
        {"partial_recompute_step_s", rw},
        {"ratio_recompute", rw / sw},
        {"sync_tail_s", median(sync_tail)},
        {"ratio_no_tail", (sw - median(sync_tail)) / sw},
        {"sync_step_cpu_s", sc},
        {"partial_step_cpu_s", pc},
        {"ratio_cpu", pc / sc},
        {"ratio_recompute_cpu", median(re.cpu) / sc},
        {"sync_prefill_s", sync_prefill_s / n},
        {"partial_prefill_s", keep.prefill_s / n},
        {"partial_prefill_tokens", int64_t(double(keep.prefill_tokens) / n)},
        {"partial_kv_resumed_mean", double(keep.resumed) / n},
        {"partial_recompute_prefill_s", re.prefill_s / n},
        {"partial_recompute_prefill_tokens", int64_t(double(re.prefill_tokens) / n)},
        {"carried_mean", double(keep.carried) / n},
        {"interrupted_mean", double(keep.interrupted) / n},
        {"dropped", keep.dropped},
        {"gen_tokens_sync", int64_t(double(sync_tokens) / n)},
        {"gen_tokens_partial", int64_t(double(keep.tokens) / n)},
        {"device_sampled_share",
         decode_steps > 0 ? double(device_sampled_steps) / double(decode_steps) : 0.0}});
}

}  // namespace rlhf::bench

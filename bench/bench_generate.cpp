#include "bench/bench_generate.h"

#include <mpi.h>
#include <omp.h>

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "io/model_source.h"
#include "model/init.h"
#include "model/ops/attention_decode.h"
#include "model/ops/half.h"
#include "model/ops/linear_decode.h"
#include "rollout/engine.h"

namespace rlhf::bench {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Multiply-adds of the linears of one decode token: (in, out) → count.
std::map<std::pair<int64_t, int64_t>, int64_t> decode_linears(const model::ModelConfig& cfg) {
  const int64_t C = cfg.hidden_size, F = cfg.intermediate_size, D = cfg.D();
  const int64_t Q = cfg.num_attention_heads * D, KV = cfg.num_key_value_heads * D;
  const int64_t L = cfg.num_hidden_layers;
  std::map<std::pair<int64_t, int64_t>, int64_t> m;
  m[{C, Q}] += L;
  m[{C, KV}] += 2 * L;
  m[{Q, C}] += L;
  m[{C, F}] += 2 * L;
  m[{F, C}] += L;
  m[{C, cfg.vocab_size}] += 1;
  return m;
}

}  // namespace

double bench_triad(int64_t bytes_per_array, int reps, const Emit& emit) {
  const int64_t n = bytes_per_array / int64_t(sizeof(float));
  RLHF_CHECK(n > 0 && reps >= 1, "bench_triad: bad size {} or reps {}", bytes_per_array, reps);
  std::unique_ptr<float[]> a(new float[size_t(n)]), b(new float[size_t(n)]),
      c(new float[size_t(n)]);
  float* pa = a.get();
  float* pb = b.get();
  float* pc = c.get();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {  // first touch by the threads that use the pages
    pa[i] = 0.0f;
    pb[i] = 1.0f;
    pc[i] = 2.0f;
  }
  const float s = 3.0f;
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r <= reps; ++r) {  // pass 0 is untimed
    const auto t0 = Clock::now();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
    const double t = since(t0);
    if (r > 0) best = std::min(best, t);
  }
  RLHF_ASSERT(pa[0] == 7.0f && pa[n - 1] == 7.0f);
  const double gbps = 3.0 * double(n) * sizeof(float) / best / 1e9;
  emit({{"bench", "triad"},
        {"bytes_per_array", n * int64_t(sizeof(float))},
        {"threads", omp_get_max_threads()},
        {"time_ms", best * 1e3},
        {"GBps", gbps}});
  return gbps;
}

double bench_sgemm_decode_shapes(const model::ModelConfig& cfg, int64_t rows, const Emit& emit,
                                 double* decode_kernel_gflops) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  double flops_total = 0, t_sgemm = 0, t_kernel = 0;
  for (const auto& [shape, count] : decode_linears(cfg)) {
    const auto [IC, OC] = shape;
    std::vector<float> x(size_t(rows * IC)), w(size_t(OC * IC)), y(size_t(rows * OC));
    for (auto& v : x) v = d(rng);
    for (auto& v : w) v = d(rng);
    const double flops = 2.0 * double(rows) * double(IC) * double(OC);
    const int reps = std::max(3, int(2e8 / flops));
    auto best_of = [&](auto&& f) {
      f();  // warm-up
      double best = std::numeric_limits<double>::infinity();
      for (int trial = 0; trial < 3; ++trial) {
        const auto t0 = Clock::now();
        for (int r = 0; r < reps; ++r) f();
        best = std::min(best, since(t0) / reps);
      }
      return best;
    };
    const double ts = best_of([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(OC), int(IC), 1.0f,
                  x.data(), int(IC), w.data(), int(IC), 0.0f, y.data(), int(OC));
    });
    // The engine's decode kernel: packed weights (packing is done once per generate(), untimed).
    std::vector<float> wp(size_t(model::linear_decode_packed_size(IC, OC)));
    model::linear_decode_pack(wp.data(), w.data(), IC, OC);
    const double tk = best_of([&] {
      model::linear_decode_packed_cpu(y.data(), x.data(), wp.data(), nullptr, rows, IC, OC);
    });
    flops_total += flops * double(count);
    t_sgemm += ts * double(count);
    t_kernel += tk * double(count);
    emit({{"bench", "decode_gemm"},
          {"M", rows},
          {"IC", IC},
          {"OC", OC},
          {"count_per_step", count},
          {"sgemm_us", ts * 1e6},
          {"sgemm_gflops_per_s", flops / ts / 1e9},
          {"decode_kernel_us", tk * 1e6},
          {"decode_kernel_gflops_per_s", flops / tk / 1e9},
          {"decode_kernel_weight_GBps", double(IC * OC) * sizeof(float) / tk / 1e9}});
  }
  const double sgemm = flops_total / t_sgemm / 1e9;
  if (decode_kernel_gflops) *decode_kernel_gflops = flops_total / t_kernel / 1e9;
  emit({{"bench", "decode_gemm_total"},
        {"M", rows},
        {"sgemm_gflops_per_s", sgemm},
        {"decode_kernel_gflops_per_s", flops_total / t_kernel / 1e9}});
  return sgemm;
}

double bench_attention_decode(const model::ModelConfig& cfg, int64_t batch, int64_t positions,
                              int64_t block_size, const Emit& emit) {
  const int64_t L = cfg.num_hidden_layers, H = cfg.num_attention_heads;
  const int64_t Hkv = cfg.num_key_value_heads, D = cfg.D();
  RLHF_CHECK(batch >= 1 && positions >= 1 && block_size >= 1,
             "bench_attention_decode: bad batch {}, positions {} or block size {}", batch,
             positions, block_size);
  const int64_t max_blocks = (positions + block_size - 1) / block_size;
  const int64_t num_blocks = batch * max_blocks, layer = num_blocks * Hkv * block_size * D;
  // Every layer's K and V, as an engine holds them; blocks handed out in a shuffled order (an
  // engine's sequences grow together, so one sequence's blocks are scattered).
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<model::f16> k(static_cast<size_t>(L * layer)), v(k.size());
  for (auto& x : k) x = model::float_to_f16(d(rng));
  for (auto& x : v) x = model::float_to_f16(d(rng));
  std::vector<int32_t> table(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) table[size_t(i)] = int32_t(i);
  std::shuffle(table.begin(), table.end(), rng);
  const std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(positions));
  std::vector<float> q(size_t(batch * H * D)), out(q.size());
  for (auto& x : q) x = d(rng);
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r <= 5; ++r) {  // pass 0 is untimed
    const auto t0 = Clock::now();
    for (int64_t l = 0; l < L; ++l)
      model::attention_decode_cpu(out.data(), q.data(), k.data() + l * layer, v.data() + l * layer,
                                  table.data(), lens.data(), batch, H, Hkv, D, num_blocks,
                                  block_size, max_blocks);
    if (r > 0) best = std::min(best, since(t0));
  }
  const double bytes = 2.0 * double(L * batch * positions * Hkv * D) * sizeof(model::f16);
  const double gbps = bytes / best / 1e9;
  emit({{"bench", "attention_decode"},
        {"batch", batch},
        {"positions", positions},
        {"block_size", block_size},
        {"kv_cache_dtype", "fp16"},
        {"step_ms", best * 1e3},
        {"kv_bytes_per_step", bytes},
        {"GBps", gbps},
        {"threads", omp_get_max_threads()}});
  return gbps;
}

void run_bench_generate(const BenchGenerateOptions& opt, const Emit& emit) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  RLHF_CHECK(world == 1,
             "bench generate runs on one rank (the engine's tensor parallelism and "
             "placement need the topology, issues 3/4); got {}",
             world);
  RLHF_CHECK(opt.prompt_len >= 1 && opt.new_tokens >= 1 && opt.long_batch >= 1 &&
                 opt.long_min_new_tokens >= 1 && opt.long_new_tokens >= opt.long_min_new_tokens,
             "bench generate: bad lengths");
  model::ModelConfig cfg = opt.config;
  const int64_t longest = std::max(opt.new_tokens, opt.long_requests > 0 || opt.long_fixed_batch > 0
                                                       ? opt.long_new_tokens
                                                       : int64_t(0));
  io::ModelSource src;
  if (!opt.pretrain.empty()) {
    src = io::resolve_model_source("", opt.pretrain, "", model::HeadKind::kLM);
    cfg = src.config;
    RLHF_CHECK(opt.prompt_len + longest <= cfg.max_position_embeddings,
               "bench generate --pretrain {}: {} prompt + {} new tokens pass its "
               "max_position_embeddings {}\nhint: --gen_long_requests 0 --gen_long_fixed_batch 0 "
               "skip the long runs",
               opt.pretrain, opt.prompt_len, longest, cfg.max_position_embeddings);
  }
  cfg.max_position_embeddings = std::max(cfg.max_position_embeddings, opt.prompt_len + longest);
  const model::ParamLayout layout(cfg, model::HeadKind::kLM);
  const int64_t L = cfg.num_hidden_layers, H = cfg.num_attention_heads, D = cfg.D();

  const double triad = bench_triad(opt.triad_mb << 20, 5, emit);
  double kernel_gflops = 0;
  const int64_t gemm_rows = std::max<int64_t>(
      opt.long_batch,
      opt.batches.empty() ? 1 : *std::max_element(opt.batches.begin(), opt.batches.end()));
  const double sgemm = bench_sgemm_decode_shapes(cfg, gemm_rows, emit, &kernel_gflops);

  // One engine for every run: slots and KV blocks for the largest batch at the longest length.
  const int64_t max_batch = gemm_rows;
  rollout::EngineOptions eo;
  eo.max_batch = max_batch;
  eo.ignore_eos = true;
  eo.kv_cache_dtype = opt.kv_dtype;
  eo.block_size = opt.block_size;
  const int64_t block_size = eo.resolved_block_size();  // what the engine will use
  if (opt.long_fixed_batch > 0) {
    // Decode attention alone at the long run's mean context, in 16-position blocks (a GPU
    // engine's, vLLM's) and in the engine's: what the block size is worth.
    const int64_t ctx = opt.prompt_len + opt.long_new_tokens / 2;
    const double g16 = bench_attention_decode(cfg, opt.long_fixed_batch, ctx, 16, emit);
    const double g = bench_attention_decode(cfg, opt.long_fixed_batch, ctx, block_size, emit);
    LOG0_INFO(
        "attention decode fp16 batch {} x {} positions: {:.1f} GB/s in 16-position blocks, {:.1f} "
        "GB/s in {}-position blocks ({:.2f}x)",
        opt.long_fixed_batch, ctx, g16, g, block_size, g / g16);
  }
  {
    const rollout::KvCache probe(cfg, int64_t(1) << 30, block_size,
                                 rollout::kv_element_bytes(opt.kv_dtype));
    eo.kv_cache_bytes =
        max_batch * probe.blocks_for(opt.prompt_len + longest) * probe.bytes_per_block();
  }
  rollout::Engine engine(layout, eo);
  if (src.pretrained)
    io::load_model_weights(src, layout, engine.unit_buffers());
  else
    for (int u = 0; u < layout.num_units(); ++u)
      model::init_unit_params(engine.unit_buffer(u), layout.unit(u), opt.seed);
  // An engine with other options and the same weights.
  auto engine_like = [&](const rollout::EngineOptions& o) {
    auto e = std::make_unique<rollout::Engine>(layout, o);
    for (int u = 0; u < layout.num_units(); ++u)
      std::copy_n(engine.unit_buffer(u), layout.unit(u).numel, e->unit_buffer(u));
    return e;
  };
  const double W = double(engine.weight_bytes_per_decode_step());
  int64_t matmul_macs = 0;
  for (const auto& [shape, count] : decode_linears(cfg))
    matmul_macs += shape.first * shape.second * count;

  std::mt19937_64 rng(opt.seed);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(cfg.vocab_size - 1));
  auto request = [&](uint64_t id, int64_t max_new) {
    rollout::GenerationRequest r;
    r.id = id;
    r.prompt.resize(size_t(opt.prompt_len));
    for (auto& t : r.prompt) t = tok(rng);
    r.max_new_tokens = max_new;
    r.sampling.temperature = 1.0;
    r.sampling.seed = opt.seed;
    return r;
  };
  auto report = [&](const char* kind, int64_t batch, int64_t requests, int64_t new_tokens,
                    const rollout::EngineStats& st, double extra_ratio, const rollout::Engine& eng,
                    double fp32_ratio = 0) {
    const double steps = double(st.decode_steps);
    const double ctx = st.kv_bytes_read / double(eng.kv_cache().bytes_per_token());
    const double flops =
        2.0 * double(matmul_macs) * double(st.decode_tokens) + 4.0 * double(L * H * D) * ctx;
    const double read_gbps = (W * steps + st.kv_bytes_read) / st.decode_s / 1e9;
    const double weight_gbps = W * steps / st.decode_s / 1e9;
    const double gflops = flops / st.decode_s / 1e9;
    const double tok_s = double(st.generated_tokens) / st.total_s;
    nlohmann::json row = {{"bench", "generate"},
                          {"run", kind},
                          {"batch", batch},
                          {"requests", requests},
                          {"prompt_len", opt.prompt_len},
                          {"new_tokens", new_tokens},
                          {"generated_tokens", st.generated_tokens},
                          {"tokens_per_s", tok_s},
                          {"decode_tokens_per_s", double(st.decode_tokens) / st.decode_s},
                          {"decode_steps", st.decode_steps},
                          {"mean_batch", st.mean_active_batch()},
                          {"step_ms", st.decode_s / steps * 1e3},
                          {"prefill_s", st.prefill_s},
                          {"decode_s", st.decode_s},
                          {"total_s", st.total_s},
                          {"weight_bytes_per_step", W},
                          {"kv_bytes_per_step", st.kv_bytes_read / steps},
                          {"weight_read_GBps", weight_gbps},
                          {"read_GBps", read_gbps},
                          {"triad_GBps", triad},
                          {"weight_ratio_to_triad", weight_gbps / triad},
                          {"ratio_to_triad", read_gbps / triad},
                          {"decode_gflops_per_s", gflops},
                          {"sgemm_gflops_per_s", sgemm},
                          {"decode_kernel_gflops_per_s", kernel_gflops},
                          {"ratio_to_sgemm", gflops / sgemm},
                          {"threads", omp_get_max_threads()},
                          {"kv_cache_dtype", rollout::to_string(eng.kv_cache().dtype())}};
    if (extra_ratio > 0) row["ratio_to_fixed"] = extra_ratio;
    if (fp32_ratio > 0) row["ratio_to_fp32"] = fp32_ratio;
    emit(row);
    LOG0_INFO(
        "generate {} {} batch {:>3} x {:>4}: {:>7.0f} tok/s ({:.0f} decode) | step {:.2f} ms, mean "
        "batch {:.1f} | read {:.1f} GB/s = {:.0f}% of triad {:.1f} (weights {:.0f}%) | {:.1f} "
        "GFLOP/s = {:.0f}% of sgemm {:.1f}{}{}",
        kind, rollout::to_string(eng.kv_cache().dtype()), batch, new_tokens, tok_s,
        double(st.decode_tokens) / st.decode_s, st.decode_s / steps * 1e3, st.mean_active_batch(),
        read_gbps, 100 * read_gbps / triad, triad, 100 * weight_gbps / triad, gflops,
        100 * gflops / sgemm, sgemm,
        extra_ratio > 0 ? fmt::format(" | {:.0f}% of the fixed run's tok/s", 100 * extra_ratio)
                        : std::string(),
        fp32_ratio > 0 ? fmt::format(" | {:.2f}x the fp32 cache", fp32_ratio) : std::string());
  };

  double fixed_at_long_batch = 0;
  for (int64_t B : opt.batches) {
    std::vector<rollout::GenerationRequest> reqs;
    for (int64_t i = 0; i < B; ++i) reqs.push_back(request(uint64_t(i), opt.new_tokens));
    engine.generate(reqs);  // warm-up: pages, caches, thread pool
    rollout::EngineStats st;
    for (int rep = 0; rep < opt.repeats; ++rep) {  // the fastest of the repeats: the machine is
      engine.generate(reqs);                       // shared, interference only ever slows a run
      if (rep == 0 || engine.stats().total_s < st.total_s) st = engine.stats();
    }
    if (B == opt.long_batch) fixed_at_long_batch = double(st.generated_tokens) / st.total_s;
    report("fixed", B, B, opt.new_tokens, st, 0.0, engine);
  }
  if (opt.long_fixed_batch > 0) {
    // The same requests at long_new_tokens: in fp32 first (its own engine; the fixed run at
    // new_tokens for its ratio too), then in kv_dtype.
    const int64_t B = opt.long_fixed_batch;
    std::vector<rollout::GenerationRequest> shortr, longr;
    for (int64_t i = 0; i < B; ++i) {
      shortr.push_back(request(uint64_t(i), opt.new_tokens));
      longr.push_back(request(uint64_t(i), opt.long_new_tokens));
    }
    // Rounds of (the fixed run at new_tokens, the long run), the fastest of each side: a shared
    // machine's drift hits both sides alike, and interference only ever slows a run.
    auto paired = [&](rollout::Engine& e) {
      rollout::EngineStats s, l;
      e.generate(shortr);  // warm-up
      for (int round = 0; round < opt.long_rounds; ++round) {
        e.generate(shortr);
        if (round == 0 || e.stats().total_s < s.total_s) s = e.stats();
        e.generate(longr);
        if (round == 0 || e.stats().total_s < l.total_s) l = e.stats();
      }
      return std::pair{s, l};
    };
    auto tok_s = [](const rollout::EngineStats& st) {
      return double(st.generated_tokens) / st.total_s;
    };
    double fp32_long = 0;
    if (opt.kv_dtype != rollout::KvDtype::kFloat32) {
      rollout::EngineOptions o32 = eo;
      o32.kv_cache_dtype = rollout::KvDtype::kFloat32;
      o32.kv_cache_bytes *= 2;
      auto e32 = engine_like(o32);
      const auto [s32, l32] = paired(*e32);
      fp32_long = tok_s(l32);
      report("fixed_long", B, B, opt.long_new_tokens, l32, fp32_long / tok_s(s32), *e32);
    }
    const auto [sst, lst] = paired(engine);
    if (std::find(opt.batches.begin(), opt.batches.end(), B) == opt.batches.end())
      report("fixed", B, B, opt.new_tokens, sst, 0.0, engine);  // not among the fixed runs
    report("fixed_long", B, B, opt.long_new_tokens, lst, tok_s(lst) / tok_s(sst), engine,
           fp32_long > 0 ? tok_s(lst) / fp32_long : 0.0);
  }
  if (opt.long_requests > 0) {
    std::uniform_int_distribution<int64_t> len(opt.long_min_new_tokens, opt.long_new_tokens);
    std::vector<rollout::GenerationRequest> reqs;
    for (int64_t i = 0; i < opt.long_requests; ++i)
      reqs.push_back(request(uint64_t(1000 + i), len(rng)));
    // At most long_batch sequences at once: a finished one hands its slot to the next request.
    std::unique_ptr<rollout::Engine> other;
    rollout::Engine* ragged = &engine;
    if (opt.long_batch != eo.max_batch) {
      rollout::EngineOptions lo = eo;
      lo.max_batch = opt.long_batch;
      other = engine_like(lo);
      ragged = other.get();
    }
    ragged->generate(reqs);
    const rollout::EngineStats st = ragged->stats();
    const double tok_s = double(st.generated_tokens) / st.total_s;
    report("ragged", opt.long_batch, opt.long_requests, opt.long_new_tokens, st,
           fixed_at_long_batch > 0 ? tok_s / fixed_at_long_batch : 0.0, *ragged);
  }
}

}  // namespace rlhf::bench

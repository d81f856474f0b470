#include "bench/bench_generate.h"

#include <mpi.h>
#include <omp.h>

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/log.h"
#include "core/openblas_core.h"
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

namespace {

/// Tokens generated per second of a run, end to end (prefill and decode).
double tokens_per_s(const rollout::EngineStats& st) {
  return double(st.generated_tokens) / st.total_s;
}

/// run_bench_generate's runs and the state they share: the model, one engine sized for the
/// largest batch at the longest length (and engines like it, with the same weights), the triad
/// GB/s and decode-GEMM GFLOP/s every row is measured against, and the random prompts. Call the
/// constructor, attention_decode_rows (with long fixed runs), make_engine, then the runs.
class GenerateBench {
 public:
  /// Checks the options, resolves the model (--pretrain or opt.config, its
  /// max_position_embeddings raised to the longest run), emits the triad and decode-GEMM rows and
  /// sets the engine's options.
  GenerateBench(const BenchGenerateOptions& opt, const Emit& emit);

  /// Decode attention alone at the long run's mean context (prompt_len + long_new_tokens / 2
  /// positions), batch long_fixed_batch, in 16-position blocks and in the engine's: two
  /// {"bench":"attention_decode"} rows and their GB/s ratio in the log.
  void attention_decode_rows();

  /// The shared engine: KV cache for max_batch sequences of prompt_len + the longest run, weights
  /// from --pretrain or a random init (seed).
  void make_engine();

  /// One "fixed" row per opt.batches entry B: B requests of new_tokens, one warm-up, then the
  /// fastest of `repeats` runs.
  void fixed_runs();

  /// The "fixed_long" rows at long_fixed_batch: rounds of (fixed run at new_tokens, long run at
  /// long_new_tokens), in fp32 first (its own engine) when kv_dtype is not fp32, then in kv_dtype;
  /// a "fixed" row too when that batch is not among the fixed runs.
  void long_fixed_runs();

  /// The "ragged" row: long_requests requests of uniform [long_min_new_tokens, long_new_tokens]
  /// new tokens, at most long_batch at once, timed once.
  void ragged_run();

  /// The fixed-length runs again on a bf16 engine (opt.bf16), each against its fp32 run
  /// (fixed_runs first): "fixed_bf16" and "generate_bf16_vs_fp32" rows.
  void bf16_runs();

 private:
  /// A request of prompt_len random tokens and max_new new tokens (temperature 1, opt.seed).
  rollout::GenerationRequest request(uint64_t id, int64_t max_new);

  /// An engine with options `o` and the shared engine's weights.
  std::unique_ptr<rollout::Engine> engine_like(const rollout::EngineOptions& o);

  /// Rounds of (`shortr`, `longr`) on `e` after one warm-up of `shortr`: the fastest of each side
  /// (a shared machine's drift hits both sides alike; interference only ever slows a run).
  std::pair<rollout::EngineStats, rollout::EngineStats> paired(
      rollout::Engine& e, const std::vector<rollout::GenerationRequest>& shortr,
      const std::vector<rollout::GenerationRequest>& longr) const;

  /// Emits one {"bench":"generate"} row for run `kind` with stats `st` of engine `eng` and logs
  /// it. extra_ratio > 0 adds ratio_to_fixed, fp32_ratio > 0 adds ratio_to_fp32.
  void report(const char* kind, int64_t batch, int64_t requests, int64_t new_tokens,
              const rollout::EngineStats& st, double extra_ratio, const rollout::Engine& eng,
              double fp32_ratio = 0) const;

  const BenchGenerateOptions& opt_;
  const Emit& emit_;
  model::ModelConfig cfg_;
  io::ModelSource src_;
  int64_t longest_ = 0;  ///< new tokens of the longest run
  std::optional<model::ParamLayout> layout_;
  double triad_ = 0;           ///< triad GB/s
  double sgemm_ = 0;           ///< sgemm GFLOP/s on the decode shapes
  double kernel_gflops_ = 0;   ///< the decode kernel's GFLOP/s on them
  rollout::EngineOptions eo_;  ///< the shared engine's options
  int64_t block_size_ = 0;     ///< positions per KV block the engine uses
  std::unique_ptr<rollout::Engine> engine_;
  double weight_bytes_ = 0;  ///< weight bytes read per decode step
  int64_t matmul_macs_ = 0;  ///< linear multiply-adds per decode token
  std::mt19937_64 rng_;
  std::uniform_int_distribution<int32_t> tok_;
  double fixed_at_long_batch_ = 0;  ///< tokens/s of the fixed run at long_batch (0 = none)
  std::vector<rollout::EngineStats> fixed_stats_;  ///< the fixed runs' stats, by opt.batches
};

GenerateBench::GenerateBench(const BenchGenerateOptions& opt, const Emit& emit)
    : opt_(opt), emit_(emit), rng_(opt.seed) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  RLHF_CHECK(world == 1,
             "bench generate runs on one rank (the engine's tensor parallelism and "
             "placement need the topology, issues 3/4); got {}",
             world);
  RLHF_CHECK(opt.prompt_len >= 1 && opt.new_tokens >= 1 && opt.long_batch >= 1 &&
                 opt.long_min_new_tokens >= 1 && opt.long_new_tokens >= opt.long_min_new_tokens,
             "bench generate: bad lengths");
  cfg_ = opt.config;
  longest_ = std::max(opt.new_tokens, opt.long_requests > 0 || opt.long_fixed_batch > 0
                                          ? opt.long_new_tokens
                                          : int64_t(0));
  if (!opt.pretrain.empty()) {
    src_ = io::resolve_model_source("", opt.pretrain, "", model::HeadKind::kLM);
    cfg_ = src_.config;
    RLHF_CHECK(opt.prompt_len + longest_ <= cfg_.max_position_embeddings,
               "bench generate --pretrain {}: {} prompt + {} new tokens pass its "
               "max_position_embeddings {}\nhint: --gen_long_requests 0 --gen_long_fixed_batch 0 "
               "skip the long runs",
               opt.pretrain, opt.prompt_len, longest_, cfg_.max_position_embeddings);
  }
  cfg_.max_position_embeddings = std::max(cfg_.max_position_embeddings, opt.prompt_len + longest_);
  layout_.emplace(cfg_, model::HeadKind::kLM);

  triad_ = bench_triad(opt.triad_mb << 20, 5, emit);
  // The ragged run's batch only when it runs (the decode-GEMM rows at 64 rows take minutes on a
  // loaded machine).
  // The fixed-length 1024-token run's batch too: the engine's slots bound every run's batch.
  const int64_t gemm_rows = std::max<int64_t>(
      {opt.long_requests > 0 ? opt.long_batch : 1, opt.long_fixed_batch,
       opt.batches.empty() ? 1 : *std::max_element(opt.batches.begin(), opt.batches.end())});
  sgemm_ = bench_sgemm_decode_shapes(cfg_, gemm_rows, emit, &kernel_gflops_);

  // One engine for every run: slots and KV blocks for the largest batch at the longest length.
  eo_.max_batch = gemm_rows;
  eo_.ignore_eos = true;
  eo_.kv_cache_dtype = opt.kv_dtype;
  eo_.block_size = opt.block_size;
  block_size_ = eo_.resolved_block_size();  // what the engine will use
  tok_ = std::uniform_int_distribution<int32_t>(0, int32_t(cfg_.vocab_size - 1));
}

void GenerateBench::attention_decode_rows() {
  // Decode attention alone at the long run's mean context, in 16-position blocks (a GPU
  // engine's, vLLM's) and in the engine's: what the block size is worth.
  const int64_t ctx = opt_.prompt_len + opt_.long_new_tokens / 2;
  const double g16 = bench_attention_decode(cfg_, opt_.long_fixed_batch, ctx, 16, emit_);
  const double g = bench_attention_decode(cfg_, opt_.long_fixed_batch, ctx, block_size_, emit_);
  LOG0_INFO(
      "attention decode fp16 batch {} x {} positions: {:.1f} GB/s in 16-position blocks, {:.1f} "
      "GB/s in {}-position blocks ({:.2f}x)",
      opt_.long_fixed_batch, ctx, g16, g, block_size_, g / g16);
}

void GenerateBench::make_engine() {
  {
    const rollout::KvCache probe(cfg_, int64_t(1) << 30, block_size_,
                                 rollout::kv_element_bytes(opt_.kv_dtype));
    eo_.kv_cache_bytes =
        eo_.max_batch * probe.blocks_for(opt_.prompt_len + longest_) * probe.bytes_per_block();
  }
  const model::ParamLayout& layout = *layout_;
  engine_ = std::make_unique<rollout::Engine>(layout, eo_);
  if (src_.pretrained)
    io::load_model_weights(src_, layout, engine_->unit_buffers());
  else
    for (int u = 0; u < layout.num_units(); ++u)
      model::init_unit_params(engine_->unit_buffer(u), layout.unit(u), opt_.seed);
  weight_bytes_ = double(engine_->weight_bytes_per_decode_step());
  for (const auto& [shape, count] : decode_linears(cfg_))
    matmul_macs_ += shape.first * shape.second * count;
}

rollout::GenerationRequest GenerateBench::request(uint64_t id, int64_t max_new) {
  rollout::GenerationRequest r;
  r.id = id;
  r.prompt.resize(size_t(opt_.prompt_len));
  for (auto& t : r.prompt) t = tok_(rng_);
  r.max_new_tokens = max_new;
  r.sampling.temperature = 1.0;
  r.sampling.seed = opt_.seed;
  return r;
}

std::unique_ptr<rollout::Engine> GenerateBench::engine_like(const rollout::EngineOptions& o) {
  const model::ParamLayout& layout = *layout_;
  auto e = std::make_unique<rollout::Engine>(layout, o);
  for (int u = 0; u < layout.num_units(); ++u)
    std::copy_n(engine_->unit_buffer(u), layout.unit(u).numel, e->unit_buffer(u));
  return e;
}

std::pair<rollout::EngineStats, rollout::EngineStats> GenerateBench::paired(
    rollout::Engine& e, const std::vector<rollout::GenerationRequest>& shortr,
    const std::vector<rollout::GenerationRequest>& longr) const {
  rollout::EngineStats s, l;
  e.generate(shortr);  // warm-up
  for (int round = 0; round < opt_.long_rounds; ++round) {
    e.generate(shortr);
    if (round == 0 || e.stats().total_s < s.total_s) s = e.stats();
    e.generate(longr);
    if (round == 0 || e.stats().total_s < l.total_s) l = e.stats();
  }
  return std::pair{s, l};
}

void GenerateBench::report(const char* kind, int64_t batch, int64_t requests, int64_t new_tokens,
                           const rollout::EngineStats& st, double extra_ratio,
                           const rollout::Engine& eng, double fp32_ratio) const {
  const int64_t L = cfg_.num_hidden_layers, H = cfg_.num_attention_heads, D = cfg_.D();
  const double W = weight_bytes_, triad = triad_, sgemm = sgemm_;
  const double steps = double(st.decode_steps);
  const double ctx = st.kv_bytes_read / double(eng.kv_cache().bytes_per_token());
  const double flops =
      2.0 * double(matmul_macs_) * double(st.decode_tokens) + 4.0 * double(L * H * D) * ctx;
  const double read_gbps = (W * steps + st.kv_bytes_read) / st.decode_s / 1e9;
  const double weight_gbps = W * steps / st.decode_s / 1e9;
  const double gflops = flops / st.decode_s / 1e9;
  const double tok_s = tokens_per_s(st);
  nlohmann::json row = {{"bench", "generate"},
                        {"run", kind},
                        {"batch", batch},
                        {"requests", requests},
                        {"prompt_len", opt_.prompt_len},
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
                        {"decode_kernel_gflops_per_s", kernel_gflops_},
                        {"ratio_to_sgemm", gflops / sgemm},
                        {"openblas_core", openblas_core_name()},
                        {"threads", omp_get_max_threads()},
                        {"kv_cache_dtype", rollout::to_string(eng.kv_cache().dtype())}};
  if (extra_ratio > 0) row["ratio_to_fixed"] = extra_ratio;
  if (fp32_ratio > 0) row["ratio_to_fp32"] = fp32_ratio;
  emit_(row);
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
}

void GenerateBench::fixed_runs() {
  rollout::Engine& engine = *engine_;
  for (int64_t B : opt_.batches) {
    std::vector<rollout::GenerationRequest> reqs;
    for (int64_t i = 0; i < B; ++i) reqs.push_back(request(uint64_t(i), opt_.new_tokens));
    engine.generate(reqs);  // warm-up: pages, caches, thread pool
    rollout::EngineStats st;
    for (int rep = 0; rep < opt_.repeats; ++rep) {  // the fastest of the repeats: the machine is
      engine.generate(reqs);                        // shared, interference only ever slows a run
      if (rep == 0 || engine.stats().total_s < st.total_s) st = engine.stats();
    }
    if (B == opt_.long_batch) fixed_at_long_batch_ = tokens_per_s(st);
    fixed_stats_.push_back(st);
    report("fixed", B, B, opt_.new_tokens, st, 0.0, engine);
  }
}

void GenerateBench::bf16_runs() {
  rollout::EngineOptions ob = eo_;
  ob.bf16 = true;
  auto eb = engine_like(ob);
  const double w32 = weight_bytes_;
  weight_bytes_ = double(eb->weight_bytes_per_decode_step());  // report()'s bytes: bf16 weights
  for (size_t i = 0; i < opt_.batches.size(); ++i) {
    const int64_t B = opt_.batches[i];
    std::vector<rollout::GenerationRequest> reqs;
    for (int64_t j = 0; j < B; ++j) reqs.push_back(request(uint64_t(j), opt_.new_tokens));
    eb->generate(reqs);  // warm-up
    rollout::EngineStats st;
    for (int rep = 0; rep < opt_.repeats; ++rep) {
      eb->generate(reqs);
      if (rep == 0 || eb->stats().total_s < st.total_s) st = eb->stats();
    }
    report("fixed_bf16", B, B, opt_.new_tokens, st, 0.0, *eb);
    const rollout::EngineStats& s32 = fixed_stats_[i];
    emit_({{"bench", "generate_bf16_vs_fp32"},
           {"batch", B},
           {"new_tokens", opt_.new_tokens},
           {"fp32_tokens_per_s", tokens_per_s(s32)},
           {"bf16_tokens_per_s", tokens_per_s(st)},
           {"speedup", tokens_per_s(st) / tokens_per_s(s32)},
           {"fp32_step_ms", s32.decode_s / double(s32.decode_steps) * 1e3},
           {"bf16_step_ms", st.decode_s / double(st.decode_steps) * 1e3},
           {"isa", cpu_isa_string(cpu_features())}});
    LOG0_INFO("generate bf16 vs fp32, batch {}: {:.0f} vs {:.0f} tok/s = {:.2f}x (ISA {})", B,
              tokens_per_s(st), tokens_per_s(s32), tokens_per_s(st) / tokens_per_s(s32),
              cpu_isa_string(cpu_features()));
  }
  weight_bytes_ = w32;
}

void GenerateBench::long_fixed_runs() {
  // The same requests at long_new_tokens: in fp32 first (its own engine; the fixed run at
  // new_tokens for its ratio too), then in kv_dtype.
  const int64_t B = opt_.long_fixed_batch;
  std::vector<rollout::GenerationRequest> shortr, longr;
  for (int64_t i = 0; i < B; ++i) {
    shortr.push_back(request(uint64_t(i), opt_.new_tokens));
    longr.push_back(request(uint64_t(i), opt_.long_new_tokens));
  }
  double fp32_long = 0;
  if (opt_.kv_dtype != rollout::KvDtype::kFloat32) {
    rollout::EngineOptions o32 = eo_;
    o32.kv_cache_dtype = rollout::KvDtype::kFloat32;
    o32.kv_cache_bytes *= 2;
    auto e32 = engine_like(o32);
    const auto [s32, l32] = paired(*e32, shortr, longr);
    fp32_long = tokens_per_s(l32);
    report("fixed_long", B, B, opt_.long_new_tokens, l32, fp32_long / tokens_per_s(s32), *e32);
  }
  rollout::Engine& engine = *engine_;
  const auto [sst, lst] = paired(engine, shortr, longr);
  if (std::find(opt_.batches.begin(), opt_.batches.end(), B) == opt_.batches.end())
    report("fixed", B, B, opt_.new_tokens, sst, 0.0, engine);  // not among the fixed runs
  report("fixed_long", B, B, opt_.long_new_tokens, lst, tokens_per_s(lst) / tokens_per_s(sst),
         engine, fp32_long > 0 ? tokens_per_s(lst) / fp32_long : 0.0);
}

void GenerateBench::ragged_run() {
  std::uniform_int_distribution<int64_t> len(opt_.long_min_new_tokens, opt_.long_new_tokens);
  std::vector<rollout::GenerationRequest> reqs;
  for (int64_t i = 0; i < opt_.long_requests; ++i)
    reqs.push_back(request(uint64_t(1000 + i), len(rng_)));
  // At most long_batch sequences at once: a finished one hands its slot to the next request.
  std::unique_ptr<rollout::Engine> other;
  rollout::Engine* ragged = engine_.get();
  if (opt_.long_batch != eo_.max_batch) {
    rollout::EngineOptions lo = eo_;
    lo.max_batch = opt_.long_batch;
    other = engine_like(lo);
    ragged = other.get();
  }
  ragged->generate(reqs);
  const rollout::EngineStats st = ragged->stats();
  const double tok_s = tokens_per_s(st);
  report("ragged", opt_.long_batch, opt_.long_requests, opt_.long_new_tokens, st,
         fixed_at_long_batch_ > 0 ? tok_s / fixed_at_long_batch_ : 0.0, *ragged);
}

}  // namespace

void run_bench_generate(const BenchGenerateOptions& opt, const Emit& emit) {
  GenerateBench bench(opt, emit);  // checks; triad and decode-GEMM rows
  if (opt.long_fixed_batch > 0) bench.attention_decode_rows();
  bench.make_engine();
  bench.fixed_runs();
  if (opt.bf16) bench.bf16_runs();
  if (opt.long_fixed_batch > 0) bench.long_fixed_runs();
  if (opt.long_requests > 0) bench.ragged_run();
}

}  // namespace rlhf::bench

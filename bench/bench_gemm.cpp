#include "bench/bench_gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/cpu_features.h"
#include "core/log.h"
#include "core/openblas_core.h"
#include "model/ops/attention.h"
#include "model/ops/attention_bf16.h"
#include "model/ops/half.h"
#include "model/ops/linear_decode.h"
#include "model/ops/matmul_bf16.h"

namespace rlhf::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Seconds per call of fn: one untimed call, then repeats until min_seconds have passed.
template <typename Fn>
double time_call(const Fn& fn, double min_seconds) {
  fn();
  int reps = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  do {
    fn();
    ++reps;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (elapsed < min_seconds);
  return elapsed / reps;
}

// One GEMM of a linear layer: C (M, N) = op(A) · op(B) (+= for dW).
struct Gemm {
  const char* name;
  bool trans_a, trans_b, accumulate;
  int64_t M, N, K;
};

// Training attention at the model's heads, rows / seq_len samples of seq_len tokens: the fp32
// kernels (per-head sgemm) against the bf16-product kernels (oneDNN tiles), forward and backward
// on the same inputs. Returns nothing; emits one row per implementation.
void bench_attention(const BenchGemmOptions& opt, const Emit& emit, const std::string& isa) {
  const model::ModelConfig& cfg = opt.config;
  const int64_t T = std::min(opt.seq_len, opt.rows), B = std::max<int64_t>(1, opt.rows / T);
  const int64_t H = cfg.num_attention_heads, Hkv = cfg.num_key_value_heads, D = cfg.D();
  const int64_t N = B * T;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> q(size_t(N * H * D)), k(size_t(N * Hkv * D)), v(k.size()), dout(q.size());
  for (auto* x : {&q, &k, &v, &dout})
    for (auto& e : *x) e = dist(rng);
  std::vector<float> out(q.size()), att(size_t(B * H * T * T)), dq(q.size()), dk(k.size()),
      dv(k.size());
  std::vector<int32_t> cu(size_t(B + 1));
  for (int64_t b = 0; b <= B; ++b) cu[size_t(b)] = int32_t(b * T);
  // Causal products only: forward 2 GEMMs of T(T+1)/2 · D multiply-adds per head, backward 4.
  const double fwd_flops = 2.0 * 2.0 * double(T) * double(T + 1) / 2.0 * double(D * H * B);
  const double t_min = std::min(opt.min_seconds, 0.3);
  double t32 = 0;
  for (const bool bf16 : {false, true}) {
    if (bf16 && !model::onednn_available()) break;
    const double tf = time_call(
        [&] {
          if (bf16)
            model::attention_forward_bf16_cpu(out.data(), att.data(), q.data(), k.data(), v.data(),
                                              cu.data(), B, H, Hkv, D);
          else
            model::attention_forward_varlen_cpu(out.data(), att.data(), q.data(), k.data(),
                                                v.data(), cu.data(), B, H, Hkv, D);
        },
        t_min);
    const double tb = time_call(
        [&] {
          if (bf16)
            model::attention_backward_bf16_cpu(dq.data(), dk.data(), dv.data(), dout.data(),
                                               att.data(), q.data(), k.data(), v.data(), cu.data(),
                                               B, H, Hkv, D);
          else
            model::attention_backward_varlen_cpu(dq.data(), dk.data(), dv.data(), dout.data(),
                                                 att.data(), q.data(), k.data(), v.data(),
                                                 cu.data(), B, H, Hkv, D);
        },
        t_min);
    if (!bf16) t32 = tf + tb;
    const char* impl = bf16 ? "onednn_bf16" : "sgemm_fp32";
    emit({{"bench", "gemm_attention"},
          {"model", opt.model},
          {"B", B},
          {"T", T},
          {"H", H},
          {"Hkv", Hkv},
          {"D", D},
          {"impl", impl},
          {"forward_us", tf * 1e6},
          {"backward_us", tb * 1e6},
          {"gflops_per_s", 3.0 * fwd_flops / (tf + tb) / 1e9},
          {"speedup_vs_fp32", t32 / (tf + tb)},
          {"isa", isa},
          {"threads", omp_get_max_threads()}});
    LOG0_INFO(
        "bench gemm: attention {}x{} tokens, {} heads ({} KV) of {} | {:11s} forward {:8.0f} us + "
        "backward {:8.0f} us = {:6.1f} GFLOP/s (causal), {:.2f}x the fp32 kernels",
        B, T, H, Hkv, D, impl, tf * 1e6, tb * 1e6, 3.0 * fwd_flops / (tf + tb) / 1e9,
        t32 / (tf + tb));
  }
}

}  // namespace

void run_bench_gemm(const BenchGemmOptions& opt, const Emit& emit) {
  const model::ModelConfig& cfg = opt.config;
  const int64_t C = cfg.hidden_size, F = cfg.intermediate_size,
                Q = cfg.num_attention_heads * cfg.D();
  const int64_t rows = opt.rows;
  // Distinct (IC, OC) shapes in order, with the names of the linears that have them.
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> shapes;
  auto add = [&](int64_t ic, int64_t oc, const std::string& name) {
    for (auto& [s, n] : shapes)
      if (s == std::make_pair(ic, oc)) return void(n += "," + name);
    shapes.push_back({{ic, oc}, name});
  };
  add(C, Q, "q_proj");
  add(Q, C, "o_proj");
  add(C, F, "gate_proj,up_proj");
  add(F, C, "down_proj");
  if (opt.lm_head) add(C, cfg.vocab_size, "lm_head");

  const bool onednn = model::onednn_available();
  const std::string isa = cpu_isa_string();
  const int threads = omp_get_max_threads();
  LOG0_INFO("bench gemm: {} threads, ISA {}, {}", threads, isa, model::onednn_version_string());
  std::map<std::string, std::pair<double, double>> totals;  // impl -> (flops, seconds)
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (const auto& [shape, name] : shapes) {
    const auto [IC, OC] = shape;
    std::vector<float> x(size_t(rows * IC)), w(size_t(OC * IC)), dy(size_t(rows * OC));
    for (auto* v : {&x, &w, &dy})
      for (auto& e : *v) e = dist(rng);
    std::vector<float> out(size_t(std::max({rows * OC, rows * IC, OC * IC})), 0.0f);
    std::vector<model::bfloat16> x16(x.size()), w16(w.size()), dy16(dy.size());
    model::float_to_bf16_n(x16.data(), x.data(), int64_t(x.size()));
    model::float_to_bf16_n(w16.data(), w.data(), int64_t(w.size()));
    model::float_to_bf16_n(dy16.data(), dy.data(), int64_t(dy.size()));
    const bool head = name == "lm_head";
    std::vector<Gemm> gemms = {{"forward", false, true, false, rows, OC, IC}};
    if (!head) {
      gemms.push_back({"backward_dx", false, false, false, rows, IC, OC});
      gemms.push_back({"backward_dw", true, false, true, OC, IC, rows});
    }
    for (const Gemm& g : gemms) {
      // Operands per GEMM: forward x, w; dx dy, w; dW dy, x.
      const std::string_view kind = g.name;
      const bool fwd = kind == "forward", dxg = kind == "backward_dx";
      const float* A = fwd ? x.data() : dy.data();
      const float* B = (fwd || dxg) ? w.data() : x.data();
      const model::bfloat16* A16 = fwd ? x16.data() : dy16.data();
      const model::bfloat16* B16 = (fwd || dxg) ? w16.data() : x16.data();
      const int64_t lda = g.trans_a ? g.M : g.K, ldb = g.trans_b ? g.K : g.N;
      const double flops = 2.0 * double(g.M) * double(g.N) * double(g.K);
      const float beta = g.accumulate ? 1.0f : 0.0f;
      const double t_sgemm = time_call(
          [&] {
            cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                        g.trans_b ? CblasTrans : CblasNoTrans, int(g.M), int(g.N), int(g.K), 1.0f,
                        A, int(lda), B, int(ldb), beta, out.data(), int(g.N));
          },
          opt.min_seconds);
      auto row = [&](const char* impl, const std::string& onednn_impl, double t) {
        totals[impl].first += flops;
        totals[impl].second += t;
        nlohmann::json r = {{"bench", "gemm"},
                            {"model", opt.model},
                            {"linear", name},
                            {"gemm", g.name},
                            {"M", g.M},
                            {"N", g.N},
                            {"K", g.K},
                            {"impl", impl},
                            {"onednn_impl", onednn_impl},
                            {"time_us", t * 1e6},
                            {"gflops_per_s", flops / t / 1e9},
                            {"ratio_to_sgemm", t_sgemm / t},
                            {"isa", isa},
                            {"threads", threads}};
        return r;
      };
      emit(row("openblas_sgemm", "", t_sgemm));
      LOG0_INFO("bench gemm: {:18s} {:11s} {:5d}x{:5d}x{:5d} | sgemm {:6.1f} GFLOP/s", name, g.name,
                g.M, g.N, g.K, flops / t_sgemm / 1e9);
      if (!onednn) continue;
      // oneDNN's kernels for this exact call (primitive key: shape, transposes, accumulate).
      const double t_f32 = time_call(
          [&] {
            model::matmul_f32_onednn(g.trans_a, g.trans_b, g.M, g.N, g.K, A, lda, B, ldb, nullptr,
                                     out.data(), g.N, g.accumulate);
          },
          opt.min_seconds);
      const double t_bf16 = time_call(
          [&] {
            model::matmul_bf16_cpu(g.trans_a, g.trans_b, g.M, g.N, g.K, A16, lda, B16, ldb, nullptr,
                                   out.data(), g.N, g.accumulate);
          },
          opt.min_seconds);
      const double t_convert = time_call(
          [&] {
            model::float_to_bf16_n(const_cast<model::bfloat16*>(A16), A,
                                   fwd ? rows * IC : rows * OC);
            model::float_to_bf16_n(const_cast<model::bfloat16*>(B16), B,
                                   (fwd || dxg) ? OC * IC : rows * IC);
          },
          std::min(opt.min_seconds, 0.1));
      const std::string impl_f32 = model::onednn_matmul_impl(false, g.M, g.N, g.K);
      const std::string impl_bf16 = model::onednn_matmul_impl(true, g.M, g.N, g.K);
      emit(row("onednn_f32", impl_f32, t_f32));
      nlohmann::json r = row("onednn_bf16", impl_bf16, t_bf16);
      r["convert_us"] = t_convert * 1e6;
      emit(r);
      LOG0_INFO(
          "bench gemm: {:18s} {:11s} | oneDNN fp32 {:6.1f} GFLOP/s ({:.2f}x sgemm, {}) | bf16 "
          "{:6.1f} GFLOP/s ({:.2f}x sgemm, {}; +{:.0f} us to round fp32 operands)",
          "", "", flops / t_f32 / 1e9, t_sgemm / t_f32, impl_f32, flops / t_bf16 / 1e9,
          t_sgemm / t_bf16, impl_bf16, t_convert * 1e6);
    }
  }
  // Batch-1 decode through the engine's packed kernel: fp32 against bf16 weights (bytes-bound).
  for (const auto& [shape, name] : shapes) {
    const auto [IC, OC] = shape;
    std::vector<float> w(static_cast<size_t>(OC * IC)), x(static_cast<size_t>(IC)),
        y(static_cast<size_t>(OC));
    for (auto* v : {&w, &x})
      for (auto& e : *v) e = dist(rng);
    const int64_t n = model::linear_decode_packed_size(IC, OC);
    std::vector<float> wp(static_cast<size_t>(n));
    std::vector<model::bfloat16> wp16(static_cast<size_t>(n));
    model::linear_decode_pack(wp.data(), w.data(), IC, OC);
    model::linear_decode_pack_bf16(wp16.data(), w.data(), IC, OC);
    const double t32 = time_call(
        [&] { model::linear_decode_packed_cpu(y.data(), x.data(), wp.data(), nullptr, 1, IC, OC); },
        opt.min_seconds);
    const double t16 = time_call(
        [&] {
          model::linear_decode_packed_bf16_cpu(y.data(), x.data(), wp16.data(), nullptr, 1, IC, OC);
        },
        opt.min_seconds);
    for (const auto& [impl, t, bytes] : {std::tuple{"packed_fp32", t32, 4.0 * double(n)},
                                         std::tuple{"packed_bf16", t16, 2.0 * double(n)}}) {
      emit({{"bench", "gemm_decode"},
            {"model", opt.model},
            {"linear", name},
            {"M", 1},
            {"N", OC},
            {"K", IC},
            {"impl", impl},
            {"time_us", t * 1e6},
            {"weight_GBps", bytes / t / 1e9},
            {"speedup_vs_fp32", t32 / t},
            {"isa", isa},
            {"threads", threads}});
    }
    LOG0_INFO(
        "bench gemm: {:18s} decode M=1 | fp32 weights {:7.1f} us ({:.1f} GB/s) | bf16 {:7.1f} "
        "us ({:.1f} GB/s, {:.2f}x)",
        name, t32 * 1e6, 4.0 * double(n) / t32 / 1e9, t16 * 1e6, 2.0 * double(n) / t16 / 1e9,
        t32 / t16);
  }
  bench_attention(opt, emit, isa);
  const double sgemm = totals["openblas_sgemm"].first / totals["openblas_sgemm"].second / 1e9;
  for (const char* impl : {"openblas_sgemm", "onednn_f32", "onednn_bf16"}) {
    if (totals.count(impl) == 0) continue;
    const double g = totals[impl].first / totals[impl].second / 1e9;
    emit({{"bench", "gemm_summary"},
          {"model", opt.model},
          {"rows", rows},
          {"impl", impl},
          {"gflops_per_s", g},
          {"ratio_to_sgemm", g / sgemm},
          {"isa", isa},
          {"threads", threads},
          {"openblas_core", openblas_core_name()},
          {"onednn_version", model::onednn_version_string()}});
    LOG0_INFO("bench gemm: {:14s} {:7.1f} GFLOP/s over the shapes = {:.2f}x sgemm", impl, g,
              g / sgemm);
  }
}

}  // namespace rlhf::bench

// Timing of attention and logprob (forward + backward) at the stories15M training shapes, next to
// one cblas_sgemm of the LM head measured in the same run. Not a test (skipped by default); run
//   OMP_NUM_THREADS=2 ./build/rlhf_tests -tc="*timing*" --no-skip
// The machine is shared and noisy: compare the ratios, not the absolute times.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "model/ops/attention.h"
#include "model/ops/logprob.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

double ms_of(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

}  // namespace

TEST_CASE("timing: attention and logprob at stories15M shapes vs LM-head sgemm" * doctest::skip()) {
  const int64_t B = 16, T = 256, H = 6, Hkv = 6, D = 48, C = 288, V = 32000, N = B * T;
  const int rounds = 7;

  auto x = test::random_vec<float>(N * C, 1);
  auto w = test::random_vec<float>(V * C, 2, -0.1, 0.1);
  std::vector<float> logits(N * V);
  auto targets = test::random_tokens(N, V, 3);
  auto dlp = test::random_vec<float>(N, 4);
  auto dent = test::random_vec<float>(N, 5);
  std::vector<float> lp(N), lse(N), ent(N);
  auto q = test::random_vec<float>(N * H * D, 6);
  auto k = test::random_vec<float>(N * Hkv * D, 7);
  auto v = test::random_vec<float>(N * Hkv * D, 8);
  auto dout = test::random_vec<float>(N * H * D, 9);
  std::vector<float> out(N * H * D), att(B * H * T * T), dq(N * H * D), dk(N * Hkv * D),
      dv(N * Hkv * D);

  // LM head: logits(N, V) = x(N, C) · w(V, C)ᵀ, into the buffer logprob then reads and
  // overwrites in place with dlogits (as the trainer runs it).
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, V, C, 1.0f, x.data(), C, w.data(), C,
                0.0f, logits.data(), V);
  };
  auto lp_fwd = [&] {
    model::logprob_forward_cpu(lp.data(), lse.data(), ent.data(), logits.data(), targets.data(), N,
                               V, 1.0f);
  };
  auto lp_bwd = [&] {
    model::logprob_backward_cpu(logits.data(), dlp.data(), dent.data(), logits.data(), lse.data(),
                                ent.data(), targets.data(), N, V, 1.0f);
  };
  auto att_fwd = [&] {
    model::attention_forward_cpu(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, Hkv,
                                 D);
  };
  auto att_bwd = [&] {
    model::attention_backward_cpu(dq.data(), dk.data(), dv.data(), dout.data(), att.data(),
                                  q.data(), k.data(), v.data(), B, T, H, Hkv, D);
  };
  // Interleaved rounds (the machine is shared: each round sees similar load); best of the rounds
  // after a warm-up round.
  double best[5] = {1e300, 1e300, 1e300, 1e300, 1e300};
  for (int r = 0; r <= rounds; ++r) {
    const double t[5] = {ms_of(gemm), ms_of(lp_fwd), ms_of(lp_bwd), ms_of(att_fwd), ms_of(att_bwd)};
    if (r > 0)
      for (int i = 0; i < 5; ++i) best[i] = std::min(best[i], t[i]);
  }
  const double ms_gemm = best[0], ms_lp_fwd = best[1], ms_lp_bwd = best[2], ms_att_fwd = best[3],
               ms_att_bwd = best[4];
  const double gemm_gflops = 2.0 * N * C * V / (ms_gemm * 1e6);
  // Useful (causal) GEMM flops: 2 GEMMs forward, 4 backward, each 2·D·T(T+1)/2 per (b, h).
  const double att_flop = 2.0 * B * H * T * (T + 1) / 2.0 * D;

  MESSAGE(fmt::format("threads {} | sgemm LM head {}x{}x{}: {:.1f} ms, {:.1f} GFLOP/s",
                      omp_get_max_threads(), N, C, V, ms_gemm, gemm_gflops));
  MESSAGE(fmt::format(
      "logprob N={} V={}: fwd {:.1f} ms, bwd (in place) {:.1f} ms, total {:.1f} "
      "ms = {:.3f} x sgemm | {:.2f} + {:.2f} ns/logit",
      N, V, ms_lp_fwd, ms_lp_bwd, ms_lp_fwd + ms_lp_bwd, (ms_lp_fwd + ms_lp_bwd) / ms_gemm,
      ms_lp_fwd * 1e6 / (N * V), ms_lp_bwd * 1e6 / (N * V)));
  MESSAGE(
      fmt::format("attention B={} T={} H={} Hkv={} D={}: fwd {:.1f} ms ({:.1f} GFLOP/s), bwd "
                  "{:.1f} ms ({:.1f} GFLOP/s), total {:.1f} ms = {:.3f} x sgemm",
                  B, T, H, Hkv, D, ms_att_fwd, 2 * att_flop / (ms_att_fwd * 1e6), ms_att_bwd,
                  4 * att_flop / (ms_att_bwd * 1e6), ms_att_fwd + ms_att_bwd,
                  (ms_att_fwd + ms_att_bwd) / ms_gemm));
  CHECK(std::isfinite(lp[0]));
}

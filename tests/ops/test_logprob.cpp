// logprob (fused log-softmax + gather + entropy): CPU backward vs central finite differences in
// double, forward vs a naive log-softmax, closed forms, in-place backward, float vs double.
#include "model/ops/logprob.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

using test::ScopedThreads;

// Naive reference in double, written plainly: z = scale·x, log p_j = z_j − log Σ exp(z),
// entropy = −Σ p log p.
struct NaiveRow {
  double lse, lp, entropy;
};
NaiveRow naive_logprob(const double* x, int64_t V, int32_t target, double scale) {
  double m = -INFINITY;
  for (int64_t j = 0; j < V; ++j) m = std::max(m, scale * x[j]);
  double s = 0;
  for (int64_t j = 0; j < V; ++j) s += std::exp(scale * x[j] - m);
  const double lse = m + std::log(s);
  double h = 0;
  for (int64_t j = 0; j < V; ++j) {
    const double logp = scale * x[j] - lse;
    h -= std::exp(logp) * logp;
  }
  return {lse, target >= 0 ? scale * x[target] - lse : 0.0, h};
}

// Targets uniform in [0, V), with every `masked_every`-th row set to −1 (0: none).
std::vector<int32_t> make_targets(int64_t N, int64_t V, uint64_t seed, int64_t masked_every) {
  auto t = test::random_tokens(N, V, seed);
  if (masked_every > 0)
    for (int64_t n = 0; n < N; n += masked_every) t[n] = -1;
  return t;
}

// d/dlogits of Σ a·lp + Σ b·entropy (b omitted when with_entropy is false).
void check_logprob_grad(int64_t N, int64_t V, double scale, int64_t masked_every,
                        bool with_entropy) {
  const std::string name = fmt::format("logprob(N={},V={},scale={},masked_every={},entropy={})", N,
                                       V, scale, masked_every, with_entropy);
  auto x = test::random_vec<double>(N * V, 21, -4, 4);
  auto targets = make_targets(N, V, 22, masked_every);
  auto a = test::random_vec<double>(N, 23);
  auto b = test::random_vec<double>(N, 24);
  std::vector<double> lp(N), lse(N), ent(N);
  auto loss = [&]() {
    model::logprob_forward_cpu(lp.data(), lse.data(), with_entropy ? ent.data() : nullptr, x.data(),
                               targets.data(), N, V, scale);
    double l = test::dot(lp.data(), a.data(), N);
    if (with_entropy) l += test::dot(ent.data(), b.data(), N);
    return l;
  };
  loss();
  std::vector<double> dx(N * V, 123.0);  // assigned: the sentinel value must disappear
  model::logprob_backward_cpu(dx.data(), a.data(), with_entropy ? b.data() : nullptr, x.data(),
                              lse.data(), with_entropy ? ent.data() : nullptr, targets.data(), N, V,
                              scale);
  // h = 1e-3: the gradient entries are ~p ~ 1/V, and the 4-point stencil's truncation error
  // (~h⁴) stays far below the round-off of a loss that sums logs of thousands of terms.
  auto g = test::fd_check(loss, x.data(), dx.data(), N * V, 1e-3);
  RLHF_CHECK_GRAD(g, name + " dlogits");
}

}  // namespace

TEST_CASE("logprob backward vs finite differences") {
  // One thread: thousands of tiny forwards, and on a loaded 2-core machine every OpenMP barrier can
  // wait a scheduler time slice (17 s instead of 1 s). Threading is covered by its own test.
  const ScopedThreads one_thread(1);
  check_logprob_grad(6, 1000, 1.0 / 0.7, 3, true);  // realistic vocab slice, temperature 0.7
  check_logprob_grad(6, 1000, 1.0, 0, false);       // no entropy term
  check_logprob_grad(6, 1000, 1.0, 2, false);       // masked rows without entropy: zero rows
  check_logprob_grad(5, 7, 0.8, 2, true);           // odd
  check_logprob_grad(3, 2, 2.5, 0, true);           // two classes
  check_logprob_grad(1, 13, 1.3, 0, true);          // one row
  check_logprob_grad(2, 1, 1.0, 0, true);           // V = 1: lp = entropy = 0, zero gradient
}

TEST_CASE("logprob forward vs a naive log-softmax (double and float)") {
  for (auto [N, V, scale] : {std::tuple<int64_t, int64_t, double>{9, 1000, 1.0 / 0.7},
                             {4, 32000, 1.0},
                             {7, 7, 0.5},
                             {3, 1, 1.0}}) {
    const std::string name = fmt::format("logprob(N={},V={},scale={})", N, V, scale);
    auto x = test::random_vec<double>(N * V, 31, -10, 10);
    auto targets = make_targets(N, V, 32, 4);
    std::vector<double> ref_lp(N), ref_lse(N), ref_ent(N);
    for (int64_t n = 0; n < N; ++n) {
      auto r = naive_logprob(x.data() + n * V, V, targets[n], scale);
      ref_lp[n] = r.lp, ref_lse[n] = r.lse, ref_ent[n] = r.entropy;
    }
    std::vector<double> lp(N), lse(N), ent(N);
    model::logprob_forward_cpu(lp.data(), lse.data(), ent.data(), x.data(), targets.data(), N, V,
                               scale);
    std::vector<float> xf(x.begin(), x.end()), lpf(N), lsef(N), entf(N);
    model::logprob_forward_cpu(lpf.data(), lsef.data(), entf.data(), xf.data(), targets.data(), N,
                               V, static_cast<float>(scale));
    for (int64_t n = 0; n < N; ++n) {
      INFO(name, " row ", n, " target ", targets[n]);
      CHECK(lp[n] == doctest::Approx(ref_lp[n]).epsilon(1e-12));
      CHECK(lse[n] == doctest::Approx(ref_lse[n]).epsilon(1e-12));
      CHECK(std::fabs(ent[n] - ref_ent[n]) <= 1e-11 * std::max(1.0, ref_ent[n]));
      if (targets[n] < 0) CHECK(lp[n] == 0.0);
      // float: inputs rounded to float, sums of up to 32000 terms in float; a few e-6 relative.
      CHECK(std::fabs(lpf[n] - ref_lp[n]) <= 2e-5 * std::max(1.0, std::fabs(ref_lp[n])));
      CHECK(std::fabs(lsef[n] - ref_lse[n]) <= 2e-5 * std::max(1.0, std::fabs(ref_lse[n])));
      CHECK(std::fabs(entf[n] - ref_ent[n]) <= 2e-5 * std::max(1.0, ref_ent[n]));
    }
  }
}

TEST_CASE("logprob: uniform logits have entropy log V and lp = -log V") {
  for (int64_t V : {1, 2, 7, 1000, 32000}) {
    const int64_t N = 3;
    std::vector<float> xf(N * V, 3.25f);
    std::vector<double> xd(N * V, -1.5);
    std::vector<int32_t> targets = {0, static_cast<int32_t>(V - 1), -1};
    std::vector<float> lpf(N), lsef(N), entf(N);
    std::vector<double> lpd(N), lsed(N), entd(N);
    model::logprob_forward_cpu(lpf.data(), lsef.data(), entf.data(), xf.data(), targets.data(), N,
                               V, 0.9f);
    model::logprob_forward_cpu(lpd.data(), lsed.data(), entd.data(), xd.data(), targets.data(), N,
                               V, 0.9);
    const double logv = std::log(static_cast<double>(V));
    for (int64_t n = 0; n < N; ++n) {
      INFO("V = ", V, " row ", n);
      CHECK(entd[n] == doctest::Approx(logv).epsilon(1e-13));
      CHECK(std::fabs(entf[n] - logv) <= 1e-5 * std::max(1.0, logv));
      CHECK(lsed[n] == doctest::Approx(0.9 * -1.5 + logv).epsilon(1e-13));
      CHECK(lpd[n] == doctest::Approx(n < 2 ? -logv : 0.0).epsilon(1e-13));
    }
  }
}

TEST_CASE("logprob backward in place equals out of place; float agrees with double") {
  const int64_t N = 5, V = 32000;
  const float scale = 1.0f / 0.8f;
  auto xd = test::random_vec<double>(N * V, 41, -6, 6);
  std::vector<float> x(xd.begin(), xd.end());
  auto targets = make_targets(N, V, 42, 3);
  auto dlp = test::random_vec<float>(N, 43);
  auto dent = test::random_vec<float>(N, 44);
  std::vector<float> lp(N), lse(N), ent(N);
  model::logprob_forward_cpu(lp.data(), lse.data(), ent.data(), x.data(), targets.data(), N, V,
                             scale);
  std::vector<float> dx(N * V);
  model::logprob_backward_cpu(dx.data(), dlp.data(), dent.data(), x.data(), lse.data(), ent.data(),
                              targets.data(), N, V, scale);
  std::vector<float> inplace = x;
  model::logprob_backward_cpu(inplace.data(), dlp.data(), dent.data(), inplace.data(), lse.data(),
                              ent.data(), targets.data(), N, V, scale);
  CHECK(std::memcmp(inplace.data(), dx.data(), dx.size() * sizeof(float)) == 0);

  // The same in double; the float gradient is compared by normalised MSE (per row the gradient
  // sums to ~0 and most entries are tiny, so an elementwise relative bound would be meaningless).
  std::vector<double> dlpd(dlp.begin(), dlp.end()), dentd(dent.begin(), dent.end());
  std::vector<double> lpd(N), lsed(N), entd(N), dxd(N * V);
  std::vector<double> xr(x.begin(), x.end());  // the float inputs, exactly
  model::logprob_forward_cpu(lpd.data(), lsed.data(), entd.data(), xr.data(), targets.data(), N, V,
                             static_cast<double>(scale));
  model::logprob_backward_cpu(dxd.data(), dlpd.data(), dentd.data(), xr.data(), lsed.data(),
                              entd.data(), targets.data(), N, V, static_cast<double>(scale));
  auto c_lp = test::compare_arrays(lp.data(), lpd.data(), N);
  auto c_ent = test::compare_arrays(ent.data(), entd.data(), N);
  auto c_dx = test::compare_arrays(dx.data(), dxd.data(), N * V);
  INFO(c_lp.summary("lp float vs double"));
  INFO(c_ent.summary("entropy float vs double"));
  INFO(c_dx.summary("dlogits float vs double"));
  CHECK(c_lp.max_abs_err <= 2e-5);
  CHECK(c_ent.max_abs_err <= 2e-5);
  CHECK(c_dx.nmse <= 1e-10);
  CHECK(c_dx.finite);
}

TEST_CASE("logprob backward to bf16 is the fp32 gradient rounded once, bit for bit") {
  const float scale = 1.0f / 0.7f;
  for (const int64_t V : {int64_t(1001), int64_t(32000)}) {  // with and without a vector tail
    const int64_t N = 6;
    auto xd = test::random_vec<double>(N * V, 51, -6, 6);
    const std::vector<float> x(xd.begin(), xd.end());
    auto targets = make_targets(N, V, 52, 3);
    targets[4] = -1;  // a row with no target
    auto dlp = test::random_vec<float>(N, 53);
    auto dent = test::random_vec<float>(N, 54);
    dent[4] = 0.0f;  // ... and no entropy term: an all-zero row
    std::vector<float> lp(N), lse(N), ent(N);
    model::logprob_forward_cpu(lp.data(), lse.data(), ent.data(), x.data(), targets.data(), N, V,
                               scale);
    // With the entropy term, without it, and without the log-prob term.
    for (int variant = 0; variant < 3; ++variant) {
      const float* a = variant == 2 ? nullptr : dlp.data();
      const float* b = variant == 1 ? nullptr : dent.data();
      const float* e = variant == 1 ? nullptr : ent.data();
      std::vector<float> dx(N * V);
      model::logprob_backward_cpu(dx.data(), a, b, x.data(), lse.data(), e, targets.data(), N, V,
                                  scale);
      for (int threads : {1, 2}) {
        std::vector<model::bfloat16> d16(N * V, model::bfloat16{0x7FC0});  // NaN: all written?
        {
          const ScopedThreads st(threads);
          model::logprob_backward_bf16_cpu(d16.data(), a, b, x.data(), lse.data(), e,
                                           targets.data(), N, V, scale);
        }
        int64_t mismatches = 0;
        for (int64_t i = 0; i < N * V; ++i)
          mismatches += d16[i].bits != model::float_to_bf16(dx[i]).bits;
        INFO("V " << V << ", variant " << variant << ", " << threads << " threads");
        CHECK(mismatches == 0);
      }
    }
  }
  // A bad target throws before anything is written, naming the function and the row.
  std::vector<float> x(2 * 5, 0.5f), lse(2, 1.0f), dlp(2, 1.0f);
  std::vector<int32_t> targets = {0, 7};
  std::vector<model::bfloat16> d16(2 * 5);
  std::string msg;
  try {
    model::logprob_backward_bf16_cpu(d16.data(), dlp.data(), nullptr, x.data(), lse.data(), nullptr,
                                     targets.data(), 2, 5, 1.0f);
  } catch (const Error& err) {
    msg = err.what();
  }
  INFO(msg);
  CHECK(msg.find("logprob_backward_bf16_cpu") != std::string::npos);
  CHECK(msg.find("row 1") != std::string::npos);
}

TEST_CASE("logprob: large logits stay finite; bad targets throw naming the row") {
  const int64_t N = 3, V = 11;
  std::vector<float> x(N * V);
  for (int64_t i = 0; i < N * V; ++i) x[i] = (i % 2 ? 1e4f : -1e4f) + static_cast<float>(i);
  std::vector<int32_t> targets = {0, 1, -1};  // both point at a −1e4 logit
  std::vector<float> lp(N), lse(N), ent(N);
  model::logprob_forward_cpu(lp.data(), lse.data(), ent.data(), x.data(), targets.data(), N, V,
                             1.0f);
  for (int64_t n = 0; n < N; ++n) {
    CHECK(std::isfinite(lp[n]));
    CHECK(std::isfinite(ent[n]));
  }
  CHECK(lp[0] < -1e4f);
  CHECK(lp[1] < -1e4f);

  for (int32_t bad : {static_cast<int32_t>(V), -2}) {
    targets[2] = bad;
    std::string msg;
    try {
      model::logprob_forward_cpu(lp.data(), lse.data(), ent.data(), x.data(), targets.data(), N, V,
                                 1.0f);
    } catch (const Error& e) {
      msg = e.what();
    }
    INFO(msg);
    CHECK(msg.find("row 2") != std::string::npos);
    CHECK(msg.find(std::to_string(bad)) != std::string::npos);
    std::vector<float> dx(N * V);
    CHECK_THROWS_AS(
        model::logprob_backward_cpu<float>(dx.data(), lp.data(), nullptr, x.data(), lse.data(),
                                           nullptr, targets.data(), N, V, 1.0f),
        Error);
  }
}

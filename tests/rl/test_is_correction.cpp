// Off-policy correction (rl/is_correction.h): every weight type on a hand-computed example, the
// mismatch metrics in closed form (exactly 0 when the engine and the trainer agree), and the
// corrected policy loss's gradient against finite differences; token-budget micro-batches
// (rl/token_budget.h) on hand-made lengths.
#include "rl/is_correction.h"

#include <cmath>

#include "core/error.h"
#include "rl/losses.h"
#include "rl/token_budget.h"
#include "tests/test_util.h"

using namespace rlhf;
using rl::IsCorrection;

namespace {

// Four tokens of two samples (rows 0, 0, 1, 1) and a position that is not an action (row −1):
// d = lp_old − lp_rol = {0, −1, 1, −2.5, 0}, r = exp(d).
const float kOld[5] = {-1.0f, -2.0f, -0.5f, -3.0f, -1.0f};
const float kRol[5] = {-1.0f, -1.0f, -1.5f, -0.5f, -1.0f};
const int32_t kSeq[5] = {0, 0, 1, 1, -1};

struct Weights {
  std::vector<float> w = std::vector<float>(5, -7.0f);
  std::vector<uint8_t> masked = std::vector<uint8_t>(5, 9);
};

Weights weights(IsCorrection type, double lo, double hi) {
  Weights x;
  rl::is_weights_cpu(x.w.data(), x.masked.data(), kOld, kRol, kSeq, 5, 2, type, lo, hi);
  return x;
}

void expect(const Weights& got, const std::vector<double>& w, const std::vector<int>& masked,
            const char* what) {
  for (size_t t = 0; t < 5; ++t) {
    INFO(what << " token " << t);
    CHECK(got.w[t] == doctest::Approx(w[t]).epsilon(1e-6));
    CHECK(int(got.masked[t]) == masked[t]);
  }
}

}  // namespace

TEST_CASE("IS correction: each type on a hand-computed example") {
  const double e = std::exp(1.0), ie = std::exp(-1.0), e25 = std::exp(-2.5);
  // TIS: clamp(r, 0.5, 2).
  expect(weights(IsCorrection::kTis, 0.5, 2.0), {1, 0.5, 2, 0.5, 0}, {0, 0, 0, 0, 0}, "tis");
  // IcePop: r inside [0.5, 2] kept, else 0 (only r = 1 is inside).
  expect(weights(IsCorrection::kIcepop, 0.5, 2.0), {1, 0, 0, 0, 0}, {0, 1, 1, 1, 0}, "icepop");
  // The bounds are inclusive: [e^-1, e] keeps r = e^-1 and r = e.
  expect(weights(IsCorrection::kIcepop, ie, e), {1, ie, e, 0, 0}, {0, 0, 0, 1, 0},
         "icepop inclusive");
  // seq-mask-tis: row 0 has mean d = −0.5 (ρ = 0.607, kept: w = r unclamped), row 1 mean d = −0.75
  // (ρ = 0.472 < 0.5: both tokens dropped).
  expect(weights(IsCorrection::kSeqMaskTis, 0.5, 2.0), {1, ie, 0, 0, 0}, {0, 0, 1, 1, 0},
         "seq-mask-tis");
  expect(weights(IsCorrection::kSeqMaskTis, 0.4, 2.0), {1, ie, e, e25, 0}, {0, 0, 0, 0, 0},
         "seq-mask-tis, both rows kept");
  // Decoupled PPO: w = r, dropped above the cap (AReaL); no cap with 0.
  expect(weights(IsCorrection::kDecoupled, 0, 2.0), {1, ie, 0, e25, 0}, {0, 0, 1, 0, 0},
         "decoupled, cap 2");
  expect(weights(IsCorrection::kDecoupled, 0, 0), {1, ie, e, e25, 0}, {0, 0, 0, 0, 0},
         "decoupled, no cap");
  expect(weights(IsCorrection::kNone, 0.5, 2.0), {1, 1, 1, 1, 0}, {0, 0, 0, 0, 0}, "none");

  CHECK(rl::is_correction_from_string("seq-mask-tis") == IsCorrection::kSeqMaskTis);
  CHECK_THROWS_WITH_AS(rl::is_correction_from_string("cispo"),
                       doctest::Contains("--vllm_is_correction_type"), Error);
  const int32_t bad[1] = {3};
  float w[1];
  CHECK_THROWS_AS(
      rl::is_weights_cpu(w, nullptr, kOld, kRol, bad, 1, 2, IsCorrection::kTis, 0.5, 2.0), Error);
}

TEST_CASE("mismatch metrics: closed form, and exactly 0 when engine and trainer agree") {
  rl::MismatchSums same;
  for (int t = 0; t < 4; ++t) same.add(kOld[t], kOld[t], 1.0, false);
  const rl::MismatchStats z = rl::MismatchStats::from(same);
  CHECK(z.mismatch_kl == 0.0);
  CHECK(z.mismatch_abs_logp_mean == 0.0);
  CHECK(z.mismatch_abs_logp_max == 0.0);
  CHECK(z.vllm_kl == 0.0);
  CHECK(z.is_weight_mean == 1.0);
  CHECK(z.is_weight_min == 1.0);
  CHECK(z.is_weight_max == 1.0);
  CHECK(z.is_masked_fraction == 0.0);

  // The four action tokens of the example with IcePop's weights, split over two "ranks" and
  // merged as train() merges them (sums, maxima).
  const Weights x = weights(IsCorrection::kIcepop, 0.5, 2.0);
  rl::MismatchSums a, b;
  for (int t = 0; t < 4; ++t)
    (t < 2 ? a : b).add(kOld[t], kRol[t], x.w[size_t(t)], x.masked[size_t(t)]);
  double sa[6], ma[3], sb[6], mb[3];
  a.pack(sa, ma);
  b.pack(sb, mb);
  for (int i = 0; i < 6; ++i) sa[i] += sb[i];
  for (int i = 0; i < 3; ++i) ma[i] = std::max(ma[i], mb[i]);
  rl::MismatchSums all;
  all.unpack(sa, ma);
  const rl::MismatchStats m = rl::MismatchStats::from(all);
  const double d[4] = {0, -1, 1, -2.5};
  double k3 = 0;
  for (double v : d) k3 += std::exp(v) - 1 - v;
  CHECK(m.mismatch_kl == doctest::Approx(k3 / 4).epsilon(1e-12));
  CHECK(m.mismatch_abs_logp_mean == doctest::Approx(4.5 / 4).epsilon(1e-12));
  CHECK(m.mismatch_abs_logp_max == 2.5);
  CHECK(m.vllm_kl == doctest::Approx(2.5 / 4).epsilon(1e-12));  // mean(lp_rol − lp_old)
  CHECK(m.is_weight_mean == doctest::Approx(0.25).epsilon(1e-12));
  CHECK(m.is_weight_min == 0.0);
  CHECK(m.is_weight_max == 1.0);
  CHECK(m.is_masked_fraction == 0.75);
  CHECK(rl::MismatchStats::from(rl::MismatchSums{}).is_weight_max == 0.0);  // no tokens: zeros
}

TEST_CASE("corrected policy loss: gradient vs finite differences (the weight is a constant)") {
  // L(lp) = Σ_t a_t·w_t·ℓ_t(lp), w_t from lp_old and lp_rol only; the trainer's gradient is the
  // PPO backward with the weights a_t·w_t.
  const int64_t N = 120;
  auto lp = test::random_vec<double>(N, 1, -3.0, -0.5);
  auto off = test::random_vec<double>(N, 2, -0.6, 0.6);
  auto roff = test::random_vec<double>(N, 3, -1.5, 1.5);
  auto adv = test::random_vec<double>(N, 4, -2, 2);
  auto agg = test::random_vec<double>(N, 5, 0.1, 1.0);
  std::vector<double> lp_old(N);
  std::vector<float> old_f(N), rol_f(N), w(N);
  std::vector<int32_t> seq(N);
  for (int64_t i = 0; i < N; ++i) {
    lp_old[i] = lp[i] + off[i];
    const double r = std::exp(-off[i]);
    if (std::fabs(r - 0.8) < 2e-3 || std::fabs(r - 1.2) < 2e-3) lp_old[i] += 0.01;  // off kinks
    old_f[i] = float(lp_old[i]);
    rol_f[i] = float(lp_old[i] + roff[i]);
    seq[i] = int32_t(i / 10);
  }
  for (IsCorrection type : {IsCorrection::kTis, IsCorrection::kIcepop, IsCorrection::kSeqMaskTis,
                            IsCorrection::kDecoupled}) {
    // seq-mask-tis's row means average 10 tokens: tighter bounds so that some rows drop.
    const bool seq_mask = type == IsCorrection::kSeqMaskTis;
    rl::is_weights_cpu(w.data(), nullptr, old_f.data(), rol_f.data(), seq.data(), N, 12, type,
                       seq_mask ? 0.8 : 0.5, seq_mask ? 1.25 : 2.0);
    std::vector<double> aw(N), tmp(N), g(N);
    int zeros = 0;
    for (int64_t i = 0; i < N; ++i) {
      aw[i] = agg[i] * double(w[i]);
      zeros += w[i] == 0.0f;
    }
    CHECK_MESSAGE((type == IsCorrection::kTis || zeros > 0), rl::to_string(type));
    auto loss = [&]() {
      rl::ppo_clip_loss_forward_cpu(tmp.data(), (uint8_t*)nullptr, (double*)nullptr, lp.data(),
                                    lp_old.data(), adv.data(), N, 0.2, 0.2, 0.0);
      return test::dot(tmp.data(), aw.data(), N);
    };
    rl::ppo_clip_loss_backward_cpu(g.data(), aw.data(), lp.data(), lp_old.data(), adv.data(), N,
                                   0.2, 0.2, 0.0);
    auto c = test::fd_check(loss, lp.data(), g.data(), N, 1e-6);
    RLHF_CHECK_GRAD(c, std::string("corrected ppo loss, ") + rl::to_string(type));
    for (int64_t i = 0; i < N; ++i)
      if (w[i] == 0.0f) CHECK(g[i] == 0.0);  // a dropped token has no gradient
  }
}

TEST_CASE("token-budget micro-batches: hand-made lengths") {
  using Runs = std::vector<std::pair<int64_t, int64_t>>;
  // Budget 20 padded tokens: {5, 5, 5, 5} fits 4·5; then 9 alone would make 5·9 > 20.
  CHECK(rl::token_budget_runs({5, 5, 5, 5, 9, 3, 30, 2}, 20) ==
        Runs{{0, 4}, {4, 6}, {6, 7}, {7, 8}});
  // {9, 3}: 2·9 = 18 ≤ 20; 30 alone is over the budget (a run of its own).
  CHECK(rl::token_budget_runs({10, 10, 1}, 20) == Runs{{0, 2}, {2, 3}});
  CHECK(rl::token_budget_runs({}, 20).empty());
  // Matching another rank's count: the run with the most items is halved, the first half larger.
  CHECK(rl::token_budget_runs({1, 1, 1, 1, 1}, 100, 3) == Runs{{0, 2}, {2, 3}, {3, 5}});
  CHECK(rl::token_budget_runs({1, 1}, 100, 5) == Runs{{0, 1}, {1, 2}});  // at most one per item
  CHECK(rl::count_runs(5, 2) == Runs{{0, 2}, {2, 4}, {4, 5}});
  CHECK_THROWS_AS(rl::token_budget_runs({1}, 0), Error);
}

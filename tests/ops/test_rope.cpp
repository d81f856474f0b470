// RoPE: CPU backward vs central finite differences in double (both styles, in place too), and
// forward properties that need no second implementation: position 0 is the identity, rotation
// keeps each pair's norm, the two styles are the same map up to the dimension permutation
// (2i, 2i+1) ↔ (i, i + D/2), backward inverts forward, and hand-computed values for D = 4.
#include "model/ops/rope.h"

#include <cmath>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;
using model::RopeStyle;

namespace {

constexpr double kTheta = 10000.0;

std::string rope_name(int64_t N, int64_t H, int64_t D, RopeStyle style) {
  return fmt::format("rope(N={},H={},D={},style={})", N, H, D, model::to_string(style));
}

// Positions in [0, max_pos), with position 0 and max_pos − 1 present.
std::vector<int32_t> positions(int64_t N, int64_t max_pos, uint64_t seed) {
  auto p = test::random_tokens(N, max_pos, seed);
  p[0] = 0;
  if (N > 1) p[N - 1] = static_cast<int32_t>(max_pos - 1);
  return p;
}

template <typename T>
struct Tables {
  std::vector<T> cos, sin;
  Tables(int64_t max_pos, int64_t D) : cos(max_pos * D / 2), sin(max_pos * D / 2) {
    model::rope_tables_cpu(cos.data(), sin.data(), max_pos, D, kTheta);
  }
};

void check_rope_fd(int64_t N, int64_t H, int64_t D, RopeStyle style, int64_t max_pos) {
  const std::string name = rope_name(N, H, D, style);
  Tables<double> tab(max_pos, D);
  auto pos = positions(N, max_pos, 1);
  auto x = test::random_vec<double>(N * H * D, 2);
  auto r = test::random_vec<double>(N * H * D, 3);  // loss = Σ out ⊙ r, so dout = r
  std::vector<double> out(N * H * D);
  auto loss = [&]() {
    model::rope_forward_cpu(out.data(), x.data(), pos.data(), tab.cos.data(), tab.sin.data(), N, H,
                            D, style);
    return test::dot(out.data(), r.data(), N * H * D);
  };
  std::vector<double> dx(N * H * D, 123.0);  // assigned: prior content must not matter
  model::rope_backward_cpu(dx.data(), r.data(), pos.data(), tab.cos.data(), tab.sin.data(), N, H, D,
                           style);
  auto g = test::fd_check(loss, x.data(), dx.data(), N * H * D);
  RLHF_CHECK_GRAD(g, name + " dx");

  // In place (dx aliases dout) gives the same bits.
  std::vector<double> dinplace = r;
  model::rope_backward_cpu(dinplace.data(), dinplace.data(), pos.data(), tab.cos.data(),
                           tab.sin.data(), N, H, D, style);
  INFO(name);
  CHECK(dinplace == dx);
  // Forward in place too.
  loss();
  std::vector<double> xin = x;
  model::rope_forward_cpu(xin.data(), xin.data(), pos.data(), tab.cos.data(), tab.sin.data(), N, H,
                          D, style);
  CHECK(xin == out);
}

// Forward properties, in float and double.
template <typename T>
void check_rope_properties(int64_t N, int64_t H, int64_t D, int64_t max_pos) {
  const T tol = std::is_same_v<T, float> ? T(2e-6) : T(1e-14);
  Tables<T> tab(max_pos, D);
  auto pos = positions(N, max_pos, 4);
  auto x = test::random_vec<T>(N * H * D, 5, -2, 2);
  const int64_t half = D / 2, n_el = N * H * D;
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kRotateHalf}) {
    INFO(rope_name(N, H, D, style) << (std::is_same_v<T, float> ? " float" : " double"));
    std::vector<T> out(n_el);
    model::rope_forward_cpu(out.data(), x.data(), pos.data(), tab.cos.data(), tab.sin.data(), N, H,
                            D, style);
    double worst_norm = 0, worst_identity = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const int64_t base = (n * H + h) * D;
          const int64_t a = base + (style == RopeStyle::kInterleaved ? 2 * i : i);
          const int64_t b = base + (style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half);
          const double nx = std::hypot(double(x[a]), double(x[b]));
          const double no = std::hypot(double(out[a]), double(out[b]));
          worst_norm = std::max(worst_norm, std::fabs(no - nx) / std::max(nx, 1e-3));
          if (pos[n] == 0)
            worst_identity = std::max({worst_identity, std::fabs(double(out[a] - x[a])),
                                       std::fabs(double(out[b] - x[b]))});
        }
    INFO("worst pair-norm rel change " << worst_norm << ", worst change at position 0 "
                                       << worst_identity);
    CHECK(worst_norm <= 4 * tol);
    CHECK(worst_identity == 0.0);  // cos 0 = 1 and sin 0 = 0 exactly

    // backward(forward(x)) == x (R is orthogonal)
    std::vector<T> back(n_el);
    model::rope_backward_cpu(back.data(), out.data(), pos.data(), tab.cos.data(), tab.sin.data(), N,
                             H, D, style);
    auto cb = test::compare_arrays(back.data(), x.data(), n_el);
    INFO(cb.summary("backward(forward(x)) vs x"));
    CHECK(cb.max_abs_err <= 8 * tol);
  }

  // Interleaved(x) == P⁻¹ · RotateHalf(P · x), P moving dimension 2i → i and 2i+1 → i + D/2.
  std::vector<T> xp(n_el), out_il(n_el), out_rh(n_el);
  for (int64_t row = 0; row < N * H; ++row)
    for (int64_t i = 0; i < half; ++i) {
      xp[row * D + i] = x[row * D + 2 * i];
      xp[row * D + i + half] = x[row * D + 2 * i + 1];
    }
  model::rope_forward_cpu(out_il.data(), x.data(), pos.data(), tab.cos.data(), tab.sin.data(), N, H,
                          D, RopeStyle::kInterleaved);
  model::rope_forward_cpu(out_rh.data(), xp.data(), pos.data(), tab.cos.data(), tab.sin.data(), N,
                          H, D, RopeStyle::kRotateHalf);
  double worst = 0;
  for (int64_t row = 0; row < N * H; ++row)
    for (int64_t i = 0; i < half; ++i) {
      worst = std::max(worst, std::fabs(double(out_il[row * D + 2 * i] - out_rh[row * D + i])));
      worst = std::max(worst,
                       std::fabs(double(out_il[row * D + 2 * i + 1] - out_rh[row * D + i + half])));
    }
  INFO(fmt::format("rope(N={},H={},D={}) interleaved vs permuted rotate_half: max diff {:.3e}", N,
                   H, D, worst));
  // Same arithmetic on the same numbers, so normally bitwise; a rounding's slack for FMA
  // contraction.
  CHECK(worst <= 4 * tol);
}

}  // namespace

TEST_CASE("rope backward vs finite differences") {
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kRotateHalf}) {
    check_rope_fd(32, 6, 48, style, 256);  // stories15M q (H=6, D=48)
    check_rope_fd(7, 2, 14, style, 11);    // odd: D/2 = 7, H as a GQA k (Hkv=2 of H=4)
    check_rope_fd(5, 3, 2, style, 13);     // one pair per head
    check_rope_fd(1, 1, 10, style, 1);     // one row at position 0
  }
}

TEST_CASE("rope forward: identity at 0, pair norms kept, styles agree up to permutation") {
  check_rope_properties<float>(40, 6, 48, 2048);
  check_rope_properties<double>(40, 6, 48, 2048);
  check_rope_properties<float>(7, 4, 14, 13);
  check_rope_properties<double>(5, 3, 2, 7);
}

TEST_CASE("rope tables and one hand-computed rotation (D=4, theta=1e4, position 3)") {
  // Pair 0 has frequency 1 (angle 3), pair 1 has 1e4^(−2/4) = 0.01 (angle 0.03).
  //   (1, 2) at angle 3:    (cos3 − 2 sin3, sin3 + 2 cos3)              = (−1.27223...,
  //   −1.83886...) (3, 4) at angle 0.03: (3 cos.03 − 4 sin.03, 3 sin.03 + 4 cos.03)  =
  //   (2.87866..., 4.08818...)
  const double e0 = -1.27223251272018, e1 = -1.8388649851410237;
  const double e2 = 2.87866810043698, e3 = 4.088186635603437;
  const int64_t D = 4, max_pos = 4;
  Tables<double> tab(max_pos, D);
  CHECK(tab.cos[3 * 2 + 0] == doctest::Approx(-0.9899924966004454).epsilon(1e-15));
  CHECK(tab.sin[3 * 2 + 1] == doctest::Approx(0.02999550020249566).epsilon(1e-15));
  const int32_t pos = 3;
  {
    INFO("rope(N=1,H=1,D=4,style=interleaved)");
    const std::vector<double> x = {1, 2, 3, 4};
    std::vector<double> out(4);
    model::rope_forward_cpu(out.data(), x.data(), &pos, tab.cos.data(), tab.sin.data(), 1, 1, D,
                            RopeStyle::kInterleaved);
    CHECK(out[0] == doctest::Approx(e0).epsilon(1e-14));
    CHECK(out[1] == doctest::Approx(e1).epsilon(1e-14));
    CHECK(out[2] == doctest::Approx(e2).epsilon(1e-14));
    CHECK(out[3] == doctest::Approx(e3).epsilon(1e-14));
  }
  {
    INFO("rope(N=1,H=1,D=4,style=rotate_half)");  // pairs (0, 2) and (1, 3)
    const std::vector<float> x = {1, 3, 2, 4};
    Tables<float> tabf(max_pos, D);
    std::vector<float> out(4);
    model::rope_forward_cpu(out.data(), x.data(), &pos, tabf.cos.data(), tabf.sin.data(), 1, 1, D,
                            RopeStyle::kRotateHalf);
    CHECK(out[0] == doctest::Approx(e0).epsilon(1e-6));
    CHECK(out[2] == doctest::Approx(e1).epsilon(1e-6));
    CHECK(out[1] == doctest::Approx(e2).epsilon(1e-6));
    CHECK(out[3] == doctest::Approx(e3).epsilon(1e-6));
  }
}

TEST_CASE("rope: odd head_dim and negative positions throw") {
  std::vector<float> c(8), s(8), x(6), out(6);
  CHECK_THROWS_AS(model::rope_tables_cpu(c.data(), s.data(), 2, 3, kTheta), rlhf::Error);
  const int32_t bad = -1;
  CHECK_THROWS_AS(model::rope_forward_cpu(out.data(), x.data(), &bad, c.data(), s.data(), 1, 1, 6,
                                          RopeStyle::kRotateHalf),
                  rlhf::Error);
}

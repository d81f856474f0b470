// RoPE: CPU backward vs central finite differences in double (both styles, in place too), and
// forward properties that need no second implementation: position 0 is the identity, rotation
// keeps each pair's norm, the two styles are the same map up to the dimension permutation
// (2i, 2i+1) ↔ (i, i + D/2), backward inverts forward, and hand-computed values for D = 4.
// The inverse-frequency tables: default frequencies reproduce the theta tables bit for bit; llama3
// scaling against Meta's published loop (written out here) and against transformers' numbers.
#include "model/ops/rope.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "tests/io/io_test_util.h"
#include "tests/ops/cuda_test_util.h"
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

namespace {

// Llama-3.2-1B: head_dim 64, rope_theta 5e5, rope_scaling llama3 (factor 32, low_freq_factor 1,
// high_freq_factor 4, original_max_position_embeddings 8192).
model::ModelConfig llama3_2_config() {
  model::ModelConfig c;
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_hidden_layers = 16;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.vocab_size = 128256;
  c.max_position_embeddings = 131072;
  c.rope_theta = 500000.0;
  c.rope_scaling.rope_type = "llama3";
  c.rope_scaling.factor = 32.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  return c;
}

// Meta's apply_scaling (llama-models, models/llama3/reference_impl/model.py), the published
// formula, as a loop over freqs = 1 / theta^(2i/D) (Meta's precompute_freqs_cis): written
// independently of rope_inv_freq (other base expression, branch per regime).
std::vector<double> meta_llama3_freqs(int64_t D, double theta, double scale_factor,
                                      double low_freq_factor, double high_freq_factor,
                                      double old_context_len) {
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  std::vector<double> out;
  for (int64_t k = 0; k < D; k += 2) {
    const double freq = 1.0 / std::pow(theta, static_cast<double>(k) / static_cast<double>(D));
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_freq_wavelen) {
      out.push_back(freq);
    } else if (wavelen > low_freq_wavelen) {
      out.push_back(freq / scale_factor);
    } else {
      const double smooth =
          (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      out.push_back((1 - smooth) * freq / scale_factor + smooth * freq);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("rope inv_freq: default frequencies reproduce the theta tables bit for bit") {
  for (const int64_t D : {2, 8, 48, 64, 128}) {
    for (const double theta : {10000.0, 500000.0, 1e6, 12345.5}) {
      INFO("D=" << D << " theta=" << theta);
      const int64_t max_pos = 4099;
      const auto inv = model::rope_default_inv_freq(D, theta);
      REQUIRE(static_cast<int64_t>(inv.size()) == D / 2);
      CHECK(inv[0] == 1.0);
      const size_t n = static_cast<size_t>(max_pos * D / 2);
      std::vector<float> c1(n), s1(n), c2(n), s2(n);
      model::rope_tables_cpu(c1.data(), s1.data(), max_pos, D, theta);
      model::rope_tables_cpu(c2.data(), s2.data(), max_pos, D, inv.data());
      CHECK(c1 == c2);
      CHECK(s1 == s2);
      std::vector<double> d1(n), e1(n), d2(n), e2(n);
      model::rope_tables_cpu(d1.data(), e1.data(), max_pos, D, theta);
      model::rope_tables_cpu(d2.data(), e2.data(), max_pos, D, inv.data());
      CHECK(d1 == d2);
      CHECK(e1 == e2);
      // From a config with default RoPE: the same frequencies.
      model::ModelConfig cfg;
      cfg.hidden_size = D * 3;
      cfg.num_attention_heads = 3;
      cfg.num_key_value_heads = 3;
      cfg.rope_theta = theta;
      CHECK(model::rope_inv_freq(cfg) == inv);
    }
  }
}

TEST_CASE("rope inv_freq: llama3 scaling against Meta's published formula") {
  struct Case {
    int64_t D;
    double theta, factor, low, high;
    int64_t orig;
  };
  // Llama 3.1 (8B: D 128, factor 8), Llama 3.2 (1B: D 64, factor 32; 3B: D 128, factor 32), and
  // made-up factors that move the regime boundaries.
  for (const Case& k :
       {Case{128, 500000.0, 8.0, 1.0, 4.0, 8192}, Case{64, 500000.0, 32.0, 1.0, 4.0, 8192},
        Case{128, 500000.0, 32.0, 1.0, 4.0, 8192}, Case{32, 10000.0, 4.0, 2.0, 8.0, 512},
        Case{16, 10000.0, 1.0, 1.0, 4.0, 64}}) {
    INFO("D=" << k.D << " theta=" << k.theta << " factor=" << k.factor << " low=" << k.low
              << " high=" << k.high << " orig=" << k.orig);
    model::ModelConfig c = llama3_2_config();
    c.head_dim = k.D;
    c.rope_theta = k.theta;
    c.rope_scaling.factor = k.factor;
    c.rope_scaling.low_freq_factor = k.low;
    c.rope_scaling.high_freq_factor = k.high;
    c.rope_scaling.original_max_position_embeddings = k.orig;
    const auto inv = model::rope_inv_freq(c);
    const auto want = meta_llama3_freqs(k.D, k.theta, k.factor, k.low, k.high, double(k.orig));
    REQUIRE(inv.size() == want.size());
    for (size_t i = 0; i < inv.size(); ++i) {
      INFO("i=" << i);
      CHECK(inv[i] == doctest::Approx(want[i]).epsilon(1e-14));
    }
    // factor 1 is no scaling at all.
    if (k.factor == 1.0) {
      const auto def = model::rope_default_inv_freq(k.D, k.theta);
      for (size_t i = 0; i < inv.size(); ++i)
        CHECK(inv[i] == doctest::Approx(def[i]).epsilon(1e-15));
    }
  }
}

TEST_CASE(
    "rope inv_freq: llama3 of Llama-3.2-1B against transformers' _compute_llama3_parameters") {
  // Made once with `python scripts/make_hf_config_fixtures.py --llama3-inv-freq` (transformers
  // 4.57.6 and 5.24.0 print the same): transformers' own _compute_llama3_parameters on
  // LlamaConfig(Llama-3.2-1B), its torch calls (arange, .to, where) run by a numpy stand-in in
  // float64. transformers itself computes in float32; those values agree to ~6e-8 relative.
  const double hf[32] = {1.0,
                         0.6636012376960885,
                         0.44036660267178046,
                         0.2922278225730151,
                         0.19392274474868576,
                         0.12868737343265052,
                         0.08539710028576561,
                         0.056669621445291044,
                         0.03760603093086393,
                         0.024955408670558694,
                         0.016560440080994446,
                         0.010989528534539826,
                         0.0072926647372171085,
                         0.004839421345719893,
                         0.0032114459947525913,
                         0.001290547928209264,
                         0.00042955679655936815,
                         9.70828780262767e-05,
                         1.9461638184831125e-05,
                         1.291476718704739e-05,
                         8.570255489881478e-06,
                         5.687232150457046e-06,
                         3.7740542941082826e-06,
                         2.5044671007024935e-06,
                         1.661967467795309e-06,
                         1.102883668639601e-06,
                         7.318749675440419e-07,
                         4.856731343010108e-07,
                         3.2229329303788936e-07,
                         2.138742281610915e-07,
                         1.4192720251899592e-07,
                         9.418306725434909e-08};
  const model::ModelConfig c = llama3_2_config();
  const auto inv = model::rope_inv_freq(c);
  const auto def = model::rope_default_inv_freq(64, 500000.0);
  REQUIRE(inv.size() == 32);
  for (size_t i = 0; i < 32; ++i) {
    INFO("i=" << i);
    CHECK(inv[i] == doctest::Approx(hf[i]).epsilon(1e-14));
  }
  // The three regimes of this config: pairs 0..14 kept (wavelength < 8192/4), 15..17 smoothed,
  // 18..31 divided by 32 (wavelength > 8192).
  for (size_t i = 0; i <= 14; ++i) CHECK(inv[i] == def[i]);
  for (size_t i = 15; i <= 17; ++i) {
    CHECK(inv[i] < def[i]);
    CHECK(inv[i] > def[i] / 32);
  }
  for (size_t i = 18; i < 32; ++i) CHECK(inv[i] == def[i] / 32);

  // The tables from these frequencies: angle p·inv_freq[i] in double, at the largest position.
  const int64_t max_pos = 131072, D = 64;
  std::vector<float> cs(static_cast<size_t>(max_pos * D / 2)), sn(cs.size());
  model::rope_tables_cpu(cs.data(), sn.data(), max_pos, D, inv.data());
  for (const int64_t p : {int64_t{0}, int64_t{1}, int64_t{8191}, max_pos - 1}) {
    for (size_t i = 0; i < 32; ++i) {
      const double angle = static_cast<double>(p) * hf[i];
      INFO("p=" << p << " i=" << i);
      CHECK(cs[static_cast<size_t>(p * D / 2) + i] ==
            doctest::Approx(std::cos(angle)).epsilon(2e-6));
      CHECK(sn[static_cast<size_t>(p * D / 2) + i] ==
            doctest::Approx(std::sin(angle)).epsilon(2e-6));
    }
  }
}

TEST_CASE("rope inv_freq: invalid scaling and arguments throw") {
  model::ModelConfig c = llama3_2_config();
  c.rope_scaling.high_freq_factor = 1.0;  // == low_freq_factor: the smoothing divides by zero
  RLHF_CHECK_CONTAINS(test::error_of([&] { model::rope_inv_freq(c); }),
                      "high_freq_factor 1 must be greater than low_freq_factor 1");
  c = llama3_2_config();
  c.rope_scaling.rope_type = "yarn";
  RLHF_CHECK_CONTAINS(test::error_of([&] { model::rope_inv_freq(c); }),
                      "rope_type 'yarn' is not supported");
  CHECK_THROWS_AS(model::rope_default_inv_freq(3, 1e4), rlhf::Error);
  CHECK_THROWS_AS(model::rope_default_inv_freq(4, 0.0), rlhf::Error);
  std::vector<float> cs(8), sn(8);
  CHECK_THROWS_AS(
      model::rope_tables_cpu(cs.data(), sn.data(), 2, 4, static_cast<const double*>(nullptr)),
      rlhf::Error);
}

TEST_CASE("rope_tables_upload_cuda from inverse frequencies equals the host tables") {
#ifdef RLHF_CUDA
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
  const auto inv = model::rope_inv_freq(llama3_2_config());
  const int64_t max_pos = 9000, D = 64, n = max_pos * D / 2;
  std::vector<float> want_c(static_cast<size_t>(n)), want_s(want_c.size());
  model::rope_tables_cpu(want_c.data(), want_s.data(), max_pos, D, inv.data());
  test::DeviceBuffer<float> dc(n), ds(n);
  model::rope_tables_upload_cuda(dc.get(), ds.get(), max_pos, D, inv.data());
  CHECK(dc.download() == want_c);
  CHECK(ds.download() == want_s);
  CHECK(dc.guards_intact());
  CHECK(ds.guards_intact());
  // The theta overload still uploads the default tables.
  std::vector<float> def_c(want_c.size()), def_s(want_c.size());
  model::rope_tables_cpu(def_c.data(), def_s.data(), max_pos, D, 500000.0);
  model::rope_tables_upload_cuda(dc.get(), ds.get(), max_pos, D, 500000.0);
  CHECK(dc.download() == def_c);
  CHECK(ds.download() == def_s);
#else
  MESSAGE("skipped: built without CUDA");
#endif
}

// The CPU attention with bf16 products (model/ops/attention_bf16.h) against a double reference of
// the same formulas on the same bf16-rounded operands (q, k, v, dout, and P and dS rounded where
// they enter a product), and against the exact attention (which it must miss by bf16 rounding,
// not by a wrong term). Shapes: one token, lengths that are not multiples of the 64-token block,
// GQA, packed samples of several lengths. Also: each packed sample equals the sample alone bit for
// bit, the result does not depend on the thread count, and the errors.
//
// Bounds: against the emulating reference only fp32 summation order and the occasional bf16
// rounding of P or dS falling the other way (fp32 vs double P) differ: nmse at most 7e-11
// measured, gate 1e-8 (a wrong index or term gives 1e-3 or more). Against the exact attention
// the bf16 operands give nmse 4e-6 to 1.4e-5 measured (one bf16 rounding per operand, compounded
// through two products): gate 1e-4, and at least 1e-7 (so the products really are bf16).
#include "model/ops/attention_bf16.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/ops/attention.h"
#include "model/ops/half.h"
#include "model/ops/matmul_bf16.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

using test::ScopedThreads;

struct Problem {
  std::vector<int32_t> cu;  // cu_seqlens
  int64_t H, Hkv, D;
  int64_t N() const { return cu.back(); }
  int64_t n() const { return int64_t(cu.size()) - 1; }
  int64_t att_elems() const {
    int64_t e = 0;
    for (int64_t s = 0; s < n(); ++s) e += H * (cu[s + 1] - cu[s]) * (cu[s + 1] - cu[s]);
    return e;
  }
  std::string name() const {
    std::string lens;
    for (int64_t s = 0; s < n(); ++s) lens += fmt::format("{}{}", s ? "," : "", cu[s + 1] - cu[s]);
    return fmt::format("bf16 attention(lens={} H={} Hkv={} D={})", lens, H, Hkv, D);
  }
};

Problem make_problem(const std::vector<int32_t>& lens, int64_t H, int64_t Hkv, int64_t D) {
  Problem p{{0}, H, Hkv, D};
  for (int32_t l : lens) p.cu.push_back(p.cu.back() + l);
  return p;
}

struct Tensors {
  std::vector<float> q, k, v, dout;
  explicit Tensors(const Problem& p, uint64_t seed = 7)
      : q(test::random_vec<float>(p.N() * p.H * p.D, seed, -1.5, 1.5)),
        k(test::random_vec<float>(p.N() * p.Hkv * p.D, seed + 1, -1.5, 1.5)),
        v(test::random_vec<float>(p.N() * p.Hkv * p.D, seed + 2)),
        dout(test::random_vec<float>(p.N() * p.H * p.D, seed + 3)) {}
};

struct Result {
  std::vector<float> out, att, dq, dk, dv;
};

Result run_bf16(const Problem& p, const Tensors& x) {
  Result r;
  r.out.assign(p.N() * p.H * p.D, NAN);
  r.att.assign(p.att_elems(), NAN);
  r.dq.assign(r.out.size(), NAN);
  r.dk.assign(p.N() * p.Hkv * p.D, NAN);
  r.dv.assign(r.dk.size(), NAN);
  model::attention_forward_bf16_cpu(r.out.data(), r.att.data(), x.q.data(), x.k.data(), x.v.data(),
                                    p.cu.data(), p.n(), p.H, p.Hkv, p.D);
  model::attention_backward_bf16_cpu(r.dq.data(), r.dk.data(), r.dv.data(), x.dout.data(),
                                     r.att.data(), x.q.data(), x.k.data(), x.v.data(), p.cu.data(),
                                     p.n(), p.H, p.Hkv, p.D);
  return r;
}

// The reference in double. bf16 = true: the operands of every product rounded to bf16 as the
// kernel rounds them (q, k, v, dout; P before P·V and Pᵀ·dO; dS before dS·K and dSᵀ·Q). att is
// written in the kernel's layout (per sample and KV head, row t·G + i for head g·G + i).
struct Reference {
  std::vector<double> out, att, dq, dk, dv;
};
Reference reference(const Problem& p, const Tensors& x, bool bf16) {
  auto r = [bf16](double y) { return bf16 ? double(model::round_to_bf16(float(y))) : y; };
  const int64_t H = p.H, Hkv = p.Hkv, D = p.D, G = H / Hkv;
  const double sc = 1.0 / std::sqrt(double(D));
  Reference ref;
  ref.out.assign(p.N() * H * D, 0.0);
  ref.att.assign(p.att_elems(), 0.0);
  ref.dq.assign(ref.out.size(), 0.0);
  ref.dk.assign(p.N() * Hkv * D, 0.0);
  ref.dv.assign(ref.dk.size(), 0.0);
  auto Q = [&](int64_t t, int64_t h, int64_t d) { return r(x.q[(t * H + h) * D + d]); };
  auto dO = [&](int64_t t, int64_t h, int64_t d) { return r(x.dout[(t * H + h) * D + d]); };
  auto K = [&](int64_t t, int64_t g, int64_t d) { return r(x.k[(t * Hkv + g) * D + d]); };
  auto V = [&](int64_t t, int64_t g, int64_t d) { return r(x.v[(t * Hkv + g) * D + d]); };
  int64_t aoff = 0;
  for (int64_t s = 0; s < p.n(); ++s) {
    const int64_t a = p.cu[s], T = p.cu[s + 1] - a;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / G, i = h % G;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> w(size_t(t + 1)), dp(size_t(t + 1));
        double mx = -INFINITY, sum = 0, dot = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double z = 0;
          for (int64_t d = 0; d < D; ++d) z += Q(a + t, h, d) * K(a + u, g, d);
          w[size_t(u)] = z * sc;
          mx = std::max(mx, w[size_t(u)]);
        }
        for (int64_t u = 0; u <= t; ++u) sum += (w[size_t(u)] = std::exp(w[size_t(u)] - mx));
        for (int64_t u = 0; u <= t; ++u) {
          const double pr = w[size_t(u)] / sum;
          w[size_t(u)] = pr;
          ref.att[size_t(aoff + g * G * T * T + (t * G + i) * T + u)] = pr;
          double z = 0;
          for (int64_t d = 0; d < D; ++d) {
            ref.out[size_t(((a + t) * H + h) * D + d)] += r(pr) * V(a + u, g, d);
            ref.dv[size_t(((a + u) * Hkv + g) * D + d)] += r(pr) * dO(a + t, h, d);
            z += dO(a + t, h, d) * V(a + u, g, d);
          }
          dp[size_t(u)] = z;
          dot += pr * z;
        }
        for (int64_t u = 0; u <= t; ++u) {
          const double ds = r(sc * w[size_t(u)] * (dp[size_t(u)] - dot));
          for (int64_t d = 0; d < D; ++d) {
            ref.dq[size_t(((a + t) * H + h) * D + d)] += ds * K(a + u, g, d);
            ref.dk[size_t(((a + u) * Hkv + g) * D + d)] += ds * Q(a + t, h, d);
          }
        }
      }
    }
    aoff += H * T * T;
  }
  return ref;
}

void check_against(const Problem& p, const Result& got, const Reference& ref, double lo, double hi,
                   const char* which) {
  const std::vector<
      std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<double>*>>>
      outs = {{"out", {&got.out, &ref.out}},
              {"dq", {&got.dq, &ref.dq}},
              {"dk", {&got.dk, &ref.dk}},
              {"dv", {&got.dv, &ref.dv}}};
  for (const auto& [name, pr] : outs) {
    const auto c =
        test::compare_arrays(pr.first->data(), pr.second->data(), int64_t(pr.first->size()));
    INFO(c.summary(fmt::format("{} {} vs {}", p.name(), name, which)));
    CHECK(c.finite);
    CHECK(c.nmse <= hi);
    CHECK(c.nmse >= lo);
  }
}

const std::vector<Problem>& problems() {
  static const std::vector<Problem> ps = {
      make_problem({1}, 2, 1, 8),               // one token
      make_problem({17}, 4, 4, 8),              // shorter than a block, MHA
      make_problem({130}, 6, 2, 16),            // three blocks, the last partial, GQA
      make_problem({5, 64, 130, 1}, 6, 2, 32),  // packed samples of several lengths
      make_problem({256}, 9, 3, 64),            // SmolLM-135M's heads at 256 tokens
  };
  return ps;
}

}  // namespace

TEST_CASE("bf16 attention: forward and backward against a double reference on bf16 operands") {
  if (!model::onednn_available()) return;
  for (const Problem& p : problems()) {
    const Tensors x(p);
    const Result got = run_bf16(p, x);
    check_against(p, got, reference(p, x, true), 0.0, 1e-8, "bf16-operand reference");
    // The saved probabilities are fp32 softmax values of the bf16 scores.
    const Reference ref = reference(p, x, true);
    const auto c = test::compare_arrays(got.att.data(), ref.att.data(), int64_t(got.att.size()));
    INFO(c.summary(p.name() + " att"));
    CHECK(c.finite);
    CHECK(c.max_abs_err <= 1e-5);
  }
}

TEST_CASE("bf16 attention: off the exact attention by bf16 rounding, no more") {
  if (!model::onednn_available()) return;
  for (const Problem& p : problems()) {
    if (p.N() < 17) continue;  // a single token's out is v itself, rounded: nmse ~1e-6 at most
    const Tensors x(p);
    check_against(p, run_bf16(p, x), reference(p, x, false), 1e-7, 1e-4, "exact reference");
  }
}

TEST_CASE("bf16 attention: a packed sample equals the sample alone, bit for bit") {
  if (!model::onednn_available()) return;
  const Problem packed = make_problem({5, 64, 130, 1}, 6, 2, 32);
  const Tensors x(packed);
  const Result all = run_bf16(packed, x);
  const int64_t H = packed.H, Hkv = packed.Hkv, D = packed.D;
  for (int64_t s = 0; s < packed.n(); ++s) {
    const int32_t a = packed.cu[size_t(s)], T = packed.cu[size_t(s + 1)] - a;
    const Problem one = make_problem({T}, H, Hkv, D);
    Tensors y(one);
    auto slice = [&](const std::vector<float>& src, int64_t width) {
      return std::vector<float>(src.begin() + a * width, src.begin() + (a + T) * width);
    };
    y.q = slice(x.q, H * D);
    y.k = slice(x.k, Hkv * D);
    y.v = slice(x.v, Hkv * D);
    y.dout = slice(x.dout, H * D);
    const Result alone = run_bf16(one, y);
    CAPTURE(s);
    CHECK(alone.out == slice(all.out, H * D));
    CHECK(alone.dq == slice(all.dq, H * D));
    CHECK(alone.dk == slice(all.dk, Hkv * D));
    CHECK(alone.dv == slice(all.dv, Hkv * D));
  }
}

TEST_CASE("bf16 attention: the result does not depend on the thread count or the call") {
  if (!model::onednn_available()) return;
  const Problem p = make_problem({130, 64, 17}, 6, 2, 32);
  const Tensors x(p);
  Result one, two, again;
  {
    const ScopedThreads t(1);
    one = run_bf16(p, x);
  }
  {
    const ScopedThreads t(2);
    two = run_bf16(p, x);
    again = run_bf16(p, x);
  }
  CHECK(one.out == two.out);
  CHECK(one.att == two.att);
  CHECK(one.dq == two.dq);
  CHECK(one.dk == two.dk);
  CHECK(one.dv == two.dv);
  CHECK(two.dq == again.dq);
}

TEST_CASE("bf16 attention: bad dimensions and cu_seqlens are refused") {
  const Problem p = make_problem({4}, 4, 2, 8);
  const Tensors x(p);
  std::vector<float> out(x.q.size()), att(size_t(p.att_elems()));
  auto fwd = [&](const int32_t* cu, int64_t n, int64_t H, int64_t Hkv) {
    model::attention_forward_bf16_cpu(out.data(), att.data(), x.q.data(), x.k.data(), x.v.data(),
                                      cu, n, H, Hkv, p.D);
  };
  CHECK_THROWS_WITH_AS(fwd(p.cu.data(), 1, 4, 3), doctest::Contains("not a multiple"), Error);
  const std::vector<int32_t> empty = {0, 0, 4};
  CHECK_THROWS_WITH_AS(fwd(empty.data(), 2, 4, 2), doctest::Contains("sample 0"), Error);
  const std::vector<int32_t> offset = {1, 4};
  CHECK_THROWS_WITH_AS(fwd(offset.data(), 1, 4, 2), doctest::Contains("start at 0"), Error);
  if (!model::onednn_available())
    CHECK_THROWS_WITH_AS(fwd(p.cu.data(), 1, 4, 2), doctest::Contains("oneDNN"), Error);
}

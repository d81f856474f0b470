// Causal GQA attention: CPU backward vs central finite differences in double, forward vs a naive
// per-element softmax loop, causality, GQA = MHA with duplicated KV heads, thread-count
// independence, realistic and odd shapes.
#include "model/ops/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

using test::ScopedThreads;

struct Shape {
  int64_t B, T, H, Hkv, D;
  std::string name() const {
    return fmt::format("attention(B={},T={},H={},Hkv={},D={})", B, T, H, Hkv, D);
  }
  int64_t q_elems() const { return B * T * H * D; }
  int64_t kv_elems() const { return B * T * Hkv * D; }
  int64_t att_elems() const { return B * H * T * T; }
};

// The reference, written plainly: one query row at a time, scores, max, exp, normalise, weighted
// sum of values. Layouts as in attention.h.
void naive_attention(std::vector<double>& out, std::vector<double>& att, const double* q,
                     const double* k, const double* v, const Shape& s) {
  const int64_t G = s.H / s.Hkv;
  out.assign(s.q_elems(), 0.0);
  att.assign(s.att_elems(), 0.0);
  std::vector<double> w(s.T);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t g = h / G;
        const double* qr = q + ((b * s.T + t) * s.H + h) * s.D;
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          const double* kr = k + ((b * s.T + u) * s.Hkv + g) * s.D;
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d) dot += qr[d] * kr[d];
          w[u] = dot / std::sqrt(static_cast<double>(s.D));
          mx = std::max(mx, w[u]);
        }
        double sum = 0;
        for (int64_t u = 0; u <= t; ++u) sum += (w[u] = std::exp(w[u] - mx));
        double* o = out.data() + ((b * s.T + t) * s.H + h) * s.D;
        for (int64_t u = 0; u <= t; ++u) {
          const double p = w[u] / sum;
          att[((b * s.H + h) * s.T + t) * s.T + u] = p;
          const double* vr = v + ((b * s.T + u) * s.Hkv + g) * s.D;
          for (int64_t d = 0; d < s.D; ++d) o[d] += p * vr[d];
        }
      }
}

template <typename T>
struct Inputs {
  std::vector<T> q, k, v;
  explicit Inputs(const Shape& s, uint64_t seed = 1, double range = 1.0)
      : q(test::random_vec<T>(s.q_elems(), seed, -range, range)),
        k(test::random_vec<T>(s.kv_elems(), seed + 1, -range, range)),
        v(test::random_vec<T>(s.kv_elems(), seed + 2)) {}
};

void check_attention_grad(const Shape& s, int64_t max_points) {
  Inputs<double> in(s, 1, 1.5);
  auto r = test::random_vec<double>(s.q_elems(), 4);  // loss = Σ out ⊙ r, so dout = r
  std::vector<double> out(s.q_elems()), att(s.att_elems());
  auto loss = [&]() {
    model::attention_forward_cpu(out.data(), att.data(), in.q.data(), in.k.data(), in.v.data(), s.B,
                                 s.T, s.H, s.Hkv, s.D);
    return test::dot(out.data(), r.data(), s.q_elems());
  };
  loss();
  // Assigned outputs: start from garbage, which must be overwritten everywhere.
  std::vector<double> dq(s.q_elems(), 7.0), dk(s.kv_elems(), -7.0), dv(s.kv_elems(), 9.0);
  model::attention_backward_cpu(dq.data(), dk.data(), dv.data(), r.data(), att.data(), in.q.data(),
                                in.k.data(), in.v.data(), s.B, s.T, s.H, s.Hkv, s.D);
  // The query at t = 0 sees one key, its softmax is constant 1: dq is exactly 0 there (checked
  // exactly; FD would only see round-off). FD covers the rows t ≥ 1 of each sequence.
  const int64_t row = s.H * s.D;
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t i = 0; i < row; ++i) CHECK(dq[b * s.T * row + i] == 0.0);
    if (s.T == 1) continue;
    const int64_t off = (b * s.T + 1) * row;
    auto gq = test::fd_check(loss, in.q.data() + off, dq.data() + off, (s.T - 1) * row, 1e-5, true,
                             max_points / s.B);
    RLHF_CHECK_GRAD(gq, s.name() + fmt::format(" dq (b={}, t>=1)", b));
  }
  auto gk = test::fd_check(loss, in.k.data(), dk.data(), s.kv_elems(), 1e-5, true, max_points);
  auto gv = test::fd_check(loss, in.v.data(), dv.data(), s.kv_elems(), 1e-5, true, max_points);
  RLHF_CHECK_GRAD(gk, s.name() + " dk");
  RLHF_CHECK_GRAD(gv, s.name() + " dv");
}

const Shape kShapes[] = {
    {2, 33, 6, 2, 48},  // stories15M-like heads (D = 48), GQA with 3 query heads per KV head
    {1, 33, 6, 3, 48},  // 2 query heads per KV head
    {1, 97, 2, 1, 8},   // T crosses two query-row blocks (64) with a partial last block
    {3, 7, 4, 1, 6},    // odd: multi-query (Hkv = 1)
    {2, 5, 3, 3, 5},    // odd: plain multi-head, prime D
    {1, 1, 4, 1, 6},    // one token
};

}  // namespace

TEST_CASE("attention backward vs finite differences") {
  // One thread: thousands of tiny forwards, and on a loaded 2-core machine every OpenMP barrier can
  // wait a scheduler time slice (17 s instead of 1 s). Threading is covered by its own test.
  const ScopedThreads one_thread(1);
  // Sampled points per tensor: fewer on the big shapes, which cost ~1 ms per forward.
  const int64_t points[] = {150, 100, 200, 600, 600, 600};
  for (size_t i = 0; i < std::size(kShapes); ++i) check_attention_grad(kShapes[i], points[i]);
}

TEST_CASE("attention forward vs a naive softmax loop (double and float)") {
  for (const Shape& s : kShapes) {
    Inputs<double> in(s, 11, 2.0);
    std::vector<double> ref_out, ref_att;
    naive_attention(ref_out, ref_att, in.q.data(), in.k.data(), in.v.data(), s);

    std::vector<double> out(s.q_elems()), att(s.att_elems(), 5.0);  // 5: upper triangle must be 0
    model::attention_forward_cpu(out.data(), att.data(), in.q.data(), in.k.data(), in.v.data(), s.B,
                                 s.T, s.H, s.Hkv, s.D);
    auto co = test::compare_arrays(out.data(), ref_out.data(), s.q_elems());
    auto ca = test::compare_arrays(att.data(), ref_att.data(), s.att_elems());
    INFO(co.summary(s.name() + " out double"));
    INFO(ca.summary(s.name() + " att double"));
    CHECK(co.max_abs_err <= 1e-13);
    CHECK(ca.max_abs_err <= 1e-14);

    // float: inputs rounded to float, exp by exp_fast; errors of a few float ulps of O(1) values.
    std::vector<float> qf(in.q.begin(), in.q.end()), kf(in.k.begin(), in.k.end()),
        vf(in.v.begin(), in.v.end()), outf(s.q_elems()), attf(s.att_elems(), 5.0f);
    model::attention_forward_cpu(outf.data(), attf.data(), qf.data(), kf.data(), vf.data(), s.B,
                                 s.T, s.H, s.Hkv, s.D);
    auto cof = test::compare_arrays(outf.data(), ref_out.data(), s.q_elems());
    auto caf = test::compare_arrays(attf.data(), ref_att.data(), s.att_elems());
    INFO(cof.summary(s.name() + " out float"));
    INFO(caf.summary(s.name() + " att float"));
    CHECK(cof.max_abs_err <= 5e-6);
    CHECK(caf.max_abs_err <= 5e-6);
    CHECK(cof.finite);
    for (int64_t i = 0; i < s.att_elems(); ++i) {
      const int64_t t = (i / s.T) % s.T, u = i % s.T;
      if (u > t && (att[i] != 0.0 || attf[i] != 0.0f)) {
        FAIL_CHECK(s.name() << " att above the diagonal is not zero at index " << i);
        break;
      }
    }
  }
}

TEST_CASE("attention is causal: future keys/values leave earlier outputs bit-identical") {
  const Shape s{2, 100, 4, 2, 16};  // two row blocks; the change sits in the second one
  Inputs<float> in(s, 21);
  std::vector<float> out0(s.q_elems()), att0(s.att_elems()), out1(s.q_elems()), att1(s.att_elems());
  model::attention_forward_cpu(out0.data(), att0.data(), in.q.data(), in.k.data(), in.v.data(), s.B,
                               s.T, s.H, s.Hkv, s.D);
  const int64_t b = 1, t_changed = 70;
  for (int64_t i = 0; i < s.Hkv * s.D; ++i) {
    in.k[(b * s.T + t_changed) * s.Hkv * s.D + i] += 3.0f;
    in.v[(b * s.T + t_changed) * s.Hkv * s.D + i] -= 5.0f;
  }
  model::attention_forward_cpu(out1.data(), att1.data(), in.q.data(), in.k.data(), in.v.data(), s.B,
                               s.T, s.H, s.Hkv, s.D);
  const int64_t row = s.H * s.D;
  // batch 0 entirely, batch 1 up to t_changed − 1: identical; row t_changed: different.
  const int64_t same = (s.T + t_changed) * row;
  CHECK(std::memcmp(out0.data(), out1.data(), same * sizeof(float)) == 0);
  CHECK(std::memcmp(out0.data() + same, out1.data() + same, row * sizeof(float)) != 0);
  for (int64_t h = 0; h < s.H; ++h) {
    const float* a0 = att0.data() + (b * s.H + h) * s.T * s.T;
    const float* a1 = att1.data() + (b * s.H + h) * s.T * s.T;
    CHECK(std::memcmp(a0, a1, t_changed * s.T * sizeof(float)) == 0);
  }
}

TEST_CASE("attention: GQA equals MHA with duplicated KV heads (forward and backward)") {
  for (const Shape& s : {Shape{2, 33, 6, 2, 48}, Shape{1, 70, 4, 1, 6}}) {
    const Shape m{s.B, s.T, s.H, s.H, s.D};  // the same heads, one KV head per query head
    const int64_t G = s.H / s.Hkv;
    Inputs<double> in(s, 31);
    auto dout = test::random_vec<double>(s.q_elems(), 34);
    std::vector<double> km(m.kv_elems()), vm(m.kv_elems());
    for (int64_t bt = 0; bt < s.B * s.T; ++bt)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t d = 0; d < s.D; ++d) {
          km[(bt * s.H + h) * s.D + d] = in.k[(bt * s.Hkv + h / G) * s.D + d];
          vm[(bt * s.H + h) * s.D + d] = in.v[(bt * s.Hkv + h / G) * s.D + d];
        }
    std::vector<double> out(s.q_elems()), att(s.att_elems()), outm(s.q_elems()),
        attm(s.att_elems());
    model::attention_forward_cpu(out.data(), att.data(), in.q.data(), in.k.data(), in.v.data(), s.B,
                                 s.T, s.H, s.Hkv, s.D);
    model::attention_forward_cpu(outm.data(), attm.data(), in.q.data(), km.data(), vm.data(), m.B,
                                 m.T, m.H, m.Hkv, m.D);
    std::vector<double> dq(s.q_elems()), dk(s.kv_elems()), dv(s.kv_elems());
    std::vector<double> dqm(s.q_elems()), dkm(m.kv_elems()), dvm(m.kv_elems());
    model::attention_backward_cpu(dq.data(), dk.data(), dv.data(), dout.data(), att.data(),
                                  in.q.data(), in.k.data(), in.v.data(), s.B, s.T, s.H, s.Hkv, s.D);
    model::attention_backward_cpu(dqm.data(), dkm.data(), dvm.data(), dout.data(), attm.data(),
                                  in.q.data(), km.data(), vm.data(), m.B, m.T, m.H, m.Hkv, m.D);
    // The KV gradient of a group is the sum of the duplicated heads' gradients.
    std::vector<double> dk_sum(s.kv_elems(), 0.0), dv_sum(s.kv_elems(), 0.0);
    for (int64_t bt = 0; bt < s.B * s.T; ++bt)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t d = 0; d < s.D; ++d) {
          dk_sum[(bt * s.Hkv + h / G) * s.D + d] += dkm[(bt * s.H + h) * s.D + d];
          dv_sum[(bt * s.Hkv + h / G) * s.D + d] += dvm[(bt * s.H + h) * s.D + d];
        }
    auto c_out = test::compare_arrays(out.data(), outm.data(), s.q_elems());
    auto c_att = test::compare_arrays(att.data(), attm.data(), s.att_elems());
    auto c_dq = test::compare_arrays(dq.data(), dqm.data(), s.q_elems());
    auto c_dk = test::compare_arrays(dk.data(), dk_sum.data(), s.kv_elems());
    auto c_dv = test::compare_arrays(dv.data(), dv_sum.data(), s.kv_elems());
    INFO(c_out.summary(s.name() + " out"));
    INFO(c_att.summary(s.name() + " att"));
    INFO(c_dq.summary(s.name() + " dq"));
    INFO(c_dk.summary(s.name() + " dk"));
    INFO(c_dv.summary(s.name() + " dv"));
    CHECK(c_out.max_abs_err <= 1e-13);
    CHECK(c_att.max_abs_err <= 1e-14);
    CHECK(c_dq.max_abs_err <= 1e-12);
    CHECK(c_dk.max_abs_err <= 1e-12);
    CHECK(c_dv.max_abs_err <= 1e-12);
  }
}

TEST_CASE("attention backward is deterministic and independent of the thread count") {
  const Shape s{3, 70, 6, 2, 16};
  Inputs<float> in(s, 41);
  auto dout = test::random_vec<float>(s.q_elems(), 44);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3, 5}) {
    const ScopedThreads scoped(threads);
    std::vector<float> out(s.q_elems()), att(s.att_elems());
    std::vector<float> grads(s.q_elems() + 2 * s.kv_elems());
    float* dq = grads.data();
    float* dk = dq + s.q_elems();
    float* dv = dk + s.kv_elems();
    model::attention_forward_cpu(out.data(), att.data(), in.q.data(), in.k.data(), in.v.data(), s.B,
                                 s.T, s.H, s.Hkv, s.D);
    model::attention_backward_cpu(dq, dk, dv, dout.data(), att.data(), in.q.data(), in.k.data(),
                                  in.v.data(), s.B, s.T, s.H, s.Hkv, s.D);
    grads.insert(grads.end(), out.begin(), out.end());
    results.push_back(std::move(grads));
  }
  for (size_t i = 1; i < results.size(); ++i)
    CHECK(std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)) ==
          0);
}

TEST_CASE("attention: invalid head counts throw") {
  std::vector<float> buf(4096);
  CHECK_THROWS_AS(model::attention_forward_cpu(buf.data(), buf.data(), buf.data(), buf.data(),
                                               buf.data(), 1, 2, 6, 4, 8),
                  Error);
  CHECK_THROWS_AS(
      model::attention_backward_cpu(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(),
                                    buf.data(), buf.data(), buf.data(), 1, 2, 4, 0, 8),
      Error);
}

// OpClock (model/op_clock.h): each instrumented op adds its wall time to its own kind and to no
// other, within the wall time around the call; a call inside an OpenMP parallel region adds
// nothing (its region is its caller's time).
#include "model/op_clock.h"

#include <omp.h>

#include <chrono>
#include <vector>

#include "model/ops/attention.h"
#include "model/ops/half.h"
#include "model/ops/linear.h"
#include "tests/test_util.h"

using namespace rlhf;
using model::op_seconds;
using model::OpKind;

namespace {

struct Clocks {
  double s[3];
  Clocks() {
    for (int k = 0; k < 3; ++k) s[k] = op_seconds(OpKind(k));
  }
};

// Runs f; returns the wall seconds around it and each kind's seconds added meanwhile.
template <typename F>
std::pair<double, Clocks> measured(F&& f) {
  const Clocks c0;
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Clocks d;
  for (int k = 0; k < 3; ++k) d.s[k] -= c0.s[k];
  return {wall, d};
}

}  // namespace

TEST_CASE("op clock: GEMM, attention and bf16 rounding each count their own time") {
  const int64_t N = 256, IC = 192, OC = 320;
  std::vector<float> x(size_t(N * IC), 0.5f), w(size_t(OC * IC), 0.25f), y(size_t(N * OC));
  auto [wall, d] = measured(
      [&] { model::linear_forward_cpu<float>(y.data(), x.data(), w.data(), nullptr, N, IC, OC); });
  CHECK(d.s[int(OpKind::kGemm)] > 0);
  CHECK(d.s[int(OpKind::kGemm)] <= wall);
  CHECK(d.s[int(OpKind::kAttention)] == 0);
  CHECK(d.s[int(OpKind::kBf16Round)] == 0);

  std::vector<float> dx(x.size()), dw(w.size(), 0.0f);
  std::tie(wall, d) = measured([&] {
    model::linear_backward_cpu<float>(dx.data(), dw.data(), nullptr, y.data(), x.data(), w.data(),
                                      N, IC, OC, false);
  });
  CHECK(d.s[int(OpKind::kGemm)] > 0);
  CHECK(d.s[int(OpKind::kGemm)] <= wall);

  const int64_t B = 2, T = 64, H = 4, Hkv = 2, D = 16;
  std::vector<float> q(size_t(B * T * H * D), 0.1f), k(size_t(B * T * Hkv * D), 0.2f),
      v(k.size(), 0.3f), out(q.size()), att(size_t(B * H * T * T));
  std::tie(wall, d) = measured([&] {
    model::attention_forward_cpu<float>(out.data(), att.data(), q.data(), k.data(), v.data(), B, T,
                                        H, Hkv, D);
  });
  CHECK(d.s[int(OpKind::kAttention)] > 0);
  CHECK(d.s[int(OpKind::kAttention)] <= wall);
  CHECK(d.s[int(OpKind::kGemm)] == 0);  // its per-head sgemms are attention's time

  std::vector<model::bfloat16> x16(x.size());
  std::tie(wall, d) = measured([&] {
    model::float_to_bf16_n(x16.data(), x.data(), N * IC);
    model::round_to_bf16_n(y.data(), N * OC);
  });
  CHECK(d.s[int(OpKind::kBf16Round)] > 0);
  CHECK(d.s[int(OpKind::kBf16Round)] <= wall);
  CHECK(d.s[int(OpKind::kGemm)] == 0);
}

TEST_CASE("op clock: a call inside an OpenMP parallel region is its caller's time") {
  std::vector<float> a(4096, 1.5f);
  const auto [wall, d] = measured([&] {
#pragma omp parallel num_threads(2)
    model::round_to_bf16_n(a.data() + 2048 * omp_get_thread_num(), 2048);
  });
  (void)wall;
  CHECK(d.s[int(OpKind::kBf16Round)] == 0);
}

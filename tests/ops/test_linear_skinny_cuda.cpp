// The few-row decode linear (linear_forward_skinny_cuda) against an fp64 reference on the same
// bf16 values: every output within one bf16 rounding of the exact value; a row's output equal bit
// for bit whether it runs alone or among kSkinnyMaxRows rows; linear_forward_cuda's dispatch rules;
// refusals.
#include <cmath>

#include "model/ops/linear.h"
#include "model/ops/swiglu.h"
#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

// y = x·wᵀ + b in fp64 over the bf16 values.
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>* b, int64_t N, int64_t IC, int64_t OC) {
  std::vector<double> y(size_t(N * OC));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b != nullptr ? double((*b)[size_t(o)]) : 0.0;
      for (int64_t i = 0; i < IC; ++i)
        s += double(x[size_t(n * IC + i)]) * double(w[size_t(o * IC + i)]);
      y[size_t(n * OC + o)] = s;
    }
  return y;
}

void check_skinny(int64_t N, int64_t IC, int64_t OC, bool bias) {
  const std::string name = fmt::format("skinny(N={},IC={},OC={},bias={})", N, IC, OC, bias);
  const auto x = test::random_bf16_values(N * IC, 11);
  const auto w = test::random_bf16_values(OC * IC, 12, -0.2, 0.2);
  const auto b = test::random_bf16_values(OC, 13);
  const auto ref = reference(x, w, bias ? &b : nullptr, N, IC, OC);
  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_x(test::to_bf16(x)), d_w(test::to_bf16(w)),
      d_b(test::to_bf16(b)), d_y(N * OC);
  model::linear_forward_skinny_cuda(d_y.get(), d_x.get(), d_w.get(), bias ? d_b.get() : nullptr, N,
                                    IC, OC, s.get());
  s.sync();
  const std::vector<float> y = test::download_f32(d_y);
  // fp32 sums of IC products err by ~sqrt(IC)·2^-24 of the products' size (~1e-7 here), far
  // below bf16's 2^-9: the result is the exact value rounded once, give or take one bf16 step
  // near a tie (the 1e-6 floor covers results so close to 0 that the fp32 error shows).
  int64_t worse = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(ref[i]), 1e-30)) - 7);
    const double step = std::max(ulp, 1e-6);
    worse += std::fabs(double(y[i]) - ref[i]) > step;
  }
  CHECK_MESSAGE(worse == 0, name << ": " << worse << " outputs more than one bf16 step off");
  // Alone: each row by itself gives the same bits.
  for (int64_t n = 0; n < N; ++n) {
    test::DeviceBuffer<test::bf16> x1(
        test::to_bf16(std::vector<float>(x.begin() + n * IC, x.begin() + (n + 1) * IC))),
        y1(OC);
    model::linear_forward_skinny_cuda(y1.get(), x1.get(), d_w.get(), bias ? d_b.get() : nullptr, 1,
                                      IC, OC, s.get());
    s.sync();
    const std::vector<float> alone = test::download_f32(y1);
    int64_t differ = 0;
    for (int64_t o = 0; o < OC; ++o) differ += alone[size_t(o)] != y[size_t(n * OC + o)];
    CHECK_MESSAGE(differ == 0, name << " row " << n << ": " << differ << " outputs differ alone");
  }
  test::check_guards(name, d_x, d_w, d_b, d_y);
}

// linear_swiglu_skinny_cuda against linear_forward_skinny_cuda twice + swiglu_forward_cuda (bit
// for bit) and against the CPU ops on the same bf16 values (nmse).
void check_swiglu(int64_t N, int64_t IC, int64_t F, bool bias) {
  const std::string name = fmt::format("swiglu skinny(N={},IC={},F={},bias={})", N, IC, F, bias);
  const auto x = test::random_bf16_values(N * IC, 21);
  const auto wg = test::random_bf16_values(F * IC, 22, -0.2, 0.2);
  const auto wu = test::random_bf16_values(F * IC, 23, -0.2, 0.2);
  const auto bg = test::random_bf16_values(F, 24), bu = test::random_bf16_values(F, 25);
  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_x(test::to_bf16(x)), d_wg(test::to_bf16(wg)),
      d_wu(test::to_bf16(wu)), d_bg(test::to_bf16(bg)), d_bu(test::to_bf16(bu)), h(N * F), g(N * F),
      u(N * F), h3(N * F);
  const test::bf16* pbg = bias ? d_bg.get() : nullptr;
  const test::bf16* pbu = bias ? d_bu.get() : nullptr;
  model::linear_swiglu_skinny_cuda(h.get(), d_x.get(), d_wg.get(), pbg, d_wu.get(), pbu, N, IC, F,
                                   s.get());
  model::linear_forward_skinny_cuda(g.get(), d_x.get(), d_wg.get(), pbg, N, IC, F, s.get());
  model::linear_forward_skinny_cuda(u.get(), d_x.get(), d_wu.get(), pbu, N, IC, F, s.get());
  model::swiglu_forward_cuda(h3.get(), g.get(), u.get(), N, F, s.get());
  s.sync();
  const auto fused = test::download_f32(h), steps = test::download_f32(h3);
  int64_t differ = 0;
  for (size_t i = 0; i < fused.size(); ++i) differ += fused[i] != steps[i];
  CHECK_MESSAGE(differ == 0, name << ": " << differ << " values differ from the three steps");
  std::vector<float> g_ref(size_t(N * F)), u_ref(g_ref.size()), h_ref(g_ref.size());
  model::linear_forward_cpu(g_ref.data(), x.data(), wg.data(), bias ? bg.data() : nullptr, N, IC,
                            F);
  model::linear_forward_cpu(u_ref.data(), x.data(), wu.data(), bias ? bu.data() : nullptr, N, IC,
                            F);
  model::swiglu_forward_cpu(h_ref.data(), g_ref.data(), u_ref.data(), N, F);
  test::check_nmse(name, fused, h_ref, 4 * test::kNmseBf16Out);  // g, u and h rounded
  test::check_guards(name, d_x, d_wg, d_wu, d_bg, d_bu, h, g, u, h3);
}

}  // namespace
#endif

TEST_CASE("linear skinny cuda: gate, up and SwiGLU in one kernel = the three steps") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_swiglu(1, 576, 1536, false);  // SmolLM-135M's MLP at batch 1
  check_swiglu(3, 64, 40, true);
  check_swiglu(model::kSkinnyMaxRows, 1544, 9, false);
#endif
}

TEST_CASE("linear skinny cuda: decode rows against fp64, batch-invariant") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  for (int64_t N = 1; N <= model::kSkinnyMaxRows; ++N) check_skinny(N, 576, 960, N % 2 == 0);
  check_skinny(1, 2048, 40, false);  // a long row: the unrolled loop and its tail
  check_skinny(3, 8, 3, true);       // one chunk per row, fewer features than warps in a block
  check_skinny(model::kSkinnyMaxRows, 1544, 13, false);  // chunks not a multiple of 32 lanes
#endif
}

TEST_CASE("linear skinny cuda: linear_forward_cuda's dispatch and the refusals") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const int64_t IC = 64, OC = 16;
  test::TestStream s;
  test::DeviceBuffer<test::bf16> x(test::to_bf16(test::random_bf16_values(9 * IC, 1))),
      w(test::to_bf16(test::random_bf16_values(OC * IC, 2))), y(9 * OC), y2(9 * OC);
  const int64_t most = model::kSkinnyMaxRows;
  CHECK(model::linear_skinny_serves(x.get(), w.get(), most, IC));
  CHECK_FALSE(model::linear_skinny_serves(x.get(), w.get(), most + 1, IC));  // too many rows
  CHECK_FALSE(model::linear_skinny_serves(x.get(), w.get(), 2, 60));         // IC % 8 != 0
  CHECK_FALSE(model::linear_skinny_serves(x.get() + 1, w.get(), 2, 56));  // x not 16-byte aligned
  model::set_linear_skinny_enabled(false);
  CHECK_FALSE(model::linear_skinny_serves(x.get(), w.get(), most, IC));
  model::set_linear_skinny_enabled(true);
  // Served rows: linear_forward_cuda is the skinny kernel, bit for bit.
  model::linear_forward_cuda(y.get(), x.get(), w.get(), nullptr, most, IC, OC, s.get());
  model::linear_forward_skinny_cuda(y2.get(), x.get(), w.get(), nullptr, most, IC, OC, s.get());
  s.sync();
  const auto a = test::download_f32(y), b = test::download_f32(y2);
  CHECK(std::equal(a.begin(), a.begin() + most * OC, b.begin()));
  CHECK_THROWS_AS(model::linear_forward_skinny_cuda(y.get(), x.get(), w.get(), nullptr, most + 1,
                                                    IC, OC, s.get()),
                  rlhf::Error);
  CHECK_THROWS_AS(
      model::linear_forward_skinny_cuda(y.get(), x.get(), w.get(), nullptr, 2, 60, OC, s.get()),
      rlhf::Error);
#endif
}

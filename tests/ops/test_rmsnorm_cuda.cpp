// RMSNorm on the GPU against the CPU op on identical bf16-valued inputs: forward, the fused
// residual + RMSNorm forward (against residual then RMSNorm on the rounded sum), and backward
// (dx accumulates into a non-zero bf16 start, dw into a non-zero fp32 start).
#include "model/ops/residual.h"
#include "model/ops/rmsnorm.h"

#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

void check_rmsnorm_cuda(int64_t N, int64_t C) {
  const std::string name = fmt::format("rmsnorm_cuda(N={},C={})", N, C);
  const double eps = 1e-5;
  const auto x = test::random_bf16_values(N * C, 1, -2, 2);
  const auto w = test::random_bf16_values(C, 2, 0.5, 1.5);
  const auto dy = test::random_bf16_values(N * C, 3);
  const auto dx0 = test::random_bf16_values(N * C, 4);  // residual stream: dx accumulates
  const auto dw0 = test::random_vec<float>(C, 5);

  std::vector<float> y_ref(N * C), rstd_ref(N), dx_ref = dx0, dw_ref = dw0;
  model::rmsnorm_forward_cpu(y_ref.data(), rstd_ref.data(), x.data(), w.data(), N, C, eps);
  model::rmsnorm_backward_cpu(dx_ref.data(), dw_ref.data(), dy.data(), x.data(), w.data(),
                              rstd_ref.data(), N, C);

  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_x(test::to_bf16(x)), d_w(test::to_bf16(w)), d_y(N * C),
      d_dy(test::to_bf16(dy)), d_dx(test::to_bf16(dx0));
  test::DeviceBuffer<float> d_rstd(N), d_dw(dw0);
  model::rmsnorm_forward_cuda(d_y.get(), d_rstd.get(), d_x.get(), d_w.get(), N, C, eps, s.get());
  // Backward reads the GPU's own rstd (what training does).
  model::rmsnorm_backward_cuda(d_dx.get(), d_dw.get(), d_dy.get(), d_x.get(), d_w.get(),
                               d_rstd.get(), N, C, s.get());
  s.sync();
  test::check_nmse(name + " y", test::download_f32(d_y), y_ref, test::kNmseBf16Out);
  test::check_nmse(name + " rstd", d_rstd.download(), rstd_ref, test::kNmseF32Out);
  test::check_nmse(name + " dx", test::download_f32(d_dx), dx_ref, test::kNmseBf16Out);
  test::check_nmse(name + " dw", d_dw.download(), dw_ref, test::kNmseF32Out);
  test::check_guards(name, d_x, d_w, d_y, d_dy, d_dx, d_rstd, d_dw);
}

void check_fused_cuda(int64_t N, int64_t C, bool in_place) {
  const std::string name =
      fmt::format("rmsnorm_residual_cuda(N={},C={}{})", N, C, in_place ? ",in_place" : "");
  const double eps = 1e-6;
  const auto res = test::random_bf16_values(N * C, 31, -2, 2);
  const auto x = test::random_bf16_values(N * C, 32, -2, 2);
  const auto w = test::random_bf16_values(C, 33, 0.5, 1.5);
  // Reference: the sum rounded to bf16 (the stored residual), then RMSNorm of the rounded sum.
  std::vector<float> sum(N * C), y_ref(N * C), rstd_ref(N);
  model::residual_forward_cpu(sum.data(), res.data(), x.data(), N * C);
  sum = test::round_bf16(sum);
  model::rmsnorm_forward_cpu(y_ref.data(), rstd_ref.data(), sum.data(), w.data(), N, C, eps);

  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_res(test::to_bf16(res)), d_x(test::to_bf16(x)),
      d_w(test::to_bf16(w)), d_out(N * C), d_y(N * C);
  test::DeviceBuffer<float> d_rstd(N);
  test::bf16* out = in_place ? d_res.get() : d_out.get();
  model::rmsnorm_residual_forward_cuda(out, d_y.get(), d_rstd.get(), d_res.get(), d_x.get(),
                                       d_w.get(), N, C, eps, s.get());
  s.sync();
  const auto got_sum = test::download_f32(in_place ? d_res : d_out);
  // The sum: the same fp32 add and the same bf16 rounding as the reference: bit-exact.
  const auto c_sum = test::compare_arrays(got_sum.data(), sum.data(), N * C);
  MESSAGE(c_sum.summary(name + " residual_out"));
  CHECK(c_sum.max_abs_err == 0.0);
  test::check_nmse(name + " y", test::download_f32(d_y), y_ref, test::kNmseBf16Out);
  test::check_nmse(name + " rstd", d_rstd.download(), rstd_ref, test::kNmseF32Out);
  test::check_guards(name, d_res, d_x, d_w, d_out, d_y, d_rstd);
}

}  // namespace
#endif

TEST_CASE("rmsnorm cuda vs cpu") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_rmsnorm_cuda(64, 288);   // stories15M
  check_rmsnorm_cuda(300, 576);  // SmolLM-135M
  check_rmsnorm_cuda(5, 2048);   // Llama-1B width
  check_rmsnorm_cuda(7, 13);     // odd
  check_rmsnorm_cuda(1, 5);      // one row, C < 32 (idle lanes)
#endif
}

TEST_CASE("rmsnorm cuda: fused residual add + rmsnorm forward") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_fused_cuda(64, 288, false);
  check_fused_cuda(64, 288, true);  // residual_out aliases residual_in
  check_fused_cuda(11, 13, false);
  check_fused_cuda(1, 5, true);
#endif
}

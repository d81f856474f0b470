// Linear (cuBLASLt) on the GPU against the CPU op (OpenBLAS sgemm on the same bf16 values):
// forward with and without bias (aligned bias: the epilogue; a bias at an odd address: the
// pre-fill path), backward with dx assigned and accumulated, dw and db accumulated in fp32, and
// frozen weights (dw = nullptr). Shapes: stories15M and SmolLM projections, odd and tiny ones.
#include "model/ops/linear.h"

#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

void check_linear_cuda(int64_t N, int64_t IC, int64_t OC, bool bias, bool accumulate_dx,
                       bool misaligned_bias = false) {
  const std::string name =
      fmt::format("linear_cuda(N={},IC={},OC={},bias={},acc_dx={}{})", N, IC, OC, bias,
                  accumulate_dx, misaligned_bias ? ",misaligned_bias" : "");
  const auto x = test::random_bf16_values(N * IC, 1);
  const auto w = test::random_bf16_values(OC * IC, 2, -0.2, 0.2);
  const auto b = test::random_bf16_values(OC, 3);
  const auto dy = test::random_bf16_values(N * OC, 4);
  const auto dx0 = test::random_bf16_values(N * IC, 5);
  const auto dw0 = test::random_vec<float>(OC * IC, 6);
  const auto db0 = test::random_vec<float>(OC, 7);

  std::vector<float> y_ref(N * OC), dx_ref = dx0, dw_ref = dw0, db_ref = db0;
  model::linear_forward_cpu(y_ref.data(), x.data(), w.data(), bias ? b.data() : nullptr, N, IC, OC);
  model::linear_backward_cpu(dx_ref.data(), dw_ref.data(), db_ref.data(), dy.data(), x.data(),
                             w.data(), N, IC, OC, accumulate_dx);

  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_x(test::to_bf16(x)), d_w(test::to_bf16(w)), d_y(N * OC),
      d_dy(test::to_bf16(dy)), d_dx(test::to_bf16(dx0));
  // The bias sits at element 1 of its buffer when misaligned (2-byte aligned only).
  std::vector<float> b_store(b);
  if (misaligned_bias) b_store.insert(b_store.begin(), 0.0f);
  test::DeviceBuffer<test::bf16> d_b(test::to_bf16(b_store));
  const test::bf16* b_ptr = bias ? d_b.get() + (misaligned_bias ? 1 : 0) : nullptr;
  test::DeviceBuffer<float> d_dw(dw0), d_db(db0);
  model::linear_forward_cuda(d_y.get(), d_x.get(), d_w.get(), b_ptr, N, IC, OC, s.get());
  model::linear_backward_cuda(d_dx.get(), d_dw.get(), d_db.get(), d_dy.get(), d_x.get(), d_w.get(),
                              N, IC, OC, accumulate_dx, s.get());
  s.sync();
  test::check_nmse(name + " y", test::download_f32(d_y), y_ref, test::kNmseBf16Out);
  test::check_nmse(name + " dx", test::download_f32(d_dx), dx_ref, test::kNmseBf16Out);
  test::check_nmse(name + " dw", d_dw.download(), dw_ref, test::kNmseF32Out);
  test::check_nmse(name + " db", d_db.download(), db_ref, test::kNmseF32Out);
  test::check_guards(name, d_x, d_w, d_y, d_dy, d_dx, d_b, d_dw, d_db);
}

}  // namespace
#endif

TEST_CASE("linear cuda vs cpu") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_linear_cuda(64, 288, 768, false, false);   // stories15M gate/up
  check_linear_cuda(64, 768, 288, true, true);     // stories15M down, with bias, dx +=
  check_linear_cuda(256, 576, 1536, true, false);  // SmolLM-135M gate/up
  check_linear_cuda(128, 576, 192, true, true);    // SmolLM k/v projection (Hkv·D = 3·64)
  check_linear_cuda(7, 13, 11, true, false);       // odd: ld not a multiple of 8 elements
  check_linear_cuda(7, 13, 11, true, true, true);  // odd, bias at an odd address
  check_linear_cuda(1, 5, 7, false, true);         // one row
  check_linear_cuda(5, 7, 1, true, false);         // one output (a scalar head)
#endif
}

TEST_CASE("linear cuda: frozen weights (dw = nullptr) still give dx; N = 0 is a no-op") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const int64_t N = 9, IC = 16, OC = 24;
  const auto w = test::random_bf16_values(OC * IC, 41);
  const auto dy = test::random_bf16_values(N * OC, 42);
  const auto x = test::random_bf16_values(N * IC, 43);
  std::vector<float> dx_ref(N * IC), dw_unused(OC * IC, 0.0f);
  model::linear_backward_cpu(dx_ref.data(), dw_unused.data(), static_cast<float*>(nullptr),
                             dy.data(), x.data(), w.data(), N, IC, OC, false);
  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_w(test::to_bf16(w)), d_dy(test::to_bf16(dy)),
      d_x(test::to_bf16(x)), d_dx(N * IC);
  model::linear_backward_cuda(d_dx.get(), nullptr, nullptr, d_dy.get(), d_x.get(), d_w.get(), N, IC,
                              OC, false, s.get());
  test::DeviceBuffer<test::bf16> d_y0(1);
  model::linear_forward_cuda(d_y0.get(), d_x.get(), d_w.get(), nullptr, 0, IC, OC, s.get());
  s.sync();
  test::check_nmse("linear_cuda frozen dx", test::download_f32(d_dx), dx_ref, test::kNmseBf16Out);
  CHECK(std::isnan(test::download_f32(d_y0)[0]));  // untouched (still the NaN fill)
  test::check_guards("linear_cuda frozen", d_w, d_dy, d_x, d_dx, d_y0);
  CHECK_THROWS_AS(
      model::linear_forward_cuda(d_y0.get(), d_x.get(), d_w.get(), nullptr, N, 0, OC, s.get()),
      rlhf::Error);
#endif
}

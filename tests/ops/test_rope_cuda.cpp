// RoPE on the GPU against the CPU op, both pairing styles, forward and backward (the inverse
// rotation), with the same fp32 tables; also in place (out aliasing x) and the round trip
// backward(forward(x)) ≈ x.
#include "model/ops/rope.h"

#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

void check_rope_cuda(int64_t N, int64_t H, int64_t D, model::RopeStyle style, double theta) {
  const std::string name = fmt::format("rope_cuda(N={},H={},D={},style={},theta={:g})", N, H, D,
                                       model::to_string(style), theta);
  const int64_t max_pos = 4096;
  std::vector<float> cos(max_pos * D / 2), sin(max_pos * D / 2);
  model::rope_tables_cpu(cos.data(), sin.data(), max_pos, D, theta);
  auto pos = test::random_tokens(N, max_pos, 1);
  pos[0] = 0;
  if (N > 1) pos[N - 1] = static_cast<int32_t>(max_pos - 1);
  const auto x = test::random_bf16_values(N * H * D, 2);
  const auto dout = test::random_bf16_values(N * H * D, 3);
  std::vector<float> out_ref(N * H * D), dx_ref(N * H * D);
  model::rope_forward_cpu(out_ref.data(), x.data(), pos.data(), cos.data(), sin.data(), N, H, D,
                          style);
  model::rope_backward_cpu(dx_ref.data(), dout.data(), pos.data(), cos.data(), sin.data(), N, H, D,
                           style);

  test::TestStream s;
  test::DeviceBuffer<float> d_cos(cos), d_sin(sin);
  test::DeviceBuffer<int32_t> d_pos(pos);
  test::DeviceBuffer<test::bf16> d_x(test::to_bf16(x)), d_out(N * H * D),
      d_dout(test::to_bf16(dout)), d_dx(N * H * D), d_inplace(test::to_bf16(x));
  model::rope_forward_cuda(d_out.get(), d_x.get(), d_pos.get(), d_cos.get(), d_sin.get(), N, H, D,
                           style, s.get());
  model::rope_backward_cuda(d_dx.get(), d_dout.get(), d_pos.get(), d_cos.get(), d_sin.get(), N, H,
                            D, style, s.get());
  model::rope_forward_cuda(d_inplace.get(), d_inplace.get(), d_pos.get(), d_cos.get(), d_sin.get(),
                           N, H, D, style, s.get());
  s.sync();
  const auto out = test::download_f32(d_out);
  test::check_nmse(name + " out", out, out_ref, test::kNmseBf16Out);
  test::check_nmse(name + " dx", test::download_f32(d_dx), dx_ref, test::kNmseBf16Out);
  const auto inplace = test::download_f32(d_inplace);
  CHECK(test::compare_arrays(inplace.data(), out.data(), N * H * D).max_abs_err == 0.0);
  // Round trip: Rᵀ·R = I, up to two bf16 roundings.
  model::rope_backward_cuda(d_inplace.get(), d_inplace.get(), d_pos.get(), d_cos.get(), d_sin.get(),
                            N, H, D, style, s.get());
  s.sync();
  test::check_nmse(name + " backward(forward(x))", test::download_f32(d_inplace), x,
                   2 * test::kNmseBf16Out);
  test::check_guards(name, d_cos, d_sin, d_pos, d_x, d_out, d_dout, d_dx, d_inplace);
}

}  // namespace
#endif

TEST_CASE("rope cuda vs cpu") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  for (auto style : {model::RopeStyle::kInterleaved, model::RopeStyle::kRotateHalf}) {
    check_rope_cuda(64, 6, 48, style, 1e4);   // stories15M
    check_rope_cuda(100, 9, 64, style, 1e5);  // SmolLM-135M
    check_rope_cuda(7, 4, 16, style, 1e4);    // odd N
    check_rope_cuda(1, 1, 2, style, 5e5);     // one pair
    check_rope_cuda(13, 3, 128, style, 5e5);  // D = 128
  }
#endif
}

// SwiGLU on the GPU against the CPU op on identical bf16 inputs, gate values spanning the
// saturated ranges (|g| up to 30), forward and backward; also dgate/dup aliasing dh.
#include "model/ops/swiglu.h"

#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

void check_swiglu_cuda(int64_t N, int64_t F, double gate_range) {
  const std::string name = fmt::format("swiglu_cuda(N={},F={},gate=±{:g})", N, F, gate_range);
  const int64_t n = N * F;
  const auto gate = test::random_bf16_values(n, 1, -gate_range, gate_range);
  const auto up = test::random_bf16_values(n, 2, -2, 2);
  const auto dh = test::random_bf16_values(n, 3);
  std::vector<float> h_ref(n), dgate_ref(n), dup_ref(n);
  model::swiglu_forward_cpu(h_ref.data(), gate.data(), up.data(), N, F);
  model::swiglu_backward_cpu(dgate_ref.data(), dup_ref.data(), dh.data(), gate.data(), up.data(), N,
                             F);
  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_gate(test::to_bf16(gate)), d_up(test::to_bf16(up)), d_h(n),
      d_dh(test::to_bf16(dh)), d_dgate(n), d_dup(n), d_alias(test::to_bf16(dh));
  model::swiglu_forward_cuda(d_h.get(), d_gate.get(), d_up.get(), N, F, s.get());
  model::swiglu_backward_cuda(d_dgate.get(), d_dup.get(), d_dh.get(), d_gate.get(), d_up.get(), N,
                              F, s.get());
  // dgate written over dh (the in-place use in a trainer that reuses the buffer).
  model::swiglu_backward_cuda(d_alias.get(), d_dup.get(), d_alias.get(), d_gate.get(), d_up.get(),
                              N, F, s.get());
  s.sync();
  test::check_nmse(name + " h", test::download_f32(d_h), h_ref, test::kNmseBf16Out);
  const auto dgate = test::download_f32(d_dgate);
  test::check_nmse(name + " dgate", dgate, dgate_ref, test::kNmseBf16Out);
  test::check_nmse(name + " dup", test::download_f32(d_dup), dup_ref, test::kNmseBf16Out);
  const auto alias = test::download_f32(d_alias);
  CHECK(test::compare_arrays(alias.data(), dgate.data(), n).max_abs_err == 0.0);
  test::check_guards(name, d_gate, d_up, d_h, d_dh, d_dgate, d_dup, d_alias);
}

}  // namespace
#endif

TEST_CASE("swiglu cuda vs cpu") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_swiglu_cuda(64, 768, 4);    // stories15M
  check_swiglu_cuda(32, 1536, 30);  // SmolLM-135M, saturated gates
  check_swiglu_cuda(7, 13, 8);      // odd
  check_swiglu_cuda(1, 1, 1);
#endif
}

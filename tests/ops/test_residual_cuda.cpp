// Residual add on the GPU against the CPU op: both sides do the same IEEE fp32 add of the same
// values, and the GPU's one bf16 rounding is reproduced on the host, so results are bit-identical.
// Backward adds dout into two bf16 accumulators (and into one alone).
#include "model/ops/residual.h"

#include <tuple>

#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

void check_residual_cuda(int64_t n) {
  const std::string name = fmt::format("residual_cuda(n={})", n);
  const auto a = test::random_bf16_values(n, 1, -4, 4);
  const auto b = test::random_bf16_values(n, 2, -4, 4);
  const auto dout = test::random_bf16_values(n, 3);
  const auto da0 = test::random_bf16_values(n, 4), db0 = test::random_bf16_values(n, 5);
  std::vector<float> out_ref(n), da_ref = da0, db_ref = db0;
  model::residual_forward_cpu(out_ref.data(), a.data(), b.data(), n);
  model::residual_backward_cpu(da_ref.data(), db_ref.data(), dout.data(), n);
  out_ref = test::round_bf16(out_ref);
  da_ref = test::round_bf16(da_ref);
  db_ref = test::round_bf16(db_ref);

  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_a(test::to_bf16(a)), d_b(test::to_bf16(b)), d_out(n),
      d_dout(test::to_bf16(dout)), d_da(test::to_bf16(da0)), d_db(test::to_bf16(db0)),
      d_only(test::to_bf16(da0));
  model::residual_forward_cuda(d_out.get(), d_a.get(), d_b.get(), n, s.get());
  model::residual_backward_cuda(d_da.get(), d_db.get(), d_dout.get(), n, s.get());
  model::residual_backward_cuda(d_only.get(), nullptr, d_dout.get(), n, s.get());
  s.sync();
  // The same fp32 add, then the same round-to-nearest-even to bf16: bit-exact.
  for (auto [what, got, ref] : {std::tuple{"out", test::download_f32(d_out), out_ref},
                                std::tuple{"da", test::download_f32(d_da), da_ref},
                                std::tuple{"db", test::download_f32(d_db), db_ref},
                                std::tuple{"da alone", test::download_f32(d_only), da_ref}}) {
    const auto c = test::compare_arrays(got.data(), ref.data(), n);
    MESSAGE(c.summary(name + " " + what));
    CHECK(c.finite);
    CHECK(c.max_abs_err == 0.0);
  }
  test::check_guards(name, d_a, d_b, d_out, d_dout, d_da, d_db, d_only);
}

}  // namespace
#endif

TEST_CASE("residual cuda vs cpu") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_residual_cuda(64 * 288);
  check_residual_cuda(1000003);  // odd, several grid-stride rounds
  check_residual_cuda(13);
  check_residual_cuda(1);
#endif
}

// Embedding on the GPU against the CPU op: forward is a copy (exact), backward accumulates the
// same fp32 additions in the same order (n increasing per token), so it must be bit-identical.
// Repeated tokens (every third position reuses one id) exercise the sorted runs; an invalid id
// gives a NaN row forward and is skipped backward.
#include "model/ops/embedding.h"

#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

void check_embedding_cuda(int64_t N, int64_t C, int64_t V) {
  const std::string name = fmt::format("embedding_cuda(N={},C={},V={})", N, C, V);
  auto tokens = test::random_tokens(N, V, 11);
  for (int64_t n = 3; n < N; n += 3) tokens[n] = tokens[0];
  const auto wte = test::random_bf16_values(V * C, 12);
  const auto dout = test::random_bf16_values(N * C, 13);
  const auto dwte0 = test::random_vec<float>(V * C, 14);  // dwte accumulates: non-zero start

  // CPU reference on the same (bf16-valued) inputs.
  std::vector<float> out_ref(N * C), dwte_ref = dwte0;
  model::embedding_forward_cpu(out_ref.data(), tokens.data(), wte.data(), N, C, V);
  model::embedding_backward_cpu(dwte_ref.data(), dout.data(), tokens.data(), N, C, V);

  test::TestStream stream;
  test::DeviceBuffer<int32_t> d_tokens(tokens);
  test::DeviceBuffer<test::bf16> d_wte(test::to_bf16(wte)), d_out(N * C),
      d_dout(test::to_bf16(dout));
  test::DeviceBuffer<float> d_dwte(dwte0);
  model::embedding_forward_cuda(d_out.get(), d_tokens.get(), d_wte.get(), N, C, V, stream.get());
  model::embedding_backward_cuda(d_dwte.get(), d_dout.get(), d_tokens.get(), N, C, V, stream.get());
  stream.sync();

  // Forward copies bf16 values: exact. Backward: same fp32 adds in the same order: exact.
  const auto out = test::download_f32(d_out);
  const auto dwte = d_dwte.download();
  const auto c_out = test::compare_arrays(out.data(), out_ref.data(), N * C);
  const auto c_dw = test::compare_arrays(dwte.data(), dwte_ref.data(), V * C);
  MESSAGE(c_out.summary(name + " out"));
  MESSAGE(c_dw.summary(name + " dwte"));
  CHECK(c_out.finite);
  CHECK(c_out.max_abs_err == 0.0);
  CHECK(c_dw.finite);
  CHECK(c_dw.max_abs_err == 0.0);
  test::check_guards(name, d_tokens, d_wte, d_out, d_dout, d_dwte);
}

}  // namespace
#endif

TEST_CASE("embedding cuda vs cpu") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_embedding_cuda(256, 288, 512);   // stories15M width, many repeats
  check_embedding_cuda(64, 576, 49152);  // SmolLM width and vocabulary
  check_embedding_cuda(7, 13, 5);        // odd, every token repeated
  check_embedding_cuda(1, 5, 11);        // one row
#endif
}

TEST_CASE("embedding cuda: an invalid token gives a NaN row forward and is skipped backward") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const int64_t N = 4, C = 7, V = 5;
  const std::vector<int32_t> tokens = {1, 5, -1, 1};  // positions 1 and 2 are invalid
  const auto wte = test::random_bf16_values(V * C, 21);
  const auto dout = test::random_bf16_values(N * C, 22);
  test::TestStream stream;
  test::DeviceBuffer<int32_t> d_tokens(tokens);
  test::DeviceBuffer<test::bf16> d_wte(test::to_bf16(wte)), d_out(N * C),
      d_dout(test::to_bf16(dout));
  test::DeviceBuffer<float> d_dwte(std::vector<float>(V * C, 0.0f));
  model::embedding_forward_cuda(d_out.get(), d_tokens.get(), d_wte.get(), N, C, V, stream.get());
  model::embedding_backward_cuda(d_dwte.get(), d_dout.get(), d_tokens.get(), N, C, V, stream.get());
  stream.sync();
  const auto out = test::download_f32(d_out);
  const auto dwte = d_dwte.download();
  for (int64_t c = 0; c < C; ++c) {
    CHECK(out[0 * C + c] == wte[1 * C + c]);
    CHECK(std::isnan(out[1 * C + c]));
    CHECK(std::isnan(out[2 * C + c]));
    CHECK(out[3 * C + c] == wte[1 * C + c]);
    CHECK(dwte[1 * C + c] == dout[0 * C + c] + dout[3 * C + c]);  // rows 0 then 3
    for (int64_t v : {0, 2, 3, 4}) CHECK(dwte[v * C + c] == 0.0f);
  }
  test::check_guards("embedding invalid", d_tokens, d_wte, d_out, d_dout, d_dwte);
#endif
}

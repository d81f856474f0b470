// Log-softmax + gather (+ entropy) on the GPU against the CPU op on identical bf16 logits:
// forward (lp, lse, entropy in fp32) and backward (dlogits in bf16) with the log-prob term, the
// entropy term, both, or neither; targets including −1 (no target); temperature scaling; the
// in-place backward (dlogits over logits) bit-identical to the out-of-place one; SmolLM's and
// Llama-2's vocabularies and odd sizes.
#include "model/ops/logprob.h"

#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

void check_logprob_cuda(int64_t N, int64_t V, float scale, bool with_dlp, bool with_entropy) {
  const std::string name = fmt::format("logprob_cuda(N={},V={},scale={:g},dlp={},entropy={})", N, V,
                                       scale, with_dlp, with_entropy);
  const auto logits = test::random_bf16_values(N * V, 1, -8, 8);
  auto targets = test::random_tokens(N, V, 2);
  for (int64_t n = 2; n < N; n += 3) targets[n] = -1;  // prompt positions
  const auto dlp = test::random_vec<float>(N, 3);
  const auto dent = test::random_vec<float>(N, 4);

  std::vector<float> lp_ref(N), lse_ref(N), ent_ref(N), dlogits_ref(N * V);
  model::logprob_forward_cpu(lp_ref.data(), lse_ref.data(), ent_ref.data(), logits.data(),
                             targets.data(), N, V, scale);
  model::logprob_backward_cpu(dlogits_ref.data(), with_dlp ? dlp.data() : nullptr,
                              with_entropy ? dent.data() : nullptr, logits.data(), lse_ref.data(),
                              with_entropy ? ent_ref.data() : nullptr, targets.data(), N, V, scale);

  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_logits(test::to_bf16(logits)), d_dlogits(N * V),
      d_inplace(test::to_bf16(logits));
  test::DeviceBuffer<int32_t> d_targets(targets);
  test::DeviceBuffer<float> d_lp(N), d_lse(N), d_ent(N), d_dlp(dlp), d_dent(dent);
  model::logprob_forward_cuda(d_lp.get(), d_lse.get(), d_ent.get(), d_logits.get(), d_targets.get(),
                              N, V, scale, s.get());
  const float* dlp_ptr = with_dlp ? d_dlp.get() : nullptr;
  const float* dent_ptr = with_entropy ? d_dent.get() : nullptr;
  const float* ent_ptr = with_entropy ? d_ent.get() : nullptr;
  model::logprob_backward_cuda(d_dlogits.get(), dlp_ptr, dent_ptr, d_logits.get(), d_lse.get(),
                               ent_ptr, d_targets.get(), N, V, scale, s.get());
  model::logprob_backward_cuda(d_inplace.get(), dlp_ptr, dent_ptr, d_inplace.get(), d_lse.get(),
                               ent_ptr, d_targets.get(), N, V, scale, s.get());
  s.sync();
  test::check_nmse(name + " lp", d_lp.download(), lp_ref, test::kNmseF32Out);
  test::check_nmse(name + " lse", d_lse.download(), lse_ref, test::kNmseF32Out);
  test::check_nmse(name + " entropy", d_ent.download(), ent_ref, test::kNmseF32Out);
  const auto dlogits = test::download_f32(d_dlogits);
  if (with_dlp || with_entropy) {
    test::check_nmse(name + " dlogits", dlogits, dlogits_ref, test::kNmseBf16Out);
  } else {
    CHECK(test::compare_arrays(dlogits.data(), dlogits_ref.data(), N * V).max_abs_err == 0.0);
  }
  const auto inplace = test::download_f32(d_inplace);
  CHECK(test::compare_arrays(inplace.data(), dlogits.data(), N * V).max_abs_err == 0.0);
  // Rows without a target and without an entropy term are exactly zero.
  if (!with_entropy)
    for (int64_t n = 2; n < N; n += 3)
      for (int64_t j = 0; j < V; ++j) REQUIRE(dlogits[n * V + j] == 0.0f);
  test::check_guards(name, d_logits, d_dlogits, d_inplace, d_targets, d_lp, d_lse, d_ent, d_dlp,
                     d_dent);
}

}  // namespace
#endif

TEST_CASE("logprob cuda vs cpu") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_logprob_cuda(16, 32000, 1.0f, true, true);         // Llama-2 / stories vocabulary
  check_logprob_cuda(8, 49152, 1.0f / 0.7f, true, false);  // SmolLM vocabulary, temperature 0.7
  check_logprob_cuda(7, 13, 1.0f, false, true);            // odd, entropy term only
  check_logprob_cuda(5, 1000, 2.0f, false, false);         // no gradient terms: zeros
  check_logprob_cuda(1, 1, 1.0f, true, true);              // V = 1: lp = 0, entropy = 0
#endif
}

TEST_CASE("logprob cuda: an invalid target gives NaN for its row only") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const int64_t N = 3, V = 10;
  const auto logits = test::random_bf16_values(N * V, 5);
  const std::vector<int32_t> targets = {3, 10, -1};  // row 1 invalid
  const std::vector<float> dlp = {1.0f, 1.0f, 1.0f};
  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_logits(test::to_bf16(logits)), d_dlogits(N * V);
  test::DeviceBuffer<int32_t> d_targets(targets);
  test::DeviceBuffer<float> d_lp(N), d_lse(N), d_dlp(dlp);
  model::logprob_forward_cuda(d_lp.get(), d_lse.get(), nullptr, d_logits.get(), d_targets.get(), N,
                              V, 1.0f, s.get());
  model::logprob_backward_cuda(d_dlogits.get(), d_dlp.get(), nullptr, d_logits.get(), d_lse.get(),
                               nullptr, d_targets.get(), N, V, 1.0f, s.get());
  s.sync();
  const auto lp = d_lp.download();
  const auto dl = test::download_f32(d_dlogits);
  CHECK(std::isfinite(lp[0]));
  CHECK(std::isnan(lp[1]));
  CHECK(lp[2] == 0.0f);
  for (int64_t j = 0; j < V; ++j) {
    CHECK(std::isfinite(dl[j]));
    CHECK(std::isnan(dl[V + j]));
    CHECK(dl[2 * V + j] == 0.0f);
  }
  test::check_guards("logprob invalid", d_logits, d_dlogits, d_targets, d_lp, d_lse, d_dlp);
#endif
}

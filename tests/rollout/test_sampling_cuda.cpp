// Sampling on the GPU (sample_rows_cuda) against the host Sampler on the same bf16 logits and the
// same uniform draws: the same token on every row (greedy with tied maxima, temperatures below and
// above 1, draws at 0 and just under 1, vocabularies that do and do not fill the last 256-token
// chunk, and real models' sizes: several rounds of each warp's chunks), the log-prob within 1e-5; a
// row's result does not depend on the other rows; rows whose logits are not finite come back as
// token −1 without touching their neighbours.
#include <cmath>
#include <limits>

#include "rollout/sampling.h"
#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

// expf (device) against exp_fast (host, ≤ 2 ulp): the log-probs differ in their last bits.
constexpr float kLogprobTol = 1e-5f;

struct RowsOut {
  std::vector<int32_t> token;
  std::vector<float> logprob;
};

RowsOut sample_on_device(const std::vector<float>& logits, int64_t B, int64_t V,
                         const std::vector<float>& inv_t, const std::vector<double>& u) {
  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_logits(test::to_bf16(logits));
  test::DeviceBuffer<float> d_inv_t(inv_t), d_lp(B);
  test::DeviceBuffer<double> d_u(u);
  test::DeviceBuffer<int32_t> d_tok(B);
  rollout::sample_rows_cuda(d_tok.get(), d_lp.get(), d_logits.get(), B, V, d_inv_t.get(), d_u.get(),
                            s.get());
  s.sync();
  test::check_guards("sample_rows_cuda", d_logits, d_inv_t, d_lp, d_u, d_tok);
  return {d_tok.download(), d_lp.download()};
}

// B rows over a vocabulary of V: every 4th row greedy with two tied maxima (ids 3 and V − 5),
// the others at temperatures 0.7, 1 and 1.6; row 1's draw is 0, row 2's just under 1.
void check_against_host(int64_t B, int64_t V, uint64_t seed) {
  CAPTURE(V);
  std::vector<float> logits = test::random_bf16_values(B * V, seed, -4, 4);
  std::vector<float> inv_t(static_cast<size_t>(B));
  std::vector<double> u(static_cast<size_t>(B));
  std::vector<rollout::SamplingParams> params(static_cast<size_t>(B));
  const double temps[] = {0.0, 0.7, 1.0, 1.6};
  for (int64_t b = 0; b < B; ++b) {
    rollout::SamplingParams& p = params[size_t(b)];
    p.temperature = temps[b % 4];
    inv_t[size_t(b)] = p.is_greedy() ? 0.0f : float(1.0 / p.temperature);
    u[size_t(b)] = rollout::counter_uniform(seed, uint64_t(b), 0, 0);
    if (p.is_greedy()) logits[size_t(b * V + 3)] = logits[size_t(b * V + V - 5)] = 6.0f;
  }
  u[1] = 0.0;
  u[2] = 1.0 - 0x1.0p-53;
  const RowsOut dev = sample_on_device(logits, B, V, inv_t, u);
  rollout::Sampler host(V);
  for (int64_t b = 0; b < B; ++b) {
    CAPTURE(b);
    const rollout::SampledToken ref =
        host.sample(logits.data() + b * V, params[size_t(b)], u[size_t(b)]);
    CHECK(dev.token[size_t(b)] == ref.token);
    CHECK(std::fabs(dev.logprob[size_t(b)] - ref.logprob) <= kLogprobTol);
    if (params[size_t(b)].is_greedy()) CHECK(dev.token[size_t(b)] == 3);
  }
}

}  // namespace
#endif

TEST_CASE("sample_rows_cuda: the host Sampler's token and log-prob on every row") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_against_host(24, 1000, 3);  // 4 chunks, the last one partial
  check_against_host(8, 4096, 4);   // whole chunks only
  check_against_host(4, 200, 5);    // one partial chunk
  // Vocabularies of real models: every warp loads several rounds of chunks (8 warps × 4 chunks
  // in flight = 32 chunks a round), with 16-byte loads (49,152) and token by token (32,001).
  check_against_host(4, 49152, 6);
  check_against_host(4, 32001, 7);
#endif
}

TEST_CASE("sample_rows_cuda: rows are independent, and non-finite rows give token -1") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const int64_t B = 9, V = 700;
  std::vector<float> logits = test::random_bf16_values(B * V, 8, -3, 3);
  logits[size_t(2 * V + 123)] = std::numeric_limits<float>::quiet_NaN();
  for (int64_t j = 0; j < V; ++j)
    logits[size_t(5 * V + j)] = -std::numeric_limits<float>::infinity();
  logits[size_t(7 * V + 600)] = std::numeric_limits<float>::infinity();
  std::vector<float> inv_t(static_cast<size_t>(B), 1.0f);
  std::vector<double> u(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) u[size_t(b)] = rollout::counter_uniform(9, uint64_t(b), 0, 0);
  inv_t[4] = 0.0f;  // greedy
  const RowsOut all = sample_on_device(logits, B, V, inv_t, u);
  for (int64_t b : {2, 5, 7}) {
    CAPTURE(b);
    CHECK(all.token[size_t(b)] == -1);
    CHECK(std::isnan(all.logprob[size_t(b)]));
  }
  // Rows 3..4 alone: the same bits as within the batch.
  const std::vector<float> part(logits.begin() + 3 * V, logits.begin() + 5 * V);
  const RowsOut alone = sample_on_device(part, 2, V, {inv_t[3], inv_t[4]}, {u[3], u[4]});
  for (int64_t b = 0; b < 2; ++b) {
    CHECK(alone.token[size_t(b)] == all.token[size_t(3 + b)]);
    CHECK(alone.logprob[size_t(b)] == all.logprob[size_t(3 + b)]);
    CHECK(alone.token[size_t(b)] >= 0);
  }
  CHECK_THROWS_WITH_AS(
      rollout::sample_rows_cuda(nullptr, nullptr, nullptr, 1, 0, nullptr, nullptr, nullptr),
      doctest::Contains("vocabulary size V"), Error);
#endif
}

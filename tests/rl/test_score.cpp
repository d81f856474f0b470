// rl::Scorer's windows against direct forwards of the same model (a closed form of Hugging Face's
// strided perplexity: which tokens each window scores and with which context).
#include "rl/score.h"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

using namespace rlhf;

namespace {

model::ModelConfig tiny() {
  model::ModelConfig c;
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  return c;
}

struct Fixture {
  model::ParamLayout layout{tiny(), model::HeadKind::kLM};
  rl::Scorer scorer{layout};
  std::vector<int32_t> ids;
  Fixture() {
    std::vector<float*> units = scorer.unit_buffers();
    for (int u = 0; u < layout.num_units(); ++u)
      model::init_unit_params(units[size_t(u)], layout.unit(u), 7, 0.2);
    for (int i = 0; i < 29; ++i) ids.push_back(int32_t((i * 11 + 3) % 37));
  }
  // log p(ids[t] | ids[b..t)) by a forward over exactly that context.
  double direct(int64_t b, int64_t t) {
    const std::span<const int32_t> all(ids);
    return scorer
        .response_logprobs(all.subspan(size_t(b), size_t(t - b)), all.subspan(size_t(t), 1))
        .at(0);
  }
};

}  // namespace

TEST_CASE("score: response log-probs are the log-probs of the response tokens after the prompt") {
  Fixture f;
  const std::span<const int32_t> all(f.ids);
  const std::vector<double> lp = f.scorer.response_logprobs(all.first(5), all.subspan(5, 7));
  REQUIRE(lp.size() == 7);
  for (int64_t j = 0; j < 7; ++j)
    CHECK(lp[size_t(j)] == doctest::Approx(f.direct(0, 5 + j)).epsilon(1e-5));
  for (double x : lp) CHECK(x < 0);
  CHECK(rl::mean_nll(lp) > 0);
  CHECK_THROWS_WITH_AS(f.scorer.response_logprobs({}, all.first(2)),
                       doctest::Contains("the prompt has no tokens"), Error);
  std::vector<int32_t> long_ids(33, 1);
  CHECK_THROWS_WITH_AS(f.scorer.response_logprobs(std::span<const int32_t>(long_ids).first(3),
                                                  std::span<const int32_t>(long_ids).subspan(3)),
                       doctest::Contains("more than the model's 32 positions"), Error);
}

TEST_CASE("score: strided windows score each token once, with the context HF's algorithm gives") {
  Fixture f;
  const int64_t n = int64_t(f.ids.size());  // 29
  SUBCASE("stride < window: every token but the first, context from its window's start") {
    const int64_t window = 8, stride = 4;
    const std::vector<double> lp = f.scorer.text_logprobs(f.ids, window, stride);
    REQUIRE(int64_t(lp.size()) == n - 1);
    // Token t is scored by the first window [b, b + 8) (b multiple of 4) whose end passes the
    // previous window's end, i.e. b = 4·max(0, ceil((t + 1 - 8) / 4)) for t >= 8, else 0.
    for (int64_t t = 1; t < n; ++t) {
      const int64_t b = t < window ? 0 : ((t + 1 - window + stride - 1) / stride) * stride;
      CAPTURE(t);
      CHECK(lp[size_t(t - 1)] == doctest::Approx(f.direct(b, t)).epsilon(1e-5));
    }
  }
  SUBCASE("stride == window: disjoint windows, each window's first token unscored") {
    const std::vector<double> lp = f.scorer.text_logprobs(f.ids, 10, 10);
    REQUIRE(lp.size() == size_t(n - 1 - 2));  // windows at 0, 10, 20: tokens 10 and 20 unscored
    CHECK(lp[0] == doctest::Approx(f.direct(0, 1)).epsilon(1e-5));
    CHECK(lp[9] == doctest::Approx(f.direct(10, 11)).epsilon(1e-5));
  }
  SUBCASE("one window holding the whole text = the response log-probs after the first token") {
    const std::span<const int32_t> all(f.ids);
    const std::vector<double> a = f.scorer.text_logprobs(f.ids, 32, 16);
    const std::vector<double> b = f.scorer.response_logprobs(all.first(1), all.subspan(1));
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-6));
  }
  CHECK_THROWS_WITH_AS(f.scorer.text_logprobs(f.ids, 33, 4), doctest::Contains("window 33"), Error);
  CHECK_THROWS_WITH_AS(f.scorer.text_logprobs(f.ids, 8, 9), doctest::Contains("stride 9"), Error);
}

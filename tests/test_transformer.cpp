// The whole model: gradients of a loss w.r.t. every parameter against central finite differences
// in double, on tiny configs covering both RoPE styles, tied/untied heads, GQA, q/k/v bias and
// the value head; gradient checkpointing gives bitwise the same gradients as without.
#include "model/transformer.h"

#include "model/local_provider.h"
#include "tests/test_util.h"

using namespace rlhf;
using model::HeadKind;

namespace {

model::ModelConfig tiny_config(model::RopeStyle style, bool tied, bool bias) {
  model::ModelConfig c;
  c.model_type = bias ? "qwen2" : "llama";
  c.hidden_size = 16;
  c.intermediate_size = 20;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 11;
  c.max_position_embeddings = 16;
  c.rope_style = style;
  c.tie_word_embeddings = tied;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = 0;
  return c;
}

// Qwen3: RMSNorm over each head of q and k before RoPE, head_dim 6 (H·D = 24 != hidden 16: the
// projections change width).
model::ModelConfig qwen3_config() {
  model::ModelConfig c = tiny_config(model::RopeStyle::kRotateHalf, true, false);
  c.model_type = "qwen3";
  c.head_dim = 6;
  return c;
}

// Loss used for the checks: Σ a·lp + Σ b·entropy (LM) or Σ a·value (scalar head), which makes
// dlp = a, dentropy = b, dvalues = a.
struct Case {
  std::string name;
  model::ModelConfig cfg;
  HeadKind head;
  bool with_entropy;
};

void check_model_grads(const Case& cs) {
  const int64_t B = 2, T = 5, N = B * T;
  model::ParamLayout layout(cs.cfg, cs.head);
  model::LocalParams<double> P(layout);
  P.init(123, 0.3);  // large std so the gradients are not tiny
  // Random (non-unit) norm weights and biases, so their gradients are exercised.
  for (int u = 0; u < layout.num_units(); ++u)
    for (const auto& t : layout.unit(u).tensors)
      if (t.name.find("norm") != std::string::npos || t.name.find("bias") != std::string::npos) {
        auto r = test::random_vec<double>(t.numel, 1000 + u, 0.5, 1.5);
        std::copy(r.begin(), r.end(), P.params(u) + t.offset);
      }
  auto tokens = test::random_tokens(N, cs.cfg.vocab_size, 5);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n) targets[n] = (n % T == T - 1) ? -1 : tokens[n + 1];
  targets[3] = -1;  // an ignored position in the middle
  auto a = test::random_vec<double>(N, 8);
  auto b = test::random_vec<double>(N, 9);
  model::Transformer<double> net(layout, false);
  std::vector<double> out(N), ent(N);
  const double inv_temp = 1.0 / 0.7;
  auto loss = [&]() {
    if (cs.head == HeadKind::kLM) {
      net.forward_lm(P, tokens.data(), targets.data(), B, T, out.data(),
                     cs.with_entropy ? ent.data() : nullptr, false, inv_temp);
      return test::dot(out.data(), a.data(), N) +
             (cs.with_entropy ? test::dot(ent.data(), b.data(), N) : 0.0);
    }
    net.forward_scalar(P, tokens.data(), B, T, out.data(), false);
    return test::dot(out.data(), a.data(), N);
  };
  P.zero_grads();
  if (cs.head == HeadKind::kLM) {
    net.forward_lm(P, tokens.data(), targets.data(), B, T, out.data(),
                   cs.with_entropy ? ent.data() : nullptr, true, inv_temp);
    net.backward_lm(P, a.data(), cs.with_entropy ? b.data() : nullptr);
  } else {
    net.forward_scalar(P, tokens.data(), B, T, out.data(), true);
    net.backward_scalar(P, a.data());
  }
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const auto& t : layout.unit(u).tensors) {
      std::vector<double> g(P.grads(u) + t.offset, P.grads(u) + t.offset + t.numel);
      auto cmp = test::fd_check(loss, P.params(u) + t.offset, g.data(), t.numel, 1e-5, true, 60);
      RLHF_CHECK_GRAD(cmp, cs.name + " " + t.name);
    }
  }
  // The alignment gaps between tensors of every unit's gradient stay zero.
  for (int u = 0; u < layout.num_units(); ++u) {
    int64_t end = 0;
    for (const auto& t : layout.unit(u).tensors) {
      for (int64_t i = end; i < t.offset; ++i) REQUIRE(P.grads(u)[i] == 0.0);
      end = t.offset + t.numel;
    }
  }
}

}  // namespace

TEST_CASE("transformer gradients vs finite differences") {
  using model::RopeStyle;
  std::vector<Case> cases = {
      {"llama(rotate_half, untied, GQA)", tiny_config(RopeStyle::kRotateHalf, false, false),
       HeadKind::kLM, true},
      {"llama(interleaved, tied)", tiny_config(RopeStyle::kInterleaved, true, false), HeadKind::kLM,
       false},
      {"qwen2(qkv bias)", tiny_config(RopeStyle::kRotateHalf, false, true), HeadKind::kLM, false},
      {"value head", tiny_config(RopeStyle::kRotateHalf, false, false), HeadKind::kValue, false},
      {"qwen3(q/k norm, head_dim 6)", qwen3_config(), HeadKind::kLM, true},
  };
  for (const auto& cs : cases) {
    SUBCASE(cs.name.c_str()) {
      check_model_grads(cs);
    }
  }
}

TEST_CASE("gradient checkpointing gives identical gradients") {
  auto cfg = tiny_config(model::RopeStyle::kRotateHalf, true, false);
  model::ParamLayout layout(cfg, HeadKind::kLM);
  const int64_t B = 3, T = 7, N = B * T;
  auto tokens = test::random_tokens(N, cfg.vocab_size, 1);
  std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
  targets.push_back(-1);
  auto dlp = test::random_vec<float>(N, 2);
  std::vector<std::vector<float>> grads[2];
  for (int ck = 0; ck < 2; ++ck) {
    model::LocalParams<float> P(layout);
    P.init(7, 0.2);
    model::Transformer<float> net(layout, ck == 1);
    std::vector<float> lp(N);
    net.forward_lm(P, tokens.data(), targets.data(), B, T, lp.data(), nullptr, true);
    net.backward_lm(P, dlp.data(), nullptr);
    for (int u = 0; u < layout.num_units(); ++u)
      grads[ck].emplace_back(P.grads(u), P.grads(u) + layout.unit(u).numel);
  }
  for (size_t u = 0; u < grads[0].size(); ++u) CHECK(grads[0][u] == grads[1][u]);
}

TEST_CASE("forward_logits agrees with forward_lm's log-probs") {
  auto cfg = tiny_config(model::RopeStyle::kInterleaved, false, false);
  model::ParamLayout layout(cfg, HeadKind::kLM);
  model::LocalParams<double> P(layout);
  P.init(3, 0.3);
  const int64_t B = 2, T = 6, N = B * T, V = cfg.vocab_size;
  auto tokens = test::random_tokens(N, V, 4);
  auto targets = test::random_tokens(N, V, 5);
  model::Transformer<double> net(layout, false);
  std::vector<double> logits(N * V), lp(N);
  net.forward_logits(P, tokens.data(), B, T, logits.data());
  net.forward_lm(P, tokens.data(), targets.data(), B, T, lp.data(), nullptr, false);
  for (int64_t n = 0; n < N; ++n) {
    double m = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, logits[n * V + v]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(logits[n * V + v] - m);
    CHECK(lp[n] == doctest::Approx(logits[n * V + targets[n]] - m - std::log(s)).epsilon(1e-12));
  }
}

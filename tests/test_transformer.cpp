// The whole model: gradients of a loss w.r.t. every parameter against central finite differences
// in double, on tiny configs covering both RoPE styles, tied/untied heads, GQA, q/k/v bias and
// the value head; gradient checkpointing gives bitwise the same gradients as without.
#include "model/transformer.h"

#include "model/local_provider.h"
#include "parallel/train_model.h"
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

namespace {

// LocalParams that counts acquire_params per unit (what a ZeRO-3 store would gather).
template <typename T>
struct CountingParams : model::LocalParams<T> {
  using model::LocalParams<T>::LocalParams;
  std::vector<int> acquired = std::vector<int>(64, 0);
  const T* acquire_params(int u) override {
    ++acquired[size_t(u)];
    return model::LocalParams<T>::acquire_params(u);
  }
};

// Three micro-batches of different shapes, right-padded (pad 0, target −1), as the experience
// passes build them.
struct SweepData {
  std::vector<std::vector<int32_t>> tokens, targets;
  std::vector<int64_t> B{3, 1, 2}, T{7, 9, 4};
  explicit SweepData(int64_t V) {
    for (size_t i = 0; i < B.size(); ++i) {
      const int64_t N = B[i] * T[i];
      tokens.push_back(test::random_tokens(N, V, 20 + i));
      targets.push_back(test::random_tokens(N, V, 30 + i));
      targets.back()[0] = -1;
      targets.back()[size_t(N - 1)] = -1;
    }
  }
};

}  // namespace

TEST_CASE("forward sweep: each unit acquired once, outputs bit-identical to one forward a batch") {
  for (const auto& [name, cfg, head] :
       {std::tuple{"llama tied lm", tiny_config(model::RopeStyle::kRotateHalf, true, false),
                   HeadKind::kLM},
        std::tuple{"qwen2 untied lm", tiny_config(model::RopeStyle::kInterleaved, false, true),
                   HeadKind::kLM},
        std::tuple{"qwen3 lm", qwen3_config(), HeadKind::kLM},
        std::tuple{"value head", tiny_config(model::RopeStyle::kRotateHalf, false, false),
                   HeadKind::kValue}}) {
    SUBCASE(name) {
      model::ParamLayout layout(cfg, head);
      CountingParams<float> P(layout);
      P.init(5, 0.3);
      SweepData d(cfg.vocab_size);
      model::Transformer<float> net(layout, false);
      const bool lm = head == HeadKind::kLM;
      const float inv_temp = 1.0f / 0.7f;
      // One forward per micro-batch, as before the sweep.
      std::vector<std::vector<float>> one(d.B.size()), swept(d.B.size());
      for (size_t i = 0; i < d.B.size(); ++i) {
        one[i].assign(size_t(d.B[i] * d.T[i]), 0.0f);
        if (lm)
          net.forward_lm(P, d.tokens[i].data(), d.targets[i].data(), d.B[i], d.T[i], one[i].data(),
                         nullptr, false, inv_temp);
        else
          net.forward_scalar(P, d.tokens[i].data(), d.B[i], d.T[i], one[i].data(), false);
      }
      const std::vector<int> per_batch = P.acquired;
      std::fill(P.acquired.begin(), P.acquired.end(), 0);
      std::vector<model::ForwardBatch<float>> batches;
      for (size_t i = 0; i < d.B.size(); ++i) {
        swept[i].assign(size_t(d.B[i] * d.T[i]), -99.0f);
        batches.push_back(
            {d.tokens[i].data(), d.targets[i].data(), d.B[i], d.T[i], swept[i].data()});
      }
      if (lm)
        net.forward_lm_sweep(P, batches, inv_temp);
      else
        net.forward_scalar_sweep(P, batches);
      for (size_t i = 0; i < d.B.size(); ++i) CHECK(swept[i] == one[i]);
      // Per unit: the sweep acquires once what one forward per batch acquires once per batch
      // (the tied embedding twice: embedding and LM head).
      for (int u = 0; u < layout.num_units(); ++u) {
        CHECK(per_batch[size_t(u)] == 3 * P.acquired[size_t(u)]);
        CHECK(P.acquired[size_t(u)] == ((cfg.tie_word_embeddings && lm && u == 0) ? 2 : 1));
      }
      // A training step after a sweep sees no trace of it: the same gradients as a fresh model.
      if (lm) {
        const int64_t B = 2, T = 5, N = B * T;
        auto tokens = test::random_tokens(N, cfg.vocab_size, 40);
        auto targets = test::random_tokens(N, cfg.vocab_size, 41);
        auto dlp = test::random_vec<float>(N, 42);
        std::vector<std::vector<float>> grads[2];
        for (int fresh = 0; fresh < 2; ++fresh) {
          model::Transformer<float> other(layout, false);
          model::Transformer<float>& m = fresh ? other : net;
          P.zero_grads();
          std::vector<float> lp(N);
          m.forward_lm(P, tokens.data(), targets.data(), B, T, lp.data(), nullptr, true);
          m.backward_lm(P, dlp.data(), nullptr);
          for (int u = 0; u < layout.num_units(); ++u)
            grads[fresh].emplace_back(P.grads(u), P.grads(u) + layout.unit(u).numel);
        }
        for (size_t u = 0; u < grads[0].size(); ++u) CHECK(grads[0][u] == grads[1][u]);
        CHECK_THROWS_WITH_AS(net.backward_lm(P, dlp.data(), nullptr),
                             doctest::Contains("needs a preceding forward_lm"), Error);
      }
    }
  }
}

TEST_CASE("forward sweep: a sweep after a training forward leaves no backward state") {
  auto cfg = tiny_config(model::RopeStyle::kRotateHalf, true, false);
  model::ParamLayout layout(cfg, HeadKind::kLM);
  model::LocalParams<float> P(layout);
  P.init(5, 0.3);
  SweepData d(cfg.vocab_size);
  model::Transformer<float> net(layout, false);
  std::vector<float> lp(size_t(d.B[0] * d.T[0])), dlp(lp.size(), 1.0f);
  net.forward_lm(P, d.tokens[0].data(), d.targets[0].data(), d.B[0], d.T[0], lp.data(), nullptr,
                 true);
  std::vector<float> out(lp.size());
  net.forward_lm_sweep(P, {{d.tokens[0].data(), d.targets[0].data(), d.B[0], d.T[0], out.data()}});
  CHECK(out == lp);
  CHECK_THROWS_WITH_AS(net.backward_lm(P, dlp.data(), nullptr),
                       doctest::Contains("needs a preceding forward_lm"), Error);
}

TEST_CASE("sweep_groups: consecutive groups within the residual budget") {
  std::vector<parallel::ForwardBatch> b(5);
  const int64_t T[5] = {10, 10, 30, 5, 100};
  for (int i = 0; i < 5; ++i) b[size_t(i)] = {nullptr, nullptr, 2, T[i], nullptr};
  // 4 bytes a token: 80, 80, 240, 40, 800 bytes.
  CHECK(parallel::sweep_groups(b, 4, 1 << 20) == std::vector<size_t>{0, 5});
  CHECK(parallel::sweep_groups(b, 4, 400) == std::vector<size_t>{0, 3, 4, 5});
  CHECK(parallel::sweep_groups(b, 4, 160) == std::vector<size_t>{0, 2, 3, 4, 5});
  CHECK(parallel::sweep_groups(b, 4, 1) == std::vector<size_t>{0, 1, 2, 3, 4, 5});
  CHECK(parallel::sweep_groups({}, 4, 400) == std::vector<size_t>{0});
}

// LoRA adapters (model/lora.h) in the whole model: the gradients of A and B against central
// finite differences in double with the base frozen (no base gradient is written), a fresh
// adapter (B = 0) and switched-off adapters reproduce the base model bit for bit, and the merged
// weights W + (α/r)·B·A give the unmerged forward within fp32 rounding.
#include "model/lora.h"

#include <cmath>

#include "model/local_provider.h"
#include "model/transformer.h"
#include "tests/test_util.h"

using namespace rlhf;
using model::HeadKind;
using model::Proj;

namespace {

model::ModelConfig tiny(const char* type, bool tied) {
  model::ModelConfig c;
  c.model_type = type;
  c.hidden_size = 16;
  c.intermediate_size = 20;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 11;
  c.max_position_embeddings = 16;
  c.tie_word_embeddings = tied;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = 0;
  return c;
}

model::LoraConfig lora_cfg(int r, const char* targets) {
  model::LoraConfig c;
  c.rank = r;
  c.alpha = 5.0;
  c.targets = model::parse_target_modules(targets);
  return c;
}

// A random adapter (B != 0, so the adapter changes the output): PEFT's init, then B ~ U(-0.5, 0.5).
template <typename T>
std::vector<T> random_adapter(const model::LoraLayout& ll, uint64_t seed) {
  std::vector<float> f(size_t(ll.numel()));
  model::lora_init(ll, f.data(), seed);
  std::vector<T> out(f.begin(), f.end());
  for (const model::TensorInfo& t : ll.tensors())
    if (t.name.find("lora_B") != std::string::npos) {
      auto r = test::random_vec<T>(t.numel, seed + uint64_t(t.offset), -0.5, 0.5);
      std::copy(r.begin(), r.end(), out.begin() + t.offset);
    }
  return out;
}

}  // namespace

TEST_CASE("lora: --target_modules parsing") {
  auto all = model::parse_target_modules("all-linear");
  for (bool b : all) CHECK(b);
  auto qv = model::parse_target_modules("q_proj,v_proj");
  CHECK(model::target_modules_string(qv) == "q_proj,v_proj");
  CHECK(model::target_modules_string(all) ==
        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
  CHECK_THROWS_WITH_AS(model::parse_target_modules("q_proj,qq_proj"),
                       doctest::Contains("--target_modules: unknown module 'qq_proj'"), Error);
  model::LoraConfig c = lora_cfg(4, "q_proj");
  c.dropout = 0.1;
  c.validate();  // dropout in [0, 1) is implemented
  c.dropout = 1.0;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("--lora_dropout"), Error);
  c.dropout = 0;
  c.alpha = 0;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("--lora_alpha"), Error);
}

TEST_CASE("lora: layout and PEFT initialisation") {
  const auto cfg = tiny("llama", false);
  const model::LayerSpec spec = model::layer_spec(cfg);
  model::LoraLayout ll(spec, 2, lora_cfg(3, "q_proj,down_proj"));
  REQUIRE(ll.tensors().size() == 8);  // 2 layers × 2 projections × (A, B)
  CHECK(ll.tensors()[0].name == "model.layers.0.self_attn.q_proj.lora_A.weight");
  CHECK(ll.tensors()[0].shape == std::vector<int64_t>{3, 16});
  CHECK(ll.tensors()[3].name == "model.layers.0.mlp.down_proj.lora_B.weight");
  CHECK(ll.tensors()[3].shape == std::vector<int64_t>{16, 3});
  CHECK(model::LoraLayout::peft_key(ll.tensors()[0].name) ==
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  CHECK(ll.entry(1, Proj::kK).a == -1);
  std::vector<float> p(size_t(ll.numel()), 9.0f), q(p.size());
  model::lora_init(ll, p.data(), 42);
  model::lora_init(ll, q.data(), 42);
  CHECK(p == q);
  for (const model::TensorInfo& t : ll.tensors()) {
    const bool is_a = t.name.find("lora_A") != std::string::npos;
    const double bound = 1.0 / std::sqrt(double(t.shape[1]));
    double mx = 0;
    for (int64_t i = 0; i < t.numel; ++i) {
      const float v = p[size_t(t.offset + i)];
      if (!is_a) REQUIRE(v == 0.0f);
      REQUIRE(std::fabs(v) <= bound);
      mx = std::max(mx, double(std::fabs(v)));
    }
    if (is_a) CHECK(mx > 0.5 * bound);  // spread over the range, not collapsed near 0
  }
}

TEST_CASE("lora: adapter gradients vs finite differences, base frozen") {
  struct Case {
    const char* name;
    model::ModelConfig cfg;
    const char* targets;
  };
  for (const Case& cs :
       {Case{"llama untied, all-linear", tiny("llama", false), "all-linear"},
        Case{"qwen2 tied, q,v,down", tiny("qwen2", true), "q_proj,v_proj,down_proj"}}) {
    SUBCASE(cs.name) {
      const int64_t B = 2, T = 5, N = B * T;
      model::ParamLayout layout(cs.cfg, HeadKind::kLM);
      model::LocalParams<double> P(layout);
      P.init(123, 0.3);
      model::LoraLayout ll(model::layer_spec(cs.cfg), int(cs.cfg.num_hidden_layers),
                           lora_cfg(3, cs.targets));
      std::vector<double> ad = random_adapter<double>(ll, 7), dad(ad.size(), 0.0);
      model::FrozenBaseProvider<double> frozen(P);
      auto tokens = test::random_tokens(N, cs.cfg.vocab_size, 5);
      std::vector<int32_t> targets(N);
      for (int64_t n = 0; n < N; ++n) targets[n] = (n % T == T - 1) ? -1 : tokens[n + 1];
      auto a = test::random_vec<double>(N, 8);
      model::Transformer<double> net(layout, false);
      net.set_lora(&ll, ad.data(), dad.data());
      std::vector<double> lp(N);
      auto loss = [&]() {
        net.forward_lm(frozen, tokens.data(), targets.data(), B, T, lp.data(), nullptr, false);
        return test::dot(lp.data(), a.data(), N);
      };
      P.zero_grads();
      net.forward_lm(frozen, tokens.data(), targets.data(), B, T, lp.data(), nullptr, true);
      net.backward_lm(frozen, a.data(), nullptr);
      for (const model::TensorInfo& t : ll.tensors()) {
        auto cmp = test::fd_check(loss, ad.data() + t.offset, dad.data() + t.offset, t.numel, 1e-5,
                                  true, 60);
        RLHF_CHECK_GRAD(cmp, std::string(cs.name) + " " + t.name);
      }
      // The base got no gradient at all.
      for (int u = 0; u < layout.num_units(); ++u)
        for (int64_t i = 0; i < layout.unit(u).numel; ++i) REQUIRE(P.grads(u)[i] == 0.0);
      // Gradient checkpointing recomputes the layers with the adapters: the same gradients.
      std::vector<double> dad2(ad.size(), 0.0);
      model::Transformer<double> ck(layout, true);
      ck.set_lora(&ll, ad.data(), dad2.data());
      ck.forward_lm(frozen, tokens.data(), targets.data(), B, T, lp.data(), nullptr, true);
      ck.backward_lm(frozen, a.data(), nullptr);
      CHECK(dad2 == dad);
    }
  }
}

TEST_CASE("lora: fresh adapter and adapters off give the base; merged weights = unmerged") {
  const auto cfg = tiny("qwen2", false);
  const int64_t B = 2, T = 6, N = B * T;
  model::ParamLayout layout(cfg, HeadKind::kLM);
  model::LocalParams<float> P(layout);
  P.init(5, 0.3);
  model::LoraLayout ll(model::layer_spec(cfg), int(cfg.num_hidden_layers),
                       lora_cfg(4, "all-linear"));
  auto tokens = test::random_tokens(N, cfg.vocab_size, 3);
  std::vector<int32_t> targets(N, 1);
  model::Transformer<float> net(layout, false);
  std::vector<float> base(N), with(N), off(N), merged(N);
  net.forward_lm(P, tokens.data(), targets.data(), B, T, base.data(), nullptr, false);

  std::vector<float> fresh(size_t(ll.numel()));
  model::lora_init(ll, fresh.data(), 1);
  net.set_lora(&ll, fresh.data(), nullptr);
  net.forward_lm(P, tokens.data(), targets.data(), B, T, with.data(), nullptr, false);
  CHECK(with == base);  // B = 0: + 0 exactly

  std::vector<float> ad = random_adapter<float>(ll, 11);
  net.set_lora(&ll, ad.data(), nullptr);
  net.forward_lm(P, tokens.data(), targets.data(), B, T, with.data(), nullptr, false);
  auto diff = test::compare_arrays(with.data(), base.data(), N);
  CHECK(diff.max_abs_err > 1e-3);  // the adapter matters
  net.set_lora_enabled(false);     // the reference policy: the same weights, adapters off
  net.forward_lm(P, tokens.data(), targets.data(), B, T, off.data(), nullptr, false);
  CHECK(off == base);
  net.set_lora_enabled(true);

  // Merge into a copy of the base: W' = W + (α/r)·B·A.
  model::LocalParams<float> M(layout);
  for (int u = 0; u < layout.num_units(); ++u)
    std::copy(P.params(u), P.params(u) + layout.unit(u).numel, M.params(u));
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const model::UnitLayout& u = layout.unit(layout.layer_unit(l));
    for (const model::ProjInfo& pi : model::kProjections) {
      const model::LoraLayout::Entry& e = ll.entry(l, pi.id);
      model::lora_merge_cpu(M.params(layout.layer_unit(l)) + u.at(pi.weight_name).offset,
                            ad.data() + e.a, ad.data() + e.b, float(ll.config().scale()), 4, e.in,
                            e.out);
    }
  }
  model::Transformer<float> plain(layout, false);
  plain.forward_lm(M, tokens.data(), targets.data(), B, T, merged.data(), nullptr, false);
  auto cmp = test::compare_arrays(merged.data(), with.data(), N);
  INFO(cmp.summary("merged vs unmerged lp"));
  CHECK(cmp.max_abs_err < 2e-5);
}

TEST_CASE("lora dropout: the branch vs an explicit mask; gradients vs finite differences") {
  const int64_t N = 5, in = 7, out = 6, r = 3;
  const double p = 0.3, scale = 1.7;
  auto x = test::random_vec<double>(N * in, 1);
  auto A = test::random_vec<double>(r * in, 2, -0.5, 0.5);
  auto Bm = test::random_vec<double>(out * r, 3, -0.5, 0.5);
  std::vector<double> dA(A.size(), 0.0), dB(Bm.size(), 0.0), dx(x.size(), 0.0);
  model::LoraProjView<double> a{A.data(), Bm.data(), dA.data(), dB.data(), r, p, 0x1234};
  std::vector<double> y(N * out, 0.0), want(N * out, 0.0);
  model::lora_forward_cpu(y.data(), x.data(), a, scale, N, in, out);
  // The reference: PEFT's lora_B(lora_A(dropout(x))) · scale, inverted dropout, written out.
  int64_t kept = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < r; ++k) {
        double h = 0;
        for (int64_t i = 0; i < in; ++i)
          if (model::lora_dropout_keep(a.key, n, i, in, p))
            h += x[n * in + i] / (1 - p) * A[k * in + i];
        want[n * out + o] += scale * h * Bm[o * r + k];
      }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < in; ++i) kept += model::lora_dropout_keep(a.key, n, i, in, p);
  CHECK(kept > 0);
  CHECK(kept < N * in);  // the mask drops some inputs
  CHECK(test::compare_arrays(y.data(), want.data(), N * out).max_abs_err < 1e-12);

  auto w = test::random_vec<double>(N * out, 4);
  auto loss = [&]() {
    std::vector<double> yy(N * out, 0.0);
    model::lora_forward_cpu(yy.data(), x.data(), a, scale, N, in, out);
    return test::dot(yy.data(), w.data(), N * out);
  };
  model::lora_backward_cpu(dx.data(), w.data(), x.data(), a, scale, N, in, out);
  RLHF_CHECK_GRAD(test::fd_check(loss, A.data(), dA.data(), int64_t(A.size())), "dA");
  RLHF_CHECK_GRAD(test::fd_check(loss, Bm.data(), dB.data(), int64_t(Bm.size())), "dB");
  RLHF_CHECK_GRAD(test::fd_check(loss, x.data(), dx.data(), int64_t(x.size())), "dx");
  // A dropped input gets no gradient through the branch.
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < in; ++i)
      if (!model::lora_dropout_keep(a.key, n, i, in, p)) CHECK(dx[n * in + i] == 0.0);
}

TEST_CASE("lora dropout: the keep rate is 1 - p; keys give independent masks") {
  const int64_t n = 200000;
  int64_t k1 = 0, k2 = 0, both = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool a = model::lora_dropout_keep(11, 0, i, n, 0.25);
    const bool b =
        model::lora_dropout_keep(model::lora_dropout_key(1, 2, 0, Proj::kQ), 0, i, n, 0.25);
    k1 += a;
    k2 += b;
    both += a && b;
  }
  CHECK(double(k1) / n == doctest::Approx(0.75).epsilon(0.01));
  CHECK(double(k2) / n == doctest::Approx(0.75).epsilon(0.01));
  CHECK(double(both) / n == doctest::Approx(0.75 * 0.75).epsilon(0.02));  // independent
  CHECK(model::lora_dropout_key(1, 2, 0, Proj::kQ) != model::lora_dropout_key(1, 2, 0, Proj::kK));
  CHECK(model::lora_dropout_key(1, 2, 0, Proj::kQ) != model::lora_dropout_key(1, 3, 0, Proj::kQ));
  CHECK(model::lora_dropout_key(1, 2, 0, Proj::kQ) != model::lora_dropout_key(2, 2, 0, Proj::kQ));
}

TEST_CASE("lora dropout in the model: training passes only, deterministic, recompute-exact") {
  const auto cfg = tiny("llama", false);
  const int64_t B = 2, T = 6, N = B * T;
  model::ParamLayout layout(cfg, HeadKind::kLM);
  model::LocalParams<float> P(layout);
  P.init(5, 0.3);
  model::LoraConfig lc = lora_cfg(4, "all-linear");
  lc.dropout = 0.4;
  lc.seed = 3;
  model::LoraLayout ll(model::layer_spec(cfg), int(cfg.num_hidden_layers), lc);
  model::LoraConfig l0 = lc;
  l0.dropout = 0;
  model::LoraLayout ll0(model::layer_spec(cfg), int(cfg.num_hidden_layers), l0);
  auto tokens = test::random_tokens(N, cfg.vocab_size, 3);
  std::vector<int32_t> targets(N, 1);
  std::vector<float> ad = random_adapter<float>(ll, 11);
  model::FrozenBaseProvider<float> frozen(P);
  auto dlp = test::random_vec<float>(N, 9);
  std::vector<float> g1(ad.size(), 0.0f), g2(ad.size(), 0.0f), g0(ad.size(), 0.0f);
  std::vector<float> eval(N), eval0(N), train1(N), train2(N), train0(N);
  model::Transformer<float> net(layout, false), ck(layout, true), plain(layout, false);
  net.set_lora(&ll, ad.data(), g1.data());
  ck.set_lora(&ll, ad.data(), g2.data());
  plain.set_lora(&ll0, ad.data(), g0.data());
  net.forward_lm(frozen, tokens.data(), targets.data(), B, T, eval.data(), nullptr, false);
  plain.forward_lm(frozen, tokens.data(), targets.data(), B, T, eval0.data(), nullptr, false);
  CHECK(eval == eval0);  // evaluation / experience passes: no dropout
  net.forward_lm(frozen, tokens.data(), targets.data(), B, T, train1.data(), nullptr, true);
  net.backward_lm(frozen, dlp.data(), nullptr);
  CHECK(test::compare_arrays(train1.data(), eval.data(), N).max_abs_err > 1e-4);  // dropout acts
  ck.forward_lm(frozen, tokens.data(), targets.data(), B, T, train2.data(), nullptr, true);
  ck.backward_lm(frozen, dlp.data(), nullptr);
  CHECK(train2 == train1);  // the same (seed, weights, batch): the same masks
  CHECK(g2 == g1);          // gradient checkpointing recomputes the same masks
  plain.forward_lm(frozen, tokens.data(), targets.data(), B, T, train0.data(), nullptr, true);
  plain.backward_lm(frozen, dlp.data(), nullptr);
  CHECK(test::compare_arrays(g1.data(), g0.data(), int64_t(ad.size())).max_abs_err > 1e-6);
  // Other weights (the next optimizer step) draw other masks.
  std::vector<float> moved = ad;
  moved[0] += 1e-3f;
  net.set_lora(&ll, moved.data(), nullptr);
  std::vector<float> train3(N);
  net.forward_lm(frozen, tokens.data(), targets.data(), B, T, train3.data(), nullptr, true);
  CHECK(model::lora_dropout_pass(moved.data(), moved.size() * 4, tokens.data(), N) !=
        model::lora_dropout_pass(ad.data(), ad.size() * 4, tokens.data(), N));
}

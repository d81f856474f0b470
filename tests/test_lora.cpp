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

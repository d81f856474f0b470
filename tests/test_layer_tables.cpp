// The layer's tables: the projection table against the shapes Hugging Face's modeling code gives
// each architecture (written out here by hand), the parameter counts it feeds, and the
// activation tables against the buffers they carve (in bounds, disjoint, sized as act_elems says,
// the GPU's two regions in its fixed order, shared norms aliased), and the layer's backward with
// frozen projections.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "model/activations.h"
#include "model/decoder_layer.h"
#include "model/layer_params.h"
#include "model/layout.h"
#include "model/ops/attention.h"
#include "model/ops/linear.h"
#include "model/ops/rope.h"
#include "model/projections.h"
#include "tests/test_util.h"

using namespace rlhf;
using model::Act;
using model::Proj;
using model::TpSplit;

namespace {

model::ModelConfig config(const std::string& type, bool attention_bias) {
  model::ModelConfig c;
  c.model_type = type;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = type == "qwen3" ? 24 : 0;  // Qwen3: H·D = 96 != hidden 64
  c.vocab_size = 50;
  c.max_position_embeddings = 32;
  c.attention_bias = attention_bias;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = 0;
  return c;
}

struct Shape {
  std::vector<int64_t> weight;  // (out, in)
  bool bias;
};

}  // namespace

TEST_CASE("projection table: HF shapes, biases and tensor-parallel splits per architecture") {
  // Expected from transformers' modeling_{llama,mistral,qwen2,qwen3}.py: nn.Linear(in, out)
  // stores (out, in); q = H·D = 4·16 (or 4·24 on Qwen3), kv = 2·16 (2·24), C = 64, F = 96.
  struct Case {
    std::string type;
    bool attention_bias;
    bool qkv_bias, o_bias;
    int64_t D;
  };
  for (const Case& k :
       {Case{"llama", false, false, false, 16}, Case{"llama", true, true, true, 16},
        Case{"mistral", false, false, false, 16}, Case{"qwen2", false, true, false, 16},
        Case{"qwen3", false, false, false, 24}, Case{"qwen3", true, true, true, 24}}) {
    INFO(k.type << " attention_bias=" << k.attention_bias);
    const model::ModelConfig c = config(k.type, k.attention_bias);
    const model::LayerSpec s = model::layer_spec(c);
    const int64_t q = 4 * k.D, kv = 2 * k.D;
    const std::map<std::string, Shape> hf = {
        {"q_proj", {{q, 64}, k.qkv_bias}},  {"k_proj", {{kv, 64}, k.qkv_bias}},
        {"v_proj", {{kv, 64}, k.qkv_bias}}, {"o_proj", {{64, q}, k.o_bias}},
        {"gate_proj", {{96, 64}, false}},   {"up_proj", {{96, 64}, false}},
        {"down_proj", {{64, 96}, false}},
    };
    const std::vector<model::Projection> t = model::layer_projections(s);
    REQUIRE(t.size() == hf.size());
    const model::ParamLayout layout(c, model::HeadKind::kLM);
    const model::UnitLayout& u = layout.unit(layout.layer_unit(1));
    for (const model::Projection& p : t) {
      INFO(p.info->name);
      const Shape& e = hf.at(p.info->name);
      CHECK(std::vector<int64_t>{p.out, p.in} == e.weight);
      CHECK(p.bias == e.bias);
      // The layout holds exactly these tensors, under the HF names.
      CHECK(u.at(p.info->weight_name).shape == e.weight);
      CHECK(u.at(p.info->weight_name).name == std::string("model.layers.1.") + p.info->weight_name);
      CHECK((u.find(p.info->bias_name) != nullptr) == e.bias);
    }
    // Megatron's split: q/k/v/gate/up by output rows, o/down by input columns.
    CHECK(model::projection(s, Proj::kQ).split() == TpSplit::kColumn);
    CHECK(model::projection(s, Proj::kUp).split() == TpSplit::kColumn);
    CHECK(model::projection(s, Proj::kO).split() == TpSplit::kRow);
    CHECK(model::projection(s, Proj::kDown).split() == TpSplit::kRow);
    // Parameter counts from the table agree with the layout's tensors (which the loaders check
    // against the checkpoint) and with a sum written out by hand.
    const int64_t layer = 64 * q + 2 * 64 * kv + q * 64 + 3 * 64 * 96 + 2 * 64 +
                          (k.qkv_bias ? q + 2 * kv : 0) + (k.o_bias ? 64 : 0) +
                          (k.type == "qwen3" ? 2 * k.D : 0);
    CHECK(c.num_parameters() == 50 * 64 + 2 * layer + 64 + 50 * 64);
    CHECK(c.num_parameters() == layout.num_parameters());
    CHECK(model::layer_matmul_params(s) == 64 * q + 2 * 64 * kv + q * 64 + 3 * 64 * 96);
  }
}

TEST_CASE("LayerParams: weight(p) and bias(p) are the named fields, from the table") {
  const model::ModelConfig c = config("qwen2", false);
  const model::ParamLayout layout(c, model::HeadKind::kLM);
  const model::UnitLayout& u = layout.unit(layout.layer_unit(0));
  std::vector<float> buf(size_t(u.numel));
  model::LayerParams<float> w(u, buf.data());
  CHECK(w.weight(Proj::kQ) == w.wq);
  CHECK(w.bias(Proj::kQ) == w.bq);
  CHECK(w.bias(Proj::kQ) == buf.data() + u.at("self_attn.q_proj.bias").offset);
  CHECK(w.weight(Proj::kO) == buf.data() + u.at("self_attn.o_proj.weight").offset);
  CHECK(w.bias(Proj::kO) == nullptr);  // Qwen2: no o_proj bias
  CHECK(w.weight(Proj::kDown) == buf.data() + u.at("mlp.down_proj.weight").offset);
  CHECK(w.bias(Proj::kDown) == nullptr);
  w.weight(Proj::kUp) = nullptr;  // assignable: the engine swaps in its slices and packed copies
  CHECK(w.wu == nullptr);
}

namespace {

// Every buffer of `t` carved for N rows: in bounds of its region, disjoint from the others.
template <typename Acts>
void check_carve(const std::vector<model::ActInfo>& t, int64_t N, int64_t align) {
  const model::ActElems e = model::act_elems(t, N, align);
  std::vector<float> values(size_t(e.values)), stats(size_t(e.stats));
  Acts a;
  model::carve(a, t, N, values.data(), stats.empty() ? nullptr : stats.data(), align);
  std::vector<std::pair<const float*, const float*>> taken;
  for (const model::ActInfo& r : t) {
    INFO(r.name);
    float** slot = r.stat ? model::stat_slot(a, r.id) : model::value_slot(a, r.id);
    REQUIRE(slot != nullptr);
    REQUIRE(*slot != nullptr);
    if (r.same_as != r.id) continue;
    const std::vector<float>& region = r.stat ? stats : values;
    const float* b = *slot;
    const float* end = b + N * r.per_row;
    CHECK(b >= region.data());
    CHECK(end <= region.data() + region.size());
    CHECK((b - region.data()) % align == 0);
    for (const auto& [b2, e2] : taken) CHECK((end <= b2 || b >= e2));
    taken.emplace_back(b, end);
  }
}

}  // namespace

TEST_CASE("activation tables carve disjoint in-bounds buffers sized as act_elems says") {
  for (const char* type : {"llama", "qwen3"}) {
    INFO(type);
    const model::LayerSpec s = model::layer_spec(config(type, false));
    const int64_t N = 7, T = 7;
    model::ActOptions train_cpu{true, s.H * T, false}, train_gpu{true, s.H, false},
        infer{false, 0, true};
    for (const model::ActOptions& o : {train_cpu, train_gpu, infer})
      for (int64_t align : {1, 64}) {
        check_carve<model::LayerActs<float>>(model::layer_act_table(s, o), N, align);
      }
    check_carve<model::LayerGradScratch<float>>(model::layer_grad_table(s), N, 128);
    // The GPU's layout, fixed by its kernels' alignment: bf16 values ln1, q, k, v, atty, x_mid,
    // ln2, gate, up, h (then q_raw, k_raw), fp32 statistics rstd1, rstd2, lse (then q_rstd,
    // k_rstd); the sizes the old hand-written formulas gave.
    const int64_t C = s.C, Q = s.q_dim(), KV = s.kv_dim(), F = s.F, H = s.H, Hkv = s.Hkv;
    const bool qk = s.qk_norm;
    const model::ActElems e = model::act_elems(model::layer_act_table(s, train_gpu), N);
    CHECK(e.values ==
          N * C + N * Q + 2 * N * KV + N * Q + 2 * N * C + 3 * N * F + (qk ? N * (Q + KV) : 0));
    CHECK(e.stats == 2 * N + N * H + (qk ? N * (H + Hkv) : 0));
    std::vector<float> v(size_t(e.values)), st(size_t(e.stats));
    model::LayerActs<float> a;
    model::carve(a, model::layer_act_table(s, train_gpu), N, v.data(), st.data());
    CHECK(a.ln1 == v.data());
    CHECK(a.q == v.data() + N * C);
    CHECK(a.h == v.data() + N * C + 2 * N * Q + 2 * N * KV + 2 * N * C + 2 * N * F);
    CHECK(a.rstd1 == st.data());
    CHECK(a.rstd2 == st.data() + N);
    CHECK(a.att == st.data() + 2 * N);
    // Inference: no saved attention, QK-norm in place, the two norms share their buffers.
    model::LayerActs<float> b;
    const auto it = model::layer_act_table(s, infer);
    const model::ActElems ei = model::act_elems(it, N);
    std::vector<float> vi(size_t(ei.values)), si(size_t(ei.stats));
    model::carve(b, it, N, vi.data(), si.data());
    CHECK(b.ln2 == b.ln1);
    CHECK(b.rstd2 == b.rstd1);
    CHECK(b.att == nullptr);
    CHECK(b.q_raw == nullptr);
    CHECK((b.q_rstd != nullptr) == qk);
  }
}

TEST_CASE("decoder layer backward: frozen projections skip their gradient, the rest is bitwise") {
  // A Qwen2 layer (q/k/v biases) over one sequence of T tokens in double: the backward with
  // q_proj's and down_proj's weight gradients frozen (nullptr, as LoRA freezes base weights) must
  // leave the residual gradient and every other parameter gradient bit for bit as the full one.
  const model::ModelConfig c = config("qwen2", false);
  const model::LayerSpec s = model::layer_spec(c);
  const model::ParamLayout layout(c, model::HeadKind::kLM);
  const model::UnitLayout& u = layout.unit(layout.layer_unit(0));
  const int64_t T = 5, N = T, C = s.C;
  const std::vector<double> params = test::random_vec<double>(u.numel, 41, -0.2, 0.2);
  const model::LayerParams<const double> w(u, params.data());
  const std::vector<double> x = test::random_vec<double>(N * C, 42);
  const std::vector<double> dy = test::random_vec<double>(N * C, 43);
  model::ActOptions o;
  o.att_per_row = s.H * T;
  const auto table = model::layer_act_table(s, o);
  const model::ActElems e = model::act_elems(table, N);
  std::vector<double> acts(size_t(e.values + e.stats));
  model::LayerActs<double> a;
  model::carve(a, table, N, acts.data(), static_cast<double*>(nullptr));
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t);
  std::vector<double> cos(size_t(c.max_position_embeddings * s.D / 2)), sin(cos.size());
  model::rope_tables_cpu(cos.data(), sin.data(), c.max_position_embeddings, s.D,
                         model::rope_inv_freq(c).data());
  model::LayerRun<double> run;
  run.N = N;
  run.pos = pos.data();
  run.rope_cos = cos.data();
  run.rope_sin = sin.data();
  run.linear = &model::linear_forward_cpu<double>;
  double* att = a.att;
  run.attention = [&](double* atty, const double* q, const double* k, const double* v) {
    model::attention_forward_cpu(atty, att, q, k, v, 1, T, s.H, s.Hkv, s.D);
  };
  const model::AttentionBackwardFn<double> attention_bwd = [&](double* dq, double* dk, double* dv,
                                                               const double* datty, const double* q,
                                                               const double* k, const double* v) {
    model::attention_backward_cpu(dq, dk, dv, datty, att, q, k, v, 1, T, s.H, s.Hkv, s.D);
  };
  std::vector<double> out(size_t(N * C));
  model::decoder_layer_forward_cpu(out.data(), a, x.data(), w, s, run);
  const auto gtable = model::layer_grad_table(s);
  std::vector<double> scratch(size_t(model::act_elems(gtable, N).values));
  auto backward = [&](bool frozen, std::vector<double>& grads) {
    grads.assign(size_t(u.numel), 0.0);
    model::LayerParams<double> g(u, grads.data());
    if (frozen) g.weight(Proj::kQ) = g.weight(Proj::kDown) = nullptr;
    model::LayerGradScratch<double> d;
    model::carve(d, gtable, N, scratch.data(), static_cast<double*>(nullptr));
    std::vector<double> dres = dy;
    model::decoder_layer_backward_cpu(dres.data(), g, d, a, x.data(), w, s, run, attention_bwd);
    return dres;
  };
  std::vector<double> full, frozen;
  const std::vector<double> dres_full = backward(false, full);
  const std::vector<double> dres_frozen = backward(true, frozen);
  CHECK(dres_frozen == dres_full);
  for (const model::TensorInfo& t : u.tensors) {
    INFO(t.name);
    const bool skipped = t.name.ends_with("q_proj.weight") || t.name.ends_with("down_proj.weight");
    const auto f0 = full.begin() + t.offset, f1 = f0 + t.numel;
    const auto z0 = frozen.begin() + t.offset;
    if (skipped) {
      CHECK(std::all_of(z0, z0 + t.numel, [](double v) { return v == 0.0; }));
      CHECK(std::any_of(f0, f1, [](double v) { return v != 0.0; }));  // it had one to skip
    } else {
      CHECK(std::equal(f0, f1, z0));
    }
  }
}

#include "model/layout.h"

#include "core/error.h"
#include "model/arch.h"
#include "model/projections.h"

namespace rlhf::model {

namespace {

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

void add_tensor(UnitLayout& u, std::string name, std::vector<int64_t> shape, bool decay) {
  TensorInfo t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.numel = 1;
  for (int64_t d : t.shape) t.numel *= d;
  t.offset = round_up(u.numel, kTensorAlignElems);
  t.weight_decay = decay;
  u.numel = t.offset + t.numel;
  u.tensors.push_back(std::move(t));
}

}  // namespace

const TensorInfo* UnitLayout::find(std::string_view suffix) const {
  for (const TensorInfo& t : tensors) {
    if (t.name.size() >= suffix.size() &&
        std::string_view(t.name).substr(t.name.size() - suffix.size()) == suffix &&
        (t.name.size() == suffix.size() || t.name[t.name.size() - suffix.size() - 1] == '.'))
      return &t;
  }
  return nullptr;
}

const TensorInfo& UnitLayout::at(std::string_view suffix) const {
  const TensorInfo* t = find(suffix);
  RLHF_CHECK(t != nullptr, "unit '{}' has no tensor '{}'", name, suffix);
  return *t;
}

ParamLayout::TensorRef ParamLayout::lm_head_weight() const {
  const int u = config_.tie_word_embeddings ? embedding_unit() : head_unit();
  return {
      u, unit(u).at(config_.tie_word_embeddings ? "embed_tokens.weight" : "lm_head.weight").offset};
}

ParamLayout::ParamLayout(const ModelConfig& config, HeadKind head) : config_(config), head_(head) {
  config.validate();
  const LayerSpec spec = layer_spec(config);
  const int64_t C = spec.C, V = config.vocab_size, D = spec.D;

  UnitLayout emb;
  emb.name = "model.embed_tokens";
  emb.kind = UnitKind::kEmbedding;
  add_tensor(emb, "model.embed_tokens.weight", {V, C}, true);
  units_.push_back(std::move(emb));

  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    UnitLayout u;
    u.name = "model.layers." + std::to_string(l);
    u.kind = UnitKind::kLayer;
    u.layer = static_cast<int>(l);
    const std::string p = u.name + ".";
    // The projections of the table (model/projections.h): q, k, v weights back to back, then
    // their biases (when the sizes keep the 64-element alignment, the three are one (q + 2·kv, C)
    // matrix and one bias, for one fused GEMM on the GPU: qkv_packed), then the other attention
    // projections, the QK-norm weights, and the MLP's projections.
    const std::vector<Projection> projs = layer_projections(spec);
    auto add_weight = [&](const Projection& r) {
      add_tensor(u, p + r.info->weight_name, {r.out, r.in}, true);
    };
    auto add_bias = [&](const Projection& r) {
      if (r.bias) add_tensor(u, p + r.info->bias_name, {r.out}, false);
    };
    for (const Projection& r : projs)
      if (r.info->fused_qkv) add_weight(r);
    for (const Projection& r : projs)
      if (r.info->fused_qkv) add_bias(r);
    for (const Projection& r : projs)
      if (r.info->block == ProjBlock::kAttention && !r.info->fused_qkv) add_weight(r), add_bias(r);
    if (spec.qk_norm) {  // Qwen3: one RMSNorm weight per head dim, shared by all heads
      add_tensor(u, p + "self_attn.q_norm.weight", {D}, false);
      add_tensor(u, p + "self_attn.k_norm.weight", {D}, false);
    }
    for (const Projection& r : projs)
      if (r.info->block == ProjBlock::kMlp) add_weight(r), add_bias(r);
    add_tensor(u, p + "input_layernorm.weight", {C}, false);
    add_tensor(u, p + "post_attention_layernorm.weight", {C}, false);
    units_.push_back(std::move(u));
  }

  UnitLayout h;
  h.name = "head";
  h.kind = UnitKind::kHead;
  add_tensor(h, "model.norm.weight", {C}, false);
  if (head == HeadKind::kLM) {
    if (!config.tie_word_embeddings) add_tensor(h, "lm_head.weight", {V, C}, true);
  } else {
    add_tensor(h, "score.weight", {1, C}, true);
  }
  units_.push_back(std::move(h));
}

std::pair<int, const TensorInfo*> ParamLayout::locate(std::string_view hf_name) const {
  for (int i = 0; i < num_units(); ++i)
    for (const TensorInfo& t : units_[static_cast<size_t>(i)].tensors)
      if (t.name == hf_name) return {i, &t};
  RLHF_FAIL("tensor '{}' is not part of this model", hf_name);
}

int64_t ParamLayout::num_parameters() const {
  int64_t n = 0;
  for (const UnitLayout& u : units_)
    for (const TensorInfo& t : u.tensors) n += t.numel;
  return n;
}

int64_t ParamLayout::total_numel() const {
  int64_t n = 0;
  for (const UnitLayout& u : units_) n += u.numel;
  return n;
}

}  // namespace rlhf::model

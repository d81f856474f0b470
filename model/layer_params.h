// Pointers to the tensors of one decoder layer inside its flat unit buffer, from the projection
// table (model/projections.h) and the layer's norm weights.
// Shared by the trainer (model/transformer.cpp: params and grads) and the generation engine.
#pragma once

#include <type_traits>

#include "model/layout.h"
#include "model/projections.h"

namespace rlhf::model {

template <typename T>
struct LoraLayerView;  // model/lora.h

/// The tensors of a decoder layer inside a unit buffer `base` laid out as `u` (params or grads;
/// P = float, const float, double, ...). Each projection of the table (model/projections.h) is a
/// weight (out, in) and an optional bias (out), reachable by name (wq, bq, ...) or by Proj
/// (weight(p), bias(p)); q_norm/k_norm are Qwen3's per-head RMSNorm weights, (D) each. What the
/// architecture lacks (biases, QK-norm) is nullptr. Throws rlhf::Error (from UnitLayout::at) when
/// a required tensor is missing from `u`.
template <typename P>
struct LayerParams {
  P *wq = nullptr, *bq = nullptr, *wk = nullptr, *bk = nullptr, *wv = nullptr, *bv = nullptr,
    *wo = nullptr, *bo = nullptr, *q_norm = nullptr, *k_norm = nullptr, *wg = nullptr,
    *wu = nullptr, *wd = nullptr, *w_in = nullptr, *w_post = nullptr;
  /// The layer's LoRA adapters (model/lora.h), set on the parameter view only; nullptr: none
  /// (or switched off: the reference policy). The projection call sites read it.
  const LoraLayerView<std::remove_const_t<P>>* lora = nullptr;
  LayerParams() = default;
  LayerParams(const UnitLayout& u, P* base) {
    auto opt = [&](const char* s) -> P* {
      const TensorInfo* t = u.find(s);
      return t ? base + t->offset : nullptr;
    };
    for (const ProjInfo& p : kProjections) {
      weight(p.id) = base + u.at(p.weight_name).offset;
      bias(p.id) = opt(p.bias_name);
    }
    q_norm = opt("self_attn.q_norm.weight");
    k_norm = opt("self_attn.k_norm.weight");
    w_in = base + u.at("input_layernorm.weight").offset;
    w_post = base + u.at("post_attention_layernorm.weight").offset;
  }
  /// Projection p's (out, in) weight.
  P*& weight(Proj p) { return *slot(p, false); }
  P* weight(Proj p) const { return *const_cast<LayerParams*>(this)->slot(p, false); }
  /// Projection p's (out) bias, nullptr when it has none.
  P*& bias(Proj p) { return *slot(p, true); }
  P* bias(Proj p) const { return *const_cast<LayerParams*>(this)->slot(p, true); }

 private:
  P** slot(Proj p, bool b) {
    switch (p) {
      case Proj::kQ:
        return b ? &bq : &wq;
      case Proj::kK:
        return b ? &bk : &wk;
      case Proj::kV:
        return b ? &bv : &wv;
      case Proj::kO:
        return b ? &bo : &wo;
      case Proj::kGate:
        return b ? &bg_ : &wg;
      case Proj::kUp:
        return b ? &bu_ : &wu;
      case Proj::kDown:
        return b ? &bd_ : &wd;
    }
    return nullptr;
  }
  // The dense MLP's projections have no bias in any supported architecture; their slots exist
  // so that every projection of the table has one.
  P *bg_ = nullptr, *bu_ = nullptr, *bd_ = nullptr;
};

/// True when the q, k, v projection weights of layer unit `u` lie back to back (q·C, kv·C, kv·C
/// elements, q = H·D, kv = Hkv·D), and so do their biases when present: then, in any params or
/// grads buffer of the unit, LayerParams::wq is one (q + 2·kv, C) matrix and bq one (q + 2·kv)
/// bias, and the three projections are one GEMM. The layout (model/layout.cpp) orders them so;
/// the 64-element tensor alignment breaks it when q·C, kv·C, q or kv is not a multiple of 64.
/// Throws rlhf::Error (from UnitLayout::at) when u is not a decoder layer.
inline bool qkv_packed(const UnitLayout& u) {
  const TensorInfo &q = u.at("self_attn.q_proj.weight"), &k = u.at("self_attn.k_proj.weight"),
                   &v = u.at("self_attn.v_proj.weight");
  if (k.offset != q.offset + q.numel || v.offset != k.offset + k.numel) return false;
  const TensorInfo* bq = u.find("self_attn.q_proj.bias");
  if (bq == nullptr) return true;
  const TensorInfo &bk = u.at("self_attn.k_proj.bias"), &bv = u.at("self_attn.v_proj.bias");
  return bk.offset == bq->offset + bq->numel && bv.offset == bk.offset + bk.numel;
}

/// The LM head weight (V, C) of a pass, and its gradient (dw, when hg is given): inside the head
/// unit's params hp and grads hg, or, when the embeddings are tied (tied = true), inside the
/// embedding unit, whose params (and grads when hg is given) are acquired here from p: the caller
/// releases them after the head. Provider: UnitProvider<T> or UnitProviderCuda; W, G: its param
/// and grad element types.
template <typename W, typename G>
struct LmHead {
  const W* w;
  G* dw;
  bool tied;
};
template <typename Provider, typename W, typename G>
LmHead<W, G> acquire_lm_head(Provider& p, const ParamLayout& layout, const W* hp, G* hg) {
  const ParamLayout::TensorRef r = layout.lm_head_weight();
  if (!layout.config().tie_word_embeddings)
    return {hp + r.offset, hg != nullptr ? hg + r.offset : nullptr, false};
  const W* w = p.acquire_params(r.unit) + r.offset;
  G* g = hg != nullptr ? p.acquire_grads(r.unit) : nullptr;
  return {w, g != nullptr ? g + r.offset : nullptr, true};
}

}  // namespace rlhf::model

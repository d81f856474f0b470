#include "model/transformer.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/checked_alloc.h"
#include "core/error.h"
#include "model/layer_params.h"
#include "model/ops/attention.h"
#include "model/ops/attention_bf16.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "model/ops/logprob.h"
#include "model/ops/matmul_bf16.h"
#include "model/ops/residual.h"
#include "model/ops/rmsnorm.h"
#include "model/ops/rope.h"
#include "model/ops/swiglu.h"

namespace rlhf::model {

namespace {

// Keys of the head weights in the bf16 head cache (layer units use their unit index).
constexpr int kHeadKeyLm = -1, kHeadKeyScore = -2;

template <typename T>
void grow(std::vector<T>& v, int64_t n, const char* what) {
  checked_grow(v, n, what);
}

}  // namespace

template <typename T>
Transformer<T>::Transformer(const ParamLayout& layout, bool gradient_checkpointing)
    : Base(layout, gradient_checkpointing) {
  const ModelConfig& c = layout.config();
  const int64_t P = c.max_position_embeddings;
  // P <= kMaxPositionEmbeddings and D <= kMaxHeadDim (validate()): P·D/2 <= 2^35.
  const std::string rope = fmt::format("({} positions x {} frequencies)", P, D_ / 2);
  checked_resize(rope_cos_, P * D_ / 2, "the RoPE cos table " + rope);
  checked_resize(rope_sin_, P * D_ / 2, "the RoPE sin table " + rope);
  rope_tables_cpu(rope_cos_.data(), rope_sin_.data(), P, D_, rope_inv_freq(c).data());
}

template <typename T>
std::vector<ActInfo> Transformer<T>::act_table() const {
  // Training keeps QK-norm's inputs and the (B, H, T, T) attention probabilities.
  ActOptions o;
  o.backward = true;
  o.att_per_row = H_ * max_seg_;  // packed: Σ H·n_s² <= N·H·max n_s
  return layer_act_table(spec_, o);
}

template <typename T>
int64_t Transformer<T>::layer_floats() const {
  const ActElems e = act_elems(act_table(), N_);
  return e.values + e.stats;
}

template <typename T>
void Transformer<T>::point_layer(LayerActs<T>& a, int set) {
  // One region per set, values and statistics in table order.
  carve(a, act_table(), N_, layers_.data() + set * layer_floats(), static_cast<T*>(nullptr));
}

template <typename T>
LayerRun<T> Transformer<T>::layer_run(LayerActs<T>& s, const int32_t* pos) const {
  LayerRun<T> run;
  run.N = N_;
  run.pos = pos != nullptr ? pos : pos_.data();
  run.rope_cos = rope_cos_.data();
  run.rope_sin = rope_sin_.data();
  run.linear = &linear_forward_cpu<T>;
  T* att = s.att;
  const int32_t* cu = cu_.data();
  const int64_t n = int64_t(cu_.size()) - 1, H = H_, Hkv = Hkv_, D = D_;
  const bool bf16_att = attn_bf16_;
  run.attention = [att, cu, n, H, Hkv, D, bf16_att](T* atty, const T* q, const T* k, const T* v) {
    if constexpr (std::is_same_v<T, float>)
      if (bf16_att) return attention_forward_bf16_cpu(atty, att, q, k, v, cu, n, H, Hkv, D);
    attention_forward_varlen_cpu(atty, att, q, k, v, cu, n, H, Hkv, D);
  };
  return run;
}

template <typename T>
void Transformer<T>::set_bf16(bool on) {
  RLHF_CHECK(!on || (std::is_same_v<T, float>), "bf16 compute needs the float model, not double");
  RLHF_CHECK(!on || onednn_available(),
             "bf16 compute on the CPU needs oneDNN, and this build has none (libdnnl-dev; CMake "
             "RLHF_ONEDNN)");
  bf16_ = on;
  bf16_next_pass();
}

template <typename T>
void Transformer<T>::bf16_next_pass(UnitProvider<T>* p) {
  const Bf16Twins* twins = nullptr;
  if constexpr (std::is_same_v<T, float>)
    if (p != nullptr) twins = dynamic_cast<const Bf16Twins*>(p);
  bf16_layer_.next_pass(twins);
  bf16_head_.next_pass(twins);
}

template <typename T>
void Transformer<T>::bf16_layer_small(LayerParams<const T>& w, const T* params,
                                      const UnitLayout& u) {
  if constexpr (std::is_same_v<T, float>) {
    if (!bf16_) return;
    // Runs of consecutive small tensors in offset order (no GEMM weight between them) are copied
    // whole, alignment gaps included, so that adjacent ones (packed q/k/v biases) stay adjacent.
    std::vector<const TensorInfo*> order;
    for (const TensorInfo& t : u.tensors) order.push_back(&t);
    std::sort(order.begin(), order.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    struct Run {
      int64_t begin, end, at;  // unit offsets [begin, end) copied to bf16_small_ + at
    };
    std::vector<Run> runs;
    int64_t total = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i]->weight_decay) continue;
      const int64_t begin = order[i]->offset;
      while (i + 1 < order.size() && !order[i + 1]->weight_decay) ++i;
      runs.push_back({begin, order[i]->offset + order[i]->numel, total});
      total += runs.back().end - begin;
    }
    grow(bf16_small_, total, "bf16 copies of a layer's biases and norm weights");
    T* s = bf16_small_.data();
    for (const Run& r : runs)
      for (int64_t i = r.begin; i < r.end; ++i) s[r.at + i - r.begin] = round_to_bf16(params[i]);
    for (const T** ptr : {&w.bq, &w.bk, &w.bv, &w.bo, &w.q_norm, &w.k_norm, &w.w_in, &w.w_post}) {
      if (*ptr == nullptr) continue;
      const int64_t off = *ptr - params;
      for (const Run& r : runs)
        if (off >= r.begin && off < r.end) *ptr = s + r.at + (off - r.begin);
    }
  }
}

template <typename T>
const T* Transformer<T>::final_norm_weight(const T* head_params) {
  const T* w = head_params + layout_.unit(layout_.head_unit()).at("model.norm.weight").offset;
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_) {
      grow(bf16_norm_, C_, "the bf16 copy of the final norm's weight");
      for (int64_t i = 0; i < C_; ++i) bf16_norm_[size_t(i)] = round_to_bf16(w[i]);
      return bf16_norm_.data();
    }
  }
  return w;
}

template <typename T>
void Transformer<T>::bf16_round(T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    if (bf16_) round_to_bf16_n(x, n);
}

template <typename T>
void Transformer<T>::head_linear(T* y, const T* x, const T* w, int64_t rows, int64_t IC, int64_t OC,
                                 int key) {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_) {
      thread_local std::vector<bfloat16> xb;
      if (int64_t(xb.size()) < rows * IC) xb.resize(size_t(rows * IC));
      float_to_bf16_n(xb.data(), x, rows * IC);
      linear_forward_bf16(y, xb.data(), bf16_head_.get(w, key, OC * IC), nullptr, rows, IC, OC);
      return;
    }
  }
  linear_forward_cpu(y, x, w, static_cast<const T*>(nullptr), rows, IC, OC);
}

template <typename T>
void Transformer<T>::head_linear_backward(T* dx, T* dw, const T* dy, const T* x, const T* w,
                                          int64_t rows, int64_t IC, int64_t OC, int key,
                                          const bfloat16* dy16) {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_) {
      thread_local std::vector<bfloat16> dyb, xb;
      if (dy16 == nullptr) {
        if (int64_t(dyb.size()) < rows * OC) dyb.resize(size_t(rows * OC));
        float_to_bf16_n(dyb.data(), dy, rows * OC);
        dy16 = dyb.data();
      }
      if (int64_t(xb.size()) < rows * IC) xb.resize(size_t(rows * IC));
      float_to_bf16_n(xb.data(), x, rows * IC);
      linear_backward_bf16(dx, dw, nullptr, dy16, xb.data(), bf16_head_.get(w, key, OC * IC), rows,
                           IC, OC, false);
      round_to_bf16_n(dx, rows * IC);
      return;
    }
  }
  linear_backward_cpu(dx, dw, static_cast<T*>(nullptr), dy, x, w, rows, IC, OC, false);
}

template <typename T>
void Transformer<T>::reserve(int64_t B, int64_t T_len, bool for_backward, SeqLens seqs) {
  set_geometry(B, T_len, seqs);
  // The pass's attention, fixed here so that its backward reads the probabilities the way its
  // forward saved them.
  attn_bf16_ = std::is_same_v<T, float> && bf16_ && cpu_attention_bf16();
  // Every buffer below is N = B·T rows of a bounded model width (ModelConfig::validate), times the
  // layers kept for backward: refuse a batch whose buffers would not fit in int64 before any
  // product can wrap.
  const long double rows = static_cast<long double>(B) * static_cast<long double>(T_len);
  const long double floats =
      rows * static_cast<long double>(L_ + 2) *
          static_cast<long double>(C_ + 3 * F_ + 4 * H_ * D_ + H_ * max_seg_ + 16) +
      rows * static_cast<long double>(V_);
  RLHF_CHECK(floats < 0x1p60L,
             "a batch of {} x {} tokens is too large for this model: its activations would take "
             "{:.3g} elements",
             B, T_len, static_cast<double>(floats));
  const int64_t N = N_;
  grow(res_, residual_slots(for_backward) * N * C_, "activations (residual stream)");
  grow(layers_, layer_sets(for_backward) * layer_floats(), "activations (decoder layers)");
  grow(lnf_, N * C_, "activations (final norm)");
  grow(rstdf_, N, "activations (final norm)");
  grow(lse_, N, "activations (log-sum-exp)");
  grow(entropy_, N, "activations (entropy)");
  checked_resize(pos_, N, "token positions");
  for (size_t s = 0; s + 1 < cu_.size(); ++s)  // positions restart at 0 per sample
    for (int32_t n = cu_[s]; n < cu_[s + 1]; ++n) pos_[size_t(n)] = n - cu_[s];
  if (for_backward) {
    grow(dres_, N * C_, "activation gradients");
    grow(dlayer_, act_elems(layer_grad_table(spec_), N, kGradAlign).values, "activation gradients");
    grow(dlnf_, N * C_, "activation gradients");
  }
}

template <typename T>
int64_t Transformer<T>::activation_bytes() const {
  size_t n = res_.size() + layers_.size() + lnf_.size() + rstdf_.size() + logits_.size() +
             lse_.size() + entropy_.size() + sweep_res_.size() + dres_.size() + dlayer_.size() +
             dlnf_.size();
  return static_cast<int64_t>(n * sizeof(T));
}

// ---------------------------------------------------------------------------------------------
// Forward

template <typename T>
void Transformer<T>::embed(UnitProvider<T>& p, const int32_t* tokens) {
  const int eu = layout_.embedding_unit();
  const T* emb = p.acquire_params(eu);
  embedding_forward_cpu(res_.data(), tokens,
                        emb + layout_.unit(eu).at("embed_tokens.weight").offset, N_, C_, V_);
  bf16_round(res_.data(), N_ * C_);
  p.release_params(eu);
}

template <typename T>
void Transformer<T>::layer_forward(const T* params, int l, const T* x_in, T* x_out, LayerActs<T>& a,
                                   const int32_t* pos) {
  const int u = layout_.layer_unit(l);
  LayerParams<const T> w(layout_.unit(u), params);
  LoraLayerView<T> lora;
  if (lora_active()) {
    lora = lora_layer_view<T>(*lora_layout_, l, lora_params_, nullptr, lora_drop_pass_);
    w.lora = &lora;
  }
  LayerRun<T> run = layer_run(a, pos);
  if constexpr (std::is_same_v<T, float>)
    if (bf16_) {
      bf16_view_ = layer_bf16(layout_.unit(u), bf16_layer_.get(params, u, layout_.unit(u).numel));
      run.bf16 = &bf16_view_;
      bf16_layer_small(w, params, layout_.unit(u));
    }
  decoder_layer_forward_cpu(x_out, a, x_in, w, spec_, run);
}

template <typename T>
void Transformer<T>::trunk_forward(UnitProvider<T>& p, const int32_t* tokens, int64_t B,
                                   int64_t T_len, bool for_backward, SeqLens seqs) {
  reserve(B, T_len, for_backward, seqs);
  tokens_.assign(tokens, tokens + N_);
  // LoRA dropout acts in training passes only (PEFT's nn.Dropout in train mode).
  lora_drop_pass_ = 0;
  if (for_backward && lora_active() && lora_layout_->config().dropout > 0)
    lora_drop_pass_ = lora_dropout_pass(lora_params_, size_t(lora_layout_->numel()) * sizeof(T),
                                        tokens_.data(), N_);
  embed(p, tokens);
  forward_layers(p, for_backward);
}

template <typename T>
void Transformer<T>::final_norm(const T* head_params, const T* x) {
  rmsnorm_forward_cpu(lnf_.data(), rstdf_.data(), x, final_norm_weight(head_params), N_, C_,
                      layout_.config().rms_norm_eps);
}

template <typename T>
void Transformer<T>::lm_logprobs(const T* w, T* lp, T* entropy, bool keep_logits) {
  // Kept for backward, the (N, V) logits are whole (backward turns them into dlogits in place);
  // otherwise rows go through a bounded chunk buffer.
  const int64_t chunk =
      keep_logits ? N_ : std::min<int64_t>(N_, std::max<int64_t>(1, (int64_t(1) << 24) / V_));
  grow(logits_, chunk * V_, "logits");
  T* ent = entropy ? entropy_.data() : nullptr;
  for (int64_t r0 = 0; r0 < N_; r0 += chunk) {
    const int64_t rows = std::min(chunk, N_ - r0);
    head_linear(logits_.data(), lnf_.data() + r0 * C_, w, rows, C_, V_, kHeadKeyLm);
    logprob_forward_cpu(lp + r0, lse_.data() + r0, ent ? ent + r0 : nullptr, logits_.data(),
                        targets_.data() + r0, rows, V_, inv_temperature_);
  }
  if (entropy) std::copy(entropy_.data(), entropy_.data() + N_, entropy);
}

template <typename T>
void Transformer<T>::forward_lm(UnitProvider<T>& p, const int32_t* tokens, const int32_t* targets,
                                int64_t B, int64_t T_len, T* lp, T* entropy, bool for_backward,
                                T inv_temperature, SeqLens seqs) {
  check_head(true, "forward_lm");
  bf16_next_pass(&p);
  p.begin_pass(false);
  trunk_forward(p, tokens, B, T_len, for_backward, seqs);
  targets_.assign(targets, targets + N_);
  inv_temperature_ = inv_temperature;
  head_forward(p, for_backward, [&](const T* hp, const T* w) {
    final_norm(hp, x_last());
    lm_logprobs(w, lp, entropy, for_backward);
  });
  entropy_valid_ = entropy != nullptr;
}

template <typename T>
void Transformer<T>::forward_logits(UnitProvider<T>& p, const int32_t* tokens, int64_t B,
                                    int64_t T_len, T* logits) {
  check_head(true, "forward_logits");
  bf16_next_pass(&p);
  p.begin_pass(false);
  trunk_forward(p, tokens, B, T_len, false);
  head_forward(p, false, [&](const T* hp, const T* w) {
    final_norm(hp, x_last());
    head_linear(logits, lnf_.data(), w, N_, C_, V_, kHeadKeyLm);
  });
}

template <typename T>
void Transformer<T>::final_norm_backward(const T* head_params, T* head_grads) {
  // dlnf_ holds d loss / d RMSNorm(x_L); the residual gradient starts here.
  const int64_t norm_off = layout_.unit(layout_.head_unit()).at("model.norm.weight").offset;
  std::fill(dres_.begin(), dres_.begin() + N_ * C_, T(0));
  rmsnorm_backward_cpu(dres_.data(), head_grads != nullptr ? head_grads + norm_off : nullptr,
                       dlnf_.data(), x_last(), final_norm_weight(head_params), rstdf_.data(), N_,
                       C_);
}

template <typename T>
void Transformer<T>::backward_lm(UnitProvider<T>& p, const T* dlp, const T* dentropy) {
  check_backward(true, dentropy != nullptr);
  bf16_next_pass(&p);
  head_backward(p, [&](const T*, const T* w, T* dw) {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_) {  // dlogits straight to bf16: no fp32 (N, V) pass and rounding pass over it
        thread_local std::vector<bfloat16> dlogits16;
        if (int64_t(dlogits16.size()) < N_ * V_) dlogits16.resize(size_t(N_ * V_));
        logprob_backward_bf16_cpu(dlogits16.data(), dlp, dentropy, logits_.data(), lse_.data(),
                                  dentropy ? entropy_.data() : nullptr, targets_.data(), N_, V_,
                                  inv_temperature_);
        head_linear_backward(dlnf_.data(), dw, nullptr, lnf_.data(), w, N_, C_, V_, kHeadKeyLm,
                             dlogits16.data());
        return;
      }
    }
    logprob_backward_cpu(logits_.data(), dlp, dentropy, logits_.data(), lse_.data(),
                         dentropy ? entropy_.data() : nullptr, targets_.data(), N_, V_,
                         inv_temperature_);
    head_linear_backward(dlnf_.data(), dw, logits_.data(), lnf_.data(), w, N_, C_, V_, kHeadKeyLm);
  });
}

template <typename T>
void Transformer<T>::forward_scalar(UnitProvider<T>& p, const int32_t* tokens, int64_t B,
                                    int64_t T_len, T* values, bool for_backward, SeqLens seqs) {
  check_head(false, "forward_scalar");
  bf16_next_pass(&p);
  p.begin_pass(false);
  trunk_forward(p, tokens, B, T_len, for_backward, seqs);
  head_forward(p, for_backward, [&](const T* hp, const T* score) {
    final_norm(hp, x_last());
    head_linear(values, lnf_.data(), score, N_, C_, int64_t(1), kHeadKeyScore);
  });
}

template <typename T>
void Transformer<T>::backward_scalar(UnitProvider<T>& p, const T* dvalues) {
  check_backward(false, false);
  bf16_next_pass(&p);
  head_backward(p, [&](const T*, const T* score, T* dscore) {
    head_linear_backward(dlnf_.data(), dscore, dvalues, lnf_.data(), score, N_, C_, int64_t(1),
                         kHeadKeyScore);
  });
}

// ---------------------------------------------------------------------------------------------
// Backward

template <typename T>
void Transformer<T>::layer_backward(const T* params, T* grads, int l, const T* x_in,
                                    LayerActs<T>& a, T* dres) {
  const UnitLayout& u = layout_.unit(layout_.layer_unit(l));
  LayerParams<const T> w(u, params);
  // A frozen base (LoRA) hands out no gradient buffer: every base gradient is skipped.
  const LayerParams<T> g = grads != nullptr ? LayerParams<T>(u, grads) : LayerParams<T>();
  LoraLayerView<T> lora;
  if (lora_active()) {
    lora = lora_layer_view<T>(*lora_layout_, l, lora_params_, lora_grads_, lora_drop_pass_);
    w.lora = &lora;
  }
  LayerGradScratch<T> d;
  carve(d, layer_grad_table(spec_), N_, dlayer_.data(), static_cast<T*>(nullptr), kGradAlign);
  const T* att = a.att;
  const int32_t* cu = cu_.data();
  const int64_t n = int64_t(cu_.size()) - 1, H = H_, Hkv = Hkv_, D = D_;
  const bool bf16_att = attn_bf16_;
  const AttentionBackwardFn<T> attention = [att, cu, n, H, Hkv, D, bf16_att](
                                               T* dq, T* dk, T* dv, const T* datty, const T* q,
                                               const T* k, const T* v) {
    if constexpr (std::is_same_v<T, float>)
      if (bf16_att)
        return attention_backward_bf16_cpu(dq, dk, dv, datty, att, q, k, v, cu, n, H, Hkv, D);
    attention_backward_varlen_cpu(dq, dk, dv, datty, att, q, k, v, cu, n, H, Hkv, D);
  };
  LayerRun<T> run = layer_run(a);
  if constexpr (std::is_same_v<T, float>)
    if (bf16_) {
      const int ui = layout_.layer_unit(l);
      bf16_view_ = layer_bf16(u, bf16_layer_.get(params, ui, u.numel));
      run.bf16 = &bf16_view_;
      bf16_layer_small(w, params, u);
    }
  decoder_layer_backward_cpu(dres, g, d, a, x_in, w, spec_, run, attention);
}

template <typename T>
void Transformer<T>::trunk_backward(UnitProvider<T>& p) {
  T* dres = dres_.data();
  backward_layers(p, dres);
  const int eu = layout_.embedding_unit();
  T* eg = p.acquire_grads(eu);
  if (eg != nullptr)
    embedding_backward_cpu(eg + layout_.unit(eu).at("embed_tokens.weight").offset, dres,
                           tokens_.data(), N_, C_, V_);
  p.release_grads(eu);
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace rlhf::model

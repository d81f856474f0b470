#include "model/transformer.h"

#include <algorithm>
#include <cstring>

#include "core/checked_alloc.h"
#include "core/error.h"
#include "model/layer_params.h"
#include "model/ops/attention.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "model/ops/logprob.h"
#include "model/ops/residual.h"
#include "model/ops/rmsnorm.h"
#include "model/ops/rope.h"
#include "model/ops/swiglu.h"

namespace rlhf::model {

namespace {

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
  run.attention = [att, cu, n, H, Hkv, D](T* atty, const T* q, const T* k, const T* v) {
    attention_forward_varlen_cpu(atty, att, q, k, v, cu, n, H, Hkv, D);
  };
  return run;
}

template <typename T>
void Transformer<T>::reserve(int64_t B, int64_t T_len, bool for_backward, SeqLens seqs) {
  set_geometry(B, T_len, seqs);
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
  p.release_params(eu);
}

template <typename T>
void Transformer<T>::layer_forward(const T* params, int l, const T* x_in, T* x_out, LayerActs<T>& a,
                                   const int32_t* pos) {
  const LayerParams<const T> w(layout_.unit(layout_.layer_unit(l)), params);
  decoder_layer_forward_cpu(x_out, a, x_in, w, spec_, layer_run(a, pos));
}

template <typename T>
void Transformer<T>::trunk_forward(UnitProvider<T>& p, const int32_t* tokens, int64_t B,
                                   int64_t T_len, bool for_backward, SeqLens seqs) {
  reserve(B, T_len, for_backward, seqs);
  tokens_.assign(tokens, tokens + N_);
  embed(p, tokens);
  forward_layers(p, for_backward);
}

template <typename T>
void Transformer<T>::final_norm(const T* head_params, const T* x) {
  const UnitLayout& hu = layout_.unit(layout_.head_unit());
  rmsnorm_forward_cpu(lnf_.data(), rstdf_.data(), x,
                      head_params + hu.at("model.norm.weight").offset, N_, C_,
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
    linear_forward_cpu(logits_.data(), lnf_.data() + r0 * C_, w, static_cast<const T*>(nullptr),
                       rows, C_, V_);
    logprob_forward_cpu(lp + r0, lse_.data() + r0, ent ? ent + r0 : nullptr, logits_.data(),
                        targets_.data() + r0, rows, V_, inv_temperature_);
  }
  if (entropy) std::copy(entropy_.data(), entropy_.data() + N_, entropy);
}

template <typename T>
void Transformer<T>::forward_lm(UnitProvider<T>& p, const int32_t* tokens, const int32_t* targets,
                                int64_t B, int64_t T_len, T* lp, T* entropy, bool for_backward,
                                T inv_temperature, SeqLens seqs) {
  RLHF_CHECK(layout_.head() == HeadKind::kLM, "forward_lm needs a model with an LM head, not '{}'",
             to_string(layout_.head()));
  p.begin_pass(false);
  trunk_forward(p, tokens, B, T_len, for_backward, seqs);
  targets_.assign(targets, targets + N_);
  inv_temperature_ = inv_temperature;
  const int hu = layout_.head_unit(), eu = layout_.embedding_unit();
  const bool tied = layout_.config().tie_word_embeddings;
  const T* hp = p.acquire_params(hu);
  final_norm(hp, x_last());
  const T* w = acquire_lm_head(p, layout_, hp, static_cast<T*>(nullptr)).w;
  lm_logprobs(w, lp, entropy, for_backward);
  if (tied) p.release_params(eu);
  p.release_params(hu);
  p.end_pass(false);
  have_backward_state_ = for_backward;
  last_head_ = HeadKind::kLM;
  entropy_valid_ = entropy != nullptr;
}

template <typename T>
void Transformer<T>::forward_logits(UnitProvider<T>& p, const int32_t* tokens, int64_t B,
                                    int64_t T_len, T* logits) {
  RLHF_CHECK(layout_.head() == HeadKind::kLM, "forward_logits needs a model with an LM head");
  p.begin_pass(false);
  trunk_forward(p, tokens, B, T_len, false);
  const int hu = layout_.head_unit(), eu = layout_.embedding_unit();
  const bool tied = layout_.config().tie_word_embeddings;
  const T* hp = p.acquire_params(hu);
  final_norm(hp, x_last());
  const T* w = acquire_lm_head(p, layout_, hp, static_cast<T*>(nullptr)).w;
  linear_forward_cpu(logits, lnf_.data(), w, static_cast<const T*>(nullptr), N_, C_, V_);
  if (tied) p.release_params(eu);
  p.release_params(hu);
  p.end_pass(false);
  have_backward_state_ = false;
}

template <typename T>
void Transformer<T>::head_backward_common(UnitProvider<T>& p, const T* head_params, T* head_grads) {
  // dlnf_ holds d loss / d RMSNorm(x_L); the residual gradient starts here.
  const UnitLayout& hu = layout_.unit(layout_.head_unit());
  const int64_t norm_off = hu.at("model.norm.weight").offset;
  std::fill(dres_.begin(), dres_.begin() + N_ * C_, T(0));
  rmsnorm_backward_cpu(dres_.data(), head_grads + norm_off, dlnf_.data(), x_last(),
                       head_params + norm_off, rstdf_.data(), N_, C_);
  p.release_grads(layout_.head_unit());
  p.release_params(layout_.head_unit());
  trunk_backward(p, dres_.data());
  have_backward_state_ = false;
  p.end_pass(true);
}

template <typename T>
void Transformer<T>::backward_lm(UnitProvider<T>& p, const T* dlp, const T* dentropy) {
  RLHF_CHECK(have_backward_state_ && last_head_ == HeadKind::kLM,
             "backward_lm needs a preceding forward_lm(for_backward = true)");
  RLHF_CHECK(dentropy == nullptr || entropy_valid_,
             "backward_lm with an entropy gradient needs forward_lm to compute the entropy");
  p.begin_pass(true);
  logprob_backward_cpu(logits_.data(), dlp, dentropy, logits_.data(), lse_.data(),
                       dentropy ? entropy_.data() : nullptr, targets_.data(), N_, V_,
                       inv_temperature_);
  const int hu = layout_.head_unit(), eu = layout_.embedding_unit();
  const bool tied = layout_.config().tie_word_embeddings;
  const T* hp = p.acquire_params(hu);
  T* hg = p.acquire_grads(hu);
  const auto head = acquire_lm_head(p, layout_, hp, hg);
  const T* w = head.w;
  T* dw = head.dw;
  linear_backward_cpu(dlnf_.data(), dw, static_cast<T*>(nullptr), logits_.data(), lnf_.data(), w,
                      N_, C_, V_, false);
  if (tied) {
    // Hand the LM-head part of the embedding gradient back now (a ZeRO-3 provider reduce-scatters
    // it) rather than holding a full embedding-sized buffer through the whole backward; the
    // embedding backward acquires it again and accumulates.
    p.release_grads(eu);
    p.release_params(eu);
  }
  head_backward_common(p, hp, hg);
}

template <typename T>
void Transformer<T>::forward_scalar(UnitProvider<T>& p, const int32_t* tokens, int64_t B,
                                    int64_t T_len, T* values, bool for_backward, SeqLens seqs) {
  RLHF_CHECK(layout_.head() != HeadKind::kLM,
             "forward_scalar needs a model with a value or reward head");
  p.begin_pass(false);
  trunk_forward(p, tokens, B, T_len, for_backward, seqs);
  const int hu = layout_.head_unit();
  const T* hp = p.acquire_params(hu);
  final_norm(hp, x_last());
  linear_forward_cpu(values, lnf_.data(), hp + layout_.unit(hu).at("score.weight").offset,
                     static_cast<const T*>(nullptr), N_, C_, int64_t(1));
  p.release_params(hu);
  p.end_pass(false);
  have_backward_state_ = for_backward;
  last_head_ = layout_.head();
}

template <typename T>
void Transformer<T>::backward_scalar(UnitProvider<T>& p, const T* dvalues) {
  RLHF_CHECK(have_backward_state_ && last_head_ != HeadKind::kLM,
             "backward_scalar needs a preceding forward_scalar(for_backward = true)");
  p.begin_pass(true);
  const int hu = layout_.head_unit();
  const T* hp = p.acquire_params(hu);
  T* hg = p.acquire_grads(hu);
  const int64_t off = layout_.unit(hu).at("score.weight").offset;
  linear_backward_cpu(dlnf_.data(), hg + off, static_cast<T*>(nullptr), dvalues, lnf_.data(),
                      hp + off, N_, C_, int64_t(1), false);
  head_backward_common(p, hp, hg);
}

// ---------------------------------------------------------------------------------------------
// Backward

template <typename T>
void Transformer<T>::layer_backward(const T* params, T* grads, int l, const T* x_in,
                                    LayerActs<T>& a, T* dres) {
  const UnitLayout& u = layout_.unit(layout_.layer_unit(l));
  const LayerParams<const T> w(u, params);
  const LayerParams<T> g(u, grads);
  LayerGradScratch<T> d;
  carve(d, layer_grad_table(spec_), N_, dlayer_.data(), static_cast<T*>(nullptr), kGradAlign);
  const T* att = a.att;
  const int32_t* cu = cu_.data();
  const int64_t n = int64_t(cu_.size()) - 1, H = H_, Hkv = Hkv_, D = D_;
  const AttentionBackwardFn<T> attention = [att, cu, n, H, Hkv, D](T* dq, T* dk, T* dv,
                                                                   const T* datty, const T* q,
                                                                   const T* k, const T* v) {
    attention_backward_varlen_cpu(dq, dk, dv, datty, att, q, k, v, cu, n, H, Hkv, D);
  };
  decoder_layer_backward_cpu(dres, g, d, a, x_in, w, spec_, layer_run(a), attention);
}

template <typename T>
void Transformer<T>::trunk_backward(UnitProvider<T>& p, T* dres) {
  backward_layers(p, dres);
  const int eu = layout_.embedding_unit();
  T* eg = p.acquire_grads(eu);
  embedding_backward_cpu(eg + layout_.unit(eu).at("embed_tokens.weight").offset, dres,
                         tokens_.data(), N_, C_, V_);
  p.release_grads(eu);
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace rlhf::model

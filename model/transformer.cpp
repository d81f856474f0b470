#include "model/transformer.h"

#include <algorithm>
#include <cstring>

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
void grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

}  // namespace

template <typename T>
Transformer<T>::Transformer(const ParamLayout& layout, bool gradient_checkpointing)
    : layout_(layout), checkpointing_(gradient_checkpointing) {
  const ModelConfig& c = layout.config();
  C_ = c.hidden_size;
  F_ = c.intermediate_size;
  H_ = c.num_attention_heads;
  Hkv_ = c.num_key_value_heads;
  D_ = c.D();
  V_ = c.vocab_size;
  L_ = c.num_hidden_layers;
  const int64_t P = c.max_position_embeddings;
  rope_cos_.resize(static_cast<size_t>(P * D_ / 2));
  rope_sin_.resize(static_cast<size_t>(P * D_ / 2));
  rope_tables_cpu(rope_cos_.data(), rope_sin_.data(), P, D_, c.rope_theta);
}

template <typename T>
int64_t Transformer<T>::layer_floats() const {
  const int64_t N = N_;
  return N * C_ + N + N * H_ * D_ + 2 * N * Hkv_ * D_ + N * H_ * T_ + N * H_ * D_ + N * C_ +
         N * C_ + N + 3 * N * F_;
}

template <typename T>
void Transformer<T>::point_layer(LayerActs& a, T* base) const {
  const int64_t N = N_;
  T* p = base;
  auto take = [&](int64_t n) {
    T* r = p;
    p += n;
    return r;
  };
  a.ln1 = take(N * C_);
  a.rstd1 = take(N);
  a.q = take(N * H_ * D_);
  a.k = take(N * Hkv_ * D_);
  a.v = take(N * Hkv_ * D_);
  a.att = take(N * H_ * T_);
  a.atty = take(N * H_ * D_);
  a.x_mid = take(N * C_);
  a.ln2 = take(N * C_);
  a.rstd2 = take(N);
  a.gate = take(N * F_);
  a.up = take(N * F_);
  a.h = take(N * F_);
}

template <typename T>
void Transformer<T>::reserve(int64_t B, int64_t T_len, bool for_backward) {
  RLHF_CHECK(B >= 1 && T_len >= 1, "batch must be non-empty, got B={} T={}", B, T_len);
  RLHF_CHECK(T_len <= layout_.config().max_position_embeddings,
             "sequence length {} exceeds max_position_embeddings {}", T_len,
             layout_.config().max_position_embeddings);
  B_ = B;
  T_ = T_len;
  N_ = B * T_len;
  const int64_t N = N_;
  const int64_t sets = (for_backward && !checkpointing_) ? L_ : 1;
  grow(res_, (for_backward ? L_ + 1 : 2) * N * C_);
  grow(layers_, sets * layer_floats());
  grow(lnf_, N * C_);
  grow(rstdf_, N);
  grow(lse_, N);
  grow(entropy_, N);
  pos_.resize(static_cast<size_t>(N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T_len; ++t) pos_[static_cast<size_t>(b * T_len + t)] = int32_t(t);
  if (for_backward) {
    grow(dres_, N * C_);
    grow(dln_, N * C_);
    grow(datty_, N * H_ * D_);
    grow(dq_, N * H_ * D_);
    grow(dk_, N * Hkv_ * D_);
    grow(dv_, N * Hkv_ * D_);
    grow(dh_, N * F_);
    grow(dgate_, N * F_);
    grow(dup_, N * F_);
    grow(dlnf_, N * C_);
  }
}

template <typename T>
int64_t Transformer<T>::activation_bytes() const {
  size_t n = res_.size() + layers_.size() + lnf_.size() + rstdf_.size() + logits_.size() +
             lse_.size() + entropy_.size() + dres_.size() + dln_.size() + datty_.size() +
             dq_.size() + dk_.size() + dv_.size() + dh_.size() + dgate_.size() + dup_.size() +
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
void Transformer<T>::layer_forward(const T* params, int l, const T* x_in, T* x_out, LayerActs& a) {
  const UnitLayout& u = layout_.unit(layout_.layer_unit(l));
  LayerParams<const T> w(u, params);
  const int64_t N = N_, Q = H_ * D_, KV = Hkv_ * D_;
  const double eps = layout_.config().rms_norm_eps;
  const RopeStyle style = layout_.config().rope_style;
  rmsnorm_forward_cpu(a.ln1, a.rstd1, x_in, w.w_in, N, C_, eps);
  linear_forward_cpu(a.q, a.ln1, w.wq, w.bq, N, C_, Q);
  linear_forward_cpu(a.k, a.ln1, w.wk, w.bk, N, C_, KV);
  linear_forward_cpu(a.v, a.ln1, w.wv, w.bv, N, C_, KV);
  rope_forward_cpu(a.q, a.q, pos_.data(), rope_cos_.data(), rope_sin_.data(), N, H_, D_, style);
  rope_forward_cpu(a.k, a.k, pos_.data(), rope_cos_.data(), rope_sin_.data(), N, Hkv_, D_, style);
  attention_forward_cpu(a.atty, a.att, a.q, a.k, a.v, B_, T_, H_, Hkv_, D_);
  linear_forward_cpu(a.x_mid, a.atty, w.wo, w.bo, N, Q, C_);
  residual_forward_cpu(a.x_mid, a.x_mid, x_in, N * C_);
  rmsnorm_forward_cpu(a.ln2, a.rstd2, a.x_mid, w.w_post, N, C_, eps);
  linear_forward_cpu(a.gate, a.ln2, w.wg, static_cast<const T*>(nullptr), N, C_, F_);
  linear_forward_cpu(a.up, a.ln2, w.wu, static_cast<const T*>(nullptr), N, C_, F_);
  swiglu_forward_cpu(a.h, a.gate, a.up, N, F_);
  linear_forward_cpu(x_out, a.h, w.wd, static_cast<const T*>(nullptr), N, F_, C_);
  residual_forward_cpu(x_out, x_out, a.x_mid, N * C_);
}

template <typename T>
void Transformer<T>::trunk_forward(UnitProvider<T>& p, const int32_t* tokens, int64_t B,
                                   int64_t T_len, bool for_backward) {
  reserve(B, T_len, for_backward);
  tokens_.assign(tokens, tokens + N_);
  have_backward_state_ = false;
  kept_ = for_backward;
  embed(p, tokens);
  const int64_t NC = N_ * C_;
  const int64_t lf = layer_floats();
  for (int l = 0; l < L_; ++l) {
    // Residual stream: with backward, res_[l] is layer l's input (kept); without, ping-pong.
    const T* x_in = res_.data() + (for_backward ? l : l % 2) * NC;
    T* x_out = res_.data() + (for_backward ? l + 1 : (l + 1) % 2) * NC;
    LayerActs a;
    point_layer(a, layers_.data() + ((for_backward && !checkpointing_) ? l * lf : 0));
    const int u = layout_.layer_unit(l);
    const T* params = p.acquire_params(u);
    layer_forward(params, l, x_in, x_out, a);
    p.release_params(u);
  }
}

template <typename T>
const T* Transformer<T>::x_last() const {
  return res_.data() + (kept_ ? L_ : L_ % 2) * N_ * C_;
}

template <typename T>
void Transformer<T>::final_norm(const T* head_params) {
  const UnitLayout& hu = layout_.unit(layout_.head_unit());
  rmsnorm_forward_cpu(lnf_.data(), rstdf_.data(), x_last(),
                      head_params + hu.at("model.norm.weight").offset, N_, C_,
                      layout_.config().rms_norm_eps);
}

template <typename T>
void Transformer<T>::forward_lm(UnitProvider<T>& p, const int32_t* tokens, const int32_t* targets,
                                int64_t B, int64_t T_len, T* lp, T* entropy, bool for_backward,
                                T inv_temperature) {
  RLHF_CHECK(layout_.head() == HeadKind::kLM, "forward_lm needs a model with an LM head, not '{}'",
             to_string(layout_.head()));
  p.begin_pass(false);
  trunk_forward(p, tokens, B, T_len, for_backward);
  targets_.assign(targets, targets + N_);
  inv_temperature_ = inv_temperature;
  const int hu = layout_.head_unit(), eu = layout_.embedding_unit();
  const bool tied = layout_.config().tie_word_embeddings;
  const T* hp = p.acquire_params(hu);
  final_norm(hp);
  const T* w = acquire_lm_head(p, layout_, hp, static_cast<T*>(nullptr)).w;
  // With backward the (N, V) logits are kept (backward turns them into dlogits in place);
  // without, rows go through a bounded chunk buffer.
  const int64_t chunk =
      for_backward ? N_ : std::min<int64_t>(N_, std::max<int64_t>(1, (int64_t(1) << 24) / V_));
  grow(logits_, chunk * V_);
  T* ent = entropy ? entropy_.data() : nullptr;
  for (int64_t r0 = 0; r0 < N_; r0 += chunk) {
    const int64_t rows = std::min(chunk, N_ - r0);
    linear_forward_cpu(logits_.data(), lnf_.data() + r0 * C_, w, static_cast<const T*>(nullptr),
                       rows, C_, V_);
    logprob_forward_cpu(lp + r0, lse_.data() + r0, ent ? ent + r0 : nullptr, logits_.data(),
                        targets_.data() + r0, rows, V_, inv_temperature);
  }
  if (entropy) std::copy(entropy_.data(), entropy_.data() + N_, entropy);
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
  final_norm(hp);
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
                                    int64_t T_len, T* values, bool for_backward) {
  RLHF_CHECK(layout_.head() != HeadKind::kLM,
             "forward_scalar needs a model with a value or reward head");
  p.begin_pass(false);
  trunk_forward(p, tokens, B, T_len, for_backward);
  const int hu = layout_.head_unit();
  const T* hp = p.acquire_params(hu);
  final_norm(hp);
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
void Transformer<T>::layer_backward(const T* params, T* grads, int l, const T* x_in, LayerActs& a,
                                    T* dres) {
  const UnitLayout& u = layout_.unit(layout_.layer_unit(l));
  LayerParams<const T> w(u, params);
  LayerParams<T> g(u, grads);
  const int64_t N = N_, Q = H_ * D_, KV = Hkv_ * D_;
  const RopeStyle style = layout_.config().rope_style;
  // MLP: x_out = x_mid + down(h); dres is d x_out.
  linear_backward_cpu(dh_.data(), g.wd, static_cast<T*>(nullptr), dres, a.h, w.wd, N, F_, C_,
                      false);
  swiglu_backward_cpu(dgate_.data(), dup_.data(), dh_.data(), a.gate, a.up, N, F_);
  linear_backward_cpu(dln_.data(), g.wg, static_cast<T*>(nullptr), dgate_.data(), a.ln2, w.wg, N,
                      C_, F_, false);
  linear_backward_cpu(dln_.data(), g.wu, static_cast<T*>(nullptr), dup_.data(), a.ln2, w.wu, N, C_,
                      F_, true);
  rmsnorm_backward_cpu(dres, g.w_post, dln_.data(), a.x_mid, w.w_post, a.rstd2, N, C_);
  // Attention: x_mid = x_in + o_proj(atty); dres is now d x_mid.
  linear_backward_cpu(datty_.data(), g.wo, g.bo, dres, a.atty, w.wo, N, Q, C_, false);
  attention_backward_cpu(dq_.data(), dk_.data(), dv_.data(), datty_.data(), a.att, a.q, a.k, a.v,
                         B_, T_, H_, Hkv_, D_);
  rope_backward_cpu(dq_.data(), dq_.data(), pos_.data(), rope_cos_.data(), rope_sin_.data(), N, H_,
                    D_, style);
  rope_backward_cpu(dk_.data(), dk_.data(), pos_.data(), rope_cos_.data(), rope_sin_.data(), N,
                    Hkv_, D_, style);
  linear_backward_cpu(dln_.data(), g.wq, g.bq, dq_.data(), a.ln1, w.wq, N, C_, Q, false);
  linear_backward_cpu(dln_.data(), g.wk, g.bk, dk_.data(), a.ln1, w.wk, N, C_, KV, true);
  linear_backward_cpu(dln_.data(), g.wv, g.bv, dv_.data(), a.ln1, w.wv, N, C_, KV, true);
  rmsnorm_backward_cpu(dres, g.w_in, dln_.data(), x_in, w.w_in, a.rstd1, N, C_);
}

template <typename T>
void Transformer<T>::trunk_backward(UnitProvider<T>& p, T* dres) {
  const int64_t NC = N_ * C_;
  const int64_t lf = layer_floats();
  for (int l = static_cast<int>(L_) - 1; l >= 0; --l) {
    const int u = layout_.layer_unit(l);
    const T* params = p.acquire_params(u);
    T* grads = p.acquire_grads(u);
    LayerActs a;
    const T* x_in = res_.data() + l * NC;
    if (checkpointing_) {
      point_layer(a, layers_.data());
      // Recompute this layer's activations; its output equals the kept res_[l+1] bit for bit.
      layer_forward(params, l, x_in, res_.data() + (l + 1) * NC, a);
    } else {
      point_layer(a, layers_.data() + l * lf);
    }
    layer_backward(params, grads, l, x_in, a, dres);
    p.release_grads(u);
    p.release_params(u);
  }
  const int eu = layout_.embedding_unit();
  T* eg = p.acquire_grads(eu);
  embedding_backward_cpu(eg + layout_.unit(eu).at("embed_tokens.weight").offset, dres,
                         tokens_.data(), N_, C_, V_);
  p.release_grads(eu);
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace rlhf::model

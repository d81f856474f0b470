#ifdef RLHF_CUDA
#include "model/transformer_cuda.h"

#include <algorithm>
#include <mutex>

#include "core/error.h"
#include "core/log.h"
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

void TransformerCuda::check_ids(const int32_t* ids, int64_t N, int64_t V, bool allow_minus_one,
                                const char* what) {
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = ids[n];
    RLHF_CHECK((allow_minus_one && t == -1) || (t >= 0 && t < V),
               "TransformerCuda: {} {} at position {} is outside the vocabulary [0, {}){}\nhint: "
               "the tokenizer and the model config disagree on vocab_size, or the data holds ids "
               "from another tokenizer",
               what, t, n, V, allow_minus_one ? " and is not -1 (no target)" : "");
  }
}

namespace {

void download(float* host, const float* dev, int64_t n, cudaStream_t s) {
  CUDA_CHECK(cudaMemcpyAsync(host, dev, static_cast<size_t>(n) * sizeof(float),
                             cudaMemcpyDeviceToHost, s));
}

}  // namespace

void TransformerCuda::download_widened(float* host, const bf16* dev, int64_t n, cudaStream_t s) {
  std::vector<bf16> staged(static_cast<size_t>(n));
  CUDA_CHECK(
      cudaMemcpyAsync(staged.data(), dev, staged.size() * sizeof(bf16), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  for (int64_t i = 0; i < n; ++i) host[i] = __bfloat162float(staged[static_cast<size_t>(i)]);
}

TransformerCuda::TransformerCuda(const ParamLayout& layout, bool gradient_checkpointing,
                                 int64_t logit_chunk_bytes)
    : ModelLoop(layout, gradient_checkpointing), logit_chunk_bytes_(logit_chunk_bytes) {
  RLHF_CHECK(logit_chunk_bytes > 0, "TransformerCuda: logit_chunk_bytes must be > 0, got {}",
             logit_chunk_bytes);
  const ModelConfig& c = layout.config();
  const int64_t P = c.max_position_embeddings;
  rope_cos_.resize(P * D_ / 2, "RoPE cos table");
  rope_sin_.resize(P * D_ / 2, "RoPE sin table");
  rope_tables_upload_cuda(rope_cos_.get(), rope_sin_.get(), P, D_, rope_inv_freq(c).data());
  packable_ = L_ > 0 && !spec_.qk_norm;  // QK-norm sits between the projection and RoPE
  for (int64_t l = 0; l < L_; ++l)
    packable_ = packable_ && qkv_packed(layout_.unit(layout_.layer_unit(static_cast<int>(l))));
  fused_qkv_ = packable_;
}

void TransformerCuda::set_fused_qkv(bool on) {
  fused_qkv_ = on && packable_;
}

std::vector<ActInfo> TransformerCuda::act_table() const {
  // Training keeps QK-norm's inputs and the flash attention's (B, H, T) log-sum-exp.
  ActOptions o;
  o.backward = true;
  o.att_per_row = H_;
  return layer_act_table(spec_, o);
}

void TransformerCuda::point_layer(LayerActsCuda& a, int set) {
  const std::vector<ActInfo> t = act_table();
  const ActElems e = act_elems(t, N_);
  carve(a, t, N_, layers_.get() + set * e.values, layer_f32_.get() + set * e.stats);
}

namespace {

// Once per process: with --attn_implementation cudnn, say that packed rows run on the flash
// kernels (the cuDNN graphs are built per dense (B, T) shape, not per packing layout).
void note_packed_attention() {
  static std::once_flag once;
  if (attention_impl() == AttentionImpl::kCudnn)
    std::call_once(once, [] {
      LOG_INFO(
          "attention: packed rows (--packing_samples) run on the flash kernels, not cuDNN (its "
          "graphs here are built per dense batch shape, not per packing layout)");
    });
}

}  // namespace

LayerRunCuda TransformerCuda::layer_run(const LayerActsCuda& a, cudaStream_t s,
                                        const int32_t* pos) const {
  LayerRunCuda run;
  run.N = N_;
  run.pos = pos != nullptr ? pos : pos_.get();
  run.rope_cos = rope_cos_.get();
  run.rope_sin = rope_sin_.get();
  run.fused_qkv = fused_qkv_ && !lora_on_qkv();
  run.stream = s;
  float* lse = a.att;
  const int64_t B = B_, T = T_, H = H_, Hkv = Hkv_, D = D_;
  if (packed()) {  // block-diagonal over the samples, read from the positions
    const int32_t* p = run.pos;
    note_packed_attention();
    run.attention = [lse, p, B, T, H, Hkv, D](bf16* atty, const bf16* q, const bf16* k,
                                              const bf16* v, cudaStream_t st) {
      attention_forward_varlen_cuda(atty, lse, q, k, v, p, B * T, H, Hkv, D, st);
    };
    return run;
  }
  run.attention = [lse, B, T, H, Hkv, D](bf16* atty, const bf16* q, const bf16* k, const bf16* v,
                                         cudaStream_t st) {
    attention_forward_cuda(atty, lse, q, k, v, B, T, H, Hkv, D, st);
  };
  return run;
}

void TransformerCuda::reserve(int64_t B, int64_t T_len, bool for_backward, cudaStream_t s,
                              SeqLens seqs) {
  set_geometry(B, T_len, seqs);
  const int64_t N = N_, Q = H_ * D_, KV = Hkv_ * D_;
  const int64_t sets = layer_sets(for_backward);
  res_.resize(residual_slots(for_backward) * N * C_, "activations (residual stream)");
  const ActElems layer = act_elems(act_table(), N);
  layers_.resize(sets * layer.values, "activations (layers)");
  layer_f32_.resize(sets * layer.stats, "activations (layer statistics)");
  proj_.resize(N * C_, "activations (projection)");
  if (fused_qkv_) qkv_.resize(N * (Q + 2 * KV), "activations (packed q/k/v)");
  lnf_.resize(N * C_, "activations (final norm)");
  rstdf_.resize(N);
  lse_.resize(N);
  entropy_.resize(N);
  lp_.resize(N);
  tokens_.resize(N);
  targets_.resize(N);
  pos_.resize(N);
  pos_host_.resize(static_cast<size_t>(N));
  for (size_t i = 0; i + 1 < cu_.size(); ++i)  // positions restart at 0 per sample
    for (int32_t n = cu_[i]; n < cu_[i + 1]; ++n) pos_host_[size_t(n)] = n - cu_[i];
  // In stream order: kernels of the previous pass may still read the old ids and positions.
  CUDA_CHECK(cudaMemcpyAsync(pos_.get(), pos_host_.data(), static_cast<size_t>(N) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, s));
  if (for_backward) {
    dres_.resize(N * C_, "activation gradients");
    dlayer_.resize(act_elems(layer_grad_table(spec_), N, kGradAlign).values,
                   "activation gradients");
    dlnf_.resize(N * C_, "activation gradients");
    dlp_.resize(N);
    dentropy_.resize(N);
  }
}

int64_t TransformerCuda::activation_bytes() const {
  int64_t n = 0;
  for (const DeviceArray<bf16>* a : {&res_, &layers_, &proj_, &qkv_, &lnf_, &logits_, &values_,
                                     &sweep_res_, &sweep_values_, &dres_, &dlayer_, &dlnf_})
    n += a->bytes();
  for (const DeviceArray<int32_t>* a : {&sweep_tokens_, &sweep_targets_, &sweep_pos_})
    n += a->bytes();
  for (const DeviceArray<float>* a :
       {&layer_f32_, &rstdf_, &lse_, &entropy_, &lp_, &dlp_, &dentropy_, &sweep_lp_})
    n += a->bytes();
  return n;
}

void TransformerCuda::upload_ids(const int32_t* tokens, const int32_t* targets, cudaStream_t s) {
  check_ids(tokens, N_, V_, false, "token id");
  CUDA_CHECK(cudaMemcpyAsync(tokens_.get(), tokens, static_cast<size_t>(N_) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, s));
  if (targets != nullptr) {
    check_ids(targets, N_, V_, true, "target");
    CUDA_CHECK(cudaMemcpyAsync(targets_.get(), targets, static_cast<size_t>(N_) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, s));
  }
}

// ---------------------------------------------------------------------------------------------
// Forward

void TransformerCuda::lora_views(int l, LoraLayerView<bf16>& w, LoraLayerView<float>& g) const {
  const LoraConfig& cfg = lora_layout_->config();
  const double p_drop = lora_drop_pass_ > 0 ? cfg.dropout : 0.0;
  w.scale = bf16(1.0f);  // B is stored pre-scaled
  g.scale = float(cfg.scale());
  for (const ProjInfo& p : kProjections) {
    const LoraLayout::Entry& e = lora_layout_->entry(l, p.id);
    if (e.a < 0) continue;
    LoraProjView<bf16>& a = w.proj[size_t(static_cast<int>(p.id))];
    a.A = lora_params_ + e.a;
    a.B = lora_params_ + e.b;
    a.r = cfg.rank;
    a.dropout = p_drop;
    if (p_drop > 0) a.key = lora_dropout_key(cfg.seed, lora_drop_pass_, l, p.id);
    LoraProjView<float>& d = g.proj[size_t(static_cast<int>(p.id))];
    d.dA = lora_grads_ != nullptr ? lora_grads_ + e.a : nullptr;
    d.dB = lora_grads_ != nullptr ? lora_grads_ + e.b : nullptr;
    d.r = cfg.rank;
  }
}

bool TransformerCuda::lora_on_qkv() const {
  if (!lora_active()) return false;
  const auto& t = lora_layout_->config().targets;
  return t[size_t(Proj::kQ)] || t[size_t(Proj::kK)] || t[size_t(Proj::kV)];
}

void TransformerCuda::set_lora_dropout_pass(const int32_t* tokens_host, bool for_backward) {
  // LoRA dropout acts in training passes only (PEFT's nn.Dropout in train mode); the id is the
  // CPU's (Transformer::trunk_forward): a hash of the fp32 adapters and the tokens.
  lora_drop_pass_ = 0;
  if (for_backward && lora_active() && lora_layout_->config().dropout > 0)
    lora_drop_pass_ = lora_dropout_pass(lora_host_, size_t(lora_layout_->numel()) * sizeof(float),
                                        tokens_host, N_);
}

void TransformerCuda::layer_forward(const bf16* params, int l, const bf16* x_in, bf16* x_out,
                                    LayerActsCuda& a, const int32_t* pos) {
  LayerParams<const bf16> w(layout_.unit(layout_.layer_unit(l)), params);
  LoraLayerView<bf16> lw;
  LoraLayerView<float> lg;
  if (lora_active()) {
    lora_views(l, lw, lg);
    w.lora = &lw;
  }
  LayerScratchCuda scratch{proj_.get(), fused_qkv_ ? qkv_.get() : nullptr};
  decoder_layer_forward_cuda(x_out, a, scratch, x_in, w, spec_, layer_run(a, stream_, pos));
}

void TransformerCuda::copy_rows(bf16* dst, const bf16* src, int64_t n) const {
  CUDA_CHECK(
      cudaMemcpyAsync(dst, src, size_t(n) * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
}

void TransformerCuda::trunk_forward(UnitProviderCuda& p, bool for_backward) {
  stream_ = p.stream();
  const int eu = layout_.embedding_unit();
  const bf16* emb = p.acquire_params(eu);
  embedding_forward_cuda(res_.get(), tokens_.get(),
                         emb + layout_.unit(eu).at("embed_tokens.weight").offset, N_, C_, V_,
                         stream_);
  p.release_params(eu);
  forward_layers(p, for_backward);
}

void TransformerCuda::final_norm(const bf16* head_params, const bf16* x, cudaStream_t s) {
  const UnitLayout& hu = layout_.unit(layout_.head_unit());
  rmsnorm_forward_cuda(lnf_.get(), rstdf_.get(), x, head_params + hu.at("model.norm.weight").offset,
                       N_, C_, layout_.config().rms_norm_eps, s);
}

int64_t TransformerCuda::logit_chunk_rows() const {
  const int64_t rows = logit_chunk_bytes_ / (V_ * static_cast<int64_t>(sizeof(bf16)));
  return std::clamp<int64_t>(rows, 1, N_);
}

void TransformerCuda::forward_lm(UnitProviderCuda& p, const int32_t* tokens, const int32_t* targets,
                                 int64_t B, int64_t T_len, float* lp, float* entropy,
                                 bool for_backward, float inv_temperature, SeqLens seqs) {
  check_head(true, "forward_lm");
  const cudaStream_t s = p.stream();
  reserve(B, T_len, for_backward, s, seqs);
  upload_ids(tokens, targets, s);
  set_lora_dropout_pass(tokens, for_backward);
  p.begin_pass(false);
  trunk_forward(p, for_backward);
  inv_temperature_ = inv_temperature;
  head_forward(p, for_backward, [&](const bf16* hp, const bf16* w) {
    final_norm(hp, x_last(), s);
    const int64_t chunk = logit_chunk_rows();
    logits_.resize(chunk * V_, "logits");
    // With one chunk the logits stay for backward (which turns them into dlogits in place).
    logits_kept_ = for_backward && chunk == N_;
    for (int64_t r0 = 0; r0 < N_; r0 += chunk) {
      const int64_t rows = std::min(chunk, N_ - r0);
      linear_forward_cuda(logits_.get(), lnf_.get() + r0 * C_, w, nullptr, rows, C_, V_, s);
      logprob_forward_cuda(lp_.get() + r0, lse_.get() + r0, entropy_.get() + r0, logits_.get(),
                           targets_.get() + r0, rows, V_, inv_temperature, s);
    }
  });
  download(lp, lp_.get(), N_, s);
  if (entropy != nullptr) download(entropy, entropy_.get(), N_, s);
  CUDA_CHECK(cudaStreamSynchronize(s));
  entropy_valid_ = true;
}

void TransformerCuda::forward_logits(UnitProviderCuda& p, const int32_t* tokens, int64_t B,
                                     int64_t T_len, float* logits) {
  check_head(true, "forward_logits");
  const cudaStream_t s = p.stream();
  reserve(B, T_len, false, s);
  upload_ids(tokens, nullptr, s);
  set_lora_dropout_pass(tokens, false);
  p.begin_pass(false);
  trunk_forward(p, false);
  head_forward(p, false, [&](const bf16* hp, const bf16* w) {
    final_norm(hp, x_last(), s);
    const int64_t chunk = logit_chunk_rows();
    logits_.resize(chunk * V_, "logits");
    std::vector<bf16> host(static_cast<size_t>(chunk * V_));
    for (int64_t r0 = 0; r0 < N_; r0 += chunk) {
      const int64_t rows = std::min(chunk, N_ - r0);
      linear_forward_cuda(logits_.get(), lnf_.get() + r0 * C_, w, nullptr, rows, C_, V_, s);
      CUDA_CHECK(cudaMemcpyAsync(host.data(), logits_.get(),
                                 static_cast<size_t>(rows * V_) * sizeof(bf16),
                                 cudaMemcpyDeviceToHost, s));
      CUDA_CHECK(cudaStreamSynchronize(s));
      for (int64_t i = 0; i < rows * V_; ++i)
        logits[r0 * V_ + i] = __bfloat162float(host[static_cast<size_t>(i)]);
    }
  });
}

void TransformerCuda::forward_scalar(UnitProviderCuda& p, const int32_t* tokens, int64_t B,
                                     int64_t T_len, float* values, bool for_backward,
                                     SeqLens seqs) {
  check_head(false, "forward_scalar");
  const cudaStream_t s = p.stream();
  reserve(B, T_len, for_backward, s, seqs);
  upload_ids(tokens, nullptr, s);
  set_lora_dropout_pass(tokens, for_backward);
  p.begin_pass(false);
  trunk_forward(p, for_backward);
  head_forward(p, for_backward, [&](const bf16* hp, const bf16* score) {
    final_norm(hp, x_last(), s);
    values_.resize(N_, "values");
    linear_forward_cuda(values_.get(), lnf_.get(), score, nullptr, N_, C_, 1, s);
  });
  download_widened(values, values_.get(), N_, s);
}

// ---------------------------------------------------------------------------------------------
// Backward

void TransformerCuda::final_norm_backward(const bf16* head_params, float* head_grads) {
  // dlnf_ holds d loss / d RMSNorm(x_L); the residual gradient starts here.
  const cudaStream_t s = stream_;
  const int64_t norm_off = layout_.unit(layout_.head_unit()).at("model.norm.weight").offset;
  CUDA_CHECK(cudaMemsetAsync(dres_.get(), 0, static_cast<size_t>(N_ * C_) * sizeof(bf16), s));
  rmsnorm_backward_cuda(dres_.get(), head_grads != nullptr ? head_grads + norm_off : nullptr,
                        dlnf_.get(), x_last(), head_params + norm_off, rstdf_.get(), N_, C_, s);
}

void TransformerCuda::backward_lm(UnitProviderCuda& p, const float* dlp, const float* dentropy) {
  check_backward(true, dentropy != nullptr);
  const cudaStream_t s = p.stream();
  stream_ = s;
  CUDA_CHECK(cudaMemcpyAsync(dlp_.get(), dlp, static_cast<size_t>(N_) * sizeof(float),
                             cudaMemcpyHostToDevice, s));
  if (dentropy != nullptr)
    CUDA_CHECK(cudaMemcpyAsync(dentropy_.get(), dentropy, static_cast<size_t>(N_) * sizeof(float),
                               cudaMemcpyHostToDevice, s));
  head_backward(p, [&](const bf16*, const bf16* w, float* dw) {
    const int64_t chunk = logit_chunk_rows();
    for (int64_t r0 = 0; r0 < N_; r0 += chunk) {
      const int64_t rows = std::min(chunk, N_ - r0);
      if (!logits_kept_)
        linear_forward_cuda(logits_.get(), lnf_.get() + r0 * C_, w, nullptr, rows, C_, V_, s);
      logprob_backward_cuda(logits_.get(), dlp_.get() + r0,
                            dentropy != nullptr ? dentropy_.get() + r0 : nullptr, logits_.get(),
                            lse_.get() + r0, entropy_.get() + r0, targets_.get() + r0, rows, V_,
                            inv_temperature_, s);
      linear_backward_cuda(dlnf_.get() + r0 * C_, dw, nullptr, logits_.get(), lnf_.get() + r0 * C_,
                           w, rows, C_, V_, false, s);
    }
    logits_kept_ = false;  // turned into dlogits
  });
  CUDA_CHECK(cudaStreamSynchronize(s));
}

void TransformerCuda::backward_scalar(UnitProviderCuda& p, const float* dvalues) {
  check_backward(false, false);
  const cudaStream_t s = p.stream();
  stream_ = s;
  std::vector<bf16> host(static_cast<size_t>(N_));
  for (int64_t i = 0; i < N_; ++i) host[static_cast<size_t>(i)] = __float2bfloat16_rn(dvalues[i]);
  CUDA_CHECK(cudaMemcpyAsync(values_.get(), host.data(), host.size() * sizeof(bf16),
                             cudaMemcpyHostToDevice, s));
  head_backward(p, [&](const bf16*, const bf16* score, float* dscore) {
    linear_backward_cuda(dlnf_.get(), dscore, nullptr, values_.get(), lnf_.get(), score, N_, C_, 1,
                         false, s);
    CUDA_CHECK(cudaStreamSynchronize(s));  // `host` is read by the copy above
  });
  CUDA_CHECK(cudaStreamSynchronize(s));
}

void TransformerCuda::layer_backward(const bf16* params, float* grads, int l, const bf16* x_in,
                                     LayerActsCuda& a, bf16* dres) {
  const cudaStream_t s = stream_;
  const UnitLayout& u = layout_.unit(layout_.layer_unit(l));
  LayerParams<const bf16> w(u, params);
  // A frozen base (LoRA) hands out no gradient buffer: every base gradient is skipped.
  LayerParams<float> g = grads != nullptr ? LayerParams<float>(u, grads) : LayerParams<float>();
  LoraLayerView<bf16> lw;
  LoraLayerView<float> lg;
  if (lora_active()) {
    lora_views(l, lw, lg);
    w.lora = &lw;
    g.lora = &lg;
  }
  LayerGradScratchCuda d;
  carve(d, layer_grad_table(spec_), N_, dlayer_.get(), static_cast<bf16*>(nullptr), kGradAlign);
  LayerScratchCuda scratch{proj_.get(), fused_qkv_ ? qkv_.get() : nullptr};
  const LayerActsCuda& acts = a;
  const float* lse = a.att;
  const int64_t B = B_, T = T_, H = H_, Hkv = Hkv_, D = D_;
  const int32_t* pos = packed() ? pos_.get() : nullptr;
  auto attention = [&acts, lse, pos, B, T, H, Hkv, D](bf16* dq, bf16* dk, bf16* dv,
                                                      const bf16* datty, cudaStream_t st) {
    if (pos != nullptr)
      attention_backward_varlen_cuda(dq, dk, dv, datty, acts.atty, lse, acts.q, acts.k, acts.v, pos,
                                     B * T, H, Hkv, D, st);
    else
      attention_backward_cuda(dq, dk, dv, datty, acts.atty, lse, acts.q, acts.k, acts.v, B, T, H,
                              Hkv, D, st);
  };
  decoder_layer_backward_cuda(dres, g, d, scratch, acts, x_in, w, spec_, layer_run(a, s),
                              attention);
}

void TransformerCuda::trunk_backward(UnitProviderCuda& p) {
  stream_ = p.stream();
  backward_layers(p, dres_.get());
  bf16* dres = dres_.get();
  const int eu = layout_.embedding_unit();
  float* eg = p.acquire_grads(eu);
  if (eg != nullptr)
    embedding_backward_cuda(eg + layout_.unit(eu).at("embed_tokens.weight").offset, dres,
                            tokens_.get(), N_, C_, V_, stream_);
  p.release_grads(eu);
}

}  // namespace rlhf::model
#endif  // RLHF_CUDA

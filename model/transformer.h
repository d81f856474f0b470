// The Llama-family decoder, composed from the ops: forward that keeps what backward needs,
// backward, optional per-layer activation recomputation, LM and scalar heads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/arch.h"
#include "model/decoder_layer.h"
#include "model/forward_batch.h"
#include "model/layer_bf16.h"
#include "model/layout.h"
#include "model/lora.h"
#include "model/model_loop.h"
#include "model/provider.h"

namespace rlhf::model {

/// Forward/backward of the whole model for a batch of B right-padded sequences of length T
/// (N = B·T tokens; position of token t is t). Parameters come from a UnitProvider, one unit at a
/// time, so the same code runs on full local buffers and on ZeRO-3 shards.
///
/// Each layer is decoder_layer_forward_cpu / decoder_layer_backward_cpu (model/decoder_layer.h)
/// with causal attention over the B sequences.
/// Heads: LM  — lp[n] = log softmax(RMSNorm(x)·Wlmᵀ / temperature)[target[n]] (+ entropy);
///        scalar — value[n] = RMSNorm(x)·scoreᵀ (critic values; a reward model reads the last one).
///
/// T is float (training) or double (gradient checks). Not thread-safe: one instance per stream.
template <typename T>
class Transformer : public ModelLoop<Transformer<T>, T, LayerActs<T>> {
  using Base = ModelLoop<Transformer<T>, T, LayerActs<T>>;
  friend Base;

 public:
  /// gradient_checkpointing: keep only each layer's input and recompute the layer in backward.
  Transformer(const ParamLayout& layout, bool gradient_checkpointing = false);

  /// The compute precision of every later pass: false (the default) = T everywhere; true (T =
  /// float only) = the bf16 mode of model/layer_bf16.h for every GEMM — the decoder layers'
  /// projections and the LM or scalar head (logits and values stay fp32, unrounded) — with fp32
  /// parameters and gradients. Every weight is read as its bf16 value (the GEMM weights, and the
  /// norm weights, biases and embedding rows too), as the GPU model and the bf16 engines read
  /// theirs; so any provider — local buffers, or ZeRO-3 gathering fp32 or bf16 shards — gives the
  /// same results. Throws rlhf::Error for T = double or a build without oneDNN.
  void set_bf16(bool on);
  bool bf16() const { return bf16_; }
  /// Weight elements converted to bf16 by the bf16 mode since construction: 0 when every weight
  /// came from the provider's bf16 twins (a bf16-gathering ZeRO-3 store, model/bf16_twin.h).
  int64_t bf16_converted_elements() const {
    return bf16_layer_.converted() + bf16_head_.converted();
  }

  /// LM forward. tokens, targets: (B, T) int32 (target −1 = no loss at that position, lp = 0).
  /// lp: (B, T) out; entropy: (B, T) out or nullptr. inv_temperature scales the logits before the
  /// softmax (OpenRLHF divides by --temperature). With for_backward, activations are kept for
  /// backward_lm; without, only one layer's scratch is used. seqs: sample packing (SeqLens,
  /// model/forward_batch.h): the B·T tokens hold seqs.n samples, each attending to itself only,
  /// positions restarting per sample (the backward uses the same). Throws rlhf::Error on a token
  /// or target outside the vocabulary, a sequence (sample) longer than max_position_embeddings,
  /// or bad seqs.
  void forward_lm(UnitProvider<T>& p, const int32_t* tokens, const int32_t* targets, int64_t B,
                  int64_t T_, T* lp, T* entropy, bool for_backward, T inv_temperature = T(1),
                  SeqLens seqs = {});

  /// Inference forward returning the raw logits: logits (B, T, V) out. For tests and references
  /// (the training path never materialises more than it needs).
  void forward_logits(UnitProvider<T>& p, const int32_t* tokens, int64_t B, int64_t T_, T* logits);

  /// LM backward for the last forward_lm(for_backward = true): dlp (B, T), dentropy (B, T) or
  /// nullptr. Parameter gradients accumulate (+=) into the provider's grad buffers.
  void backward_lm(UnitProvider<T>& p, const T* dlp, const T* dentropy);

  /// Scalar-head forward: values (B, T) out (one scalar per position); seqs as forward_lm.
  void forward_scalar(UnitProvider<T>& p, const int32_t* tokens, int64_t B, int64_t T_, T* values,
                      bool for_backward, SeqLens seqs = {});

  /// Scalar-head backward for the last forward_scalar(for_backward = true); dvalues (B, T).
  void backward_scalar(UnitProvider<T>& p, const T* dvalues);

  /// Forward-only LM passes over several micro-batches, unit-major: each unit is acquired once
  /// and applied to every batch before the next (one ZeRO-3 gather per unit for the whole list
  /// instead of one per micro-batch). Each batch's lp is bit-identical to forward_lm(for_backward =
  /// false) on that batch alone: the same kernels run on the same shapes. Holds every batch's
  /// residual stream at once (Σ B·seq_len·hidden_size elements; sweep_residual_bytes). Ends any
  /// backward state. Throws what forward_lm throws.
  void forward_lm_sweep(UnitProvider<T>& p, const std::vector<ForwardBatch<T>>& batches,
                        T inv_temperature = T(1));

  /// forward_lm_sweep for the scalar head: out = values (B, seq_len), bit-identical to
  /// forward_scalar(for_backward = false) on each batch.
  void forward_scalar_sweep(UnitProvider<T>& p, const std::vector<ForwardBatch<T>>& batches);

  /// Bytes a sweep holds for its residual streams per token (hidden_size elements of T).
  int64_t sweep_residual_bytes_per_token() const { return C_ * int64_t(sizeof(T)); }

  /// Bytes of activation memory currently allocated (for the memory report).
  int64_t activation_bytes() const;

  /// Runs every layer with LoRA adapters (model/lora.h): params is the flat adapter buffer
  /// (layout->numel() elements), grads its gradient buffer (accumulated += by backward; nullptr:
  /// none). The pointers must stay valid while the adapters are set; layout nullptr removes them.
  /// The base weights' gradients are whatever the provider's acquire_grads returns: nullptr (a
  /// frozen base, the LoRA case) skips every base gradient.
  void set_lora(const LoraLayout* layout, const T* params, T* grads) {
    lora_layout_ = layout;
    lora_params_ = params;
    lora_grads_ = grads;
  }
  /// Switches the adapters off (false: the passes run the base weights alone — the reference
  /// policy) or back on. No effect without set_lora.
  void set_lora_enabled(bool on) { lora_on_ = on; }
  bool lora_active() const { return lora_layout_ != nullptr && lora_on_; }
  /// The score head the scalar passes use, given the head unit's parameters hp: the trained copy
  /// among the adapters when the adapters are on and carry one (LoraConfig::save_score, PEFT's
  /// modules_to_save), else the base's "score.weight".
  const T* score_weight(const T* hp) const {
    if (lora_active() && lora_layout_->score_offset() >= 0)
      return lora_params_ + lora_layout_->score_offset();
    return hp + layout_.unit(layout_.head_unit()).at("score.weight").offset;
  }
  /// Where the score head's gradient goes (+=), given the head unit's gradients hg (nullptr for a
  /// frozen base): the adapters' gradient buffer for a trained copy, else hg's "score.weight";
  /// nullptr: none.
  T* score_grad(T* hg) const {
    if (lora_active() && lora_layout_->score_offset() >= 0)
      return lora_grads_ != nullptr ? lora_grads_ + lora_layout_->score_offset() : nullptr;
    return hg != nullptr ? hg + layout_.unit(layout_.head_unit()).at("score.weight").offset
                         : nullptr;
  }

 private:
  // Each backward scratch buffer starts on a multiple of this many elements (256 bytes of float).
  static constexpr int64_t kGradAlign = 64;
  void reserve(int64_t B, int64_t T_, bool for_backward, SeqLens seqs = {});
  // One layer's saved forward (model/activations.h): the routine's activations and, as att, the
  // attention probabilities (B, H, T, T) that attention_backward_cpu needs.
  std::vector<ActInfo> act_table() const;
  // ModelLoop's steps (model/model_loop.h).
  T* residual(int slot) { return res_.data() + slot * N_ * C_; }
  void point_layer(LayerActs<T>& a, int set);
  void copy_rows(T* dst, const T* src, int64_t n) const { std::copy(src, src + n, dst); }
  int64_t layer_floats() const;
  // pos: the (N) positions of the layer's tokens (nullptr = pos_).
  LayerRun<T> layer_run(LayerActs<T>& a, const int32_t* pos = nullptr) const;
  void embed(UnitProvider<T>& p, const int32_t* tokens);
  void layer_forward(const T* params, int l, const T* x_in, T* x_out, LayerActs<T>& a,
                     const int32_t* pos);
  void layer_backward(const T* params, T* grads, int l, const T* x_in, LayerActs<T>& a, T* dres);
  void trunk_forward(UnitProvider<T>& p, const int32_t* tokens, int64_t B, int64_t T_,
                     bool for_backward, SeqLens seqs = {});
  // ModelLoop's head steps: the decoder layers' and the embedding's backward from dres_, and the
  // final norm's backward from dlnf_ into dres_ (head_grads: nullptr = frozen).
  void trunk_backward(UnitProvider<T>& p);
  void final_norm_backward(const T* head_params, T* head_grads);
  // bf16 mode reads every weight as its bf16 value, as the GPU (whose stores hold bf16 only) and
  // the bf16 engines do: the GEMM weights through the bf16 caches, the rest through these. T =
  // float in bf16 mode only; otherwise they change nothing.
  //  - w's biases and norm weights (the layer's tensors without weight decay) redirected to
  //    bf16-rounded copies in bf16_small_ (adjacent ones, e.g. packed q/k/v biases, stay so);
  void bf16_layer_small(LayerParams<const T>& w, const T* params, const UnitLayout& u);
  //  - the final norm's weight (C): head_params' own, or a bf16-rounded copy;
  const T* final_norm_weight(const T* head_params);
  //  - n embedding outputs rounded in place (= a lookup in the rounded table).
  void bf16_round(T* x, int64_t n);
  void final_norm(const T* head_params, const T* x);
  void lm_logprobs(const T* w, T* lp, T* entropy, bool keep_logits);
  std::vector<int64_t> sweep_trunk(UnitProvider<T>& p, const std::vector<ForwardBatch<T>>& batches);
  // A new pass: the bf16 copies are converted again (the weights may have changed).
  // p: the pass's provider, whose bf16 twins (model/bf16_twin.h) the caches use when it has them.
  void bf16_next_pass(UnitProvider<T>* p = nullptr);
  // y (rows, OC) = x (rows, IC) · wᵀ, the heads' GEMM (no bias): T, or bf16 operands with fp32
  // accumulation and an unrounded fp32 y when bf16_ (w's bf16 copy cached per pass under key).
  void head_linear(T* y, const T* x, const T* w, int64_t rows, int64_t IC, int64_t OC, int key);
  // Its backward: dx (rows, IC) = dy · w (assigned; rounded to bf16 when bf16_), dw += dyᵀ · x
  // (skipped when nullptr). dy16: dy already in bf16 when bf16_ (then dy is not read), else
  // nullptr (dy rounded here).
  void head_linear_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t rows,
                            int64_t IC, int64_t OC, int key, const bfloat16* dy16 = nullptr);

  using Base::B_, Base::C_, Base::D_, Base::F_, Base::H_, Base::Hkv_, Base::L_, Base::N_, Base::T_,
      Base::V_, Base::checkpointing_, Base::cu_, Base::entropy_valid_, Base::have_backward_state_,
      Base::kept_, Base::last_head_, Base::layout_, Base::max_seg_, Base::spec_;
  using Base::backward_layers, Base::check_backward, Base::check_head, Base::forward_layers,
      Base::head_backward, Base::head_forward, Base::layer_sets, Base::residual_slots,
      Base::idle_sweep, Base::set_geometry, Base::sweep_geometry, Base::sweep_layers, Base::x_last;
  std::vector<T> rope_cos_, rope_sin_;  // (max_pos, D/2)
  std::vector<int32_t> tokens_, targets_, pos_;
  T inv_temperature_ = T(1);
  const LoraLayout* lora_layout_ = nullptr;
  const T* lora_params_ = nullptr;
  T* lora_grads_ = nullptr;
  bool lora_on_ = true;
  // The dropout id of the current training pass (lora_dropout_pass; 0: no dropout), set by
  // trunk_forward and kept for the recompute and backward of that pass.
  uint64_t lora_drop_pass_ = 0;

  // Activation storage, sized by reserve(): residual stream (L+1, N, C), per-layer activations
  // (L or 1 sets), final norm, head output.
  std::vector<T> res_;     // (L+1, N, C)
  std::vector<T> layers_;  // (n_sets, layer_floats)
  std::vector<T> lnf_, rstdf_, logits_, lse_, entropy_;
  std::vector<T> sweep_res_;        // a sweep's residual streams, batch after batch (Σ N_b, C)
  std::vector<int32_t> sweep_pos_;  // and its tokens' positions (Σ N_b)
  // Backward scratch: the residual gradient, one layer's activation gradients (carved by
  // layer_grad_table), the final norm's output gradient.
  std::vector<T> dres_, dlayer_, dlnf_;
  // bf16 mode (set_bf16): the copy of the layer unit being run and of the head's weight, and the
  // view layer_run hands the decoder layer.
  bool bf16_ = false;
  // This pass's attention takes bf16 products (model/ops/attention_bf16.h): bf16_ and
  // cpu_attention_bf16() when the pass began (reserve).
  bool attn_bf16_ = false;
  Bf16UnitCache bf16_layer_, bf16_head_;
  LayerBf16 bf16_view_;
  std::vector<T> bf16_small_, bf16_norm_;  // bf16_layer_small / final_norm_weight copies
};

}  // namespace rlhf::model

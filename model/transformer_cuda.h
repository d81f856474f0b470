// TransformerCuda: the Llama-family decoder of model/transformer.h on the GPU, composed from the
// CUDA ops (model/ops/cuda/): bf16 activations and weights, fp32 statistics and fp32 parameter
// gradients (the ZeRO master gradient precision), every kernel on the provider's stream.
#pragma once

#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/device_memory.h"
#include "model/decoder_layer.h"
#include "model/forward_batch.h"
#include "model/layout.h"
#include "model/lora.h"
#include "model/model_loop.h"
#include "model/provider_cuda.h"

namespace rlhf::model {

/// Forward/backward of the whole model on the GPU for B right-padded sequences of length T
/// (N = B·T tokens, position of token t is t), with the same equations, head semantics and
/// contracts as Transformer<float> (model/transformer.h); the differences are numerical:
///  - activations (residual stream, norms, projections, attention output, MLP) are bf16, each
///    op computes in fp32 and rounds its output once; statistics (rstd, attention lse, logit lse,
///    lp, entropy) and parameter gradients are fp32; activation gradients are bf16;
///  - attention is flash-style (model/ops/attention.h, CUDA section): the (T, T) probabilities
///    are never stored, backward recomputes them from the saved lse;
///  - the LM head goes over the vocabulary in row chunks of at most kLogitChunkBytes of bf16
///    logits, so logits never exist in fp32, and exist at full (N, V) size only when that fits in
///    one chunk; otherwise backward recomputes each chunk's logits (one more head GEMM);
///  - the post-attention residual add is fused into the following RMSNorm
///    (rmsnorm_residual_forward_cuda);
///  - when the layout packs q/k/v (qkv_packed, model/layer_params.h) and the architecture has no
///    QK-norm, the three projections are one GEMM into a packed (N, q + 2·kv) buffer whose split
///    applies RoPE (qkv_rope_split_cuda); backward packs dq, dk, dv with the inverse rotation
///    (qkv_rope_merge_backward_cuda) for one input-gradient GEMM and one weight-gradient GEMM.
/// Each layer is decoder_layer_forward_cuda / decoder_layer_backward_cuda (model/decoder_layer.h)
/// with the causal flash attention over the B sequences.
/// Inputs and outputs of the public methods are host arrays (tokens, targets, lp, entropy,
/// values, their gradients): they are B·T elements, small next to the model, and the trainer's
/// losses are computed on the host. Each public method synchronises the provider's stream before
/// returning its host outputs. Not thread-safe: one instance per stream.
class TransformerCuda : public ModelLoop<TransformerCuda, bf16, LayerActsCuda> {
  friend ModelLoop<TransformerCuda, bf16, LayerActsCuda>;

 public:
  /// Bytes of bf16 logits one LM-head chunk may hold (256 MiB).
  static constexpr int64_t kLogitChunkBytes = int64_t{256} << 20;

  /// gradient_checkpointing: keep only each layer's input and recompute the layer in backward.
  /// logit_chunk_bytes: the LM-head chunk budget (tests make it small to exercise the chunked
  /// path). Uploads the RoPE tables (max_position_embeddings × D/2 fp32, twice) to the current
  /// device.
  TransformerCuda(const ParamLayout& layout, bool gradient_checkpointing = false,
                  int64_t logit_chunk_bytes = kLogitChunkBytes);

  /// LM forward, contract of Transformer::forward_lm: tokens, targets (B, T) int32 host (target
  /// −1: no loss, lp = 0); lp (B, T) fp32 host out; entropy (B, T) host out or nullptr.
  /// seqs: sample packing (SeqLens), attention by attention_forward_varlen_cuda. Throws
  /// rlhf::Error on a token or target outside the vocabulary, a sequence (sample) longer than
  /// max_position_embeddings, bad seqs, or a CUDA failure.
  void forward_lm(UnitProviderCuda& p, const int32_t* tokens, const int32_t* targets, int64_t B,
                  int64_t T_, float* lp, float* entropy, bool for_backward,
                  float inv_temperature = 1.0f, SeqLens seqs = {});

  /// Raw logits (B, T, V) fp32 host out (widened from bf16), for tests and references.
  void forward_logits(UnitProviderCuda& p, const int32_t* tokens, int64_t B, int64_t T_,
                      float* logits);

  /// LM backward for the last forward_lm(for_backward = true): dlp, dentropy (B, T) fp32 host
  /// (dentropy may be nullptr). Parameter gradients accumulate (+=) into the provider's buffers.
  void backward_lm(UnitProviderCuda& p, const float* dlp, const float* dentropy);

  /// Scalar-head forward: values (B, T) fp32 host out (bf16 head output, widened); seqs as
  /// forward_lm.
  void forward_scalar(UnitProviderCuda& p, const int32_t* tokens, int64_t B, int64_t T_,
                      float* values, bool for_backward, SeqLens seqs = {});

  /// Scalar-head backward for the last forward_scalar(for_backward = true); dvalues (B, T) fp32
  /// host (rounded to bf16 on the device).
  void backward_scalar(UnitProviderCuda& p, const float* dvalues);

  /// Forward-only LM passes over several micro-batches, unit-major (contract of
  /// Transformer::forward_lm_sweep): each unit acquired once for all of them; each batch's lp
  /// (B, seq_len) fp32 host out, bit-identical to forward_lm(for_backward = false) on that batch.
  /// Holds every batch's residual stream on the device (Σ B·seq_len·hidden_size bf16), its ids,
  /// positions and outputs; synchronises the stream once, at the end.
  void forward_lm_sweep(UnitProviderCuda& p, const std::vector<ForwardBatch<float>>& batches,
                        float inv_temperature = 1.0f);

  /// forward_lm_sweep for the scalar head: each batch's values (B, seq_len) fp32 host out,
  /// bit-identical to forward_scalar(for_backward = false).
  void forward_scalar_sweep(UnitProviderCuda& p, const std::vector<ForwardBatch<float>>& batches);

  /// Bytes a sweep holds for its residual streams per token (hidden_size bf16).
  int64_t sweep_residual_bytes_per_token() const { return C_ * int64_t(sizeof(bf16)); }

  /// Bytes of device memory the activations and scratch currently hold.
  int64_t activation_bytes() const;

  /// Whether the packed q/k/v path is in use (true when every layer is qkv_packed, unless
  /// set_fused_qkv(false) turned it off: tests compare the two paths).
  bool fused_qkv() const { return fused_qkv_; }
  void set_fused_qkv(bool on);

  /// Runs every layer with LoRA adapters (model/lora.h, the GPU branch of model/lora_cuda.h):
  /// `params` is the device copy of the flat adapter buffer (layout->numel() bf16) with every B
  /// stored pre-scaled as (α/r)·B and every A (and the score head's trained copy) as they are;
  /// `grads` the fp32 device gradient buffer (same layout, accumulated += by backward; nullptr:
  /// none); `host` the fp32 adapters on the host (the CPU's dropout pass id hashes them, so both
  /// backends drop the same inputs). The pointers must stay valid while set; layout nullptr
  /// removes the adapters. The base weights' gradients are whatever the provider's acquire_grads
  /// returns: nullptr (a frozen base) skips every base gradient. With adapters on q/k/v the
  /// packed q/k/v GEMM is not used (each projection has its own branch).
  void set_lora(const LoraLayout* layout, const float* host, const bf16* params, float* grads) {
    lora_layout_ = layout;
    lora_host_ = host;
    lora_params_ = params;
    lora_grads_ = grads;
  }
  /// Switches the adapters off (the base alone: the reference policy) or back on.
  void set_lora_enabled(bool on) { lora_on_ = on; }
  bool lora_active() const { return lora_layout_ != nullptr && lora_on_; }
  /// The score head the scalar passes use (the adapters' trained copy with LoraConfig::save_score
  /// when they are on, else the head unit's "score.weight"), given the head unit's parameters.
  const bf16* score_weight(const bf16* hp) const {
    if (lora_active() && lora_layout_->score_offset() >= 0)
      return lora_params_ + lora_layout_->score_offset();
    return hp + layout_.unit(layout_.head_unit()).at("score.weight").offset;
  }
  /// Where the score head's gradient goes (+=): the adapters' gradient buffer for a trained copy,
  /// else the head unit's gradients hg (nullptr for a frozen base); nullptr: none.
  float* score_grad(float* hg) const {
    if (lora_active() && lora_layout_->score_offset() >= 0)
      return lora_grads_ != nullptr ? lora_grads_ + lora_layout_->score_offset() : nullptr;
    return hg != nullptr ? hg + layout_.unit(layout_.head_unit()).at("score.weight").offset
                         : nullptr;
  }

 private:
  // Each backward scratch buffer starts on a multiple of this many elements (256 bytes of bf16,
  // cudaMalloc's alignment).
  static constexpr int64_t kGradAlign = 128;
  // Throws rlhf::Error naming the first id outside [0, V) (−1 allowed with allow_minus_one).
  static void check_ids(const int32_t* ids, int64_t N, int64_t V, bool allow_minus_one,
                        const char* what);
  void reserve(int64_t B, int64_t T_, bool for_backward, cudaStream_t s, SeqLens seqs = {});
  // One layer's saved forward (model/activations.h): the routine's activations and, as att, the
  // attention lse (B, H, T) the flash backward needs; bf16 values in layers_, fp32 statistics in
  // layer_f32_.
  std::vector<ActInfo> act_table() const;
  // ModelLoop's steps (model/model_loop.h); the kernels go on stream_, the pass's stream.
  bf16* residual(int slot) { return res_.get() + slot * N_ * C_; }
  void point_layer(LayerActsCuda& a, int set);
  void copy_rows(bf16* dst, const bf16* src, int64_t n) const;
  // pos: the (N) device positions of the layer's tokens (nullptr = pos_).
  LayerRunCuda layer_run(const LayerActsCuda& a, cudaStream_t s,
                         const int32_t* pos = nullptr) const;
  void upload_ids(const int32_t* tokens, const int32_t* targets, cudaStream_t s);
  void trunk_forward(UnitProviderCuda& p, bool for_backward);
  void layer_forward(const bf16* params, int l, const bf16* x_in, bf16* x_out, LayerActsCuda& a,
                     const int32_t* pos);
  void layer_backward(const bf16* params, float* grads, int l, const bf16* x_in, LayerActsCuda& a,
                      bf16* dres);
  // ModelLoop's head steps: the decoder layers' and the embedding's backward from dres_, and the
  // final norm's backward from dlnf_ into dres_, on stream_.
  void trunk_backward(UnitProviderCuda& p);
  void final_norm_backward(const bf16* head_params, float* head_grads);
  // Layer l's adapter views: w (device bf16 A and pre-scaled B, this pass's dropout keys) and g
  // (fp32 device gradients and the true scale α/r).
  void lora_views(int l, LoraLayerView<bf16>& w, LoraLayerView<float>& g) const;
  // Whether the active adapters include q, k or v (then the packed q/k/v GEMM is off).
  bool lora_on_qkv() const;
  // The dropout id of a training pass over the uploaded tokens_host (lora_dropout_pass), or 0.
  void set_lora_dropout_pass(const int32_t* tokens_host, bool for_backward);
  void final_norm(const bf16* head_params, const bf16* x, cudaStream_t s);
  // The sweep's trunk: every batch's residual stream after the last layer, in sweep_res_.
  void sweep_trunk(UnitProviderCuda& p, const std::vector<ForwardBatch<float>>& batches, bool lm);
  // Each batch's rows of `host` (Σ N_b, the sweep's outputs in batch order) into its out.
  void sweep_outputs(const std::vector<float>& host,
                     const std::vector<ForwardBatch<float>>& batches) const;
  // n bf16 device values widened into host fp32; synchronises the stream.
  static void download_widened(float* host, const bf16* dev, int64_t n, cudaStream_t s);
  int64_t logit_chunk_rows() const;

  const LoraLayout* lora_layout_ = nullptr;  // set_lora
  const float* lora_host_ = nullptr;
  const bf16* lora_params_ = nullptr;
  float* lora_grads_ = nullptr;
  bool lora_on_ = true;
  uint64_t lora_drop_pass_ = 0;  // this pass's dropout id (0: no dropout)

  int64_t logit_chunk_bytes_;
  bool packable_ = false;   // every layer's q/k/v are packed in the layout (and no QK-norm)
  bool fused_qkv_ = false;  // packable_ and not turned off
  DeviceArray<float> rope_cos_, rope_sin_;  // (max_pos, D/2)

  cudaStream_t stream_ = nullptr;  // the provider's stream of the pass in progress
  bool logits_kept_ = false;
  float inv_temperature_ = 1.0f;
  std::vector<int32_t> pos_host_;

  DeviceArray<int32_t> tokens_, targets_, pos_;
  DeviceArray<bf16> res_;         // (L+1 or 2, N, C)
  DeviceArray<bf16> layers_;      // (sets, the act_table values)
  DeviceArray<float> layer_f32_;  // (sets, the act_table statistics): rstd1, rstd2, lse, ...
  DeviceArray<bf16> proj_;        // (N, C): o_proj / down_proj output before the residual add
  DeviceArray<bf16> qkv_;  // (N, q + 2·kv): packed QKV GEMM output, and its gradient in backward
  DeviceArray<bf16> lnf_, logits_;
  DeviceArray<float> rstdf_, lse_, entropy_, lp_, dlp_, dentropy_;
  DeviceArray<bf16> values_;
  // A forward sweep's batches end to end: residual streams (Σ N_b, C), ids and positions (Σ N_b),
  // outputs (Σ N_b); sweep_offset_ is each batch's first row, then Σ N_b.
  DeviceArray<bf16> sweep_res_, sweep_values_;
  DeviceArray<int32_t> sweep_tokens_, sweep_targets_, sweep_pos_;
  DeviceArray<float> sweep_lp_;
  std::vector<int64_t> sweep_offset_;
  std::vector<int32_t> sweep_host_ids_;  // host staging of the uploads: tokens, positions, targets
  // Backward scratch: the residual gradient, one layer's activation gradients (carved by
  // layer_grad_table), the final norm's output gradient.
  DeviceArray<bf16> dres_, dlayer_, dlnf_;
};

}  // namespace rlhf::model
#endif  // RLHF_CUDA

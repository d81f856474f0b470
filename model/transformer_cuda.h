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
#include "model/device_provider.h"
#include "model/forward_batch.h"
#include "model/layout.h"

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
class TransformerCuda {
 public:
  /// Bytes of bf16 logits one LM-head chunk may hold (256 MiB).
  static constexpr int64_t kLogitChunkBytes = int64_t{256} << 20;

  /// gradient_checkpointing: keep only each layer's input and recompute the layer in backward.
  /// logit_chunk_bytes: the LM-head chunk budget (tests make it small to exercise the chunked
  /// path). Uploads the RoPE tables (max_position_embeddings × D/2 fp32, twice) to the current
  /// device.
  TransformerCuda(const ParamLayout& layout, bool gradient_checkpointing = false,
                  int64_t logit_chunk_bytes = kLogitChunkBytes);

  const ParamLayout& layout() const { return layout_; }

  /// LM forward, contract of Transformer::forward_lm: tokens, targets (B, T) int32 host (target
  /// −1: no loss, lp = 0); lp (B, T) fp32 host out; entropy (B, T) host out or nullptr.
  /// Throws rlhf::Error on a token or target outside the vocabulary, T > max_position_embeddings,
  /// or a CUDA failure.
  void forward_lm(DeviceUnitProvider& p, const int32_t* tokens, const int32_t* targets, int64_t B,
                  int64_t T_, float* lp, float* entropy, bool for_backward,
                  float inv_temperature = 1.0f);

  /// Raw logits (B, T, V) fp32 host out (widened from bf16), for tests and references.
  void forward_logits(DeviceUnitProvider& p, const int32_t* tokens, int64_t B, int64_t T_,
                      float* logits);

  /// LM backward for the last forward_lm(for_backward = true): dlp, dentropy (B, T) fp32 host
  /// (dentropy may be nullptr). Parameter gradients accumulate (+=) into the provider's buffers.
  void backward_lm(DeviceUnitProvider& p, const float* dlp, const float* dentropy);

  /// Scalar-head forward: values (B, T) fp32 host out (bf16 head output, widened).
  void forward_scalar(DeviceUnitProvider& p, const int32_t* tokens, int64_t B, int64_t T_,
                      float* values, bool for_backward);

  /// Scalar-head backward for the last forward_scalar(for_backward = true); dvalues (B, T) fp32
  /// host (rounded to bf16 on the device).
  void backward_scalar(DeviceUnitProvider& p, const float* dvalues);

  /// Forward-only LM passes over several micro-batches, unit-major (contract of
  /// Transformer::forward_lm_sweep): each unit acquired once for all of them; each batch's lp
  /// (B, seq_len) fp32 host out, bit-identical to forward_lm(for_backward = false) on that batch.
  /// Holds every batch's residual stream on the device (Σ B·seq_len·hidden_size bf16), its ids,
  /// positions and outputs; synchronises the stream once, at the end.
  void forward_lm_sweep(DeviceUnitProvider& p, const std::vector<ForwardBatch<float>>& batches,
                        float inv_temperature = 1.0f);

  /// forward_lm_sweep for the scalar head: each batch's values (B, seq_len) fp32 host out,
  /// bit-identical to forward_scalar(for_backward = false).
  void forward_scalar_sweep(DeviceUnitProvider& p, const std::vector<ForwardBatch<float>>& batches);

  /// Bytes a sweep holds for its residual streams per token (hidden_size bf16).
  int64_t sweep_residual_bytes_per_token() const { return C_ * int64_t(sizeof(bf16)); }

  /// Bytes of device memory the activations and scratch currently hold.
  int64_t activation_bytes() const;

  /// Whether the packed q/k/v path is in use (true when every layer is qkv_packed, unless
  /// set_fused_qkv(false) turned it off: tests compare the two paths).
  bool fused_qkv() const { return fused_qkv_; }
  void set_fused_qkv(bool on);

 private:
  // One layer's saved forward: the routine's activations and the attention lse (B, H, T) the
  // flash backward needs.
  struct Saved {
    LayerActsCuda acts;
    float* att_lse = nullptr;
  };
  // Throws rlhf::Error naming the first id outside [0, V) (−1 allowed with allow_minus_one).
  static void check_ids(const int32_t* ids, int64_t N, int64_t V, bool allow_minus_one,
                        const char* what);
  void reserve(int64_t B, int64_t T_, bool for_backward, cudaStream_t s);
  int64_t layer_bf16() const;
  int64_t layer_f32() const;
  void point_layer(Saved& a, int set);
  // pos: the (N) device positions of the layer's tokens (nullptr = pos_).
  LayerRunCuda layer_run(const Saved& a, cudaStream_t s, const int32_t* pos = nullptr) const;
  void upload_ids(const int32_t* tokens, const int32_t* targets, cudaStream_t s);
  void trunk_forward(DeviceUnitProvider& p, bool for_backward);
  void layer_forward(const bf16* params, int l, const bf16* x_in, bf16* x_out, Saved& a,
                     cudaStream_t s, const int32_t* pos = nullptr);
  void layer_backward(const bf16* params, float* grads, int l, const bf16* x_in, Saved& a,
                      bf16* dres, cudaStream_t s);
  void trunk_backward(DeviceUnitProvider& p, bf16* dres);
  void final_norm(const bf16* head_params, const bf16* x, cudaStream_t s);
  // The sweep's trunk: every batch's residual stream after the last layer, in sweep_res_.
  void sweep_trunk(DeviceUnitProvider& p, const std::vector<ForwardBatch<float>>& batches, bool lm);
  // B_, T_, N_ of one batch of a sweep (the scratch is sized for the largest).
  void sweep_geometry(const ForwardBatch<float>& b);
  // Each batch's rows of `host` (Σ N_b, the sweep's outputs in batch order) into its out.
  void sweep_outputs(const std::vector<float>& host,
                     const std::vector<ForwardBatch<float>>& batches) const;
  // n bf16 device values widened into host fp32; synchronises the stream.
  static void download_widened(float* host, const bf16* dev, int64_t n, cudaStream_t s);
  const bf16* x_last() const;
  int64_t logit_chunk_rows() const;
  void head_backward_common(DeviceUnitProvider& p, const bf16* head_params, float* head_grads);

  ParamLayout layout_;
  LayerSpec spec_;
  bool checkpointing_;
  int64_t logit_chunk_bytes_;
  bool packable_ = false;   // every layer's q/k/v are packed in the layout (and no QK-norm)
  bool fused_qkv_ = false;  // packable_ and not turned off
  int64_t C_, F_, H_, Hkv_, D_, V_, L_;
  DeviceArray<float> rope_cos_, rope_sin_;  // (max_pos, D/2)

  int64_t B_ = 0, T_ = 0, N_ = 0;
  bool have_backward_state_ = false, entropy_valid_ = false, kept_ = false, logits_kept_ = false;
  HeadKind last_head_ = HeadKind::kLM;
  float inv_temperature_ = 1.0f;
  std::vector<int32_t> pos_host_;

  DeviceArray<int32_t> tokens_, targets_, pos_;
  DeviceArray<bf16> res_;         // (L+1 or 2, N, C)
  DeviceArray<bf16> layers_;      // (sets, layer_bf16)
  DeviceArray<float> layer_f32_;  // (sets, layer_f32): rstd1, rstd2, attention lse
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
  // Backward scratch.
  DeviceArray<bf16> dres_, dln_, datty_, dq_, dk_, dv_, dq_raw_, dk_raw_, dh_, dgate_, dup_, dlnf_;
};

}  // namespace rlhf::model
#endif  // RLHF_CUDA

#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "model/decoder_layer.h"
#include "model/lora.h"
#include "model/lora_cuda.h"
#include "model/mlp.h"
#include "model/ops/linear.h"
#include "model/ops/residual.h"
#include "model/ops/rmsnorm.h"
#include "model/ops/rope.h"

namespace rlhf::model {

namespace {
// Projection p's adapter on the device: A and the pre-scaled B from the parameter view's LoRA
// (bf16: B holds (α/r)·B, see TransformerCuda::set_lora), the fp32 gradients and the true scale
// from the gradient view's (nullptr: none wanted).
LoraDeviceAdapter device_adapter(Proj p, const LoraLayerView<bf16>& w,
                                 const LoraLayerView<float>* g) {
  const LoraProjView<bf16>& a = w[p];
  LoraDeviceAdapter d;
  d.A = a.A;
  d.Bs = a.B;
  d.r = a.r;
  d.dropout = a.dropout;
  d.key = a.key;
  if (g != nullptr) {
    d.dA = (*g)[p].dA;
    d.dB = (*g)[p].dB;
    d.scale = g->scale;
  }
  return d;
}
}  // namespace

void project_forward_cuda(Proj p, bf16* y, const bf16* x, const LayerParams<const bf16>& w,
                          const LayerSpec& s, int64_t N, cudaStream_t st) {
  const Projection r = projection(s, p);
  linear_forward_cuda(y, x, w.weight(p), w.bias(p), N, r.in, r.out, st);
  if (w.lora != nullptr)
    lora_forward_cuda(y, x, device_adapter(p, *w.lora, nullptr), N, r.in, r.out, st);
}

void project_backward_cuda(Proj p, bf16* dx, const bf16* dy, const bf16* x,
                           const LayerParams<float>& g, const LayerParams<const bf16>& w,
                           const LayerSpec& s, int64_t N, bool accumulate_dx, cudaStream_t st) {
  const Projection r = projection(s, p);
  linear_backward_cuda(dx, g.weight(p), g.bias(p), dy, x, w.weight(p), N, r.in, r.out,
                       accumulate_dx, st);
  if (w.lora != nullptr)
    lora_backward_cuda(dx, dy, x, device_adapter(p, *w.lora, g.lora), N, r.in, r.out, st);
}

void project_qkv_forward_cuda(bf16* y, const bf16* x, const LayerParams<const bf16>& w,
                              const LayerSpec& s, int64_t N, cudaStream_t st) {
  linear_forward_cuda(y, x, w.wq, w.bq, N, s.C, s.q_dim() + 2 * s.kv_dim(), st);
}

void project_qkv_backward_cuda(bf16* dx, const bf16* dy, const bf16* x, const LayerParams<float>& g,
                               const LayerParams<const bf16>& w, const LayerSpec& s, int64_t N,
                               cudaStream_t st) {
  linear_backward_cuda(dx, g.wq, g.bq, dy, x, w.wq, N, s.C, s.q_dim() + 2 * s.kv_dim(), false, st);
}

void decoder_layer_forward_cuda(bf16* x_out, LayerActsCuda& a, LayerScratchCuda& scratch,
                                const bf16* x_in, const LayerParams<const bf16>& w,
                                const LayerSpec& s, const LayerRunCuda& run) {
  const int64_t N = run.N, C = s.C;
  const double eps = s.rms_norm_eps;
  const cudaStream_t st = run.stream;
  if (!run.input_normed) rmsnorm_forward_cuda(a.ln1, a.rstd1, x_in, w.w_in, N, C, eps, st);
  if (run.fused_qkv) {  // wq is the packed (Q + 2·KV, C) matrix, bq the packed bias
    RLHF_ASSERT(!s.qk_norm && scratch.qkv != nullptr);
    RLHF_ASSERT(w.lora == nullptr ||
                ((*w.lora)[Proj::kQ].A == nullptr && (*w.lora)[Proj::kK].A == nullptr &&
                 (*w.lora)[Proj::kV].A == nullptr));
    project_qkv_forward_cuda(scratch.qkv, a.ln1, w, s, N, st);
    qkv_rope_split_cuda(a.q, a.k, a.v, scratch.qkv, run.pos, run.rope_cos, run.rope_sin, N, s.H,
                        s.Hkv, s.D, s.rope_style, st, run.kv_cache);
  } else {
    // With QK-norm and backward, the projections land in q_raw/k_raw and the norm writes q/k.
    bf16* qp = s.qk_norm && a.q_raw ? a.q_raw : a.q;
    bf16* kp = s.qk_norm && a.k_raw ? a.k_raw : a.k;
    project_forward_cuda(Proj::kQ, qp, a.ln1, w, s, N, st);
    project_forward_cuda(Proj::kK, kp, a.ln1, w, s, N, st);
    project_forward_cuda(Proj::kV, a.v, a.ln1, w, s, N, st);
    if (s.qk_norm) {
      RLHF_ASSERT(w.q_norm != nullptr && w.k_norm != nullptr && a.q_rstd && a.k_rstd);
      rmsnorm_forward_cuda(a.q, a.q_rstd, qp, w.q_norm, N * s.H, s.D, eps, st);
      rmsnorm_forward_cuda(a.k, a.k_rstd, kp, w.k_norm, N * s.Hkv, s.D, eps, st);
    }
    rope_forward_cuda(a.q, a.q, run.pos, run.rope_cos, run.rope_sin, N, s.H, s.D, s.rope_style, st);
    rope_forward_cuda(a.k, a.k, run.pos, run.rope_cos, run.rope_sin, N, s.Hkv, s.D, s.rope_style,
                      st);
  }
  run.attention(a.atty, a.q, a.k, a.v, st);
  project_forward_cuda(Proj::kO, scratch.proj, a.atty, w, s, N, st);
  if (run.partial_sum) run.partial_sum(scratch.proj, N * C, st);
  // x_mid = x_in + o_proj(atty), fused with the post-attention RMSNorm.
  rmsnorm_residual_forward_cuda(a.x_mid, a.ln2, a.rstd2, x_in, scratch.proj, w.w_post, N, C, eps,
                                st);
  mlp_forward_cuda(scratch.proj, a, a.ln2, w, s, N, st, run.forward_only);
  if (run.partial_sum) run.partial_sum(scratch.proj, N * C, st);
  if (run.next_input_norm != nullptr)  // x_out = x_mid + mlp, and the next layer's input norm
    rmsnorm_residual_forward_cuda(x_out, a.ln1, a.rstd1, a.x_mid, scratch.proj, run.next_input_norm,
                                  N, C, eps, st);
  else
    residual_forward_cuda(x_out, a.x_mid, scratch.proj, N * C, st);
}

void decoder_layer_backward_cuda(
    bf16* dres, const LayerParams<float>& g, LayerGradScratchCuda& d, LayerScratchCuda& scratch,
    const LayerActsCuda& a, const bf16* x_in, const LayerParams<const bf16>& w, const LayerSpec& s,
    const LayerRunCuda& run,
    const std::function<void(bf16* dq, bf16* dk, bf16* dv, const bf16* datty, cudaStream_t)>&
        attention) {
  const int64_t N = run.N, C = s.C, Q = s.q_dim(), KV = s.kv_dim();
  const cudaStream_t st = run.stream;
  // MLP: x_out = x_mid + mlp(ln2); dres is d x_out.
  mlp_backward_cuda(d.dln, g, d, a, dres, a.ln2, w, s, N, st);
  rmsnorm_backward_cuda(dres, g.w_post, d.dln, a.x_mid, w.w_post, a.rstd2, N, C, st);
  // Attention: x_mid = x_in + o_proj(atty); dres is now d x_mid.
  project_backward_cuda(Proj::kO, d.datty, dres, a.atty, g, w, s, N, false, st);
  attention(d.dq, d.dk, d.dv, d.datty, st);
  if (run.fused_qkv) {  // one GEMM pair over the packed q/k/v weights and gradients
    qkv_rope_merge_backward_cuda(scratch.qkv, d.dq, d.dk, d.dv, run.pos, run.rope_cos, run.rope_sin,
                                 N, s.H, s.Hkv, s.D, s.rope_style, st);
    project_qkv_backward_cuda(d.dln, scratch.qkv, a.ln1, g, w, s, N, st);
  } else {
    rope_backward_cuda(d.dq, d.dq, run.pos, run.rope_cos, run.rope_sin, N, s.H, s.D, s.rope_style,
                       st);
    rope_backward_cuda(d.dk, d.dk, run.pos, run.rope_cos, run.rope_sin, N, s.Hkv, s.D, s.rope_style,
                       st);
    bf16* dqp = d.dq;
    bf16* dkp = d.dk;
    if (s.qk_norm) {
      RLHF_ASSERT(a.q_raw && a.k_raw && d.dq_raw && d.dk_raw);
      // The norm's input is not the residual stream: its gradient starts at zero (the op adds).
      CUDA_CHECK(cudaMemsetAsync(d.dq_raw, 0, size_t(N * Q) * sizeof(bf16), st));
      CUDA_CHECK(cudaMemsetAsync(d.dk_raw, 0, size_t(N * KV) * sizeof(bf16), st));
      rmsnorm_backward_cuda(d.dq_raw, g.q_norm, d.dq, a.q_raw, w.q_norm, a.q_rstd, N * s.H, s.D,
                            st);
      rmsnorm_backward_cuda(d.dk_raw, g.k_norm, d.dk, a.k_raw, w.k_norm, a.k_rstd, N * s.Hkv, s.D,
                            st);
      dqp = d.dq_raw;
      dkp = d.dk_raw;
    }
    project_backward_cuda(Proj::kQ, d.dln, dqp, a.ln1, g, w, s, N, false, st);
    project_backward_cuda(Proj::kK, d.dln, dkp, a.ln1, g, w, s, N, true, st);
    project_backward_cuda(Proj::kV, d.dln, d.dv, a.ln1, g, w, s, N, true, st);
  }
  rmsnorm_backward_cuda(dres, g.w_in, d.dln, x_in, w.w_in, a.rstd1, N, C, st);
}

}  // namespace rlhf::model
#endif  // RLHF_CUDA

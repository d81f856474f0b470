#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "model/decoder_layer.h"
#include "model/ops/linear.h"
#include "model/ops/residual.h"
#include "model/ops/rmsnorm.h"
#include "model/ops/rope.h"
#include "model/ops/swiglu.h"

namespace rlhf::model {

void decoder_layer_forward_cuda(bf16* x_out, LayerActsCuda& a, LayerScratchCuda& scratch,
                                const bf16* x_in, const LayerParams<const bf16>& w,
                                const LayerSpec& s, const LayerRunCuda& run) {
  const int64_t N = run.N, C = s.C, F = s.F, Q = s.q_dim(), KV = s.kv_dim();
  const double eps = s.rms_norm_eps;
  const cudaStream_t st = run.stream;
  rmsnorm_forward_cuda(a.ln1, a.rstd1, x_in, w.w_in, N, C, eps, st);
  if (run.fused_qkv) {  // wq is the packed (Q + 2·KV, C) matrix, bq the packed bias
    RLHF_ASSERT(!s.qk_norm && scratch.qkv != nullptr);
    linear_forward_cuda(scratch.qkv, a.ln1, w.wq, w.bq, N, C, Q + 2 * KV, st);
    qkv_rope_split_cuda(a.q, a.k, a.v, scratch.qkv, run.pos, run.rope_cos, run.rope_sin, N, s.H,
                        s.Hkv, s.D, s.rope_style, st);
  } else {
    // With QK-norm and backward, the projections land in q_raw/k_raw and the norm writes q/k.
    bf16* qp = s.qk_norm && a.q_raw ? a.q_raw : a.q;
    bf16* kp = s.qk_norm && a.k_raw ? a.k_raw : a.k;
    linear_forward_cuda(qp, a.ln1, w.wq, w.bq, N, C, Q, st);
    linear_forward_cuda(kp, a.ln1, w.wk, w.bk, N, C, KV, st);
    linear_forward_cuda(a.v, a.ln1, w.wv, w.bv, N, C, KV, st);
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
  linear_forward_cuda(scratch.proj, a.atty, w.wo, w.bo, N, Q, C, st);
  // x_mid = x_in + o_proj(atty), fused with the post-attention RMSNorm.
  rmsnorm_residual_forward_cuda(a.x_mid, a.ln2, a.rstd2, x_in, scratch.proj, w.w_post, N, C, eps,
                                st);
  linear_forward_cuda(a.gate, a.ln2, w.wg, nullptr, N, C, F, st);
  linear_forward_cuda(a.up, a.ln2, w.wu, nullptr, N, C, F, st);
  swiglu_forward_cuda(a.h, a.gate, a.up, N, F, st);
  linear_forward_cuda(scratch.proj, a.h, w.wd, nullptr, N, F, C, st);
  residual_forward_cuda(x_out, a.x_mid, scratch.proj, N * C, st);
}

void decoder_layer_backward_cuda(
    bf16* dres, const LayerParams<float>& g, LayerGradScratchCuda& d, LayerScratchCuda& scratch,
    const LayerActsCuda& a, const bf16* x_in, const LayerParams<const bf16>& w, const LayerSpec& s,
    const LayerRunCuda& run,
    const std::function<void(bf16* dq, bf16* dk, bf16* dv, const bf16* datty, cudaStream_t)>&
        attention) {
  const int64_t N = run.N, C = s.C, F = s.F, Q = s.q_dim(), KV = s.kv_dim();
  const cudaStream_t st = run.stream;
  // MLP: x_out = x_mid + down(h); dres is d x_out.
  linear_backward_cuda(d.dh, g.wd, nullptr, dres, a.h, w.wd, N, F, C, false, st);
  swiglu_backward_cuda(d.dgate, d.dup, d.dh, a.gate, a.up, N, F, st);
  linear_backward_cuda(d.dln, g.wg, nullptr, d.dgate, a.ln2, w.wg, N, C, F, false, st);
  linear_backward_cuda(d.dln, g.wu, nullptr, d.dup, a.ln2, w.wu, N, C, F, true, st);
  rmsnorm_backward_cuda(dres, g.w_post, d.dln, a.x_mid, w.w_post, a.rstd2, N, C, st);
  // Attention: x_mid = x_in + o_proj(atty); dres is now d x_mid.
  linear_backward_cuda(d.datty, g.wo, g.bo, dres, a.atty, w.wo, N, Q, C, false, st);
  attention(d.dq, d.dk, d.dv, d.datty, st);
  if (run.fused_qkv) {  // one GEMM pair over the packed q/k/v weights and gradients
    qkv_rope_merge_backward_cuda(scratch.qkv, d.dq, d.dk, d.dv, run.pos, run.rope_cos, run.rope_sin,
                                 N, s.H, s.Hkv, s.D, s.rope_style, st);
    linear_backward_cuda(d.dln, g.wq, g.bq, scratch.qkv, a.ln1, w.wq, N, C, Q + 2 * KV, false, st);
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
    linear_backward_cuda(d.dln, g.wq, g.bq, dqp, a.ln1, w.wq, N, C, Q, false, st);
    linear_backward_cuda(d.dln, g.wk, g.bk, dkp, a.ln1, w.wk, N, C, KV, true, st);
    linear_backward_cuda(d.dln, g.wv, g.bv, d.dv, a.ln1, w.wv, N, C, KV, true, st);
  }
  rmsnorm_backward_cuda(dres, g.w_in, d.dln, x_in, w.w_in, a.rstd1, N, C, st);
}

}  // namespace rlhf::model
#endif  // RLHF_CUDA

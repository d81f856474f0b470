#include "model/decoder_layer.h"

#include <algorithm>

#include "core/error.h"
#include "model/ops/linear.h"
#include "model/ops/residual.h"
#include "model/ops/rmsnorm.h"
#include "model/ops/rope.h"
#include "model/ops/swiglu.h"

namespace rlhf::model {

template <typename T>
void decoder_layer_forward_cpu(T* x_out, LayerActs<T>& a, const T* x_in,
                               const LayerParams<const T>& w, const LayerSpec& s,
                               const LayerRun<T>& run) {
  const int64_t N = run.N, C = s.C, F = s.F, Q = s.q_dim(), KV = s.kv_dim();
  const double eps = s.rms_norm_eps;
  const T* none = nullptr;
  rmsnorm_forward_cpu(a.ln1, a.rstd1, x_in, w.w_in, N, C, eps);
  // With QK-norm and backward, the projections land in q_raw/k_raw and the norm writes q/k.
  T* qp = s.qk_norm && a.q_raw ? a.q_raw : a.q;
  T* kp = s.qk_norm && a.k_raw ? a.k_raw : a.k;
  run.linear(qp, a.ln1, w.wq, w.bq, N, C, Q);
  run.linear(kp, a.ln1, w.wk, w.bk, N, C, KV);
  run.linear(a.v, a.ln1, w.wv, w.bv, N, C, KV);
  if (s.qk_norm) {
    RLHF_ASSERT(w.q_norm != nullptr && w.k_norm != nullptr && a.q_rstd && a.k_rstd);
    rmsnorm_forward_cpu(a.q, a.q_rstd, qp, w.q_norm, N * s.H, s.D, eps);
    rmsnorm_forward_cpu(a.k, a.k_rstd, kp, w.k_norm, N * s.Hkv, s.D, eps);
  }
  rope_forward_cpu(a.q, a.q, run.pos, run.rope_cos, run.rope_sin, N, s.H, s.D, s.rope_style);
  rope_forward_cpu(a.k, a.k, run.pos, run.rope_cos, run.rope_sin, N, s.Hkv, s.D, s.rope_style);
  run.attention(a.atty, a.q, a.k, a.v);
  run.linear(a.x_mid, a.atty, w.wo, w.bo, N, Q, C);
  if (run.partial_sum) run.partial_sum(a.x_mid, N * C);
  residual_forward_cpu(a.x_mid, a.x_mid, x_in, N * C);
  rmsnorm_forward_cpu(a.ln2, a.rstd2, a.x_mid, w.w_post, N, C, eps);
  run.linear(a.gate, a.ln2, w.wg, none, N, C, F);
  run.linear(a.up, a.ln2, w.wu, none, N, C, F);
  swiglu_forward_cpu(a.h, a.gate, a.up, N, F);
  run.linear(x_out, a.h, w.wd, none, N, F, C);
  if (run.partial_sum) run.partial_sum(x_out, N * C);
  residual_forward_cpu(x_out, x_out, a.x_mid, N * C);
}

template <typename T>
void decoder_layer_backward_cpu(T* dres, const LayerParams<T>& g, LayerGradScratch<T>& d,
                                const LayerActs<T>& a, const T* x_in, const LayerParams<const T>& w,
                                const LayerSpec& s, const LayerRun<T>& run,
                                const AttentionBackwardFn<T>& attention) {
  const int64_t N = run.N, C = s.C, F = s.F, Q = s.q_dim(), KV = s.kv_dim();
  T* none = nullptr;
  // MLP: x_out = x_mid + down(h); dres is d x_out.
  linear_backward_cpu(d.dh, g.wd, none, dres, a.h, w.wd, N, F, C, false);
  swiglu_backward_cpu(d.dgate, d.dup, d.dh, a.gate, a.up, N, F);
  linear_backward_cpu(d.dln, g.wg, none, d.dgate, a.ln2, w.wg, N, C, F, false);
  linear_backward_cpu(d.dln, g.wu, none, d.dup, a.ln2, w.wu, N, C, F, true);
  rmsnorm_backward_cpu(dres, g.w_post, d.dln, a.x_mid, w.w_post, a.rstd2, N, C);
  // Attention: x_mid = x_in + o_proj(atty); dres is now d x_mid.
  linear_backward_cpu(d.datty, g.wo, g.bo, dres, a.atty, w.wo, N, Q, C, false);
  attention(d.dq, d.dk, d.dv, d.datty, a.q, a.k, a.v);
  rope_backward_cpu(d.dq, d.dq, run.pos, run.rope_cos, run.rope_sin, N, s.H, s.D, s.rope_style);
  rope_backward_cpu(d.dk, d.dk, run.pos, run.rope_cos, run.rope_sin, N, s.Hkv, s.D, s.rope_style);
  T* dqp = d.dq;
  T* dkp = d.dk;
  if (s.qk_norm) {
    RLHF_ASSERT(a.q_raw && a.k_raw && d.dq_raw && d.dk_raw);
    // The norm's input is not the residual stream: its gradient starts at zero (the op adds).
    std::fill(d.dq_raw, d.dq_raw + N * Q, T(0));
    std::fill(d.dk_raw, d.dk_raw + N * KV, T(0));
    rmsnorm_backward_cpu(d.dq_raw, g.q_norm, d.dq, a.q_raw, w.q_norm, a.q_rstd, N * s.H, s.D);
    rmsnorm_backward_cpu(d.dk_raw, g.k_norm, d.dk, a.k_raw, w.k_norm, a.k_rstd, N * s.Hkv, s.D);
    dqp = d.dq_raw;
    dkp = d.dk_raw;
  }
  linear_backward_cpu(d.dln, g.wq, g.bq, dqp, a.ln1, w.wq, N, C, Q, false);
  linear_backward_cpu(d.dln, g.wk, g.bk, dkp, a.ln1, w.wk, N, C, KV, true);
  linear_backward_cpu(d.dln, g.wv, g.bv, d.dv, a.ln1, w.wv, N, C, KV, true);
  rmsnorm_backward_cpu(dres, g.w_in, d.dln, x_in, w.w_in, a.rstd1, N, C);
}

template void decoder_layer_forward_cpu<float>(float*, LayerActs<float>&, const float*,
                                               const LayerParams<const float>&, const LayerSpec&,
                                               const LayerRun<float>&);
template void decoder_layer_forward_cpu<double>(double*, LayerActs<double>&, const double*,
                                                const LayerParams<const double>&, const LayerSpec&,
                                                const LayerRun<double>&);
template void decoder_layer_backward_cpu<float>(float*, const LayerParams<float>&,
                                                LayerGradScratch<float>&, const LayerActs<float>&,
                                                const float*, const LayerParams<const float>&,
                                                const LayerSpec&, const LayerRun<float>&,
                                                const AttentionBackwardFn<float>&);
template void decoder_layer_backward_cpu<double>(double*, const LayerParams<double>&,
                                                 LayerGradScratch<double>&,
                                                 const LayerActs<double>&, const double*,
                                                 const LayerParams<const double>&, const LayerSpec&,
                                                 const LayerRun<double>&,
                                                 const AttentionBackwardFn<double>&);

}  // namespace rlhf::model

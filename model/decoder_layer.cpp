#include "model/decoder_layer.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "model/layer_bf16.h"
#include "model/lora.h"
#include "model/mlp.h"
#include "model/ops/linear.h"
#include "model/ops/residual.h"
#include "model/ops/rmsnorm.h"
#include "model/ops/rope.h"

namespace rlhf::model {

template <typename T>
const bfloat16* bf16_shared_input(const LayerRun<T>& run, const T* x, int64_t width,
                                  std::vector<bfloat16>& buf) {
  if constexpr (std::is_same_v<T, float>) return round_bf16_input(run.bf16, x, run.N * width, buf);
  (void)run, (void)x, (void)width, (void)buf;
  return nullptr;
}

template <typename T>
void project_forward_cpu(Proj p, T* y, const T* x, const LayerParams<const T>& w,
                         const LayerSpec& s, const LayerRun<T>& run, const bfloat16* x16) {
  const Projection r = projection(s, p);
  bool done = false;
  if constexpr (std::is_same_v<T, float>)
    if (run.bf16 != nullptr) {
      project_forward_bf16(*run.bf16, p, y, x, w.bias(p), run.N, r.in, r.out, x16);
      done = true;
    }
  if (!done) run.linear(y, x, w.weight(p), w.bias(p), run.N, r.in, r.out);
  // The adapter's low-rank branch (in fp32, also when the base GEMM ran in bf16).
  if (w.lora != nullptr) lora_forward_cpu(y, x, (*w.lora)[p], w.lora->scale, run.N, r.in, r.out);
}

template <typename T>
void project_backward_cpu(Proj p, T* dx, const T* dy, const T* x, const LayerParams<T>& g,
                          const LayerParams<const T>& w, const LayerSpec& s, const LayerRun<T>& run,
                          bool accumulate_dx, const bfloat16* x16) {
  const Projection r = projection(s, p);
  bool done = false;
  if constexpr (std::is_same_v<T, float>)
    if (run.bf16 != nullptr) {
      project_backward_bf16(*run.bf16, p, dx, g.weight(p), g.bias(p), dy, x, run.N, r.in, r.out,
                            accumulate_dx, x16);
      done = true;
    }
  if (!done)
    linear_backward_cpu(dx, g.weight(p), g.bias(p), dy, x, w.weight(p), run.N, r.in, r.out,
                        accumulate_dx);
  if (w.lora != nullptr)
    lora_backward_cpu(dx, dy, x, (*w.lora)[p], w.lora->scale, run.N, r.in, r.out);
}

template <typename T>
void decoder_layer_forward_cpu(T* x_out, LayerActs<T>& a, const T* x_in,
                               const LayerParams<const T>& w, const LayerSpec& s,
                               const LayerRun<T>& run) {
  const int64_t N = run.N, C = s.C;
  const double eps = s.rms_norm_eps;
  rmsnorm_forward_cpu(a.ln1, a.rstd1, x_in, w.w_in, N, C, eps);
  // With QK-norm and backward, the projections land in q_raw/k_raw and the norm writes q/k.
  T* qp = s.qk_norm && a.q_raw ? a.q_raw : a.q;
  T* kp = s.qk_norm && a.k_raw ? a.k_raw : a.k;
  thread_local std::vector<bfloat16> ln1_16;  // ln1 in bf16 once for q, k and v
  const bfloat16* x16 = bf16_shared_input(run, a.ln1, projection(s, Proj::kQ).in, ln1_16);
  project_forward_cpu(Proj::kQ, qp, a.ln1, w, s, run, x16);
  project_forward_cpu(Proj::kK, kp, a.ln1, w, s, run, x16);
  project_forward_cpu(Proj::kV, a.v, a.ln1, w, s, run, x16);
  if (s.qk_norm) {
    RLHF_ASSERT(w.q_norm != nullptr && w.k_norm != nullptr && a.q_rstd && a.k_rstd);
    rmsnorm_forward_cpu(a.q, a.q_rstd, qp, w.q_norm, N * s.H, s.D, eps);
    rmsnorm_forward_cpu(a.k, a.k_rstd, kp, w.k_norm, N * s.Hkv, s.D, eps);
  }
  rope_forward_cpu(a.q, a.q, run.pos, run.rope_cos, run.rope_sin, N, s.H, s.D, s.rope_style);
  rope_forward_cpu(a.k, a.k, run.pos, run.rope_cos, run.rope_sin, N, s.Hkv, s.D, s.rope_style);
  run.attention(a.atty, a.q, a.k, a.v);
  project_forward_cpu(Proj::kO, a.x_mid, a.atty, w, s, run);
  if (run.partial_sum) run.partial_sum(a.x_mid, N * C);
  residual_forward_cpu(a.x_mid, a.x_mid, x_in, N * C);
  rmsnorm_forward_cpu(a.ln2, a.rstd2, a.x_mid, w.w_post, N, C, eps);
  mlp_forward_cpu(x_out, a, a.ln2, w, s, run);
  if (run.partial_sum) run.partial_sum(x_out, N * C);
  residual_forward_cpu(x_out, x_out, a.x_mid, N * C);
}

template <typename T>
void decoder_layer_backward_cpu(T* dres, const LayerParams<T>& g, LayerGradScratch<T>& d,
                                const LayerActs<T>& a, const T* x_in, const LayerParams<const T>& w,
                                const LayerSpec& s, const LayerRun<T>& run,
                                const AttentionBackwardFn<T>& attention) {
  const int64_t N = run.N, C = s.C, Q = s.q_dim(), KV = s.kv_dim();
  // MLP: x_out = x_mid + mlp(ln2); dres is d x_out.
  mlp_backward_cpu(d.dln, g, d, a, dres, a.ln2, w, s, run);
  rmsnorm_backward_cpu(dres, g.w_post, d.dln, a.x_mid, w.w_post, a.rstd2, N, C);
  // Attention: x_mid = x_in + o_proj(atty); dres is now d x_mid.
  project_backward_cpu(Proj::kO, d.datty, dres, a.atty, g, w, s, run, false);
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
  thread_local std::vector<bfloat16> ln1_16;  // ln1 in bf16 once for the q, k and v gradients
  const bfloat16* x16 = bf16_shared_input(run, a.ln1, projection(s, Proj::kQ).in, ln1_16);
  project_backward_cpu(Proj::kQ, d.dln, dqp, a.ln1, g, w, s, run, false, x16);
  project_backward_cpu(Proj::kK, d.dln, dkp, a.ln1, g, w, s, run, true, x16);
  project_backward_cpu(Proj::kV, d.dln, d.dv, a.ln1, g, w, s, run, true, x16);
  rmsnorm_backward_cpu(dres, g.w_in, d.dln, x_in, w.w_in, a.rstd1, N, C);
}

#define RLHF_INSTANTIATE_PROJECT(T)                                                            \
  template void project_forward_cpu<T>(Proj, T*, const T*, const LayerParams<const T>&,        \
                                       const LayerSpec&, const LayerRun<T>&, const bfloat16*); \
  template void project_backward_cpu<T>(Proj, T*, const T*, const T*, const LayerParams<T>&,   \
                                        const LayerParams<const T>&, const LayerSpec&,         \
                                        const LayerRun<T>&, bool, const bfloat16*);            \
  template const bfloat16* bf16_shared_input<T>(const LayerRun<T>&, const T*, int64_t,         \
                                                std::vector<bfloat16>&);
RLHF_INSTANTIATE_PROJECT(float)
RLHF_INSTANTIATE_PROJECT(double)
#undef RLHF_INSTANTIATE_PROJECT
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

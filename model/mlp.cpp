#include "model/mlp.h"

#include "model/ops/swiglu.h"

namespace rlhf::model {

void mlp_act_rows(std::vector<ActInfo>& t, const LayerSpec& s) {
  switch (s.mlp) {
    case MlpKind::kDense:  // (N, F) gate, up, h
      t.push_back({Act::kGate, "gate", s.F, false, Act::kGate});
      t.push_back({Act::kUp, "up", s.F, false, Act::kUp});
      t.push_back({Act::kH, "h", s.F, false, Act::kH});
      return;
  }
}

void mlp_grad_rows(std::vector<ActInfo>& t, const LayerSpec& s) {
  switch (s.mlp) {
    case MlpKind::kDense:  // (N, F) dh, dgate, dup
      t.push_back({Act::kDh, "dh", s.F, false, Act::kDh});
      t.push_back({Act::kDgate, "dgate", s.F, false, Act::kDgate});
      t.push_back({Act::kDup, "dup", s.F, false, Act::kDup});
      return;
  }
}

template <typename T>
void mlp_forward_cpu(T* y, LayerActs<T>& a, const T* x, const LayerParams<const T>& w,
                     const LayerSpec& s, const LayerRun<T>& run) {
  switch (s.mlp) {
    case MlpKind::kDense: {
      thread_local std::vector<bfloat16> x16_buf;  // x in bf16 once for gate and up
      const bfloat16* x16 = bf16_shared_input(run, x, projection(s, Proj::kGate).in, x16_buf);
      project_forward_cpu(Proj::kGate, a.gate, x, w, s, run, x16);
      project_forward_cpu(Proj::kUp, a.up, x, w, s, run, x16);
      swiglu_forward_cpu(a.h, a.gate, a.up, run.N, s.F);
      project_forward_cpu(Proj::kDown, y, a.h, w, s, run);
      return;
    }
  }
}

template <typename T>
void mlp_backward_cpu(T* dx, const LayerParams<T>& g, LayerGradScratch<T>& d, const LayerActs<T>& a,
                      const T* dy, const T* x, const LayerParams<const T>& w, const LayerSpec& s,
                      const LayerRun<T>& run) {
  const int64_t N = run.N;
  switch (s.mlp) {
    case MlpKind::kDense: {
      project_backward_cpu(Proj::kDown, d.dh, dy, a.h, g, w, s, run, false);
      swiglu_backward_cpu(d.dgate, d.dup, d.dh, a.gate, a.up, N, s.F);
      thread_local std::vector<bfloat16> x16_buf;  // x in bf16 once for the gate and up gradients
      const bfloat16* x16 = bf16_shared_input(run, x, projection(s, Proj::kGate).in, x16_buf);
      project_backward_cpu(Proj::kGate, dx, d.dgate, x, g, w, s, run, false, x16);
      project_backward_cpu(Proj::kUp, dx, d.dup, x, g, w, s, run, true, x16);
      return;
    }
  }
}

#define RLHF_INSTANTIATE_MLP(T)                                                                 \
  template void mlp_forward_cpu<T>(T*, LayerActs<T>&, const T*, const LayerParams<const T>&,    \
                                   const LayerSpec&, const LayerRun<T>&);                       \
  template void mlp_backward_cpu<T>(                                                            \
      T*, const LayerParams<T>&, LayerGradScratch<T>&, const LayerActs<T>&, const T*, const T*, \
      const LayerParams<const T>&, const LayerSpec&, const LayerRun<T>&);
RLHF_INSTANTIATE_MLP(float)
RLHF_INSTANTIATE_MLP(double)
#undef RLHF_INSTANTIATE_MLP

}  // namespace rlhf::model

#ifdef RLHF_CUDA
#include "model/mlp.h"
#include "model/ops/linear.h"
#include "model/ops/swiglu.h"

namespace rlhf::model {

void mlp_forward_cuda(bf16* y, LayerActsCuda& a, const bf16* x, const LayerParams<const bf16>& w,
                      const LayerSpec& s, int64_t N, cudaStream_t st, bool forward_only) {
  switch (s.mlp) {
    case MlpKind::kDense:
      if (forward_only && w.lora == nullptr &&
          linear_skinny_serves(x, w.weight(Proj::kGate), N, s.C) &&
          linear_skinny_serves(x, w.weight(Proj::kUp), N, s.C)) {
        linear_swiglu_skinny_cuda(a.h, x, w.weight(Proj::kGate), w.bias(Proj::kGate),
                                  w.weight(Proj::kUp), w.bias(Proj::kUp), N, s.C, s.F, st);
        project_forward_cuda(Proj::kDown, y, a.h, w, s, N, st);
        return;
      }
      project_forward_cuda(Proj::kGate, a.gate, x, w, s, N, st);
      project_forward_cuda(Proj::kUp, a.up, x, w, s, N, st);
      swiglu_forward_cuda(a.h, a.gate, a.up, N, s.F, st);
      project_forward_cuda(Proj::kDown, y, a.h, w, s, N, st);
      return;
  }
}

void mlp_backward_cuda(bf16* dx, const LayerParams<float>& g, LayerGradScratchCuda& d,
                       const LayerActsCuda& a, const bf16* dy, const bf16* x,
                       const LayerParams<const bf16>& w, const LayerSpec& s, int64_t N,
                       cudaStream_t st) {
  switch (s.mlp) {
    case MlpKind::kDense:
      project_backward_cuda(Proj::kDown, d.dh, dy, a.h, g, w, s, N, false, st);
      swiglu_backward_cuda(d.dgate, d.dup, d.dh, a.gate, a.up, N, s.F, st);
      project_backward_cuda(Proj::kGate, dx, d.dgate, x, g, w, s, N, false, st);
      project_backward_cuda(Proj::kUp, dx, d.dup, x, g, w, s, N, true, st);
      return;
  }
}

}  // namespace rlhf::model
#endif  // RLHF_CUDA

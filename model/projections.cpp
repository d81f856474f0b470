#include "model/projections.h"

#include "core/error.h"

namespace rlhf::model {

Projection projection(const LayerSpec& s, Proj p) {
  const int64_t C = s.C, Q = s.q_dim(), KV = s.kv_dim(), F = s.F;
  Projection r;
  r.info = &proj_info(p);
  switch (p) {
    case Proj::kQ:
      r.in = C, r.out = Q, r.bias = s.qkv_bias;
      break;
    case Proj::kK:
    case Proj::kV:
      r.in = C, r.out = KV, r.bias = s.qkv_bias;
      break;
    case Proj::kO:
      r.in = Q, r.out = C, r.bias = s.o_bias;
      break;
    case Proj::kGate:
    case Proj::kUp:
      r.in = C, r.out = F, r.bias = false;
      break;
    case Proj::kDown:
      r.in = F, r.out = C, r.bias = false;
      break;
  }
  return r;
}

std::vector<Projection> layer_projections(const LayerSpec& s) {
  std::vector<Projection> r;
  for (const ProjInfo& p : kProjections) {
    if (p.block == ProjBlock::kMlp) {
      switch (s.mlp) {
        case MlpKind::kDense:  // gate, up, down
          break;
      }
    }
    r.push_back(projection(s, p.id));
  }
  return r;
}

int64_t layer_matmul_params(const LayerSpec& s) {
  int64_t n = 0;
  for (const Projection& p : layer_projections(s)) n += p.in * p.out;
  return n;
}

}  // namespace rlhf::model

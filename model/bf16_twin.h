// Bf16Twins: how a bf16 model (Transformer::set_bf16) finds a bf16 copy of weights that already
// exists — a ZeRO-3 store that gathers bf16 shards (parallel/zero3.h, Zero3Options::bf16_gather)
// widens them into the fp32 units it hands out, and its gathered bf16 unit can feed the bf16 GEMMs
// directly instead of being rounded again from the widened copy (the same values either way).
#pragma once

#include <cstdint>

#include "model/ops/half.h"

namespace rlhf::model {

/// Implemented by a UnitProvider<float> whose acquired units are widened bf16 arrays.
class Bf16Twins {
 public:
  virtual ~Bf16Twins() = default;
  /// The bf16 array whose widening is the fp32 elements [p, p + n) of a unit acquired from this
  /// provider (valid until that unit is released), or nullptr when [p, p + n) lies in no such unit.
  virtual const bfloat16* bf16_twin(const float* p, int64_t n) const = 0;
};

}  // namespace rlhf::model

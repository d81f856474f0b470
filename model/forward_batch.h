// ForwardBatch: one micro-batch of a forward-only sweep, the unit-major pass of the experience
// (old and reference log-probs, values, reward-model scores) on the CPU and the GPU models.
#pragma once

#include <cstdint>

namespace rlhf::model {

/// One micro-batch of a forward-only sweep (Transformer::forward_lm_sweep / forward_scalar_sweep):
/// B right-padded sequences of seq_len tokens. tokens, targets: (B, seq_len) int32 (targets: the
/// LM head's, as in forward_lm; unused by the scalar head); out: (B, seq_len) — the log-probs or
/// the scalar values.
template <typename T>
struct ForwardBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int64_t B = 0, seq_len = 0;
  T* out = nullptr;
};

}  // namespace rlhf::model

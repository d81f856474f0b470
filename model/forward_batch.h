// ForwardBatch: one micro-batch of a forward-only sweep, the unit-major pass of the experience
// (old and reference log-probs, values, reward-model scores) on the CPU and the GPU models.
#pragma once

#include <cstdint>

namespace rlhf::model {

/// Sample packing (--packing_samples; flash-attn's varlen convention): the n samples of a batch
/// laid end to end over its B·T flattened tokens. cu: (n + 1) int32, cu[0] = 0, strictly
/// ascending, cu[n] = B·T; sample s is tokens [cu[s], cu[s+1]). Attention is causal within each
/// sample only (block-diagonal) and RoPE positions restart at 0 per sample, so each sample's
/// outputs are those of the sample alone (up to summation order). cu = nullptr: B separate
/// sequences of T tokens (the padded layout). The array is the caller's and is copied by the
/// model at the start of a pass.
struct SeqLens {
  const int32_t* cu = nullptr;
  int64_t n = 0;
  bool packed() const { return cu != nullptr; }
};

/// One micro-batch of a forward-only sweep (Transformer::forward_lm_sweep / forward_scalar_sweep):
/// B right-padded sequences of seq_len tokens. tokens, targets: (B, seq_len) int32 (targets: the
/// LM head's, as in forward_lm; unused by the scalar head); out: (B, seq_len) — the log-probs or
/// the scalar values; seqs: the samples packed into the tokens (SeqLens; none: B sequences).
template <typename T>
struct ForwardBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int64_t B = 0, seq_len = 0;
  T* out = nullptr;
  SeqLens seqs = {};
};

}  // namespace rlhf::model

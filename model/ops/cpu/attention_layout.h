// What the CPU training attentions (cpu/attention.cpp, cpu/attention_bf16.cpp) share about a packed
// batch's saved probabilities: where each sample's block starts.
#pragma once

#include <cstdint>
#include <vector>

namespace rlhf::model {

/// Offsets of the saved probabilities of a packed batch (cu_seqlens: n + 1 entries from 0): sample
/// s's block of H·n_s² floats starts at H·Σ_{s'<s} n_s'² (for B rows of T tokens:
/// (b·H + h)·T·T, the (B, H, T, T) layout). n + 1 entries, the last the total.
inline std::vector<int64_t> attention_prob_offsets(const int32_t* cu, int64_t n, int64_t H) {
  std::vector<int64_t> off(size_t(n + 1), 0);
  for (int64_t s = 0; s < n; ++s) {
    const int64_t len = cu[s + 1] - cu[s];
    off[size_t(s + 1)] = off[size_t(s)] + H * len * len;
  }
  return off;
}

}  // namespace rlhf::model

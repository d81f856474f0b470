// Sample packing (--packing_samples; OpenRLHF's name) for the supervised trainers: the rows of a
// right-padded micro-batch laid end to end in one row without their padding, with the samples'
// boundaries for the model (model::SeqLens: block-diagonal causal attention, positions from 0 per
// sample), so a packed forward computes only real tokens (docs/algorithms.md, "Sample packing").
#pragma once

#include <cstdint>
#include <vector>

#include "model/forward_batch.h"

namespace rlhf::rl {

/// One packed row: tokens and targets (Σ len) int32, start[r] the position of row r's token 0,
/// cu = (start..., Σ len) the boundaries (SeqLens::cu).
struct PackedRows {
  std::vector<int32_t> tokens, targets;
  std::vector<int64_t> start;
  std::vector<int32_t> cu;
  int64_t T = 0;  ///< Σ len: the packed row's length
  /// The boundaries as the model takes them (valid while this object lives).
  model::SeqLens seqs() const { return {cu.data(), int64_t(start.size())}; }
};

/// Packs rows r < B of tokens (B, T) (and targets (B, T), or nullptr: none) keeping each row's
/// first len[r] tokens (1 <= len[r] <= T). Throws rlhf::Error on a bad length.
PackedRows pack_rows(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                     const std::vector<int64_t>& len);

}  // namespace rlhf::rl

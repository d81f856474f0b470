// ShardLayout: how ZeRO-3 cuts a model's units over the ranks of train_comm (docs/design.md, "Flat
// parameter units"; Megatron's padding). The model sees only its units (model::ParamLayout:
// tensors, offsets, numel); the shard count, the padding and the shard offsets live here.
#pragma once

#include <cstdint>
#include <vector>

#include "model/layout.h"

namespace rlhf::parallel {

/// A unit's padded size is a multiple of lcm(n_shards, kUnitAlignElems) elements.
inline constexpr int64_t kUnitAlignElems = 128;

/// Unit u of `layout`, padded with zeros to padded_numel(u) = numel rounded up to a multiple of
/// lcm(n_shards, kUnitAlignElems), is split into n_shards equal shards: rank r owns elements
/// [r·S, (r+1)·S) with S = shard_numel(u) = padded_numel(u) / n_shards. Padding elements are zero
/// in weights, gradients and moments, and excluded from norms and optimizer segments. Never
/// "must divide evenly": any rank count works.
class ShardLayout {
 public:
  /// Throws rlhf::Error unless n_shards >= 1.
  ShardLayout(const model::ParamLayout& layout, int n_shards);

  const model::ParamLayout& layout() const { return layout_; }
  int n_shards() const { return n_shards_; }
  int num_units() const { return layout_.num_units(); }
  /// Elements of unit u's padded buffer (what a gather of every shard fills).
  int64_t padded_numel(int u) const { return padded_.at(size_t(u)); }
  /// Elements of each rank's shard of unit u.
  int64_t shard_numel(int u) const { return padded_numel(u) / n_shards_; }
  /// Where rank r's shard of unit u starts in the padded unit (elements).
  int64_t shard_offset(int u, int r) const { return int64_t(r) * shard_numel(u); }
  /// padded_numel(u) for every unit, in order.
  const std::vector<int64_t>& padded_numels() const { return padded_; }
  /// Sum of padded_numel over all units.
  int64_t total_padded() const;
  /// Sum of shard_numel over all units: the elements one rank owns.
  int64_t total_shard() const;

 private:
  model::ParamLayout layout_;
  int n_shards_;
  std::vector<int64_t> padded_;
};

/// One rank's shard of a full unit buffer: shard[i] = full[offset + i] for offset + i < numel, 0
/// past it (the padding). shard: (count); full: (numel) fp32.
void scatter_shard(float* shard, const float* full, int64_t numel, int64_t offset, int64_t count);

}  // namespace rlhf::parallel

#include "parallel/shard_layout.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace rlhf::parallel {

ShardLayout::ShardLayout(const model::ParamLayout& layout, int n_shards)
    : layout_(layout), n_shards_(n_shards) {
  RLHF_CHECK(n_shards >= 1, "number of shards must be >= 1, got {}", n_shards);
  const int64_t align = std::lcm(static_cast<int64_t>(n_shards), kUnitAlignElems);
  for (const model::UnitLayout& u : layout.units())
    padded_.push_back((u.numel + align - 1) / align * align);
}

void scatter_shard(float* shard, const float* full, int64_t numel, int64_t offset, int64_t count) {
  const int64_t real = std::clamp<int64_t>(numel - offset, 0, count);
  if (real > 0) std::copy(full + offset, full + offset + real, shard);
  std::fill(shard + real, shard + count, 0.0f);
}

int64_t ShardLayout::total_padded() const {
  return std::accumulate(padded_.begin(), padded_.end(), int64_t(0));
}

int64_t ShardLayout::total_shard() const {
  return total_padded() / n_shards_;
}

}  // namespace rlhf::parallel

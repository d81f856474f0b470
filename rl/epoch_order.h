// The order in which a trainer visits its data: a fresh seeded permutation per epoch.
#pragma once

#include <cstdint>
#include <vector>

namespace rlhf::rl {

/// The shuffled sample order of each epoch: a permutation of [0, n) drawn from (seed, epoch), the
/// same on every rank and for every rank count (OpenRLHF's DistributedSampler with shuffle).
class EpochOrder {
 public:
  EpochOrder(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  /// The index at global position `pos` (pos / n is the epoch).
  int64_t at(int64_t pos);

 private:
  int64_t n_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace rlhf::rl

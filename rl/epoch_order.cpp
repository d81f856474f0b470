#include "rl/epoch_order.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace rlhf::rl {

int64_t EpochOrder::at(int64_t pos) {
  const int64_t e = pos / n_;
  if (e != epoch_) {
    epoch_ = e;
    order_.resize(static_cast<size_t>(n_));
    std::iota(order_.begin(), order_.end(), 0);
    std::mt19937_64 rng(seed_ * 1000003ull + static_cast<uint64_t>(e));
    std::shuffle(order_.begin(), order_.end(), rng);
  }
  return order_[static_cast<size_t>(pos % n_)];
}

}  // namespace rlhf::rl

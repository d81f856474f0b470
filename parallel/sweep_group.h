// for_each_group: a forward sweep's micro-batches in groups that fit a memory budget, as many
// groups on every rank (shared by the TrainModel implementations of parallel/train_model.cpp and
// parallel/lora_model_cuda.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/comm.h"
#include "parallel/train_model.h"

namespace rlhf::parallel {

/// Calls fn with the batches of [first[g], first[g+1]) for each group of sweep_groups, as many
/// groups on every rank of comm (the largest count; the others split groups or sweep nothing, which
/// still acquires every unit: a ZeRO-3 gather is a collective).
template <typename Fn>
void for_each_group(const std::vector<ForwardBatch>& batches, int64_t bytes_per_token,
                    int64_t budget_bytes, Comm* comm, Fn&& fn) {
  std::vector<size_t> first = sweep_groups(batches, bytes_per_token, budget_bytes);
  if (comm != nullptr && comm->size() > 1) {
    const int64_t mine = int64_t(first.size()) - 1;
    int64_t most = 0;
    comm->all_reduce(&mine, &most, 1, ReduceOp::kMax);
    if (most > mine) first = sweep_groups(batches, bytes_per_token, budget_bytes, most);
  }
  for (size_t g = 0; g + 1 < first.size(); ++g)
    fn(std::vector<ForwardBatch>(batches.begin() + std::ptrdiff_t(first[g]),
                                 batches.begin() + std::ptrdiff_t(first[g + 1])));
}

}  // namespace rlhf::parallel

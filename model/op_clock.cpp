#include "model/op_clock.h"

#include <omp.h>

#include <atomic>

namespace rlhf::model {

namespace {

std::atomic<int64_t> g_ns[int(OpKind::kCount)];

}  // namespace

double op_seconds(OpKind k) {
  return double(g_ns[int(k)].load(std::memory_order_relaxed)) * 1e-9;
}

OpClock::OpClock(OpKind k) : kind_(k), counting_(omp_in_parallel() == 0) {
  if (counting_) t0_ = std::chrono::steady_clock::now();
}

OpClock::~OpClock() {
  if (!counting_) return;
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
          .count();
  g_ns[int(kind_)].fetch_add(int64_t(ns), std::memory_order_relaxed);
}

}  // namespace rlhf::model

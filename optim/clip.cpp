#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace rlhf::optim {

namespace {

constexpr int kLanes = 8;

// Σ x² of one block: lane l sums x[i] for i ≡ l (mod 8) in index order, then lanes 0..7.
double block_sum_of_squares(const float* x, int64_t n) {
  double lane[kLanes] = {};
  const int64_t full = n - n % kLanes;
  for (int64_t i = 0; i < full; i += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      const double xi = static_cast<double>(x[i + l]);
      lane[l] += xi * xi;
    }
  }
  for (int64_t i = full; i < n; ++i) {
    const double xi = static_cast<double>(x[i]);
    lane[i - full] += xi * xi;
  }
  double s = 0;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  return s;
}

}  // namespace

double sum_of_squares(const float* x, int64_t n) {
  RLHF_CHECK(n >= 0, "sum_of_squares: element count must be >= 0, got {}", n);
  const int64_t nblocks = (n + kSumSquaresBlockElems - 1) / kSumSquaresBlockElems;
  if (nblocks <= 1) return block_sum_of_squares(x, n);
  std::vector<double> partial(static_cast<size_t>(nblocks));
#pragma omp parallel for schedule(static) if (nblocks >= 8)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t begin = b * kSumSquaresBlockElems;
    const int64_t len = std::min(kSumSquaresBlockElems, n - begin);
    partial[static_cast<size_t>(b)] = block_sum_of_squares(x + begin, len);
  }
  double s = 0;
  for (double p : partial) s += p;  // block order: independent of the thread count
  return s;
}

double clip_coefficient(double total_norm, double max_norm) {
  if (!(max_norm > 0)) return 1.0;
  if (std::isnan(total_norm)) return total_norm;
  // torch: clip_coef = max_norm / (total_norm + 1e-6); clamp(clip_coef, max=1.0).
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

}  // namespace rlhf::optim

#include "rl/token_budget.h"

#include <algorithm>

#include "core/error.h"

namespace rlhf::rl {

std::vector<std::pair<int64_t, int64_t>> token_budget_runs(const std::vector<int64_t>& len,
                                                           int64_t budget, int64_t min_runs,
                                                           bool packed) {
  RLHF_CHECK(budget >= 1, "token budget {} per micro-batch must be >= 1", budget);
  const int64_t n = int64_t(len.size());
  std::vector<std::pair<int64_t, int64_t>> runs;
  int64_t begin = 0, longest = 0, sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t l = std::max(longest, len[size_t(i)]), s = sum + len[size_t(i)];
    if (i > begin && (packed ? s : (i - begin + 1) * l) > budget) {
      runs.emplace_back(begin, i);
      begin = i;
      longest = sum = len[size_t(i)];
    } else {
      longest = l;
      sum = s;
    }
  }
  if (n > begin) runs.emplace_back(begin, n);
  const int64_t want = std::min(min_runs, n);
  while (int64_t(runs.size()) < want) {
    size_t big = 0;
    for (size_t r = 1; r < runs.size(); ++r)
      if (runs[r].second - runs[r].first > runs[big].second - runs[big].first) big = r;
    const auto [b, e] = runs[big];
    RLHF_ASSERT(e - b >= 2);
    const int64_t mid = b + (e - b + 1) / 2;
    runs[big] = {b, mid};
    runs.insert(runs.begin() + std::ptrdiff_t(big) + 1, {mid, e});
  }
  return runs;
}

std::vector<std::pair<int64_t, int64_t>> count_runs(int64_t n, int64_t per) {
  RLHF_CHECK(per >= 1, "micro-batch size {} must be >= 1", per);
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t a = 0; a < n; a += per) runs.emplace_back(a, std::min(n, a + per));
  return runs;
}

}  // namespace rlhf::rl

#include "rl/packing.h"

#include <algorithm>

#include "core/error.h"

namespace rlhf::rl {

PackedRows pack_rows(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                     const std::vector<int64_t>& len) {
  RLHF_CHECK(int64_t(len.size()) == B, "pack_rows: {} lengths for {} rows", len.size(), B);
  PackedRows p;
  p.cu.push_back(0);
  for (int64_t r = 0; r < B; ++r) {
    const int64_t n = len[size_t(r)];
    RLHF_CHECK(n >= 1 && n <= T, "pack_rows: row {} has length {}, outside [1, {}]", r, n, T);
    p.start.push_back(p.T);
    p.tokens.insert(p.tokens.end(), tokens + r * T, tokens + r * T + n);
    if (targets != nullptr) p.targets.insert(p.targets.end(), targets + r * T, targets + r * T + n);
    p.T += n;
    p.cu.push_back(int32_t(p.T));
  }
  return p;
}

}  // namespace rlhf::rl

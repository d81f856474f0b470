#include "parallel/failure_injection.h"

#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"

namespace rlhf::parallel {

void maybe_inject_failure(const char* point, int rank) {
  const char* env = std::getenv("RLHF_INJECT_FAILURE");
  if (env == nullptr || *env == '\0') return;
  std::string_view all(env);
  while (!all.empty()) {
    size_t comma = all.find(',');
    std::string_view spec = all.substr(0, comma);
    all = comma == std::string_view::npos ? std::string_view() : all.substr(comma + 1);
    if (spec.empty()) continue;
    size_t colon = spec.rfind(':');
    RLHF_CHECK(colon != std::string_view::npos && colon > 0 && colon + 1 < spec.size(),
               "environment variable RLHF_INJECT_FAILURE='{}': expected <point>:<rank>", env);
    std::string_view where = spec.substr(0, colon), who = spec.substr(colon + 1);
    bool any_rank = who == "*";
    int target = -1;
    if (!any_rank) {
      std::string w(who);
      char* end = nullptr;
      long v = std::strtol(w.c_str(), &end, 10);
      RLHF_CHECK(end != w.c_str() && *end == '\0' && v >= 0,
                 "environment variable RLHF_INJECT_FAILURE='{}': rank '{}' is not an integer >= 0 "
                 "or '*'",
                 env, w);
      target = static_cast<int>(v);
    }
    if (where == point && (any_rank || target == rank))
      RLHF_FAIL("injected failure at {} on rank {}", point, rank);
  }
}

}  // namespace rlhf::parallel

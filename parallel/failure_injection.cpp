#include "parallel/failure_injection.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"

namespace rlhf::parallel {

namespace {

// Whether the specs in environment variable `var` name this point and rank.
bool injection_matches(const char* var, const char* point, int rank) {
  const char* env = std::getenv(var);
  if (env == nullptr || *env == '\0') return false;
  std::string_view all(env);
  while (!all.empty()) {
    size_t comma = all.find(',');
    std::string_view spec = all.substr(0, comma);
    all = comma == std::string_view::npos ? std::string_view() : all.substr(comma + 1);
    if (spec.empty()) continue;
    size_t colon = spec.rfind(':');
    RLHF_CHECK(colon != std::string_view::npos && colon > 0 && colon + 1 < spec.size(),
               "environment variable {}='{}': expected <point>:<rank>", var, env);
    std::string_view where = spec.substr(0, colon), who = spec.substr(colon + 1);
    bool any_rank = who == "*";
    int target = -1;
    if (!any_rank) {
      std::string w(who);
      char* end = nullptr;
      long v = std::strtol(w.c_str(), &end, 10);
      RLHF_CHECK(end != w.c_str() && *end == '\0' && v >= 0,
                 "environment variable {}='{}': rank '{}' is not an integer >= 0 or '*'", var, env,
                 w);
      target = static_cast<int>(v);
    }
    if (where == point && (any_rank || target == rank)) return true;
  }
  return false;
}

}  // namespace

void maybe_inject_failure(const char* point, int rank) {
  if (injection_matches("RLHF_INJECT_FAILURE", point, rank))
    RLHF_FAIL("injected failure at {} on rank {}", point, rank);
}

void maybe_inject_stop(const char* point, int rank) {
  if (!injection_matches("RLHF_INJECT_STOP", point, rank)) return;
  std::fprintf(stderr, "[rlhf] injected stop at %s on rank %d (SIGSTOP)\n", point, rank);
  std::fflush(stderr);
  std::raise(SIGSTOP);
}

}  // namespace rlhf::parallel

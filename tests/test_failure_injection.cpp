// maybe_inject_failure: the RLHF_INJECT_FAILURE spec "<point>:<rank>" (single process).
#include <doctest/doctest.h>

#include <cstdlib>

#include "core/error.h"
#include "parallel/failure_injection.h"

using rlhf::parallel::maybe_inject_failure;

TEST_CASE("failure injection: spec parsing and matching") {
  unsetenv("RLHF_INJECT_FAILURE");
  CHECK_NOTHROW(maybe_inject_failure("step", 0));

  setenv("RLHF_INJECT_FAILURE", "step:1", 1);
  CHECK_NOTHROW(maybe_inject_failure("step", 0));
  CHECK_NOTHROW(maybe_inject_failure("other", 1));
  CHECK_THROWS_WITH_AS(maybe_inject_failure("step", 1), "injected failure at step on rank 1",
                       rlhf::Error);

  // Points may contain ':' (the rank is the last field); several specs; '*' = any rank.
  setenv("RLHF_INJECT_FAILURE", "zero3:gather:3,sync:*", 1);
  CHECK_NOTHROW(maybe_inject_failure("zero3:gather", 2));
  CHECK_THROWS_WITH_AS(maybe_inject_failure("zero3:gather", 3),
                       "injected failure at zero3:gather on rank 3", rlhf::Error);
  CHECK_THROWS_AS(maybe_inject_failure("sync", 7), rlhf::Error);

  setenv("RLHF_INJECT_FAILURE", "step", 1);
  CHECK_THROWS_WITH_AS(maybe_inject_failure("step", 0), doctest::Contains("<point>:<rank>"),
                       rlhf::Error);
  setenv("RLHF_INJECT_FAILURE", "step:x", 1);
  CHECK_THROWS_WITH_AS(maybe_inject_failure("step", 0), doctest::Contains("not an integer"),
                       rlhf::Error);
  unsetenv("RLHF_INJECT_FAILURE");
}

// UnitSchedule (the ZeRO-3 unit schedule of both sharded stores) against the static order of
// model/provider.h written out by hand: which gathers are posted when, which copies are dropped
// when, for forward, backward, the tied head's nested acquire and keep_params_for_backward.
#include "parallel/unit_schedule.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "tests/test_util.h"

using rlhf::parallel::UnitSchedule;

namespace {

// A store that records its gathers ("g3": unit 3 posted), waits ("w3") and drops ("d3").
struct Recorder {
  std::vector<std::string> log;
  UnitSchedule<int> s;
  explicit Recorder(int units, bool prefetch = true, bool keep = false)
      : s(units, prefetch, keep) {}
  void begin(bool backward) {
    s.begin_pass(backward, [&](int u) { return post(u); });
  }
  int acquire(int u) {
    return s.acquire(
        u, [&](int v) { return post(v); }, [&](int& g) { log.push_back(fmt::format("w{}", g)); });
  }
  void release(int u) {
    s.release(u, [&](int& g) { log.push_back(fmt::format("d{}", g)); });
  }
  void end(bool backward) {
    s.end_pass(backward, [&](int& g) { log.push_back(fmt::format("d{}", g)); });
  }
  int post(int u) {
    log.push_back(fmt::format("g{}", u));
    return u;
  }
};

using Log = std::vector<std::string>;

}  // namespace

TEST_CASE("unit schedule: forward and backward prefetch the next unit of the static order") {
  Recorder r(3);
  r.begin(false);
  for (int u = 0; u < 3; ++u) {
    CHECK(r.acquire(u) == u);
    r.release(u);
  }
  r.end(false);
  // Unit 0 posted by begin_pass; each acquire posts the next; nothing is left at the end.
  CHECK(r.log == Log{"g0", "w0", "g1", "d0", "w1", "g2", "d1", "w2", "d2"});
  r.log.clear();
  r.begin(true);
  for (int u = 2; u >= 0; --u) {
    r.acquire(u);
    r.release(u);
  }
  r.end(true);
  CHECK(r.log == Log{"g2", "w2", "g1", "d2", "w1", "g0", "d1", "w0", "d0"});
}

TEST_CASE("unit schedule: a nested out-of-order acquire (the tied head) prefetches nothing") {
  Recorder r(3);
  r.begin(false);
  r.acquire(0);
  r.release(0);  // dropped: nobody holds it
  r.acquire(1);
  r.release(1);
  r.acquire(2);              // the head
  CHECK(r.acquire(0) == 0);  // nested: gathered again, the cursor (past the end) does not move
  r.release(0);
  r.release(2);
  r.end(false);
  CHECK(r.log == Log{"g0", "w0", "g1", "d0", "w1", "g2", "d1", "w2", "g0", "w0", "d0", "d2"});
}

TEST_CASE("unit schedule: two holders share one copy; without prefetch only acquires gather") {
  Recorder r(2, false);
  r.begin(false);
  r.acquire(0);
  r.acquire(0);
  r.release(0);
  CHECK(r.s.gathered(0));  // one holder left
  r.release(0);
  CHECK_FALSE(r.s.gathered(0));
  r.end(false);
  CHECK(r.log == Log{"g0", "w0", "w0", "d0"});
}

TEST_CASE("unit schedule: keep_params_for_backward keeps forward's copies until backward ends") {
  Recorder r(2, true, true);
  r.begin(false);
  r.acquire(0);
  r.release(0);
  r.acquire(1);
  r.release(1);
  r.end(false);
  CHECK(r.log == Log{"g0", "w0", "g1", "w1"});  // kept: no drops
  r.log.clear();
  r.begin(true);
  r.acquire(1);
  r.release(1);  // backward: dropped on release
  r.acquire(0);
  r.release(0);
  r.end(true);
  CHECK(r.log == Log{"w1", "d1", "w0", "d0"});  // no second gather
}

// core/memory: the peak resident size follows a large touched allocation and can be reset.
#include "core/memory.h"

#include <doctest/doctest.h>

#include <cstring>
#include <memory>

TEST_CASE("memory: the peak RSS sees a touched 256 MiB buffer, and a reset forgets it") {
  const int64_t n = int64_t(256) << 20;
  const int64_t before = rlhf::peak_rss_bytes();
  REQUIRE(before > 0);
  {
    std::unique_ptr<char[]> buf(new char[size_t(n)]);
    std::memset(buf.get(), 1, size_t(n));  // touch every page
    CHECK(rlhf::rss_bytes() >= n);
    CHECK(rlhf::peak_rss_bytes() >= n);
    CHECK(buf[size_t(n) - 1] == 1);
  }
  if (!rlhf::reset_peak_rss()) {
    MESSAGE("skipped the reset check: /proc/self/clear_refs is not writable here");
    return;
  }
  // After the buffer is gone the peak restarts near the current size, far below the buffer's.
  CHECK(rlhf::peak_rss_bytes() < rlhf::rss_bytes() + n / 2);
}

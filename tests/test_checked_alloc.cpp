// checked_grow on scratch buffers: growing never holds the old and the new storage at once (the
// one-step peak-RSS transient of issue 29, item 8), and never shrinks.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/checked_alloc.h"

using namespace rlhf;

namespace {

/// Bytes live through CountingAllocator, and their high-water mark (one test at a time).
struct LiveBytes {
  static inline int64_t now = 0;
  static inline int64_t peak = 0;
  static void reset() { peak = now; }
};

/// std::allocator that counts the bytes it holds in LiveBytes.
template <typename T>
struct CountingAllocator {
  using value_type = T;
  CountingAllocator() = default;
  template <typename U>
  CountingAllocator(const CountingAllocator<U>&) {}
  T* allocate(size_t n) {
    LiveBytes::now += int64_t(n * sizeof(T));
    if (LiveBytes::now > LiveBytes::peak) LiveBytes::peak = LiveBytes::now;
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, size_t n) {
    LiveBytes::now -= int64_t(n * sizeof(T));
    std::allocator<T>().deallocate(p, n);
  }
  template <typename U>
  bool operator==(const CountingAllocator<U>&) const {
    return true;
  }
};

}  // namespace

TEST_CASE("checked_grow: growing scratch frees the old storage first (peak = the new size)") {
  using Vec = std::vector<float, CountingAllocator<float>>;
  {
    Vec v;
    checked_grow(v, 1000, "scratch");
    CHECK(v.size() == 1000);
    LiveBytes::reset();
    const int64_t before = LiveBytes::now;
    CHECK(before == 1000 * int64_t(sizeof(float)));
    // vector::resize(1100) would allocate the new block (at least 1100 elements; libstdc++ doubles
    // to 2000) while the old 1000 are still live: a peak of >= 2100 elements. Freed first, the
    // peak is the new block alone.
    checked_grow(v, 1100, "scratch");
    CHECK(v.size() == 1100);
    CHECK(LiveBytes::peak == 1100 * int64_t(sizeof(float)));
    CHECK(LiveBytes::now == 1100 * int64_t(sizeof(float)));
    for (float x : v) REQUIRE(x == 0.0f);  // value-initialised, as resize does
    // Never shrinks, and a size it already has allocates nothing.
    LiveBytes::reset();
    checked_grow(v, 10, "scratch");
    checked_grow(v, 1100, "scratch");
    CHECK(v.size() == 1100);
    CHECK(LiveBytes::peak == LiveBytes::now);
  }
  CHECK(LiveBytes::now == 0);
}

TEST_CASE("checked_grow: a size that cannot be allocated names the buffer, v unchanged") {
  std::vector<float> v(16, 1.0f);
  std::string e;
  try {
    checked_grow(v, -1, "activations (decoder layers)");
  } catch (const std::exception& ex) {
    e = ex.what();
  }
  CHECK_MESSAGE(e.find("for activations (decoder layers): negative size") != std::string::npos, e);
  CHECK(v.size() == 16);
  CHECK(v[15] == 1.0f);
}

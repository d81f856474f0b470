// Allocations whose size comes from a model config, a file or a flag (parameter shards, unit
// buffers, engine weights, KV cache, RoPE tables, activations): an allocation that fails becomes an
// rlhf::Error "cannot allocate <N> bytes (<GiB>) for <what>" instead of a bare std::bad_alloc that
// names nothing. Use these at the big allocation sites instead of try/catch copies:
//
//   checked_resize(rope_cos_, P * D / 2, "the RoPE cos table");
//   checked_assign(shard.params, S, 0.0f, fmt::format("unit '{}' parameter shard", u.name));
//   data_ = checked_new_array<float>(n, "the KV cache");          // uninitialised, like new T[n]
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string_view>

#include "core/error.h"

namespace rlhf {

/// Throws rlhf::Error "cannot allocate <count·elem_bytes> bytes (<GiB>) for <what>: <reason>".
[[noreturn]] inline void throw_alloc_error(int64_t count, size_t elem_bytes, std::string_view what,
                                           std::string_view reason) {
  // In long double: count · elem_bytes may not fit in 64 bits (that is one of the reasons).
  const long double bytes = static_cast<long double>(count) * static_cast<long double>(elem_bytes);
  RLHF_FAIL("cannot allocate {:.0f} bytes ({:.2f} GiB: {} elements of {} bytes) for {}: {}",
            static_cast<double>(bytes), static_cast<double>(bytes / (1024.0L * 1024 * 1024)), count,
            elem_bytes, what, reason);
}

namespace detail {
template <typename T>
void check_alloc_count(int64_t n, size_t max_elems, std::string_view what) {
  if (n < 0)
    throw_alloc_error(n, sizeof(T), what, "negative size (an overflowed size computation)");
  if (static_cast<uint64_t>(n) > max_elems)
    throw_alloc_error(n, sizeof(T), what, "more than the address space can hold");
}
}  // namespace detail

/// v.resize(n) (new elements value-initialised), with a failure named as above.
template <typename V>
void checked_resize(V& v, int64_t n, std::string_view what) {
  detail::check_alloc_count<typename V::value_type>(n, v.max_size(), what);
  try {
    v.resize(static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
    throw_alloc_error(n, sizeof(typename V::value_type), what, "out of memory");
  } catch (const std::length_error&) {
    throw_alloc_error(n, sizeof(typename V::value_type), what, "too large for a vector");
  }
}

/// Grows scratch storage v to at least n elements (never shrinks), with a failure named as above.
/// Its contents are NOT kept when it grows: the old storage is released before the new one is
/// allocated, and the n elements are value-initialised. (vector::resize would allocate the new
/// block and copy into it while the old one is still resident: for the GiB-sized activation buffers
/// that is a transient of the old size on the step whose micro-batch is the longest so far, seen as
/// a one-step peak-RSS spike of 6.8 -> 9.2 GiB in GRPO on a 135M model.) A size refused by
/// check_alloc_count leaves v as it was; an allocation that fails leaves it empty.
template <typename V>
void checked_grow(V& v, int64_t n, std::string_view what) {
  if (n >= 0 && static_cast<uint64_t>(n) <= v.size()) return;
  detail::check_alloc_count<typename V::value_type>(n, v.max_size(), what);  // v kept if refused
  V().swap(v);
  checked_resize(v, n, what);
}

/// v.assign(n, value), with a failure named as above.
template <typename V>
void checked_assign(V& v, int64_t n, const typename V::value_type& value, std::string_view what) {
  detail::check_alloc_count<typename V::value_type>(n, v.max_size(), what);
  try {
    v.assign(static_cast<size_t>(n), value);
  } catch (const std::bad_alloc&) {
    throw_alloc_error(n, sizeof(typename V::value_type), what, "out of memory");
  } catch (const std::length_error&) {
    throw_alloc_error(n, sizeof(typename V::value_type), what, "too large for a vector");
  }
}

/// new T[n] (default-initialised: trivial types stay uninitialised, their pages untouched), with a
/// failure named as above.
template <typename T>
std::unique_ptr<T[]> checked_new_array(int64_t n, std::string_view what) {
  detail::check_alloc_count<T>(
      n, static_cast<size_t>(std::numeric_limits<std::ptrdiff_t>::max()) / sizeof(T), what);
  try {
    return std::unique_ptr<T[]>(new T[static_cast<size_t>(n)]);
  } catch (const std::bad_alloc&) {
    throw_alloc_error(n, sizeof(T), what, "out of memory");
  }
}

}  // namespace rlhf

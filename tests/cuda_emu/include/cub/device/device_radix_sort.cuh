// The emulator's stand-in for CUB's device radix sort (only on the include path of .cu files
// compiled for the emulator): SortPairs with CUB's contract (a size query when d_temp_storage is
// null; a stable sort of (key, value) pairs by key bits [begin_bit, end_bit)), done on the host in
// the order of `stream` (arguments checked at the call).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <numeric>
#include <vector>

#include "tests/cuda_emu/runtime.h"

namespace cub {

struct DeviceRadixSort {
  template <typename K, typename V>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const K* d_keys_in,
                               K* d_keys_out, const V* d_values_in, V* d_values_out, int num_items,
                               int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t stream = 0) {
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = 256;
      return cudaSuccess;
    }
    using rlhf::emu::in_device_memory;
    const size_t n = num_items > 0 ? static_cast<size_t>(num_items) : 0;
    if (!rlhf::emu::stream_valid(stream)) return cudaErrorInvalidResourceHandle;
    if (!in_device_memory(d_temp_storage, temp_storage_bytes) ||
        (n > 0 && (!in_device_memory(d_keys_in, n * sizeof(K)) ||
                   !in_device_memory(d_keys_out, n * sizeof(K)) ||
                   !in_device_memory(d_values_in, n * sizeof(V)) ||
                   !in_device_memory(d_values_out, n * sizeof(V)))))
      return rlhf::emu::set_last_error(cudaErrorInvalidValue);
    if (begin_bit < 0 || end_bit > static_cast<int>(sizeof(K) * 8) || begin_bit >= end_bit)
      return rlhf::emu::set_last_error(cudaErrorInvalidValue);
    rlhf::emu::submit(stream, [=] {
      // CUB sorts the key bits as unsigned (signed keys have their sign bit flipped).
      const auto bits = [&](K k) {
        unsigned long long u = static_cast<unsigned long long>(k);
        if constexpr (static_cast<K>(-1) < static_cast<K>(0)) u ^= 1ull << (sizeof(K) * 8 - 1);
        if (sizeof(K) < 8) u &= (1ull << (sizeof(K) * 8)) - 1;
        const int width = end_bit - begin_bit;
        return (u >> begin_bit) & (width >= 64 ? ~0ull : ((1ull << width) - 1));
      };
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return bits(d_keys_in[a]) < bits(d_keys_in[b]); });
      std::vector<K> keys(n);
      std::vector<V> vals(n);
      for (size_t i = 0; i < n; ++i) {
        keys[i] = d_keys_in[order[i]];
        vals[i] = d_values_in[order[i]];
      }
      std::copy(keys.begin(), keys.end(), d_keys_out);
      std::copy(vals.begin(), vals.end(), d_values_out);
    });
    return cudaSuccess;
  }
};

}  // namespace cub

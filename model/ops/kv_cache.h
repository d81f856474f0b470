// Writing and copying rows of a paged KV cache on the GPU (the layout of
// model/ops/attention_decode.h: per layer, K and V of (num_blocks, Hkv, block_size, D); position s
// of a sequence lives in block table[s / block_size], row s % block_size). The CPU engine does the
// same with rollout::KvCache::write / copy_prefix.
#pragma once

#include <cstdint>

#include "model/ops/cuda_types.h"

namespace rlhf::model {

#ifdef RLHF_CUDA
/// One layer's paged KV cache as a writer of token rows sees it (kv_cache_write_cuda's
/// arguments, for the kernels that write rows as they produce them: qkv_rope_split_cuda).
struct KvCacheWrite {
  bf16* k_cache = nullptr;  ///< (num_blocks, Hkv, block_size, D) bf16
  bf16* v_cache = nullptr;
  const int32_t* block_table = nullptr;  ///< row n's blocks at block_table + n·table_stride
  int64_t table_stride = 0;
  int64_t block_size = 0;
};

/// Scatters N rows of keys and values into one layer's cache: row n (k_rows, v_rows (N, Hkv, D)
/// bf16) goes to position pos[n] of the sequence whose block list is block_table + n·table_stride
/// (table_stride = max_blocks for one token per sequence, 0 for N positions of one sequence).
/// k_cache, v_cache (num_blocks, Hkv, block_size, D) bf16; block_table, pos int32 device memory.
/// Block ids and positions are not validated on the device. Throws rlhf::Error on non-positive
/// sizes (N = 0 is a no-op).
void kv_cache_write_cuda(bf16* k_cache, bf16* v_cache, const bf16* k_rows, const bf16* v_rows,
                         const int32_t* block_table, int64_t table_stride, const int32_t* pos,
                         int64_t N, int64_t Hkv, int64_t D, int64_t block_size,
                         cudaStream_t stream);

/// Copies positions [0, n) from the sequence with blocks src (device, ⌈n / block_size⌉ ids) to
/// the one with blocks dst, in `planes` caches of plane_elems elements each starting at `cache`
/// (every layer's K and V in one allocation: planes = 2·L): the n samples of one prompt share one
/// prefill. n = 0 is a no-op.
void kv_cache_copy_prefix_cuda(bf16* cache, int64_t planes, int64_t plane_elems, const int32_t* src,
                               const int32_t* dst, int64_t n, int64_t Hkv, int64_t D,
                               int64_t block_size, cudaStream_t stream);
#endif

}  // namespace rlhf::model

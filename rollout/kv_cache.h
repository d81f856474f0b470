// The KV cache of one generation engine: per layer, the keys and values of the Hkv KV heads of
// every cached position, in fixed-size blocks handed to sequences on demand (vLLM's paged layout,
// read by model::attention_decode_cpu). Sized by a byte budget.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/ops/half.h"

namespace rlhf::rollout {

/// Element type of a host KV cache (--kv_cache_dtype): fp32, or fp16 (IEEE binary16, rounded to
/// nearest even on write and widened exactly on read: half the bytes per position).
enum class KvDtype { kFloat32, kFloat16 };
/// "fp32" | "fp16".
const char* to_string(KvDtype d);
/// "fp32" → kFloat32; "fp16" and "auto" (a CPU engine's default) → kFloat16. Throws rlhf::Error
/// naming any other value.
KvDtype kv_dtype_from_string(const std::string& name);
/// Bytes of one cached element: 4 (fp32) or 2 (fp16); KvCache's element_bytes.
inline int64_t kv_element_bytes(KvDtype d) {
  return d == KvDtype::kFloat16 ? 2 : 4;
}

/// A pool of KV blocks. Block `i` of layer `l` holds positions [0, block_size) of whichever
/// sequence owns it: K at k(l) + i·Hkv·block_size·D, shape (Hkv, block_size, D) — head-major, so
/// one head's rows of a block are contiguous for attention — in fp32 or fp16 (dtype()); V alike.
/// A sequence owns a list of blocks (its block table row); position s lives in its block s /
/// block_size, row s % block_size — the same block ids in every layer.
///
/// Memory: ⌊budget_bytes / bytes_per_block()⌋ blocks, allocated once and left untouched until
/// used (pages are first touched by the sequences that write them; blocks are handed out lowest
/// id first and reused last-freed first, so the touched footprint follows peak use).
class KvCache {
 public:
  /// Throws rlhf::Error if the budget does not hold one block (the message gives the block size
  /// in bytes) or block_size < 1. element_bytes: 4 (fp32) or 2 (fp16 here, bf16 on a GPU).
  /// host_storage = false: block bookkeeping only (ids, counts); the keys and values live
  /// elsewhere (a GPU engine's device cache with the same block ids), k()/v()/write()/
  /// copy_prefix() must not be called.
  KvCache(const model::ModelConfig& config, int64_t budget_bytes, int64_t block_size = 16,
          int64_t element_bytes = 4, bool host_storage = true);

  /// The host storage's element type: kFloat16 when built with element_bytes 2.
  KvDtype dtype() const { return dtype_; }

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  /// Most blocks in use at once since construction (or reset_peak()).
  int64_t peak_used_blocks() const { return peak_used_; }
  void reset_peak() { peak_used_ = used_blocks(); }
  /// Bytes of one position in every layer: 2 (K, V) · L · Hkv · D · element_bytes.
  int64_t bytes_per_token() const { return bytes_per_token_; }
  /// bytes_per_token() · block_size().
  int64_t bytes_per_block() const { return bytes_per_token_ * block_size_; }
  /// num_blocks() · bytes_per_block(): the memory the pool holds.
  int64_t capacity_bytes() const { return num_blocks_ * bytes_per_block(); }
  /// Blocks that `positions` positions need: ⌈positions / block_size⌉.
  int64_t blocks_for(int64_t positions) const {
    return (positions + block_size_ - 1) / block_size_;
  }

  /// Appends `n` free block ids to `out` and marks them used; returns false, allocating nothing,
  /// when fewer than n are free.
  bool allocate(int64_t n, std::vector<int32_t>& out);
  /// Returns blocks to the pool. Throws rlhf::Error on an id that is not in use (double free).
  void release(const std::vector<int32_t>& blocks);

  /// K (or V) of layer l: (num_blocks, Hkv, block_size, D) (model::attention_decode_cpu's layout),
  /// as E = float (dtype() kFloat32) or model::f16 (kFloat16). Throws rlhf::Error for the other E.
  template <typename E>
  const E* k(int64_t layer) const {
    return base<E>() + (2 * layer) * layer_elems_;
  }
  template <typename E>
  const E* v(int64_t layer) const {
    return base<E>() + (2 * layer + 1) * layer_elems_;
  }

  /// Writes positions [pos0, pos0 + n) of the sequence with block list `blocks`, layer l, from
  /// k_rows, v_rows: (n, Hkv, D) each, fp32 (rounded to fp16 for an fp16 cache).
  void write(int64_t layer, const int32_t* blocks, int64_t pos0, int64_t n, const float* k_rows,
             const float* v_rows);
  /// Copies positions [0, n) of every layer from the sequence with blocks `src` to the one with
  /// blocks `dst` (n samples of one prompt: prefill once, copy its rows).
  void copy_prefix(const int32_t* src, const int32_t* dst, int64_t n);

  /// Sleep (--vllm_enable_sleep): frees the host storage of the keys and values, keeping the block
  /// bookkeeping (ids, free list, peak). Returns the bytes freed: capacity_bytes() when there was
  /// host storage, else 0 (a bookkeeping-only cache, or already released). Throws rlhf::Error
  /// while any block is in use (a sequence in flight would lose its keys and values). Until
  /// restore_storage(), k()/v()/write()/copy_prefix() must not be called.
  int64_t release_storage();
  /// Allocates the host storage again after release_storage() (uninitialised, as at
  /// construction: every block is free, so nothing cached is lost). Returns the bytes allocated
  /// (0 when nothing had been released). Throws rlhf::Error when the allocation fails.
  int64_t restore_storage();
  /// Whether the host storage is released (release_storage() without restore_storage()).
  bool storage_released() const { return released_; }

 private:
  void allocate_storage();
  int64_t L_, Hkv_, D_, row_elems_;  // layers, KV heads, head_dim, Hkv·D
  template <typename E>
  const E* base() const;
  int64_t block_size_, num_blocks_, layer_elems_, bytes_per_token_;
  KvDtype dtype_ = KvDtype::kFloat32;
  // (L, 2, num_blocks, Hkv, block_size, D), uninitialised: one of the two, by dtype_.
  std::unique_ptr<float[]> data_;
  std::unique_ptr<model::f16[]> data16_;
  std::vector<int32_t> free_;  // stack of free ids; back() is handed out next
  std::vector<uint8_t> in_use_;
  int64_t peak_used_ = 0;
  bool released_ = false;  // release_storage() freed the host storage
};

}  // namespace rlhf::rollout

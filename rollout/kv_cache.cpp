#include "rollout/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "core/checked_alloc.h"
#include "core/error.h"

namespace rlhf::rollout {

const char* to_string(KvDtype d) {
  return d == KvDtype::kFloat16 ? "fp16" : "fp32";
}

KvDtype kv_dtype_from_string(const std::string& name) {
  if (name == "fp32") return KvDtype::kFloat32;
  RLHF_CHECK(name == "fp16" || name == "auto",
             "unknown KV cache dtype '{}' (expected auto, fp16 or fp32)", name);
  return KvDtype::kFloat16;
}

template <>
const float* KvCache::base<float>() const {
  RLHF_CHECK(data_ != nullptr, "KV cache: fp32 keys/values asked of a {} cache", to_string(dtype_));
  return data_.get();
}

template <>
const model::f16* KvCache::base<model::f16>() const {
  RLHF_CHECK(data16_ != nullptr, "KV cache: fp16 keys/values asked of a {} cache",
             to_string(dtype_));
  return data16_.get();
}

KvCache::KvCache(const model::ModelConfig& config, int64_t budget_bytes, int64_t block_size,
                 int64_t element_bytes, bool host_storage)
    : L_(config.num_hidden_layers),
      Hkv_(config.num_key_value_heads),
      D_(config.D()),
      row_elems_(config.num_key_value_heads * config.D()),
      block_size_(block_size) {
  RLHF_CHECK(block_size >= 1, "KV cache: block_size must be >= 1, got {}", block_size);
  RLHF_CHECK(element_bytes == 2 || element_bytes == 4,
             "KV cache: element_bytes must be 4 (fp32) or 2 (fp16 on the host, bf16 on a GPU), "
             "got {}",
             element_bytes);
  dtype_ = element_bytes == 2 ? KvDtype::kFloat16 : KvDtype::kFloat32;
  bytes_per_token_ = 2 * L_ * row_elems_ * element_bytes;
  num_blocks_ = budget_bytes / bytes_per_block();
  RLHF_CHECK(num_blocks_ >= 1,
             "KV cache: a budget of {} bytes holds no block of {} positions ({} bytes = 2 x {} "
             "layers x {} KV heads x head_dim {} x {} bytes per position)\nhint: raise "
             "{}",
             budget_bytes, block_size_, bytes_per_block(), L_, config.num_key_value_heads,
             config.D(), element_bytes,
             host_storage ? "--gen_kv_cache_mb" : "--vllm_gpu_memory_utilization");
  RLHF_CHECK(num_blocks_ <= INT32_MAX, "KV cache: {} blocks exceed the int32 block ids",
             num_blocks_);
  layer_elems_ = num_blocks_ * block_size_ * row_elems_;
  if (host_storage) allocate_storage();
  checked_resize(free_, num_blocks_, "the KV cache's block list");
  for (int64_t i = 0; i < num_blocks_; ++i) free_[size_t(i)] = int32_t(num_blocks_ - 1 - i);
  checked_assign(in_use_, num_blocks_, 0, "the KV cache's block list");
}

void KvCache::allocate_storage() {
  // new T[] leaves the memory uninitialised: pages are touched only when a block is written.
  const std::string what = fmt::format(
      "the KV cache ({} blocks of {} positions in {}; "
      "--gen_kv_cache_mb)",
      num_blocks_, block_size_, to_string(dtype_));
  if (dtype_ == KvDtype::kFloat32) data_ = checked_new_array<float>(2 * L_ * layer_elems_, what);
  if (dtype_ == KvDtype::kFloat16)
    data16_ = checked_new_array<model::f16>(2 * L_ * layer_elems_, what);
}

int64_t KvCache::release_storage() {
  RLHF_CHECK(used_blocks() == 0,
             "KV cache: cannot free the storage while {} block(s) hold sequences in flight "
             "(sleep needs every sequence finished)",
             used_blocks());
  if (data_ == nullptr && data16_ == nullptr) return 0;
  data_.reset();
  data16_.reset();
  released_ = true;
  return capacity_bytes();
}

int64_t KvCache::restore_storage() {
  if (!released_) return 0;
  allocate_storage();
  released_ = false;
  return capacity_bytes();
}

bool KvCache::allocate(int64_t n, std::vector<int32_t>& out) {
  RLHF_ASSERT(n >= 0);
  if (n > free_blocks()) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = free_.back();
    free_.pop_back();
    in_use_[size_t(id)] = 1;
    out.push_back(id);
  }
  peak_used_ = std::max(peak_used_, used_blocks());
  return true;
}

void KvCache::release(const std::vector<int32_t>& blocks) {
  for (int32_t id : blocks) {
    RLHF_CHECK(id >= 0 && id < num_blocks_ && in_use_[size_t(id)],
               "KV cache: releasing block {} that is not in use", id);
    in_use_[size_t(id)] = 0;
    free_.push_back(id);
  }
}

void KvCache::write(int64_t layer, const int32_t* blocks, int64_t pos0, int64_t n,
                    const float* k_rows, const float* v_rows) {
  const int64_t ko = (2 * layer) * layer_elems_, vo = (2 * layer + 1) * layer_elems_;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = pos0 + i;
    // Head h of position s: block blocks[s / bs], head-major inside the block.
    const int64_t base =
        int64_t(blocks[s / block_size_]) * block_size_ * row_elems_ + (s % block_size_) * D_;
    for (int64_t h = 0; h < Hkv_; ++h) {
      const int64_t off = base + h * block_size_ * D_;
      const float* kr = k_rows + i * row_elems_ + h * D_;
      const float* vr = v_rows + i * row_elems_ + h * D_;
      if (dtype_ == KvDtype::kFloat16) {
        model::float_to_f16_n(data16_.get() + ko + off, kr, D_);
        model::float_to_f16_n(data16_.get() + vo + off, vr, D_);
      } else {
        std::memcpy(data_.get() + ko + off, kr, sizeof(float) * size_t(D_));
        std::memcpy(data_.get() + vo + off, vr, sizeof(float) * size_t(D_));
      }
    }
  }
}

void KvCache::copy_prefix(const int32_t* src, const int32_t* dst, int64_t n) {
  const int64_t block_elems = block_size_ * row_elems_, head_elems = block_size_ * D_;
  const size_t es = dtype_ == KvDtype::kFloat16 ? sizeof(model::f16) : sizeof(float);
  char* data = dtype_ == KvDtype::kFloat16 ? reinterpret_cast<char*>(data16_.get())
                                           : reinterpret_cast<char*>(data_.get());
  for (int64_t l = 0; l < 2 * L_; ++l) {  // K and V of every layer
    char* base = data + size_t(l * layer_elems_) * es;
    for (int64_t s0 = 0; s0 < n; s0 += block_size_) {
      const int64_t rows = std::min(block_size_, n - s0);
      char* d = base + size_t(int64_t(dst[s0 / block_size_]) * block_elems) * es;
      const char* s = base + size_t(int64_t(src[s0 / block_size_]) * block_elems) * es;
      if (rows == block_size_) {
        std::memcpy(d, s, es * size_t(block_elems));
      } else {  // a partial last block: the first `rows` rows of each head
        for (int64_t h = 0; h < Hkv_; ++h)
          std::memcpy(d + size_t(h * head_elems) * es, s + size_t(h * head_elems) * es,
                      es * size_t(rows * D_));
      }
    }
  }
}

}  // namespace rlhf::rollout

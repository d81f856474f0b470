// KV cache: byte sizing, allocation within the budget, release and reuse, double free, and the
// row addressing of write / copy_prefix (checked through the documented layout).
#include "rollout/kv_cache.h"

#include <vector>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

model::ModelConfig small_config() {
  model::ModelConfig c;
  c.hidden_size = 24;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;  // D = 6, Hkv·D = 12
  c.num_hidden_layers = 3;
  c.intermediate_size = 40;
  c.vocab_size = 50;
  return c;
}

// Element (layer, K or V, position s, j) of a sequence with block list `blocks`, j = h·D + d:
// head-major blocks (Hkv, block_size, D), D = 6.
float at(const rollout::KvCache& kv, int64_t layer, bool is_v, const std::vector<int32_t>& blocks,
         int64_t s, int64_t j) {
  const int64_t D = 6, Hkv = 2, bs = kv.block_size();
  const float* base = is_v ? kv.v(layer) : kv.k(layer);
  return base[((int64_t(blocks[size_t(s / bs)]) * Hkv + j / D) * bs + s % bs) * D + j % D];
}

}  // namespace

TEST_CASE("KV cache: blocks from the byte budget, allocation never exceeds it") {
  const auto cfg = small_config();
  const int64_t per_token = 2 * 3 * 12 * 4;  // K and V, 3 layers, Hkv·D = 12, fp32
  const int64_t budget = 10 * 4 * per_token + per_token * 3;  // 10 blocks of 4 and a remainder
  rollout::KvCache kv(cfg, budget, 4);
  CHECK(kv.bytes_per_token() == per_token);
  CHECK(kv.bytes_per_block() == 4 * per_token);
  CHECK(kv.num_blocks() == 10);
  CHECK(kv.capacity_bytes() <= budget);
  CHECK(kv.blocks_for(1) == 1);
  CHECK(kv.blocks_for(4) == 1);
  CHECK(kv.blocks_for(5) == 2);

  std::vector<int32_t> a, b, c;
  CHECK(kv.allocate(6, a));
  CHECK(kv.free_blocks() == 4);
  CHECK_FALSE(kv.allocate(5, b));  // all or nothing
  CHECK(b.empty());
  CHECK(kv.free_blocks() == 4);
  CHECK(kv.allocate(4, b));
  CHECK(kv.free_blocks() == 0);
  CHECK(kv.peak_used_blocks() == 10);
  std::vector<int32_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  for (int32_t i = 0; i < 10; ++i) CHECK(all[size_t(i)] == i);  // distinct ids 0..9
  kv.release(a);
  CHECK(kv.free_blocks() == 6);
  CHECK_THROWS_AS(kv.release(a), Error);  // double free
  CHECK(kv.allocate(6, c));
  kv.release(b);
  kv.release(c);
  CHECK(kv.used_blocks() == 0);
}

TEST_CASE("KV cache: a budget below one block is a clear error") {
  CHECK_THROWS_WITH_AS(rollout::KvCache(small_config(), 100, 16),
                       doctest::Contains("--gen_kv_cache_mb"), Error);
  CHECK_THROWS_AS(rollout::KvCache(small_config(), 1 << 20, 0), Error);
}

TEST_CASE("KV cache: write and copy_prefix address rows through the block lists") {
  rollout::KvCache kv(small_config(), 1 << 20, 3);
  std::vector<int32_t> src, dst, other;
  REQUIRE(kv.allocate(2, other));  // interleave owners so block ids are not contiguous
  REQUIRE(kv.allocate(4, src));
  REQUIRE(kv.allocate(4, dst));
  const int64_t n = 11, row = 12;
  for (int64_t l = 0; l < 3; ++l) {
    auto k = test::random_vec<float>(n * row, 10 + l);
    auto v = test::random_vec<float>(n * row, 20 + l);
    kv.write(l, src.data(), 0, 7, k.data(), v.data());  // two writes: [0, 7) and [7, 11)
    kv.write(l, src.data(), 7, 4, k.data() + 7 * row, v.data() + 7 * row);
    for (int64_t s = 0; s < n; ++s)
      for (int64_t j = 0; j < row; ++j) {
        REQUIRE(at(kv, l, false, src, s, j) == k[size_t(s * row + j)]);
        REQUIRE(at(kv, l, true, src, s, j) == v[size_t(s * row + j)]);
      }
  }
  kv.copy_prefix(src.data(), dst.data(), n);
  for (int64_t l = 0; l < 3; ++l)
    for (int64_t s = 0; s < n; ++s)
      for (int64_t j = 0; j < row; ++j) {
        REQUIRE(at(kv, l, false, dst, s, j) == at(kv, l, false, src, s, j));
        REQUIRE(at(kv, l, true, dst, s, j) == at(kv, l, true, src, s, j));
      }
}

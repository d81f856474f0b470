// KV cache: byte sizing, allocation within the budget, release and reuse, double free, and the
// row addressing of write / copy_prefix (checked through the documented layout).
#include "rollout/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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
  const int64_t i = ((int64_t(blocks[size_t(s / bs)]) * Hkv + j / D) * bs + s % bs) * D + j % D;
  if (kv.dtype() == rollout::KvDtype::kFloat16)
    return model::f16_to_float((is_v ? kv.v<model::f16>(layer) : kv.k<model::f16>(layer))[i]);
  return (is_v ? kv.v<float>(layer) : kv.k<float>(layer))[i];
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

TEST_CASE("KV cache dtype names: --kv_cache_dtype's values, anything else refused by name") {
  CHECK(rollout::kv_dtype_from_string("fp32") == rollout::KvDtype::kFloat32);
  CHECK(rollout::kv_dtype_from_string("fp16") == rollout::KvDtype::kFloat16);
  CHECK(rollout::kv_dtype_from_string("auto") == rollout::KvDtype::kFloat16);
  CHECK_THROWS_WITH_AS(rollout::kv_dtype_from_string("bf16"), doctest::Contains("'bf16'"), Error);
  CHECK(rollout::kv_element_bytes(rollout::KvDtype::kFloat16) == 2);
  CHECK(rollout::kv_element_bytes(rollout::KvDtype::kFloat32) == 4);
}

TEST_CASE("KV cache: a budget below one block is a clear error") {
  CHECK_THROWS_WITH_AS(rollout::KvCache(small_config(), 100, 16),
                       doctest::Contains("--gen_kv_cache_mb"), Error);
  CHECK_THROWS_AS(rollout::KvCache(small_config(), 1 << 20, 0), Error);
}

TEST_CASE("KV cache: write and copy_prefix address rows through the block lists") {
  for (const int64_t es : {4, 2}) {  // fp32, fp16
    rollout::KvCache kv(small_config(), 1 << 20, 3, es);
    INFO("cache " << rollout::to_string(kv.dtype()));
    CHECK(kv.dtype() == (es == 2 ? rollout::KvDtype::kFloat16 : rollout::KvDtype::kFloat32));
    CHECK(kv.bytes_per_token() == 2 * 3 * 12 * es);
    // The stored value: the float itself, or its fp16 rounding.
    auto stored = [&](float x) {
      return es == 2 ? model::f16_to_float(model::float_to_f16(x)) : x;
    };
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
          REQUIRE(at(kv, l, false, src, s, j) == stored(k[size_t(s * row + j)]));
          REQUIRE(at(kv, l, true, src, s, j) == stored(v[size_t(s * row + j)]));
          if (es == 2)  // fp16 keeps 11 significant bits
            REQUIRE(std::fabs(at(kv, l, false, src, s, j) - k[size_t(s * row + j)]) <=
                    std::fabs(k[size_t(s * row + j)]) * 0x1p-11f);
        }
    }
    kv.copy_prefix(src.data(), dst.data(), n);
    for (int64_t l = 0; l < 3; ++l)
      for (int64_t s = 0; s < n; ++s)
        for (int64_t j = 0; j < row; ++j) {
          REQUIRE(at(kv, l, false, dst, s, j) == at(kv, l, false, src, s, j));
          REQUIRE(at(kv, l, true, dst, s, j) == at(kv, l, true, src, s, j));
        }
    // The other element type is refused by name.
    if (es == 2)
      CHECK_THROWS_WITH_AS(kv.k<float>(0), doctest::Contains("fp16 cache"), Error);
    else
      CHECK_THROWS_WITH_AS(kv.k<model::f16>(0), doctest::Contains("fp32 cache"), Error);
  }
}

TEST_CASE("fp16 conversion: round to nearest even, subnormals, range, as binary16 defines") {
  using model::f16;
  using model::f16_to_float;
  using model::float_to_f16;
  // Every binary16 value widens exactly and converts back to itself (NaNs stay NaN).
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float x = f16_to_float(f16{uint16_t(b)});
    if (std::isnan(x)) {
      CHECK(std::isnan(f16_to_float(float_to_f16(x))));
      continue;
    }
    REQUIRE(float_to_f16(x).bits == b);
  }
  // Closed forms: 1 + 2^-11 is a tie between 1 and 1 + 2^-10 (goes to even: 1); 1 + 3·2^-11
  // goes up; 65504 is the largest finite; 65520 rounds to inf; 2^-24 is the smallest subnormal
  // and 2^-25 a tie to 0.
  CHECK(float_to_f16(1.0f + 0x1p-11f).bits == 0x3C00u);
  CHECK(float_to_f16(1.0f + 3 * 0x1p-11f).bits == 0x3C02u);
  CHECK(float_to_f16(65504.0f).bits == 0x7BFFu);
  CHECK(float_to_f16(65520.0f).bits == 0x7C00u);
  CHECK(float_to_f16(-65520.0f).bits == 0xFC00u);
  CHECK(float_to_f16(0x1p-24f).bits == 0x0001u);
  CHECK(float_to_f16(0x1p-25f).bits == 0x0000u);
  CHECK(float_to_f16(3 * 0x1p-25f).bits == 0x0002u);
  CHECK(f16_to_float(f16{0x3555u}) == doctest::Approx(1.0 / 3).epsilon(1e-3));
  // The portable conversions (builds without F16C) agree with these bit for bit: every binary16
  // value, and floats spread over the whole range (random bit patterns, so ties and subnormals).
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float x = f16_to_float(f16{uint16_t(b)}),
                y = model::f16_to_float_portable(f16{uint16_t(b)});
    if (std::isnan(x) && std::isnan(y)) continue;  // F16C quiets a signalling NaN: NaN either way
    REQUIRE(std::memcmp(&x, &y, 4) == 0);
  }
  uint64_t state = 12345;
  for (int i = 0; i < 2000000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t bits = uint32_t(state >> 32);
    if (i % 4 == 0)  // exponents 2^-31 .. 2^16: fp16's subnormals, normals and overflow
      bits = (bits & 0x807FFFFFu) | (uint32_t(96 + (i / 4) % 48) << 23);
    float x;
    std::memcpy(&x, &bits, 4);
    if (std::isnan(x)) continue;
    REQUIRE(model::float_to_f16_portable(x).bits == float_to_f16(x).bits);
  }
  std::vector<float> xs = test::random_vec<float>(37, 5);
  std::vector<f16> hs(xs.size());
  model::float_to_f16_n(hs.data(), xs.data(), int64_t(xs.size()));  // vector body + scalar tail
  for (size_t i = 0; i < xs.size(); ++i) CHECK(hs[i].bits == float_to_f16(xs[i]).bits);
}

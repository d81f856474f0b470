// Decode attention over a paged KV cache: against attention_forward_cpu on the whole prefix (its
// last row, and every row of a sequence), float and double, ragged batches, several block sizes
// (1, odd, 16, one contiguous block per sequence), shuffled block ids, NaN in unused blocks,
// batch and thread-count invariance, and the argument checks.
#include "model/ops/attention_decode.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/ops/attention.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

using test::ScopedThreads;

struct Case {
  std::vector<int32_t> lens;  // per sequence
  int64_t H, Hkv, D, block_size;
  std::string name() const {
    std::string l;
    for (int32_t n : lens) l += fmt::format("{}{}", l.empty() ? "" : ",", n);
    return fmt::format("attention_decode(lens=[{}],H={},Hkv={},D={},block_size={})", l, H, Hkv, D,
                       block_size);
  }
};

// A batch laid out both ways: whole sequences (for attention_forward_cpu) and a paged cache of
// head-major blocks (num_blocks, Hkv, block_size, D) with block ids handed out in a shuffled order.
// Unused cache rows hold NaN: reading one would show.
template <typename T>
struct Batch {
  int64_t B, H, Hkv, D, bs, max_blocks, num_blocks;
  std::vector<std::vector<T>> q, k, v;  // per sequence: (n, H, D), (n, Hkv, D), (n, Hkv, D)
  std::vector<T> k_cache, v_cache;
  std::vector<int32_t> table, lens;

  Batch(const Case& c, uint64_t seed)
      : B(int64_t(c.lens.size())), H(c.H), Hkv(c.Hkv), D(c.D), bs(c.block_size) {
    lens = c.lens;
    const int64_t max_n = *std::max_element(lens.begin(), lens.end());
    max_blocks = (max_n + bs - 1) / bs;
    num_blocks = B * max_blocks + 3;  // a few blocks nobody owns
    std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(size_t(B * max_blocks), -1);  // entries past a sequence's blocks: never read
    const T nan = std::numeric_limits<T>::quiet_NaN();
    k_cache.assign(size_t(num_blocks * bs * Hkv * D), nan);
    v_cache.assign(size_t(num_blocks * bs * Hkv * D), nan);
    size_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = lens[size_t(b)];
      q.push_back(test::random_vec<T>(n * H * D, seed + 10 * b + 1, -2, 2));
      k.push_back(test::random_vec<T>(n * Hkv * D, seed + 10 * b + 2, -2, 2));
      v.push_back(test::random_vec<T>(n * Hkv * D, seed + 10 * b + 3));
      for (int64_t i = 0; i < (n + bs - 1) / bs; ++i)
        table[size_t(b * max_blocks + i)] = ids[next++];
      for (int64_t s = 0; s < n; ++s) {  // head-major blocks: (Hkv, bs, D)
        const int64_t blk = table[size_t(b * max_blocks + s / bs)];
        for (int64_t g = 0; g < Hkv; ++g) {
          const size_t dst = size_t(((blk * Hkv + g) * bs + s % bs) * D);
          std::copy_n(k.back().begin() + (s * Hkv + g) * D, D, k_cache.begin() + dst);
          std::copy_n(v.back().begin() + (s * Hkv + g) * D, D, v_cache.begin() + dst);
        }
      }
    }
  }
  // The current token's queries: row n−1 of each sequence, (B, H, D).
  std::vector<T> last_q() const {
    std::vector<T> out;
    for (int64_t b = 0; b < B; ++b)
      out.insert(out.end(), q[size_t(b)].end() - H * D, q[size_t(b)].end());
    return out;
  }
  void decode(T* out, const T* qq, const int32_t* lens_override = nullptr) const {
    model::attention_decode_cpu(out, qq, k_cache.data(), v_cache.data(), table.data(),
                                lens_override ? lens_override : lens.data(), B, H, Hkv, D,
                                num_blocks, bs, max_blocks);
  }
  // attention_forward_cpu on sequence b alone: (n, H, D).
  std::vector<T> full(int64_t b) const {
    const int64_t n = lens[size_t(b)];
    std::vector<T> out(size_t(n * H * D)), att(size_t(H * n * n));
    model::attention_forward_cpu(out.data(), att.data(), q[size_t(b)].data(), k[size_t(b)].data(),
                                 v[size_t(b)].data(), int64_t(1), n, H, Hkv, D);
    return out;
  }
};

template <typename T>
void check_case(const Case& c, double tol) {
  Batch<T> bt(c, 17);
  const auto qq = bt.last_q();
  std::vector<T> out(size_t(bt.B * c.H * c.D), T(99));
  bt.decode(out.data(), qq.data());
  for (int64_t b = 0; b < bt.B; ++b) {
    const auto ref = bt.full(b);
    const T* last = ref.data() + (bt.lens[size_t(b)] - 1) * c.H * c.D;
    auto cmp = test::compare_arrays(out.data() + b * c.H * c.D, last, c.H * c.D);
    INFO(cmp.summary(c.name() + fmt::format(" {} seq {}", sizeof(T) == 4 ? "float" : "double", b)));
    CHECK(cmp.finite);
    CHECK(cmp.max_abs_err <= tol);
  }
}

const Case kCases[] = {
    {{1, 5, 17, 33, 64}, 6, 2, 48, 16},  // stories-like heads with GQA, ragged lengths
    {{7, 3, 11}, 4, 1, 6, 3},            // odd: multi-query, block size 3
    {{13, 2}, 3, 3, 5, 1},               // plain multi-head, prime D, one position per block
    {{40, 9, 1}, 6, 3, 8, 40},           // contiguous: one block holds a whole sequence
    {{100}, 2, 1, 16, 16},               // one long sequence, partial last block
    {{20, 7}, 2, 1, 136, 5},             // D > 128: the portable path in float too
    {{18, 33}, 4, 2, 128, 16},           // Llama's head_dim, exactly 8 chunks
};

}  // namespace

TEST_CASE("attention_decode equals the last row of attention_forward on the whole prefix") {
  for (const Case& c : kCases) {
    check_case<double>(c, 1e-13);
    check_case<float>(c, 5e-6);  // exp_fast and float sums: a few float ulps of O(1) values
  }
}

TEST_CASE(
    "attention_decode over an fp16 cache equals the exact kernel on the rounded keys/values") {
  // The fp16 cache of a batch (NaN rows stay NaN); the double kernel on the same fp16 values
  // widened to double is the reference, so only the float kernel's own rounding remains. And the
  // fp16 path reads the same rows as the float one: the double kernel over the fp16 cache equals
  // it to 1e-13.
  for (const Case& c : kCases) {
    Batch<double> bd(c, 31);
    Batch<float> bf(c, 31);
    std::vector<model::f16> k16(bf.k_cache.size()), v16(bf.v_cache.size());
    model::float_to_f16_n(k16.data(), bf.k_cache.data(), int64_t(k16.size()));
    model::float_to_f16_n(v16.data(), bf.v_cache.data(), int64_t(v16.size()));
    for (size_t i = 0; i < k16.size(); ++i) {  // the reference: the rounded values, exactly
      bd.k_cache[i] = model::f16_to_float(k16[i]);
      bd.v_cache[i] = model::f16_to_float(v16[i]);
    }
    const auto qd = bd.last_q();
    std::vector<float> qf(qd.begin(), qd.end());
    const size_t n = size_t(bd.B * c.H * c.D);
    std::vector<double> ref(n), out_d(n);
    std::vector<float> out_f(n, 99.0f);
    bd.decode(ref.data(), qd.data());
    model::attention_decode_cpu(out_f.data(), qf.data(), k16.data(), v16.data(), bf.table.data(),
                                bf.lens.data(), bf.B, c.H, c.Hkv, c.D, bf.num_blocks, c.block_size,
                                bf.max_blocks);
    model::attention_decode_cpu(out_d.data(), qd.data(), k16.data(), v16.data(), bd.table.data(),
                                bd.lens.data(), bd.B, c.H, c.Hkv, c.D, bd.num_blocks, c.block_size,
                                bd.max_blocks);
    std::vector<double> out_fd(out_f.begin(), out_f.end());
    auto cf = test::compare_arrays(out_fd.data(), ref.data(), int64_t(n));
    auto cd = test::compare_arrays(out_d.data(), ref.data(), int64_t(n));
    INFO(cf.summary(c.name() + " fp16 cache, float"));
    INFO(cd.summary(c.name() + " fp16 cache, double"));
    CHECK(cf.finite);
    CHECK(cf.max_abs_err <= 5e-6);
    CHECK(cd.max_abs_err <= 1e-13);
    // And against the unrounded fp32 cache, the difference is fp16's rounding of O(1) values.
    std::vector<float> out32(n);
    bf.decode(out32.data(), qf.data());
    std::vector<double> o32(out32.begin(), out32.end());
    auto c32 = test::compare_arrays(out_fd.data(), o32.data(), int64_t(n));
    INFO(c32.summary(c.name() + " fp16 vs fp32 cache"));
    CHECK(c32.max_abs_err <= 5e-3);
    CHECK(c32.max_abs_err > 0);  // the cache really is fp16
  }
}

TEST_CASE("attention_decode at every length equals every row of attention_forward") {
  // One sequence of 37 positions (blocks of 8); the decode at length t reads positions < t only,
  // so the cache can hold all 37 throughout.
  const Case c{{37}, 4, 2, 12, 8};
  Batch<double> bt(c, 5);
  const auto ref = bt.full(0);
  std::vector<double> out(size_t(c.H * c.D));
  for (int32_t t = 1; t <= 37; ++t) {
    bt.decode(out.data(), bt.q[0].data() + (t - 1) * c.H * c.D, &t);
    auto cmp = test::compare_arrays(out.data(), ref.data() + (t - 1) * c.H * c.D, c.H * c.D);
    INFO(cmp.summary(fmt::format("{} at length {}", c.name(), t)));
    CHECK(cmp.max_abs_err <= 1e-13);
  }
}

TEST_CASE("attention_decode: a sequence's output does not depend on its batch or thread count") {
  const Case c{{29, 3, 64, 17, 8, 41}, 6, 2, 16, 4};
  Batch<float> bt(c, 23);
  const auto qq = bt.last_q();
  const int64_t row = c.H * c.D;
  std::vector<float> all(size_t(bt.B * row)), all1(size_t(bt.B * row));
  bt.decode(all.data(), qq.data());
  {
    const ScopedThreads one(1);
    bt.decode(all1.data(), qq.data());
  }
  CHECK(std::memcmp(all.data(), all1.data(), sizeof(float) * bt.B * row) == 0);
  // Sequence 3 alone: its own table row and length, as a batch of one.
  std::vector<float> one(static_cast<size_t>(row));
  model::attention_decode_cpu(one.data(), qq.data() + 3 * row, bt.k_cache.data(), bt.v_cache.data(),
                              bt.table.data() + 3 * bt.max_blocks, bt.lens.data() + 3, 1, c.H,
                              c.Hkv, c.D, bt.num_blocks, c.block_size, bt.max_blocks);
  CHECK(std::memcmp(one.data(), all.data() + 3 * row, sizeof(float) * row) == 0);
}

TEST_CASE("attention_decode rejects bad lengths, block ids and head counts") {
  const Case c{{5, 9}, 4, 2, 8, 4};
  Batch<float> bt(c, 3);
  const auto qq = bt.last_q();
  std::vector<float> out(size_t(2 * c.H * c.D));
  int32_t lens[2] = {5, 13};  // 13 > max_blocks (3) x block_size (4) = 12
  CHECK_THROWS_AS(bt.decode(out.data(), qq.data(), lens), Error);
  lens[1] = 0;
  CHECK_THROWS_AS(bt.decode(out.data(), qq.data(), lens), Error);
  auto bad = bt.table;
  bad[1] = int32_t(bt.num_blocks);  // sequence 0 uses 2 blocks: entry 1 is read
  CHECK_THROWS_AS(model::attention_decode_cpu(out.data(), qq.data(), bt.k_cache.data(),
                                              bt.v_cache.data(), bad.data(), bt.lens.data(), 2, c.H,
                                              c.Hkv, c.D, bt.num_blocks, 4, bt.max_blocks),
                  Error);
  CHECK_THROWS_AS(
      model::attention_decode_cpu(out.data(), qq.data(), bt.k_cache.data(), bt.v_cache.data(),
                                  bt.table.data(), bt.lens.data(), 2, int64_t(4), int64_t(3), c.D,
                                  bt.num_blocks, 4, bt.max_blocks),
      Error);
}

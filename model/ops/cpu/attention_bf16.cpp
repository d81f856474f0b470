// The bf16-product attention of model/ops/attention_bf16.h: per (sample, KV head) one OpenMP
// thread converts the group's q, k, v (and dout) to bf16 once, then walks blocks of query tokens
// and chunks of keys with fixed-shape oneDNN GEMMs (matmul_bf16_serial).
#include "model/ops/attention_bf16.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "model/op_clock.h"
#include "model/ops/cpu/attention_layout.h"
#include "model/ops/cpu/vec_math.h"
#include "model/ops/half.h"
#include "model/ops/matmul_bf16.h"

namespace rlhf::model {

namespace {

constexpr int64_t kB = kAttnBf16Block;

std::atomic<bool> g_cpu_attention_bf16{false};

// n rounded up to whole 16-lane vectors, capped at `cap`.
inline int64_t padded_len(int64_t n, int64_t cap) {
  return std::min(cap, (n + 15) / 16 * 16);
}

void check_args(const char* op, const int32_t* cu, int64_t n, int64_t H, int64_t Hkv, int64_t D) {
  RLHF_CHECK(n > 0 && H > 0 && Hkv > 0 && D > 0,
             "{}: all dimensions must be > 0, got n_seqs={} H={} Hkv={} D={}", op, n, H, Hkv, D);
  RLHF_CHECK(H % Hkv == 0,
             "{}: num_attention_heads H={} is not a multiple of num_key_value_heads Hkv={}", op, H,
             Hkv);
  RLHF_CHECK(cu != nullptr && cu[0] == 0, "{}: cu_seqlens must start at 0 (n = {})", op, n);
  for (int64_t s = 0; s < n; ++s)
    RLHF_CHECK(cu[s + 1] > cu[s], "{}: sample {} of the packed batch is empty", op, s);
  RLHF_CHECK(onednn_available(),
             "{}: bf16 attention needs oneDNN, and this build has none (libdnnl-dev; CMake "
             "RLHF_ONEDNN)",
             op);
}

// The dimensions every (sample, KV head) task shares.
struct Dims {
  int64_t H, Hkv, D, G;
  int64_t qs, ks;  // row strides of q/out/dout and of k/v
  int64_t m;       // GEMM rows of a query block: kB tokens × G heads
  float sc;        // 1 / sqrt(D)
};

Dims make_dims(int64_t H, int64_t Hkv, int64_t D) {
  const int64_t G = H / Hkv;
  return {H, Hkv, D, G, H * D, Hkv * D, kB * G, 1.0f / std::sqrt(float(D))};
}

// One OpenMP thread's buffers, sized for the longest sample (Tp = its length rounded up to kB).
struct Scratch {
  std::vector<bfloat16> q16, do16;  // (Tp·G, D) token-major: row t·G + i
  std::vector<bfloat16> k16, v16;   // (Tp, D)
  std::vector<bfloat16> p16;        // chunks (Tp/kB, m, kB): bf16 P, then bf16 dS
  std::vector<float> s;             // chunks (Tp/kB, m, kB): scores, then dP
  std::vector<float> o;             // (m, D): out or dq of a block
  std::vector<float> dk, dv;        // (Tp, D)

  void reserve(const Dims& d, int64_t Tp, bool backward) {
    q16.resize(size_t(Tp * d.G * d.D));
    k16.resize(size_t(Tp * d.D));
    v16.resize(size_t(Tp * d.D));
    p16.resize(size_t(Tp * d.m));
    s.resize(size_t(Tp * d.m));
    o.resize(size_t(d.m * d.D));
    if (backward) {
      do16.resize(q16.size());
      dk.resize(size_t(Tp * d.D));
      dv.resize(size_t(Tp * d.D));
    }
  }
};

// Per calling thread: one Scratch per OpenMP thread, grown, never shrunk.
std::vector<Scratch>& scratch_pool(const Dims& d, int64_t Tp, bool backward) {
  static thread_local std::vector<Scratch> pool;
  const size_t n = size_t(omp_get_max_threads());
  if (pool.size() < n) pool.resize(n);
  for (Scratch& s : pool) s.reserve(d, Tp, backward);
  return pool;
}

int64_t longest_padded(const int32_t* cu, int64_t n) {
  int64_t longest = 0;
  for (int64_t s = 0; s < n; ++s) longest = std::max<int64_t>(longest, cu[s + 1] - cu[s]);
  return (longest + kB - 1) / kB * kB;
}

// dst (Tp, width) bf16 = rows [0, T) of src (row stride `stride`, `width` values from each),
// rows [T, Tp) zero.
void rows_to_bf16(bfloat16* dst, const float* src, int64_t stride, int64_t width, int64_t T,
                  int64_t Tp) {
  for (int64_t t = 0; t < T; ++t) float_to_bf16_row(dst + t * width, src + t * stride, width);
  std::fill(dst + T * width, dst + Tp * width, bfloat16{});
}

// Runs task(b, g, scratch) for every (sample, KV head) on the OpenMP threads, each task on one
// thread; the first exception a task throws is rethrown here after the region.
template <typename Task>
void for_each_group(int64_t n_seqs, int64_t Hkv, std::vector<Scratch>& pool, const Task& task) {
  std::exception_ptr error;
  std::mutex mu;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bg = 0; bg < n_seqs * Hkv; ++bg) {
    try {
      task(bg / Hkv, bg % Hkv, pool[size_t(omp_get_thread_num())]);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// float_to_bf16's bits, branch-free so that a `#pragma omp simd` loop vectorises it.
inline uint16_t bf16_bits(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  return uint16_t((b & 0x7FFFFFFFu) > 0x7F800000u ? ((b >> 16) | 0x40u) : rounded);
}

// The kB values of GEMM row jl in chunk c of a chunked (nc, m, kB) buffer.
inline float* chunk_row(std::vector<float>& buf, const Dims& d, int64_t c, int64_t jl) {
  return buf.data() + (c * d.m + jl) * kB;
}
inline uint16_t* chunk_row16(std::vector<bfloat16>& buf, const Dims& d, int64_t c, int64_t jl) {
  return &buf[size_t((c * d.m + jl) * kB)].bits;
}

// Values of a row of n_pad entries that fall in chunk c.
inline int64_t chunk_len(int64_t n_pad, int64_t c) {
  return std::clamp<int64_t>(n_pad - c * kB, 0, kB);
}

// Row jl of a forward block (token t, head i): softmax over keys s <= t of its scores in the
// chunks of w.s (in place), written as fp32 to its att row (T values, zeros past the diagonal)
// and as bf16 to the P chunks.
void softmax_row(Scratch& w, const Dims& d, int64_t jl, int64_t t, int64_t nc, float* att_row,
                 int64_t T) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t n = t + 1, n_pad = padded_len(n, nc * kB);  // whole vectors: −inf pads
  float mx = kNegInf;
  for (int64_t c = 0; c * kB < n_pad; ++c) {
    float* x = chunk_row(w.s, d, c, jl);
    const int64_t len = chunk_len(n_pad, c);
    for (int64_t s = std::max<int64_t>(0, n - c * kB); s < len; ++s) x[s] = kNegInf;
#pragma omp simd simdlen(16) reduction(max : mx)
    for (int64_t s = 0; s < len; ++s) mx = x[s] > mx ? x[s] : mx;
  }
  float sum = 0;
  const float sc = d.sc;
  for (int64_t c = 0; c * kB < n_pad; ++c) {
    float* x = chunk_row(w.s, d, c, jl);
    const int64_t len = chunk_len(n_pad, c);
#pragma omp simd simdlen(16) reduction(+ : sum)
    for (int64_t s = 0; s < len; ++s) {
      const float e = exp_vec((x[s] - mx) * sc);
      x[s] = e;
      sum += e;
    }
  }
  const float inv = 1.0f / sum;
  for (int64_t c = 0; c < nc; ++c) {
    const float* x = chunk_row(w.s, d, c, jl);
    uint16_t* p16 = chunk_row16(w.p16, d, c, jl);
    float* a = att_row + c * kB;
    const int64_t len = chunk_len(n_pad, c), alen = std::clamp<int64_t>(T - c * kB, 0, kB);
    const int64_t both = std::min(len, alen);
#pragma omp simd simdlen(16)
    for (int64_t s = 0; s < both; ++s) {
      const float p = x[s] * inv;
      a[s] = p;
      p16[s] = bf16_bits(p);
    }
    for (int64_t s = both; s < len; ++s) p16[s] = bf16_bits(x[s] * inv);  // past T: 0 anyway
    std::fill(p16 + len, p16 + kB, uint16_t(0));
    if (alen > len) std::fill(a + len, a + alen, 0.0f);
  }
  if (nc * kB < T) std::fill(att_row + nc * kB, att_row + T, 0.0f);
}

// Zeroes GEMM row jl in the nc chunks of p16 (a padded query row: no token there).
void zero_p16_row(Scratch& w, const Dims& d, int64_t jl, int64_t nc) {
  for (int64_t c = 0; c < nc; ++c) {
    uint16_t* p = chunk_row16(w.p16, d, c, jl);
    std::fill(p, p + kB, uint16_t(0));
  }
}

// Chunk c (m, kB) of w.s = A · X_cᵀ for the nc key chunks X_c (kB, D) of X (Tp, D), A the block's
// (m, D) bf16 rows: the scores S = Q·Kᵀ in forward, dP = dO·Vᵀ in backward.
void chunk_products(Scratch& w, const Dims& d, const bfloat16* a, const bfloat16* x, int64_t nc) {
  for (int64_t c = 0; c < nc; ++c)
    matmul_bf16_serial(false, true, d.m, kB, d.D, a, d.D, x + c * kB * d.D, d.D,
                       w.s.data() + c * d.m * kB, kB, false);
}

// One (sample, KV head) of forward: T tokens from t_first; P: its (T·G, T) block of att.
void forward_group(float* out, float* P, const float* q, const float* k, const float* v,
                   int64_t t_first, int64_t T, int64_t g, const Dims& d, Scratch& w) {
  const int64_t Tp = (T + kB - 1) / kB * kB, GD = d.G * d.D;
  rows_to_bf16(w.q16.data(), q + t_first * d.qs + g * GD, d.qs, GD, T, Tp);
  rows_to_bf16(w.k16.data(), k + t_first * d.ks + g * d.D, d.ks, d.D, T, Tp);
  rows_to_bf16(w.v16.data(), v + t_first * d.ks + g * d.D, d.ks, d.D, T, Tp);
  for (int64_t t0 = 0; t0 < T; t0 += kB) {
    const int64_t t1 = std::min(T, t0 + kB), nc = t0 / kB + 1;  // key chunks 0..t0/kB
    const bfloat16* qb = w.q16.data() + t0 * GD;
    chunk_products(w, d, qb, w.k16.data(), nc);  // S = Q_block · Kᵀ
    for (int64_t jl = 0; jl < d.m; ++jl) {
      const int64_t t = t0 + jl / d.G, i = jl % d.G;
      if (t < T)
        softmax_row(w, d, jl, t, nc, P + (t * d.G + i) * T, T);
      else
        zero_p16_row(w, d, jl, nc);
    }
    for (int64_t c = 0; c < nc; ++c)  // O (m, D) = Σ_c P_c · V_c
      matmul_bf16_serial(false, false, d.m, d.D, kB, w.p16.data() + c * d.m * kB, kB,
                         w.v16.data() + c * kB * d.D, d.D, w.o.data(), d.D, c > 0);
    for (int64_t t = t0; t < t1; ++t)
      std::memcpy(out + (t_first + t) * d.qs + g * GD, w.o.data() + (t - t0) * GD,
                  sizeof(float) * size_t(GD));
  }
}

// Row jl of a backward block (token t): dS = P ⊙ (dP − rowsum(P ⊙ dP)) / sqrt(D) over keys
// s <= t, with dP in the chunks of w.s and P from its att row; bf16 dS into the p16 chunks.
void dsoftmax_row(Scratch& w, const Dims& d, int64_t jl, int64_t t, int64_t nc, const float* prow,
                  int64_t T) {
  const int64_t n_pad = padded_len(t + 1, T);  // P is 0 past the diagonal: whole vectors
  float dot = 0;
  for (int64_t c = 0; c * kB < n_pad; ++c) {
    const float* dp = chunk_row(w.s, d, c, jl);
    const float* p = prow + c * kB;
    const int64_t len = chunk_len(n_pad, c);
#pragma omp simd simdlen(16) reduction(+ : dot)
    for (int64_t s = 0; s < len; ++s) dot += p[s] * dp[s];
  }
  const float sc = d.sc;
  for (int64_t c = 0; c < nc; ++c) {
    const float* dp = chunk_row(w.s, d, c, jl);
    const float* p = prow + c * kB;
    uint16_t* ds = chunk_row16(w.p16, d, c, jl);
    const int64_t len = chunk_len(n_pad, c);
#pragma omp simd simdlen(16)
    for (int64_t s = 0; s < len; ++s) ds[s] = bf16_bits(sc * p[s] * (dp[s] - dot));
    std::fill(ds + len, ds + kB, uint16_t(0));
  }
}

// bf16 P of GEMM row jl (token t, head i) from its att row into the nc chunks (zero past T).
void load_p16_row(Scratch& w, const Dims& d, int64_t jl, int64_t nc, const float* prow, int64_t T) {
  for (int64_t c = 0; c < nc; ++c) {
    uint16_t* p16 = chunk_row16(w.p16, d, c, jl);
    const float* p = prow + c * kB;
    const int64_t len = std::clamp<int64_t>(T - c * kB, 0, kB);
#pragma omp simd simdlen(16)
    for (int64_t s = 0; s < len; ++s) p16[s] = bf16_bits(p[s]);
    std::fill(p16 + len, p16 + kB, uint16_t(0));
  }
}

// One (sample, KV head) of backward (see the header's formulas).
void backward_group(float* dq, float* dk, float* dv, const float* dout, const float* P,
                    const float* q, const float* k, const float* v, int64_t t_first, int64_t T,
                    int64_t g, const Dims& d, Scratch& w) {
  const int64_t Tp = (T + kB - 1) / kB * kB, GD = d.G * d.D;
  rows_to_bf16(w.q16.data(), q + t_first * d.qs + g * GD, d.qs, GD, T, Tp);
  rows_to_bf16(w.do16.data(), dout + t_first * d.qs + g * GD, d.qs, GD, T, Tp);
  rows_to_bf16(w.k16.data(), k + t_first * d.ks + g * d.D, d.ks, d.D, T, Tp);
  rows_to_bf16(w.v16.data(), v + t_first * d.ks + g * d.D, d.ks, d.D, T, Tp);
  std::fill(w.dk.begin(), w.dk.begin() + Tp * d.D, 0.0f);
  std::fill(w.dv.begin(), w.dv.begin() + Tp * d.D, 0.0f);
  for (int64_t t0 = 0; t0 < T; t0 += kB) {
    const int64_t t1 = std::min(T, t0 + kB), nc = t0 / kB + 1;
    const bfloat16* qb = w.q16.data() + t0 * GD;
    const bfloat16* dob = w.do16.data() + t0 * GD;
    chunk_products(w, d, dob, w.v16.data(), nc);  // dP = dO_block · Vᵀ
    for (int64_t jl = 0; jl < d.m; ++jl) {
      const int64_t t = t0 + jl / d.G, i = jl % d.G;
      if (t < T)
        load_p16_row(w, d, jl, nc, P + (t * d.G + i) * T, T);
      else
        zero_p16_row(w, d, jl, nc);
    }
    for (int64_t c = 0; c < nc; ++c)  // dV_c (kB, D) += P_cᵀ · dO_block
      matmul_bf16_serial(true, false, kB, d.D, d.m, w.p16.data() + c * d.m * kB, kB, dob, d.D,
                         w.dv.data() + c * kB * d.D, d.D, true);
    for (int64_t jl = 0; jl < d.m; ++jl) {  // padded rows keep their zero P16 as dS16
      const int64_t t = t0 + jl / d.G, i = jl % d.G;
      if (t < T) dsoftmax_row(w, d, jl, t, nc, P + (t * d.G + i) * T, T);
    }
    for (int64_t c = 0; c < nc; ++c) {
      const bfloat16* ds = w.p16.data() + c * d.m * kB;
      // dQ_block (m, D) = Σ_c dS_c · K_c;  dK_c (kB, D) += dS_cᵀ · Q_block
      matmul_bf16_serial(false, false, d.m, d.D, kB, ds, kB, w.k16.data() + c * kB * d.D, d.D,
                         w.o.data(), d.D, c > 0);
      matmul_bf16_serial(true, false, kB, d.D, d.m, ds, kB, qb, d.D, w.dk.data() + c * kB * d.D,
                         d.D, true);
    }
    for (int64_t t = t0; t < t1; ++t)
      std::memcpy(dq + (t_first + t) * d.qs + g * GD, w.o.data() + (t - t0) * GD,
                  sizeof(float) * size_t(GD));
  }
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(dk + (t_first + t) * d.ks + g * d.D, w.dk.data() + t * d.D,
                sizeof(float) * size_t(d.D));
    std::memcpy(dv + (t_first + t) * d.ks + g * d.D, w.dv.data() + t * d.D,
                sizeof(float) * size_t(d.D));
  }
}

}  // namespace

void attention_forward_bf16_cpu(float* out, float* att, const float* q, const float* k,
                                const float* v, const int32_t* cu_seqlens, int64_t n_seqs,
                                int64_t H, int64_t Hkv, int64_t D) {
  const OpClock clock(OpKind::kAttention);
  check_args("attention_forward_bf16_cpu", cu_seqlens, n_seqs, H, Hkv, D);
  const Dims d = make_dims(H, Hkv, D);
  const std::vector<int64_t> aoff = attention_prob_offsets(cu_seqlens, n_seqs, H);
  std::vector<Scratch>& pool = scratch_pool(d, longest_padded(cu_seqlens, n_seqs), false);
  for_each_group(n_seqs, Hkv, pool, [&](int64_t b, int64_t g, Scratch& w) {
    const int64_t T = cu_seqlens[b + 1] - cu_seqlens[b];
    forward_group(out, att + aoff[size_t(b)] + g * d.G * T * T, q, k, v, cu_seqlens[b], T, g, d, w);
  });
}

void attention_backward_bf16_cpu(float* dq, float* dk, float* dv, const float* dout,
                                 const float* att, const float* q, const float* k, const float* v,
                                 const int32_t* cu_seqlens, int64_t n_seqs, int64_t H, int64_t Hkv,
                                 int64_t D) {
  const OpClock clock(OpKind::kAttention);
  check_args("attention_backward_bf16_cpu", cu_seqlens, n_seqs, H, Hkv, D);
  const Dims d = make_dims(H, Hkv, D);
  const std::vector<int64_t> aoff = attention_prob_offsets(cu_seqlens, n_seqs, H);
  std::vector<Scratch>& pool = scratch_pool(d, longest_padded(cu_seqlens, n_seqs), true);
  for_each_group(n_seqs, Hkv, pool, [&](int64_t b, int64_t g, Scratch& w) {
    const int64_t T = cu_seqlens[b + 1] - cu_seqlens[b];
    backward_group(dq, dk, dv, dout, att + aoff[size_t(b)] + g * d.G * T * T, q, k, v,
                   cu_seqlens[b], T, g, d, w);
  });
}

void set_cpu_attention_bf16(bool on) noexcept {
  g_cpu_attention_bf16.store(on);
}
bool cpu_attention_bf16() noexcept {
  return g_cpu_attention_bf16.load();
}

}  // namespace rlhf::model

// oneDNN matmul for the bf16 GEMMs of model/ops/matmul_bf16.h (and the fp32 matmul the benchmark
// compares with). The oneDNN calls are compiled only with RLHF_ONEDNN (CMakeLists.txt defines it
// for this file alone); without it the GEMMs throw.
#include "model/ops/matmul_bf16.h"

#include <omp.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "model/op_clock.h"

#ifdef RLHF_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#endif

namespace rlhf::model {

namespace {

constexpr const char* kNoOnednn = "none (built without oneDNN)";

void check_args(const char* what, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                int64_t lda, int64_t ldb, int64_t ldc) {
  const int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  RLHF_CHECK(M >= 0 && N >= 0 && K >= 0, "{}: negative dimension M={} N={} K={}", what, M, N, K);
  RLHF_CHECK(lda >= std::max<int64_t>(1, a_cols) && ldb >= std::max<int64_t>(1, b_cols) &&
                 ldc >= std::max<int64_t>(1, N),
             "{}: leading dimension too small (M={} N={} K={} trans_a={} trans_b={}: lda={} needs "
             ">= {}, ldb={} needs >= {}, ldc={} needs >= {})",
             what, M, N, K, trans_a, trans_b, lda, a_cols, ldb, b_cols, ldc, N);
}

#ifdef RLHF_ONEDNN
using dnnl::memory;

// C = bias rows (or C += bias rows when accumulating), or C = 0 when there is no bias and no
// accumulation: what the GEMM then adds its product to.
void prepare_c(int64_t M, int64_t N, const float* bias, float* C, int64_t ldc, bool accumulate) {
  if (accumulate && bias == nullptr) return;
#pragma omp parallel for schedule(static) if (M * N >= 32768)
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    if (bias == nullptr)
      std::fill(c, c + N, 0.0f);
    else if (accumulate)
      for (int64_t j = 0; j < N; ++j) c[j] += bias[j];
    else
      std::copy(bias, bias + N, c);
  }
}

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// One cached primitive per everything its creation depends on; threads: oneDNN's OpenMP runtime
// sizes the primitive for omp_get_max_threads() at creation.
// serial (the last field): created for matmul_bf16_serial, with a user-managed scratchpad.
using Key = std::tuple<bool, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool,
                       int, bool>;

struct Cached {
  dnnl::matmul prim;
  memory::desc a, b, c;
  std::string impl;
  memory::desc scratchpad;  // serial primitives only: the scratchpad each call must bring
};

// Least recently used first: `order` holds the keys, each map entry its place in it. An entry is
// shared, so one evicted while another thread still runs it stays alive until that run ends.
struct Cache {
  std::mutex mu;
  std::list<Key> order;
  std::map<Key, std::pair<std::shared_ptr<const Cached>, std::list<Key>::iterator>> map;
  int64_t capacity = kDefaultMatmulCacheCapacity;
  int64_t hits = 0, misses = 0, evictions = 0;
};
Cache& cache() {
  static Cache c;
  return c;
}

// Drops least recently used entries until at most cc.capacity remain. Caller holds cc.mu.
void evict_to_capacity(Cache& cc) {
  while (int64_t(cc.map.size()) > cc.capacity) {
    cc.map.erase(cc.order.back());
    cc.order.pop_back();
    ++cc.evictions;
  }
}

// The cache key of a GEMM (serial: a matmul_bf16_serial primitive, whose thread count does not
// matter, as it runs on the calling thread alone).
Key matmul_key(memory::data_type dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               int64_t lda, int64_t ldb, int64_t ldc, bool accumulate, bool serial) {
  return {dt == memory::data_type::bf16,      trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate,
          serial ? 0 : omp_get_max_threads(), serial};
}

// The primitive for C (M, N) = op(A) · op(B) [+ C] with operands of type dt, created on first use.
// serial: a primitive for matmul_bf16_serial (user scratchpad; the thread count does not matter,
// as it runs on the calling thread alone).
std::shared_ptr<const Cached> get_matmul(memory::data_type dt, bool trans_a, bool trans_b,
                                         int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                                         int64_t ldc, bool accumulate, bool serial = false) {
  Cache& cc = cache();
  const Key key = matmul_key(dt, trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, serial);
  std::lock_guard<std::mutex> lock(cc.mu);
  auto it = cc.map.find(key);
  if (it != cc.map.end()) {
    ++cc.hits;
    cc.order.splice(cc.order.begin(), cc.order, it->second.second);  // most recent
    return it->second.first;
  }
  ++cc.misses;
  // Row-major operands as strided descriptors: a transpose is a swap of strides.
  const memory::desc a({M, K}, dt, trans_a ? memory::dims{1, lda} : memory::dims{lda, 1});
  const memory::desc b({K, N}, dt, trans_b ? memory::dims{1, ldb} : memory::dims{ldb, 1});
  const memory::desc c({M, N}, memory::data_type::f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  // The library's shared scratchpad may only be used by the thread that created the primitive;
  // a serial primitive runs on whichever OpenMP thread calls it, each with its own scratchpad.
  if (serial) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
    auto entry =
        std::make_shared<const Cached>(Cached{dnnl::matmul(pd), a, b, c, pd.impl_info_str(),
                                              serial ? pd.scratchpad_desc() : memory::desc()});
    cc.order.push_front(key);
    cc.map.emplace(key, std::make_pair(entry, cc.order.begin()));
    evict_to_capacity(cc);
    return entry;
  } catch (const dnnl::error& e) {
    RLHF_FAIL("oneDNN matmul ({}, M={} N={} K={} trans_a={} trans_b={}) refused: {} (status {})",
              dt == memory::data_type::bf16 ? "bf16" : "fp32", M, N, K, trans_a, trans_b, e.what(),
              int(e.status));
  }
}

void run_matmul(memory::data_type dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                const void* A, int64_t lda, const void* B, int64_t ldb, float* C, int64_t ldc,
                bool accumulate) {
  const std::shared_ptr<const Cached> p =
      get_matmul(dt, trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate);
  const Cached& m = *p;
  thread_local dnnl::stream stream(cpu_engine());
  memory ma(m.a, cpu_engine(), const_cast<void*>(A)), mb(m.b, cpu_engine(), const_cast<void*>(B)),
      mc(m.c, cpu_engine(), C);
  m.prim.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  stream.wait();
}

// matmul_bf16_serial's execution. Each thread keeps its own table of the primitives it ran, with
// their memory objects, so that a call takes no lock and allocates nothing: it points the memory
// objects at this call's buffers and the thread's scratchpad (grown, never shrunk), and executes
// through the C API (the C++ execute() builds a hash map of its arguments on every call).
struct SerialEntry {
  std::shared_ptr<const Cached>
      prim;  // keeps the primitive alive even if the shared cache drops it
  memory a, b, c, s;
};

void run_matmul_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float* C,
                       int64_t ldc, bool accumulate) {
  constexpr size_t kMaxPerThread = 64;  // a thread's table is cleared past this many shapes
  thread_local std::map<Key, SerialEntry> mine;
  thread_local dnnl::stream stream(cpu_engine());
  thread_local std::vector<uint8_t> scratch;
  const Key key = matmul_key(memory::data_type::bf16, trans_a, trans_b, M, N, K, lda, ldb, ldc,
                             accumulate, true);
  auto it = mine.find(key);
  if (it == mine.end()) {
    if (mine.size() >= kMaxPerThread) mine.clear();
    std::shared_ptr<const Cached> p = get_matmul(memory::data_type::bf16, trans_a, trans_b, M, N, K,
                                                 lda, ldb, ldc, accumulate, true);
    if (scratch.size() < p->scratchpad.get_size()) scratch.resize(p->scratchpad.get_size());
    void* any = scratch.empty() ? static_cast<void*>(C) : scratch.data();
    SerialEntry e{p, memory(p->a, cpu_engine(), const_cast<bfloat16*>(A)),
                  memory(p->b, cpu_engine(), const_cast<bfloat16*>(B)),
                  memory(p->c, cpu_engine(), C), memory(p->scratchpad, cpu_engine(), any)};
    it = mine.emplace(key, std::move(e)).first;
  }
  SerialEntry& e = it->second;
  e.a.set_data_handle(const_cast<bfloat16*>(A));
  e.b.set_data_handle(const_cast<bfloat16*>(B));
  e.c.set_data_handle(C);
  if (!scratch.empty()) e.s.set_data_handle(scratch.data());
  const dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e.a.get()},
                                   {DNNL_ARG_WEIGHTS, e.b.get()},
                                   {DNNL_ARG_DST, e.c.get()},
                                   {DNNL_ARG_SCRATCHPAD, e.s.get()}};
  const dnnl_status_t st = dnnl_primitive_execute(e.prim->prim.get(), stream.get(), 4, args);
  RLHF_CHECK(st == dnnl_success,
             "oneDNN matmul (bf16, M={} N={} K={}) failed to execute (status {})", M, N, K,
             int(st));
  RLHF_CHECK(dnnl_stream_wait(stream.get()) == dnnl_success, "oneDNN stream wait failed");
}
#endif

// Both GEMM entry points: checks, the bias/accumulate preparation of C, then oneDNN.
void gemm(const char* what, bool bf16, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
          const void* A, int64_t lda, const void* B, int64_t ldb, const float* bias, float* C,
          int64_t ldc, bool accumulate) {
  const OpClock clock(OpKind::kGemm);
  check_args(what, trans_a, trans_b, M, N, K, lda, ldb, ldc);
#ifdef RLHF_ONEDNN
  if (M == 0 || N == 0) return;
  // oneDNN adds its product to C through a sum post-op when C already holds something (the bias
  // rows or the values accumulated into); K == 0 has no product.
  const bool add = accumulate || bias != nullptr;
  if (add || K == 0) prepare_c(M, N, bias, C, ldc, accumulate);
  if (K == 0) return;
  run_matmul(bf16 ? memory::data_type::bf16 : memory::data_type::f32, trans_a, trans_b, M, N, K, A,
             lda, B, ldb, C, ldc, add);
#else
  (void)bf16, (void)A, (void)B, (void)bias, (void)C, (void)accumulate;
  RLHF_FAIL(
      "{}: this build has no oneDNN, so the CPU computes in fp32 only\nhint: install libdnnl-dev "
      "(scripts/install-deps.sh) and reconfigure with -DRLHF_ONEDNN=AUTO or ON",
      what);
#endif
}

// db (OC) += Σ_n dy[n, :] over fixed 64-column blocks, rows in order (thread-count independent),
// as linear_backward_cpu sums it. T: float, or bfloat16 (widened).
template <typename T>
void add_column_sums(float* db, const T* dy, int64_t N, int64_t OC) {
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (N * OC >= 32768)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kBlock, len = std::min(OC, c0 + kBlock) - c0;
    float acc[kBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const T* dyr = dy + n * OC + c0;
      for (int64_t c = 0; c < len; ++c) {
        if constexpr (std::is_same_v<T, bfloat16>)
          acc[c] += bf16_to_float(dyr[c]);
        else
          acc[c] += dyr[c];
      }
    }
    for (int64_t c = 0; c < len; ++c) db[c0 + c] += acc[c];
  }
}

// The adapters' thread-local bfloat16 copies of their fp32 operands (grown, never shrunk).
bfloat16* to_bf16_scratch(std::vector<bfloat16>& buf, const float* src, int64_t n) {
  if (buf.size() < size_t(n)) buf.resize(size_t(n));
  float_to_bf16_n(buf.data(), src, n);
  return buf.data();
}

}  // namespace

bool onednn_available() {
#ifdef RLHF_ONEDNN
  return true;
#else
  return false;
#endif
}

std::string onednn_version_string() {
#ifdef RLHF_ONEDNN
  const dnnl_version_t* v = dnnl::version();
  return fmt::format("oneDNN {}.{}.{} ({})", v->major, v->minor, v->patch,
                     v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "not OpenMP");
#else
  return kNoOnednn;
#endif
}

MatmulCacheStats onednn_matmul_cache_stats() {
  MatmulCacheStats s;
#ifdef RLHF_ONEDNN
  Cache& cc = cache();
  std::lock_guard<std::mutex> lock(cc.mu);
  s.entries = int64_t(cc.map.size());
  s.hits = cc.hits;
  s.misses = cc.misses;
  s.evictions = cc.evictions;
  s.capacity = cc.capacity;
#endif
  return s;
}

int64_t set_onednn_matmul_cache_capacity(int64_t capacity) {
  RLHF_CHECK(capacity >= 1, "oneDNN matmul cache capacity must be >= 1, got {}", capacity);
#ifdef RLHF_ONEDNN
  Cache& cc = cache();
  std::lock_guard<std::mutex> lock(cc.mu);
  const int64_t old = cc.capacity;
  cc.capacity = capacity;
  evict_to_capacity(cc);
  return old;
#else
  return kDefaultMatmulCacheCapacity;
#endif
}

std::string onednn_matmul_impl(bool bf16, int64_t M, int64_t N, int64_t K) {
#ifdef RLHF_ONEDNN
  RLHF_CHECK(M > 0 && N > 0 && K > 0, "onednn_matmul_impl: M={} N={} K={} must be > 0", M, N, K);
  return get_matmul(bf16 ? memory::data_type::bf16 : memory::data_type::f32, false, true, M, N, K,
                    K, K, N, false)
      ->impl;
#else
  (void)bf16, (void)M, (void)N, (void)K;
  return kNoOnednn;
#endif
}

void matmul_bf16_cpu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bfloat16* A,
                     int64_t lda, const bfloat16* B, int64_t ldb, const float* bias, float* C,
                     int64_t ldc, bool accumulate) {
  gemm("matmul_bf16_cpu", true, trans_a, trans_b, M, N, K, A, lda, B, ldb, bias, C, ldc,
       accumulate);
}

void matmul_bf16_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float* C,
                        int64_t ldc, bool accumulate) {
  check_args("matmul_bf16_serial", trans_a, trans_b, M, N, K, lda, ldb, ldc);
#ifdef RLHF_ONEDNN
  if (M == 0 || N == 0) return;
  if (K == 0) return prepare_c(M, N, nullptr, C, ldc, accumulate);  // no product: C = 0 or kept
  run_matmul_serial(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
#else
  (void)A, (void)B, (void)C, (void)accumulate;
  RLHF_FAIL("matmul_bf16_serial: this build has no oneDNN, so the CPU computes in fp32 only");
#endif
}

void matmul_f32_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                       int64_t lda, const float* B, int64_t ldb, const float* bias, float* C,
                       int64_t ldc, bool accumulate) {
  gemm("matmul_f32_onednn", false, trans_a, trans_b, M, N, K, A, lda, B, ldb, bias, C, ldc,
       accumulate);
}

void linear_forward_bf16(float* y, const bfloat16* x, const bfloat16* w, const float* b, int64_t N,
                         int64_t IC, int64_t OC) {
  // (N, OC) = (N, IC) · (OC, IC)ᵀ
  matmul_bf16_cpu(false, true, N, OC, IC, x, IC, w, IC, b, y, OC, false);
}

void linear_backward_bf16(float* dx, float* dw, float* db, const bfloat16* dy, const bfloat16* x,
                          const bfloat16* w, int64_t N, int64_t IC, int64_t OC,
                          bool accumulate_dx) {
  // dx (N, IC) = dy (N, OC) · w (OC, IC)
  if (dx != nullptr)
    matmul_bf16_cpu(false, false, N, IC, OC, dy, OC, w, IC, nullptr, dx, IC, accumulate_dx);
  // dw (OC, IC) += dyᵀ (OC, N) · x (N, IC)
  if (dw != nullptr) matmul_bf16_cpu(true, false, OC, IC, N, dy, OC, x, IC, nullptr, dw, IC, true);
  if (db != nullptr) add_column_sums(db, dy, N, OC);
}

void linear_forward_bf16_cpu(float* y, const float* x, const float* w, const float* b, int64_t N,
                             int64_t IC, int64_t OC) {
  RLHF_CHECK(N >= 0 && IC >= 0 && OC >= 0, "linear_forward_bf16_cpu: N={} IC={} OC={}", N, IC, OC);
  thread_local std::vector<bfloat16> sx, sw;
  linear_forward_bf16(y, to_bf16_scratch(sx, x, N * IC), to_bf16_scratch(sw, w, OC * IC), b, N, IC,
                      OC);
}

void linear_backward_bf16_cpu(float* dx, float* dw, float* db, const float* dy, const float* x,
                              const float* w, int64_t N, int64_t IC, int64_t OC,
                              bool accumulate_dx) {
  RLHF_CHECK(N >= 0 && IC >= 0 && OC >= 0, "linear_backward_bf16_cpu: N={} IC={} OC={}", N, IC, OC);
  thread_local std::vector<bfloat16> sdy, sx, sw;
  if (dx == nullptr && dw == nullptr) {
    if (db != nullptr) add_column_sums(db, dy, N, OC);
    return;
  }
  const bfloat16* dy16 = to_bf16_scratch(sdy, dy, N * OC);
  const bfloat16* x16 = dw != nullptr ? to_bf16_scratch(sx, x, N * IC) : nullptr;
  const bfloat16* w16 = dx != nullptr ? to_bf16_scratch(sw, w, OC * IC) : nullptr;
  linear_backward_bf16(dx, dw, nullptr, dy16, x16, w16, N, IC, OC, accumulate_dx);
  if (db != nullptr) add_column_sums(db, dy, N, OC);
}

}  // namespace rlhf::model

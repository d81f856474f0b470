// ShmComm: collectives through an MPI-3 shared-memory window with a flag barrier (see comm.h).
#include <sched.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>

#include "core/error.h"
#include "parallel/comm.h"
#include "parallel/mpi_check.h"
#include "parallel/watchdog.h"

namespace rlhf::parallel {

namespace {

constexpr int64_t kFlagBytes = 4096;                // one page of flags at the start of a segment
constexpr int64_t kSmallAllReduceBytes = 16 << 10;  // all_reduce steps up to this: 1 barrier

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// dst[0, n) = src[0, n). With `stream`, large copies use non-temporal stores (no read-for-ownership
// of the destination, which does not pollute the caches): for outputs that go to memory anyway.
// Ends with a store fence so the data is ordered like ordinary stores afterwards.
void copy_out(void* dst, const void* src, size_t n, bool stream) {
#if defined(__x86_64__) || defined(__i386__)
  if (stream && n >= 4096) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    const size_t head = (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16;
    std::memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, n - i);
    _mm_sfence();
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, n);
}

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// out[i] = f(...f(f(src[0][i], src[1][i]), src[2][i])..., src[n-1][i]) for i < len, in tiles that
// stay in L1. `out` may alias one of the sources (every source of a tile is read before the tile is
// written).
template <typename T, typename F>
void reduce_tiles(T* out, const T* const* src, int n, int64_t len, bool stream, F f) {
  constexpr int64_t kTile = 8192 / static_cast<int64_t>(sizeof(T));
  alignas(64) T tmp[kTile];
  for (int64_t t0 = 0; t0 < len; t0 += kTile) {
    const int64_t m = std::min(kTile, len - t0);
    std::memcpy(tmp, src[0] + t0, static_cast<size_t>(m) * sizeof(T));
    for (int j = 1; j < n; ++j) {
      const T* s = src[j] + t0;
      for (int64_t i = 0; i < m; ++i) tmp[i] = f(tmp[i], s[i]);
    }
    copy_out(out + t0, tmp, static_cast<size_t>(m) * sizeof(T), stream);
  }
}

template <typename T>
void reduce_typed(void* out, const char* const* src, int n, int64_t len, ReduceOp op, bool stream) {
  const T* const* s = reinterpret_cast<const T* const*>(src);
  T* o = static_cast<T*>(out);
  switch (op) {
    case ReduceOp::kSum:
      reduce_tiles(o, s, n, len, stream, [](T a, T b) { return static_cast<T>(a + b); });
      return;
    case ReduceOp::kMax:
      reduce_tiles(o, s, n, len, stream, [](T a, T b) { return b > a ? b : a; });
      return;
    case ReduceOp::kMin:
      reduce_tiles(o, s, n, len, stream, [](T a, T b) { return b < a ? b : a; });
      return;
  }
}

// Reduces len elements of n sources, in rank order, into out (non-temporal stores with `stream`).
void reduce_rank_order(void* out, const char* const* src, int n, int64_t len, DType dt, ReduceOp op,
                       bool stream = false) {
  switch (dt) {
    case DType::kFloat32:
      return reduce_typed<float>(out, src, n, len, op, stream);
    case DType::kFloat64:
      return reduce_typed<double>(out, src, n, len, op, stream);
    case DType::kInt32:
      return reduce_typed<int32_t>(out, src, n, len, op, stream);
    case DType::kInt64:
      return reduce_typed<int64_t>(out, src, n, len, op, stream);
    case DType::kUint8:
      return reduce_typed<uint8_t>(out, src, n, len, op, stream);
    case DType::kBfloat16:
      RLHF_FAIL("bfloat16 reductions need NCCL (a reduction on a shared-memory communicator)");
  }
}

}  // namespace

ShmComm::ShmComm(MPI_Comm comm, std::string name, const ShmCommOptions& opts)
    : Comm(std::move(name), comm_rank(comm), comm_size(comm)), opts_(opts) {
  RLHF_CHECK(opts.chunk_bytes >= 4096 && opts.chunk_bytes % 4096 == 0 &&
                 opts.chunk_bytes >= int64_t{64} * size(),
             "{}: shared-memory chunk_bytes {} must be a multiple of 4096 and >= max(4096, 64 * "
             "{} ranks)",
             this->name(), opts.chunk_bytes, size());
  RLHF_CHECK(opts.timeout_s >= 0, "{}: shared-memory timeout_s must be >= 0", this->name());
  RLHF_CHECK(is_node_local(comm),
             "{}: a shared-memory communicator needs all its ranks on one node, but they span "
             "several\nhint: use CommKind::kMpi or kAuto (make_comm picks MPI for such a "
             "communicator)",
             this->name());
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  try {
    // Open MPI places segments 8-byte aligned only: allocate a page of slack and align each
    // segment's start to a page. Mappings are page-aligned in every process, so every process
    // finds the same aligned address inside a peer's segment.
    const int64_t seg_bytes = kFlagBytes + 2 * opts.chunk_bytes;
    const int64_t alloc_bytes = seg_bytes + kFlagBytes;
    MPI_Info info = MPI_INFO_NULL;
    MPI_CHECK(MPI_Info_create(&info));
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    char* base = nullptr;
    int rc =
        MPI_Win_allocate_shared(static_cast<MPI_Aint>(alloc_bytes), 1, info, comm_, &base, &win_);
    MPI_Info_free(&info);
    MPI_CHECK(rc);
    int* model = nullptr;
    int flag = 0;
    MPI_CHECK(MPI_Win_get_attr(win_, MPI_WIN_MODEL, &model, &flag));
    RLHF_CHECK(flag && model != nullptr && *model == MPI_WIN_UNIFIED,
               "{}: the MPI shared window is not MPI_WIN_UNIFIED; the flag protocol needs a "
               "unified window\nhint: use CommKind::kMpi",
               this->name());
    // First touch of this rank's own segment: local pages, no page faults on the data path later,
    // and every flag starts at 0.
    std::memset(base, 0, static_cast<size_t>(alloc_bytes));
    world_ranks_ = world_ranks_of(comm_);
    seg_.resize(static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r) {
      MPI_Aint sz = 0;
      int disp = 0;
      void* p = nullptr;
      MPI_CHECK(MPI_Win_shared_query(win_, r, &sz, &disp, &p));
      const uintptr_t a = reinterpret_cast<uintptr_t>(p);
      const uintptr_t aligned = (a + kFlagBytes - 1) / kFlagBytes * kFlagBytes;
      RLHF_ASSERT(sz >= alloc_bytes && aligned + seg_bytes <= a + static_cast<uintptr_t>(sz));
      seg_[static_cast<size_t>(r)] = reinterpret_cast<char*>(aligned);
    }
    // One passive-target epoch for the window's lifetime (the MPI-3 shared-memory pattern); the
    // data path then uses plain loads/stores ordered by C++ atomics on the unified window.
    MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
    MPI_CHECK(MPI_Win_sync(win_));
    MPI_CHECK(MPI_Barrier(comm_));  // every flag is zero before anyone uses it
    MPI_CHECK(MPI_Win_sync(win_));
  } catch (...) {
    if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
    free_comm_quietly(&comm_);
    throw;
  }
}

ShmComm::~ShmComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (win_ != MPI_WIN_NULL && !finalized && std::uncaught_exceptions() == 0) {
    WatchScope watch("MPI_Win_free", name());  // collective: a stopped peer would block it
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);  // collective: every rank destroys its ShmComm in the same order
  }
  free_comm_quietly(&comm_);
}

char* ShmComm::buffer(int r, uint64_t step) const {
  return seg_[static_cast<size_t>(r)] + kFlagBytes +
         static_cast<int64_t>(step % 2) * opts_.chunk_bytes;
}

void ShmComm::flag_barrier() {
  const uint64_t e = ++epoch_;
  // Full fence: orders this rank's earlier data stores, non-temporal ones included (glibc's memcpy
  // uses them for large copies), before the flag store.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(seg_[static_cast<size_t>(rank())]))
      .store(e, std::memory_order_release);
  double t_start = 0;
  for (int k = 1; k < size(); ++k) {
    const int j = (rank() + k) % size();
    std::atomic_ref<uint64_t> f(*reinterpret_cast<uint64_t*>(seg_[static_cast<size_t>(j)]));
    for (int64_t spins = 0; f.load(std::memory_order_acquire) < e; ++spins) {
      if (spins < 128) {
        cpu_relax();
        continue;
      }
      // Past the fast path: tell the watchdog (--comm_timeout) whom this rank waits for.
      if (spins == 128) set_watch_peer(world_ranks_[static_cast<size_t>(j)]);
      sched_yield();
      if (opts_.timeout_s > 0 && spins % 1024 == 0) {
        if (t_start == 0) t_start = now_s();
        RLHF_CHECK(now_s() - t_start < opts_.timeout_s,
                   "{}: shared-memory collective timed out after {} s waiting for rank {} "
                   "(barrier {})",
                   name(), opts_.timeout_s, j, e);
      }
    }
  }
}

void ShmComm::do_barrier() {
  flag_barrier();
}

void ShmComm::do_all_gather(const void* send, void* recv, int64_t count, DType dt) {
  const int n = size(), me = rank();
  const int64_t b = count * static_cast<int64_t>(dtype_size(dt));  // bytes per rank
  const char* src = static_cast<const char*>(send);
  char* dst = static_cast<char*>(recv);
  const bool in_place = src == dst + me * b;
  const bool stream = n * b >= opts_.stream_min_bytes;
  for (int64_t off = 0; off < b; off += opts_.chunk_bytes, ++step_) {
    const size_t len = static_cast<size_t>(std::min(opts_.chunk_bytes, b - off));
    std::memcpy(buffer(me, step_), src + off, len);
    flag_barrier();
    // Own block from the (cache-hot) staging buffer, then the peers' blocks.
    if (!in_place) copy_out(dst + me * b + off, buffer(me, step_), len, stream);
    for (int k = 1; k < n; ++k) {
      const int j = (me + k) % n;
      copy_out(dst + j * b + off, buffer(j, step_), len, stream);
    }
  }
}

void ShmComm::do_all_gather_strided(const void* send, void* recv, int64_t count, int64_t stride,
                                    DType dt) {
  const int n = size(), me = rank();
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const int64_t b = count * es, sb = stride * es;
  const char* src = static_cast<const char*>(send);
  char* dst = static_cast<char*>(recv);
  const bool stream = n * b >= opts_.stream_min_bytes;
  for (int64_t off = 0; off < b; off += opts_.chunk_bytes, ++step_) {
    const size_t len = static_cast<size_t>(std::min(opts_.chunk_bytes, b - off));
    std::memcpy(buffer(me, step_), src + off, len);
    flag_barrier();
    for (int k = 0; k < n; ++k) {
      const int j = (me + k) % n;
      copy_out(dst + j * sb + off, buffer(j, step_), len, stream);
    }
  }
}

void ShmComm::do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                ReduceOp op) {
  const int n = size(), me = rank();
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const int64_t piece = opts_.chunk_bytes / (n * es);  // elements per destination rank and step
  const char* src = static_cast<const char*>(send);
  char* dst = static_cast<char*>(recv);
  std::vector<const char*> srcs(static_cast<size_t>(n));
  const bool stream = count * es >= opts_.stream_min_bytes;
  for (int64_t off = 0; off < count; off += piece, ++step_) {
    const int64_t len = std::min(piece, count - off);
    char* mine = buffer(me, step_);
    for (int r = 0; r < n; ++r)
      std::memcpy(mine + r * len * es, src + (r * count + off) * es, static_cast<size_t>(len * es));
    flag_barrier();
    for (int j = 0; j < n; ++j) srcs[static_cast<size_t>(j)] = buffer(j, step_) + me * len * es;
    reduce_rank_order(dst + off * es, srcs.data(), n, len, dt, op, stream);
  }
}

void ShmComm::do_all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op) {
  const int n = size(), me = rank();
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const int64_t per_step = opts_.chunk_bytes / es;
  const char* src = static_cast<const char*>(send);
  char* dst = static_cast<char*>(recv);
  std::vector<const char*> srcs(static_cast<size_t>(n));
  const bool stream = count * es >= opts_.stream_min_bytes;
  for (int64_t off = 0; off < count; off += per_step, ++step_) {
    const int64_t len = std::min(per_step, count - off);
    char* mine = buffer(me, step_);
    std::memcpy(mine, src + off * es, static_cast<size_t>(len * es));
    flag_barrier();
    if (len * es <= kSmallAllReduceBytes || n == 1) {
      // Every rank reduces the whole (small) step: one barrier, identical result everywhere.
      for (int j = 0; j < n; ++j) srcs[static_cast<size_t>(j)] = buffer(j, step_);
      reduce_rank_order(dst + off * es, srcs.data(), n, len, dt, op, stream);
      continue;
    }
    // Rank me reduces its slice [lo, hi) of the step into its own buffer; then everyone copies.
    auto lo_of = [&](int r) { return len * r / n; };
    const int64_t lo = lo_of(me), hi = lo_of(me + 1);
    for (int j = 0; j < n; ++j) srcs[static_cast<size_t>(j)] = buffer(j, step_) + lo * es;
    reduce_rank_order(mine + lo * es, srcs.data(), n, hi - lo, dt, op);
    flag_barrier();
    for (int k = 0; k < n; ++k) {
      const int j = (me + k) % n;
      const int64_t jl = lo_of(j), jh = lo_of(j + 1);
      copy_out(dst + (off + jl) * es, buffer(j, step_) + jl * es,
               static_cast<size_t>((jh - jl) * es), stream);
    }
  }
}

void ShmComm::do_broadcast(void* buf, int64_t count, DType dt, int root) {
  const int64_t b = count * static_cast<int64_t>(dtype_size(dt));
  char* p = static_cast<char*>(buf);
  const bool stream = b >= opts_.stream_min_bytes;
  for (int64_t off = 0; off < b; off += opts_.chunk_bytes, ++step_) {
    const size_t len = static_cast<size_t>(std::min(opts_.chunk_bytes, b - off));
    if (rank() == root) std::memcpy(buffer(root, step_), p + off, len);
    flag_barrier();
    if (rank() != root) copy_out(p + off, buffer(root, step_), len, stream);
  }
}

// Non-blocking: eager (see the class comment).
std::unique_ptr<CommRequest::Impl> ShmComm::do_iall_gather(const void* send, void* recv,
                                                           int64_t count, DType dt) {
  do_all_gather(send, recv, count, dt);
  return nullptr;
}

std::unique_ptr<CommRequest::Impl> ShmComm::do_ireduce_scatter(const void* send, void* recv,
                                                               int64_t count, DType dt,
                                                               ReduceOp op) {
  do_reduce_scatter(send, recv, count, dt, op);
  return nullptr;
}

std::unique_ptr<CommRequest::Impl> ShmComm::do_iall_reduce(const void* send, void* recv,
                                                           int64_t count, DType dt, ReduceOp op) {
  do_all_reduce(send, recv, count, dt, op);
  return nullptr;
}

std::unique_ptr<CommRequest::Impl> ShmComm::do_ibroadcast(void* buf, int64_t count, DType dt,
                                                          int root) {
  do_broadcast(buf, count, dt, root);
  return nullptr;
}

}  // namespace rlhf::parallel

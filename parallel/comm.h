// The communicator layer: one abstract interface (Comm) for the collectives that ZeRO-3, weight
// sync and the benchmarks use, with these implementations:
//  - MpiComm: MPI collectives on a duplicate of an MPI communicator (MPI_Allgather,
//    MPI_Reduce_scatter_block, MPI_Allreduce, MPI_Bcast and their MPI_I* forms);
//  - ShmComm: for communicators whose ranks all live on one node, staged through an MPI-3 shared
//    window (MPI_Win_allocate_shared) with a flag protocol (see ShmComm).
//  - NcclComm (parallel/comm_nccl.h, built with RLHF_NCCL): NCCL collectives on device buffers, on
//    the communicator's own CUDA stream, with a watchdog.
// make_comm() picks one.
//
// Contract common to every collective: called by every rank of the communicator, in the same order,
// with the same count, dtype, op and root; buffers are host memory (device memory for NcclComm);
// `count` is in elements (>= 0; 0 is a no-op that still counts as a call). Every call is accounted
// to its communicator (calls, bytes, seconds; see CommStats). Errors throw rlhf::Error (MPI_CHECK /
// RLHF_CHECK).
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rlhf::parallel {

// ---------------------------------------------------------------------------------------------
// Types

/// Element types of the collectives. kBfloat16 (the GPU's weight copies) moves as 2-byte words:
/// gathers and broadcasts on every communicator, reductions only on NCCL (ncclBfloat16).
enum class DType { kFloat32, kFloat64, kInt32, kInt64, kUint8, kBfloat16 };

/// Bytes per element: 4, 8, 4, 8, 1, 2.
size_t dtype_size(DType dt);
/// "float32", "float64", "int32", "int64", "uint8", "bfloat16".
const char* dtype_name(DType dt);
/// The MPI datatype: MPI_FLOAT, MPI_DOUBLE, MPI_INT32_T, MPI_INT64_T, MPI_UINT8_T, and
/// MPI_UINT16_T for bfloat16 (data movement only).
MPI_Datatype mpi_dtype(DType dt);

/// DType of a C++ element type (float, double, int32_t, int64_t, uint8_t).
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::kUint8;
}

/// Reduction operators. kSum on uint8 wraps modulo 256.
enum class ReduceOp { kSum, kMax, kMin };
/// "sum", "max", "min".
const char* reduce_op_name(ReduceOp op);

/// The collectives, for per-op accounting.
enum class CollOp { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
inline constexpr int kNumCollOps = 5;
/// "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier".
const char* coll_op_name(CollOp op);

/// Which implementation.
/// kNccl is never chosen by kAuto: its buffers are device memory (see parallel/comm_nccl.h).
enum class CommKind { kAuto, kMpi, kShm, kNccl };
/// "auto", "mpi", "shm", "nccl".
const char* comm_kind_name(CommKind kind);
/// The kind named "auto", "mpi" or "shm" (the --comm_backend / RLHF_COMM_KIND values; NCCL is
/// never chosen by name here). Throws rlhf::Error for any other name.
CommKind comm_kind_from_name(const std::string& name);

/// Accounting of one communicator (or one of its collectives).
///  - calls: collectives posted (blocking or not; barriers count, with 0 bytes);
///  - bytes: the collective's full buffer, nccl-tests' S: all_gather and reduce_scatter
///    size·count·elem (the gathered / the scattered buffer), all_reduce and broadcast count·elem;
///  - seconds: wall time the caller spent inside this communicator's calls: the whole of a
///    blocking call; for a non-blocking one the time to post it plus the time spent in its
///    wait()/test(). Time in which a non-blocking collective progressed while the caller computed
///    is not counted, so `seconds` is the exposed (not overlapped) communication time.
struct CommStats {
  int64_t calls = 0;
  int64_t bytes = 0;
  double seconds = 0;
  void reset() { *this = CommStats{}; }
  CommStats& operator+=(const CommStats& o) {
    calls += o.calls;
    bytes += o.bytes;
    seconds += o.seconds;
    return *this;
  }
};

class Comm;

/// Handle of a non-blocking collective. Move-only; must not outlive its Comm; the buffers passed
/// to the collective must stay alive and untouched until it completes. A default-constructed
/// request is complete. Destroying a pending request waits for it, except while an exception is
/// unwinding the stack (then it is abandoned, so a failing rank reaches MPI_Abort instead of
/// waiting for ranks that may never come).
class CommRequest {
 public:
  /// Implementation hook (MPI request, NCCL event, ...).
  struct Impl {
    virtual ~Impl() = default;
    /// Blocks until complete. Throws rlhf::Error on failure.
    virtual void wait() = 0;
    /// True if complete (then the request is finished). Throws rlhf::Error on failure.
    virtual bool test() = 0;
  };

  CommRequest() = default;
  /// A pending request of collective `op` on `comm`; impl == nullptr means already complete.
  CommRequest(std::unique_ptr<Impl> impl, Comm* comm, CollOp op);
  CommRequest(CommRequest&& o) noexcept;
  CommRequest& operator=(CommRequest&& o) noexcept;
  CommRequest(const CommRequest&) = delete;
  CommRequest& operator=(const CommRequest&) = delete;
  ~CommRequest();

  /// Blocks until the collective is complete (no-op if it is). Time is accounted to the comm.
  void wait();
  /// Completes the collective if it can without blocking; true once complete.
  bool test();
  /// True if complete (does not progress anything).
  bool done() const { return impl_ == nullptr; }

 private:
  std::unique_ptr<Impl> impl_;
  Comm* comm_ = nullptr;
  CollOp op_ = CollOp::kBarrier;
};

// ---------------------------------------------------------------------------------------------
// Interface

/// A communicator. Not thread-safe: one thread issues its collectives. Implementations override the
/// do_* hooks; the public methods validate arguments and do the accounting.
class Comm {
 public:
  virtual ~Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// The name used in logs and accounting ("train_comm", ...).
  const std::string& name() const { return name_; }
  /// Which implementation this is (kMpi or kShm).
  virtual CommKind kind() const = 0;
  /// The MPI communicator this Comm owns (a duplicate of the one it was made from), for code that
  /// needs a raw MPI call on the same group. Do not free it.
  virtual MPI_Comm mpi_comm() const = 0;

  /// All-gather. send: (count) elements of this rank; recv: (size·count), block j = rank j's send,
  /// in rank order. In place: send == recv + rank·count·elem (this rank's block already in recv).
  /// Otherwise send and recv must not overlap.
  void all_gather(const void* send, void* recv, int64_t count, DType dt);
  /// All-gather with a stride: rank j's `count` elements land at recv + j·stride elements
  /// (stride >= count; the gaps are left untouched). Gathers the same slice of every rank's shard
  /// straight into place in a full unit buffer (weight sync). send must not overlap recv.
  /// Accounted as an all-gather of size·count elements.
  void all_gather_strided(const void* send, void* recv, int64_t count, int64_t stride, DType dt);
  /// Reduce-scatter. send: (size·count) elements; recv: (count) = op over ranks of every rank's
  /// block `rank` of send. send and recv must not overlap.
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                      ReduceOp op = ReduceOp::kSum);
  /// All-reduce. send, recv: (count); recv = op over ranks of send. In place: send == recv.
  void all_reduce(const void* send, void* recv, int64_t count, DType dt,
                  ReduceOp op = ReduceOp::kSum);
  /// Broadcast. buf: (count); on return every rank holds root's buf. 0 <= root < size.
  void broadcast(void* buf, int64_t count, DType dt, int root);
  /// Barrier (accounted with 0 bytes).
  void barrier();
  /// Variable-size all-gather of bytes (MPI_Allgatherv on mpi_comm(), for host data of any
  /// communicator kind): every rank contributes `mine` and receives every rank's bytes, in rank
  /// order. Accounted as an all-gather of the total bytes. Throws rlhf::Error when the total
  /// reaches 2 GiB (MPI's int counts).
  std::vector<std::vector<uint8_t>> all_gather_bytes(const std::vector<uint8_t>& mine);

  /// Non-blocking forms: same contracts; complete the returned request before touching the buffers.
  /// MpiComm posts MPI_I* collectives (Open MPI progresses them inside MPI calls, i.e. in
  /// test()/wait() and other MPI calls on this rank); ShmComm completes them eagerly at post time
  /// (see ShmComm).
  [[nodiscard]] CommRequest iall_gather(const void* send, void* recv, int64_t count, DType dt);
  [[nodiscard]] CommRequest ireduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                            ReduceOp op = ReduceOp::kSum);
  [[nodiscard]] CommRequest iall_reduce(const void* send, void* recv, int64_t count, DType dt,
                                        ReduceOp op = ReduceOp::kSum);
  [[nodiscard]] CommRequest ibroadcast(void* buf, int64_t count, DType dt, int root);

  /// Typed conveniences (dtype from T).
  template <typename T>
  void all_gather(const T* send, T* recv, int64_t count) {
    all_gather(static_cast<const void*>(send), static_cast<void*>(recv), count, dtype_of<T>());
  }
  template <typename T>
  void reduce_scatter(const T* send, T* recv, int64_t count, ReduceOp op = ReduceOp::kSum) {
    reduce_scatter(static_cast<const void*>(send), static_cast<void*>(recv), count, dtype_of<T>(),
                   op);
  }
  template <typename T>
  void all_reduce(const T* send, T* recv, int64_t count, ReduceOp op = ReduceOp::kSum) {
    all_reduce(static_cast<const void*>(send), static_cast<void*>(recv), count, dtype_of<T>(), op);
  }
  template <typename T>
  void broadcast(T* buf, int64_t count, int root) {
    broadcast(static_cast<void*>(buf), count, dtype_of<T>(), root);
  }
  template <typename T>
  [[nodiscard]] CommRequest iall_gather(const T* send, T* recv, int64_t count) {
    return iall_gather(static_cast<const void*>(send), static_cast<void*>(recv), count,
                       dtype_of<T>());
  }
  template <typename T>
  [[nodiscard]] CommRequest ireduce_scatter(const T* send, T* recv, int64_t count,
                                            ReduceOp op = ReduceOp::kSum) {
    return ireduce_scatter(static_cast<const void*>(send), static_cast<void*>(recv), count,
                           dtype_of<T>(), op);
  }
  template <typename T>
  [[nodiscard]] CommRequest iall_reduce(const T* send, T* recv, int64_t count,
                                        ReduceOp op = ReduceOp::kSum) {
    return iall_reduce(static_cast<const void*>(send), static_cast<void*>(recv), count,
                       dtype_of<T>(), op);
  }
  template <typename T>
  [[nodiscard]] CommRequest ibroadcast(T* buf, int64_t count, int root) {
    return ibroadcast(static_cast<void*>(buf), count, dtype_of<T>(), root);
  }

  /// Totals over every collective of this communicator.
  const CommStats& stats() const { return total_; }
  /// Totals of one collective.
  const CommStats& stats(CollOp op) const { return by_op_[static_cast<size_t>(op)]; }
  /// Zeroes all counters.
  void reset_stats();
  /// One line for logs: "train_comm: 120 calls, 1.20 GB, 0.800 s" (GB = 1e9 bytes); with per_op,
  /// followed by " (all_gather 60 calls 0.60 GB 0.300 s, ...)" for the collectives used.
  std::string summary(bool per_op = false) const;

  /// Adds wall time to the accounting (used by CommRequest for time in wait/test).
  void account_seconds(CollOp op, double seconds);

 protected:
  Comm(std::string name, int rank, int size);

  virtual void do_all_gather(const void* send, void* recv, int64_t count, DType dt) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                 ReduceOp op) = 0;
  virtual void do_all_reduce(const void* send, void* recv, int64_t count, DType dt,
                             ReduceOp op) = 0;
  virtual void do_broadcast(void* buf, int64_t count, DType dt, int root) = 0;
  virtual void do_barrier() = 0;
  /// Default: a contiguous all-gather into a temporary buffer, then a copy into place.
  virtual void do_all_gather_strided(const void* send, void* recv, int64_t count, int64_t stride,
                                     DType dt);
  /// Non-blocking hooks: return nullptr when the collective completed at post time.
  virtual std::unique_ptr<CommRequest::Impl> do_iall_gather(const void* send, void* recv,
                                                            int64_t count, DType dt) = 0;
  virtual std::unique_ptr<CommRequest::Impl> do_ireduce_scatter(const void* send, void* recv,
                                                                int64_t count, DType dt,
                                                                ReduceOp op) = 0;
  virtual std::unique_ptr<CommRequest::Impl> do_iall_reduce(const void* send, void* recv,
                                                            int64_t count, DType dt,
                                                            ReduceOp op) = 0;
  virtual std::unique_ptr<CommRequest::Impl> do_ibroadcast(void* buf, int64_t count, DType dt,
                                                           int root) = 0;

 private:
  std::string name_;
  int rank_ = 0, size_ = 1;
  CommStats total_;
  std::array<CommStats, kNumCollOps> by_op_{};
  void account(CollOp op, int64_t bytes, double seconds);
  void check_args(const char* what, const void* a, const void* b, int64_t count) const;
  /// Throws rlhf::Error for a bfloat16 reduction on a communicator other than NCCL.
  void check_reduction(const char* what, DType dt) const;
};

// ---------------------------------------------------------------------------------------------
// Implementations

/// Collectives by MPI on a duplicate of `comm` (MPI_Comm_dup; freed in the destructor unless an
/// exception is unwinding). Sums are in MPI's order (not specified by MPI; not necessarily rank
/// order). Counts above INT_MAX elements per call are refused (rlhf::Error).
class MpiComm final : public Comm {
 public:
  /// Collective over `comm` (MPI_Comm_dup).
  MpiComm(MPI_Comm comm, std::string name);
  ~MpiComm() override;
  CommKind kind() const override { return CommKind::kMpi; }
  MPI_Comm mpi_comm() const override { return comm_; }

 protected:
  void do_all_gather(const void* send, void* recv, int64_t count, DType dt) override;
  void do_all_gather_strided(const void* send, void* recv, int64_t count, int64_t stride,
                             DType dt) override;
  void do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                         ReduceOp op) override;
  void do_all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op) override;
  void do_broadcast(void* buf, int64_t count, DType dt, int root) override;
  void do_barrier() override;
  std::unique_ptr<CommRequest::Impl> do_iall_gather(const void* send, void* recv, int64_t count,
                                                    DType dt) override;
  std::unique_ptr<CommRequest::Impl> do_ireduce_scatter(const void* send, void* recv, int64_t count,
                                                        DType dt, ReduceOp op) override;
  std::unique_ptr<CommRequest::Impl> do_iall_reduce(const void* send, void* recv, int64_t count,
                                                    DType dt, ReduceOp op) override;
  std::unique_ptr<CommRequest::Impl> do_ibroadcast(void* buf, int64_t count, DType dt,
                                                   int root) override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

/// Options of ShmComm.
struct ShmCommOptions {
  /// Staging bytes per rank and per buffer; each rank allocates 2 buffers (double buffering) plus a
  /// page of flags in the shared window. Larger messages are cut into steps of this size.
  int64_t chunk_bytes = int64_t{1} << 20;
  /// Collectives whose output (per rank) is at least this many bytes write it with non-temporal
  /// stores (x86): such outputs go to memory anyway, and streaming saves the read-for-ownership of
  /// every destination line. Smaller outputs use ordinary stores and stay in cache.
  int64_t stream_min_bytes = int64_t{4} << 20;
  /// > 0: a rank waiting in the flag protocol for longer than this throws rlhf::Error
  /// ("shared-memory collective timed out"); 0 waits without a limit of its own. Either way every
  /// collective, blocking or not, runs under a WatchScope, so --comm_timeout's watchdog ends a job
  /// whose peer stopped, naming the rank the flag barrier waits for.
  double timeout_s = 0;
};

/// Collectives through an MPI-3 shared-memory window, for a communicator whose ranks all live on
/// one node (checked: MPI_Comm_split_type(SHARED) must return the whole communicator, and the
/// window's memory model must be MPI_WIN_UNIFIED).
///
/// Each rank owns a segment of the window: a flag page and two staging buffers of chunk_bytes
/// (double buffering). A collective is a sequence of steps; a step writes into one buffer (own
/// segment), synchronises, then reads peers' buffers. Synchronisation is a flag barrier: each rank
/// issues a full fence, release-stores an increasing epoch into its own flag and spins (pause, then
/// sched_yield) until every peer's flag has reached it (C++ atomic acquire loads on the shared
/// memory; no MPI call on the data path). Steps alternate between the two buffers, so one barrier
/// per step suffices: a buffer is rewritten only after a later barrier proves every rank finished
/// reading it.
///  - all_gather: each step copies a chunk of this rank's send into its buffer, barrier, copies
///  every
///    rank's chunk (its own from the cache-hot buffer) into recv (1 barrier per step).
///  - reduce_scatter: each step copies, for every destination rank r, the next piece of send block
///  r
///    into its buffer, barrier, then rank r reduces piece r of every rank's buffer (1 barrier).
///  - all_reduce: each step copies a chunk, barrier, rank r reduces its 1/size slice of the chunk
///    over all buffers and writes it back into its own buffer, barrier, everyone copies every slice
///    (2 barriers); chunks up to 16 KiB are reduced whole by every rank (1 barrier).
///  - broadcast: root copies a chunk in, barrier, others copy it out (1 barrier).
/// Outputs of at least stream_min_bytes are written with non-temporal stores.
/// Reductions are deterministic and identical on every rank: op(...op(op(x0, x1), x2)..., x_{n-1})
/// in rank order, in the element type (fp32 sums in fp32), so for every rank count the result is
/// well defined and equal to a sequential sum over ranks in rank order.
///
/// Non-blocking collectives complete EAGERLY at post time: the returned request is already done.
/// There is no progress thread, so on this CPU backend a non-blocking shm collective does not
/// overlap with computation (its whole time is accounted at post).
///
/// Construction and destruction are collective over the communicator (MPI_Win_allocate_shared /
/// MPI_Win_free): every rank creates and destroys its ShmComms in the same order. While an
/// exception is unwinding, the destructor skips MPI_Win_free (leaks the window) so a failing rank
/// cannot block.
class ShmComm final : public Comm {
 public:
  /// Collective over `comm`. Throws rlhf::Error if the ranks of `comm` are not all on one node or
  /// the window is not unified.
  ShmComm(MPI_Comm comm, std::string name, const ShmCommOptions& opts = {});
  ~ShmComm() override;
  CommKind kind() const override { return CommKind::kShm; }
  MPI_Comm mpi_comm() const override { return comm_; }

 protected:
  void do_all_gather(const void* send, void* recv, int64_t count, DType dt) override;
  void do_all_gather_strided(const void* send, void* recv, int64_t count, int64_t stride,
                             DType dt) override;
  void do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                         ReduceOp op) override;
  void do_all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op) override;
  void do_broadcast(void* buf, int64_t count, DType dt, int root) override;
  void do_barrier() override;
  std::unique_ptr<CommRequest::Impl> do_iall_gather(const void* send, void* recv, int64_t count,
                                                    DType dt) override;
  std::unique_ptr<CommRequest::Impl> do_ireduce_scatter(const void* send, void* recv, int64_t count,
                                                        DType dt, ReduceOp op) override;
  std::unique_ptr<CommRequest::Impl> do_iall_reduce(const void* send, void* recv, int64_t count,
                                                    DType dt, ReduceOp op) override;
  std::unique_ptr<CommRequest::Impl> do_ibroadcast(void* buf, int64_t count, DType dt,
                                                   int root) override;

 private:
  ShmCommOptions opts_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<char*> seg_;        // base of every rank's segment (flag page, buffer 0, buffer 1)
  std::vector<int> world_ranks_;  // MPI_COMM_WORLD rank of every rank (watchdog messages)
  uint64_t epoch_ = 0;            // barriers passed
  uint64_t step_ = 0;             // steps done (selects the staging buffer: step_ % 2)
  char* buffer(int r, uint64_t step) const;
  void flag_barrier();
};

/// True if every rank of `comm` lives on one node (MPI_Comm_split_type(SHARED) gives the whole
/// communicator). Collective over `comm`.
bool is_node_local(MPI_Comm comm);

/// Makes the communicator named `name` over `comm` (collective over `comm`). Returns nullptr for
/// MPI_COMM_NULL (a rank that is not a member). kAuto: env RLHF_COMM_KIND ("mpi", "shm" or
/// "auto") if set, else ShmComm when is_node_local(comm), else MpiComm. kShm on a communicator that
/// spans nodes throws rlhf::Error. kNccl makes an NcclComm on the current CUDA device with
/// `nccl_timeout_s` as its watchdog timeout (--nccl_timeout; 0 = none); it throws rlhf::Error when
/// built without NCCL.
std::unique_ptr<Comm> make_comm(MPI_Comm comm, const std::string& name,
                                CommKind kind = CommKind::kAuto, const ShmCommOptions& opts = {},
                                double nccl_timeout_s = 600.0);

}  // namespace rlhf::parallel

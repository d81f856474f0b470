// NcclComm: the Comm interface (parallel/comm.h) on NCCL, for device buffers, plus the watchdog
// that turns a stuck or failed collective into ncclCommAbort + MPI_Abort (docs/design.md,
// "Conventions: errors").
//
// Only abort_nccl_comms() exists without NCCL (as a no-op), so app/main can call it
// unconditionally on its abort path.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/comm.h"

#ifdef RLHF_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace rlhf::parallel {

/// ncclCommAbort on every live NcclComm of this process (app/main's abort path, before
/// MPI_Abort; the watchdog's too). Idempotent, safe from any thread, never throws. A no-op when
/// built without NCCL or when there is none.
void abort_nccl_comms() noexcept;

#ifdef RLHF_NCCL

/// Options of NcclComm.
struct NcclCommOptions {
  /// --nccl_timeout: seconds a collective may stay incomplete (from the moment it is enqueued)
  /// before the watchdog ends the job; <= 0 disables the timeout (asynchronous NCCL errors are
  /// still watched).
  double timeout_s = 600.0;
  /// How often the watchdog looks at pending collectives and at ncclCommGetAsyncError.
  double poll_s = 0.1;
  /// Test hook. Empty (production): on a timeout or error the watchdog logs the reason to stderr,
  /// calls abort_nccl_comms() and then MPI_Abort(MPI_COMM_WORLD, 1). Set: the watchdog calls it
  /// (from its own thread) with the reason instead, and stops watching that collective.
  std::function<void(const std::string& reason)> on_timeout;
};

/// Collectives by NCCL on the communicator's own CUDA stream, so that (for example) ZeRO-3's
/// prefetch all-gathers and gradient reduce-scatters overlap the compute stream.
///
/// - Buffers are device memory of the CUDA device that was current at construction (NCCL also
///   accepts host memory that is registered/mapped; plain pageable host memory is not allowed).
/// - Construction is collective over `comm`: MPI_Comm_dup, rank 0 creates one ncclUniqueId and
///   broadcasts it over the duplicate (MPI_Bcast), every rank calls ncclCommInitRank. Two ranks of
///   one communicator must not share a device (NCCL refuses: "Duplicate GPU detected").
/// - Ordering: a collective is enqueued on stream() after whatever is already queued there. Data
///   produced on another stream must be ordered first with wait_for(producer); results are
///   consumed on another stream after signal_to(consumer), or on the host after the blocking call
///   or the request's wait().
/// - Blocking calls enqueue, then wait on the host for the collective's completion event.
///   Non-blocking calls enqueue, record an event and return a request whose wait() synchronises
///   that event (cudaEventSynchronize) and whose test() queries it (cudaEventQuery).
/// - Every collective's event is also handed to the watchdog thread, which polls every poll_s:
///   an event still incomplete after timeout_s, an event query that reports a CUDA error, or
///   ncclCommGetAsyncError != ncclSuccess ends the job (see NcclCommOptions::on_timeout).
/// - Sums are in NCCL's order (ring/tree; not necessarily rank order, not bitwise equal to MPI's
///   for floating point). barrier() is an all-reduce of one int on the device, then a wait.
/// - Destruction is collective (ncclCommFinalize + ncclCommDestroy, then MPI_Comm_free), like
///   MpiComm; while an exception is unwinding, the communicator is aborted instead
///   (ncclCommAbort: does not wait for peers) and the MPI duplicate is leaked.
/// Not thread-safe (one thread issues collectives), except abort().
class NcclComm final : public Comm {
 public:
  /// Collective over `comm`. Throws rlhf::Error on an MPI, CUDA or NCCL failure.
  NcclComm(MPI_Comm comm, std::string name, const NcclCommOptions& opts = {});
  ~NcclComm() override;
  CommKind kind() const override { return CommKind::kNccl; }
  MPI_Comm mpi_comm() const override { return comm_; }

  /// The stream every collective of this communicator is enqueued on (non-blocking w.r.t. the
  /// legacy default stream).
  cudaStream_t stream() const { return stream_; }
  /// The CUDA device the communicator was created on.
  int device() const { return device_; }

  /// Makes stream() wait for all work queued so far on `producer` (event + cudaStreamWaitEvent;
  /// no host blocking).
  void wait_for(cudaStream_t producer);
  /// Makes `consumer` wait for all collectives queued so far on stream().
  void signal_to(cudaStream_t consumer);

  /// ncclCommAbort, once (later calls do nothing); the communicator is unusable afterwards. Safe
  /// from any thread; never throws.
  void abort() noexcept;
  /// True once abort() has run.
  bool aborted() const { return aborted_.load(); }

  /// One collective the watchdog follows (public so that the request type can share it).
  struct Pending;

 protected:
  void do_all_gather(const void* send, void* recv, int64_t count, DType dt) override;
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
  NcclCommOptions opts_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t nccl_ = nullptr;
  int* barrier_buf_ = nullptr;  // one device int for barrier()
  std::atomic<bool> aborted_{false};
  int64_t seq_ = 0;  // collectives enqueued (for watchdog messages)

  // Watchdog state (guarded by wd_mu_).
  std::mutex wd_mu_;
  std::condition_variable wd_cv_;
  std::deque<std::shared_ptr<Pending>> wd_pending_;
  bool wd_stop_ = false;
  std::thread wd_thread_;

  // Records the completion event of the collective just enqueued on stream_, hands it to the
  // watchdog and returns it.
  std::shared_ptr<Pending> track(CollOp op, int64_t count, DType dt);
  void watchdog_loop();
  // Reports `reason` (hook, or stderr + abort_nccl_comms + MPI_Abort).
  void watchdog_fire(const std::string& reason);
  void release_resources(bool collective) noexcept;
};

#endif  // RLHF_NCCL

}  // namespace rlhf::parallel

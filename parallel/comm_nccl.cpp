// NcclComm: NCCL collectives behind the Comm interface, and the watchdog (see comm_nccl.h).
#include "parallel/comm_nccl.h"
#include "parallel/watchdog.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <set>

#include "core/cuda_check.h"
#include "core/error.h"
#include "parallel/mpi_check.h"

namespace rlhf::parallel {

#ifdef RLHF_NCCL

namespace {

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

ncclDataType_t nccl_dtype(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kUint8:
      return ncclUint8;
    case DType::kBfloat16:
      return ncclBfloat16;
  }
  RLHF_FAIL("unknown DType {}", static_cast<int>(dt));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  RLHF_FAIL("unknown ReduceOp {}", static_cast<int>(op));
}

// The live communicators, for abort_nccl_comms().
std::mutex& registry_mutex() {
  static std::mutex* m = new std::mutex();  // never destroyed: usable until the very end
  return *m;
}
std::set<NcclComm*>& registry() {
  static std::set<NcclComm*>* r = new std::set<NcclComm*>();
  return *r;
}

}  // namespace

struct NcclComm::Pending {
  cudaEvent_t event = nullptr;
  double t0 = 0;
  CollOp op = CollOp::kBarrier;
  int64_t seq = 0;
  int64_t count = 0;
  DType dt = DType::kUint8;
  Pending() = default;
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;
  ~Pending() {
    if (event != nullptr) (void)cudaEventDestroy(event);
  }
};

namespace {

// A non-blocking NCCL collective: its completion event (shared with the watchdog).
class NcclRequest final : public CommRequest::Impl {
 public:
  explicit NcclRequest(std::shared_ptr<NcclComm::Pending> p) : p_(std::move(p)) {}
  void wait() override { CUDA_CHECK(cudaEventSynchronize(p_->event)); }
  bool test() override {
    const cudaError_t e = cudaEventQuery(p_->event);
    if (e == cudaErrorNotReady) return false;  // "not actually an error" (CUDA docs)
    CUDA_CHECK(e);
    return true;
  }

 private:
  std::shared_ptr<NcclComm::Pending> p_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction and destruction

NcclComm::NcclComm(MPI_Comm comm, std::string name, const NcclCommOptions& opts)
    : Comm(std::move(name), comm_rank(comm), comm_size(comm)), opts_(opts) {
  RLHF_CHECK(opts_.poll_s > 0, "{}: NCCL watchdog poll period must be > 0, got {}", this->name(),
             opts_.poll_s);
  CUDA_CHECK(cudaGetDevice(&device_));
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  try {
    ncclUniqueId id{};
    if (rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, comm_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    void* buf = nullptr;
    CUDA_CHECK(cudaMalloc(&buf, sizeof(int)));
    barrier_buf_ = static_cast<int*>(buf);
    NCCL_CHECK(ncclCommInitRank(&nccl_, size(), id, rank()));
  } catch (...) {
    release_resources(false);
    throw;
  }
  try {
    wd_thread_ = std::thread([this] { watchdog_loop(); });
  } catch (...) {  // std::system_error: no thread, so no communicator either
    release_resources(false);
    throw;
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().insert(this);
}

NcclComm::~NcclComm() {
  {
    std::lock_guard<std::mutex> lock(wd_mu_);
    wd_stop_ = true;
  }
  wd_cv_.notify_all();
  if (wd_thread_.joinable()) wd_thread_.join();
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().erase(this);
  }
  release_resources(std::uncaught_exceptions() == 0);
}

void NcclComm::release_resources(bool collective) noexcept {
  if (nccl_ != nullptr) {
    if (collective && !aborted_.load()) {
      (void)cudaStreamSynchronize(stream_);
      (void)ncclCommFinalize(nccl_);
      (void)ncclCommDestroy(nccl_);
    } else if (!aborted_.exchange(true)) {
      (void)ncclCommAbort(nccl_);
    }
    nccl_ = nullptr;
  }
  if (barrier_buf_ != nullptr) (void)cudaFree(barrier_buf_);
  barrier_buf_ = nullptr;
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  stream_ = nullptr;
  (void)cudaGetLastError();
  if (collective) {
    free_comm_quietly(&comm_);
  } else {
    comm_ = MPI_COMM_NULL;  // leaked on purpose (a failing rank must not wait for its peers)
  }
}

void NcclComm::abort() noexcept {
  if (!aborted_.exchange(true) && nccl_ != nullptr) (void)ncclCommAbort(nccl_);
}

void abort_nccl_comms() noexcept {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (NcclComm* c : registry()) c->abort();
}

// ---------------------------------------------------------------------------------------------
// Streams and events

void NcclComm::wait_for(cudaStream_t producer) {
  cudaEvent_t ev = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  const cudaError_t e1 = cudaEventRecord(ev, producer);
  const cudaError_t e2 = e1 == cudaSuccess ? cudaStreamWaitEvent(stream_, ev, 0) : e1;
  (void)cudaEventDestroy(ev);  // safe: destruction is deferred until the wait is satisfied
  CUDA_CHECK(e2);
}

void NcclComm::signal_to(cudaStream_t consumer) {
  cudaEvent_t ev = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  const cudaError_t e1 = cudaEventRecord(ev, stream_);
  const cudaError_t e2 = e1 == cudaSuccess ? cudaStreamWaitEvent(consumer, ev, 0) : e1;
  (void)cudaEventDestroy(ev);
  CUDA_CHECK(e2);
}

std::shared_ptr<NcclComm::Pending> NcclComm::track(CollOp op, int64_t count, DType dt) {
  auto p = std::make_shared<Pending>();
  CUDA_CHECK(cudaEventCreateWithFlags(&p->event, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(p->event, stream_));
  p->t0 = now_s();
  p->op = op;
  p->seq = ++seq_;
  p->count = count;
  p->dt = dt;
  {
    std::lock_guard<std::mutex> lock(wd_mu_);
    wd_pending_.push_back(p);
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// Watchdog

void NcclComm::watchdog_loop() {
  (void)cudaSetDevice(device_);  // event queries from this thread use the communicator's device
  std::unique_lock<std::mutex> lock(wd_mu_);
  while (!wd_stop_) {
    wd_cv_.wait_for(lock, std::chrono::duration<double>(opts_.poll_s));
    if (wd_stop_) break;
    if (aborted_.load()) continue;
    ncclResult_t async = ncclSuccess;
    const ncclResult_t qr = ncclCommGetAsyncError(nccl_, &async);
    if (qr != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      const std::string reason =
          fmt::format("{}: NCCL reports an asynchronous error: {}", name(),
                      nccl_error_string(static_cast<int>(qr != ncclSuccess ? qr : async)));
      lock.unlock();
      watchdog_fire(reason);
      lock.lock();
      continue;
    }
    // Completed collectives leave the queue; the first overdue or failed one fires.
    const double now = now_s();
    for (auto it = wd_pending_.begin(); it != wd_pending_.end();) {
      const Pending& p = **it;
      const cudaError_t e = cudaEventQuery(p.event);
      if (e == cudaSuccess) {
        it = wd_pending_.erase(it);
        continue;
      }
      std::string reason;
      if (e != cudaErrorNotReady) {
        reason =
            fmt::format("{}: {} #{} ({} x {}) failed on the device: {}", name(), coll_op_name(p.op),
                        p.seq, p.count, dtype_name(p.dt), cuda_error_string(e));
      } else if (opts_.timeout_s > 0 && now - p.t0 > opts_.timeout_s) {
        reason = fmt::format(
            "{}: {} #{} ({} x {}) has not completed {:.1f} s after it was enqueued (timeout "
            "{:.1f} s)\nhint: a rank is missing from the collective (crashed, stuck, or called "
            "collectives in a different order); raise --nccl_timeout if it is only slow",
            name(), coll_op_name(p.op), p.seq, p.count, dtype_name(p.dt), now - p.t0,
            opts_.timeout_s);
      }
      if (reason.empty()) {
        ++it;
        continue;
      }
      (void)cudaGetLastError();
      it = wd_pending_.erase(it);  // reported once
      lock.unlock();
      watchdog_fire(reason);
      lock.lock();
      break;  // the queue may have changed while unlocked
    }
  }
}

void NcclComm::watchdog_fire(const std::string& reason) {
  if (opts_.on_timeout) {
    opts_.on_timeout(reason);
    return;
  }
  const std::string& ctx = error_context();
  const std::string stuck = describe_stuck_peers();  // a stopped or dead peer on this host
  std::fprintf(stderr,
               "[rlhf NCCL watchdog]%s%s%s %s%s%s\nAborting the NCCL communicators and the job.\n",
               ctx.empty() ? "" : " (", ctx.c_str(), ctx.empty() ? "" : ")", reason.c_str(),
               stuck.empty() ? "" : "; ", stuck.c_str());
  std::fflush(stderr);
  abort_nccl_comms();
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// ---------------------------------------------------------------------------------------------
// Collectives (count 0: no NCCL call, the request is complete at once; the base class still
// accounts the call)

std::unique_ptr<CommRequest::Impl> NcclComm::do_iall_gather(const void* send, void* recv,
                                                            int64_t count, DType dt) {
  if (count == 0) return nullptr;  // nothing to move: complete at post time
  NCCL_CHECK(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_dtype(dt), nccl_, stream_));
  return std::make_unique<NcclRequest>(track(CollOp::kAllGather, count, dt));
}

std::unique_ptr<CommRequest::Impl> NcclComm::do_ireduce_scatter(const void* send, void* recv,
                                                                int64_t count, DType dt,
                                                                ReduceOp op) {
  if (count == 0) return nullptr;  // nothing to move: complete at post time
  NCCL_CHECK(ncclReduceScatter(send, recv, static_cast<size_t>(count), nccl_dtype(dt), nccl_op(op),
                               nccl_, stream_));
  return std::make_unique<NcclRequest>(track(CollOp::kReduceScatter, count, dt));
}

std::unique_ptr<CommRequest::Impl> NcclComm::do_iall_reduce(const void* send, void* recv,
                                                            int64_t count, DType dt, ReduceOp op) {
  if (count == 0) return nullptr;  // nothing to move: complete at post time
  NCCL_CHECK(ncclAllReduce(send, recv, static_cast<size_t>(count), nccl_dtype(dt), nccl_op(op),
                           nccl_, stream_));
  return std::make_unique<NcclRequest>(track(CollOp::kAllReduce, count, dt));
}

std::unique_ptr<CommRequest::Impl> NcclComm::do_ibroadcast(void* buf, int64_t count, DType dt,
                                                           int root) {
  if (count == 0) return nullptr;  // nothing to move: complete at post time
  NCCL_CHECK(
      ncclBroadcast(buf, buf, static_cast<size_t>(count), nccl_dtype(dt), root, nccl_, stream_));
  return std::make_unique<NcclRequest>(track(CollOp::kBroadcast, count, dt));
}

void NcclComm::do_all_gather(const void* send, void* recv, int64_t count, DType dt) {
  if (auto r = do_iall_gather(send, recv, count, dt)) r->wait();
}

void NcclComm::do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                 ReduceOp op) {
  if (auto r = do_ireduce_scatter(send, recv, count, dt, op)) r->wait();
}

void NcclComm::do_all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op) {
  if (auto r = do_iall_reduce(send, recv, count, dt, op)) r->wait();
}

void NcclComm::do_broadcast(void* buf, int64_t count, DType dt, int root) {
  if (auto r = do_ibroadcast(buf, count, dt, root)) r->wait();
}

void NcclComm::do_barrier() {
  NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, nccl_, stream_));
  NcclRequest(track(CollOp::kBarrier, 1, DType::kInt32)).wait();
}

#else  // !RLHF_NCCL

void abort_nccl_comms() noexcept {}

#endif  // RLHF_NCCL

}  // namespace rlhf::parallel

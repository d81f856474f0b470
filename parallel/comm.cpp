// Comm base (validation, accounting), CommRequest, MpiComm, make_comm.
#include "parallel/comm.h"

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm_nccl.h"
#include "parallel/mpi_check.h"
#include "parallel/watchdog.h"

namespace rlhf::parallel {

namespace {

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  RLHF_FAIL("unknown ReduceOp {}", static_cast<int>(op));
}

int mpi_count(int64_t count, const std::string& comm, const char* what) {
  RLHF_CHECK(count <= INT_MAX,
             "{}: {} of {} elements exceeds MPI's int count limit ({})\nhint: split the call into "
             "pieces below 2^31 elements",
             comm, what, count, INT_MAX);
  return static_cast<int>(count);
}

// A pending MPI_I* collective.
class MpiRequest final : public CommRequest::Impl {
 public:
  MpiRequest() = default;
  // A nonblocking collective's request may not be freed (MPI-3.1 §5.12): if it is still pending
  // here (abandoned during unwinding), it is leaked.
  ~MpiRequest() override = default;
  void wait() override { MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE)); }
  bool test() override {
    int flag = 0;
    MPI_CHECK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  }
  MPI_Request req = MPI_REQUEST_NULL;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Names

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kUint8:
      return 1;
    case DType::kBfloat16:
      return 2;
  }
  RLHF_FAIL("unknown DType {}", static_cast<int>(dt));
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUint8:
      return "uint8";
    case DType::kBfloat16:
      return "bfloat16";
  }
  return "?";
}

MPI_Datatype mpi_dtype(DType dt) {
  switch (dt) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kUint8:
      return MPI_UINT8_T;
    case DType::kBfloat16:
      return MPI_UINT16_T;
  }
  RLHF_FAIL("unknown DType {}", static_cast<int>(dt));
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

const char* coll_op_name(CollOp op) {
  switch (op) {
    case CollOp::kAllGather:
      return "all_gather";
    case CollOp::kReduceScatter:
      return "reduce_scatter";
    case CollOp::kAllReduce:
      return "all_reduce";
    case CollOp::kBroadcast:
      return "broadcast";
    case CollOp::kBarrier:
      return "barrier";
  }
  return "?";
}

const char* comm_kind_name(CommKind kind) {
  switch (kind) {
    case CommKind::kAuto:
      return "auto";
    case CommKind::kMpi:
      return "mpi";
    case CommKind::kShm:
      return "shm";
    case CommKind::kNccl:
      return "nccl";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// CommRequest

CommRequest::CommRequest(std::unique_ptr<Impl> impl, Comm* comm, CollOp op)
    : impl_(std::move(impl)), comm_(comm), op_(op) {}

CommRequest::CommRequest(CommRequest&& o) noexcept
    : impl_(std::move(o.impl_)), comm_(o.comm_), op_(o.op_) {}

CommRequest& CommRequest::operator=(CommRequest&& o) noexcept {
  if (this != &o) {
    if (impl_ != nullptr && std::uncaught_exceptions() == 0) {
      try {
        wait();
      } catch (...) {
      }
    }
    impl_ = std::move(o.impl_);
    comm_ = o.comm_;
    op_ = o.op_;
  }
  return *this;
}

CommRequest::~CommRequest() {
  if (impl_ == nullptr) return;
  if (std::uncaught_exceptions() > 0) {
    (void)impl_.release();  // abandoned on purpose: see the class comment
    return;
  }
  try {
    wait();
  } catch (...) {
    // A destructor cannot report; the error resurfaces at the next collective.
  }
}

void CommRequest::wait() {
  if (impl_ == nullptr) return;
  WatchScope watch(coll_op_name(op_), comm_ != nullptr ? comm_->name() : std::string("request"));
  double t0 = now_s();
  impl_->wait();
  impl_.reset();
  if (comm_ != nullptr) comm_->account_seconds(op_, now_s() - t0);
}

bool CommRequest::test() {
  if (impl_ == nullptr) return true;
  double t0 = now_s();
  bool done = impl_->test();
  if (done) impl_.reset();
  if (comm_ != nullptr) comm_->account_seconds(op_, now_s() - t0);
  return done;
}

// ---------------------------------------------------------------------------------------------
// Comm: validation and accounting

Comm::Comm(std::string name, int rank, int size)
    : name_(std::move(name)), rank_(rank), size_(size) {}

void Comm::reset_stats() {
  total_.reset();
  for (auto& s : by_op_) s.reset();
}

void Comm::account(CollOp op, int64_t bytes, double seconds) {
  CommStats d{1, bytes, seconds};
  total_ += d;
  by_op_[static_cast<size_t>(op)] += d;
}

void Comm::account_seconds(CollOp op, double seconds) {
  total_.seconds += seconds;
  by_op_[static_cast<size_t>(op)].seconds += seconds;
}

std::string Comm::summary(bool per_op) const {
  std::string s = fmt::format("{}: {} calls, {:.2f} GB, {:.3f} s", name_, total_.calls,
                              static_cast<double>(total_.bytes) * 1e-9, total_.seconds);
  if (per_op) {
    std::string parts;
    for (int i = 0; i < kNumCollOps; ++i) {
      const CommStats& c = by_op_[static_cast<size_t>(i)];
      if (c.calls == 0) continue;
      parts += fmt::format("{}{} {} calls {:.2f} GB {:.3f} s", parts.empty() ? "" : ", ",
                           coll_op_name(static_cast<CollOp>(i)), c.calls,
                           static_cast<double>(c.bytes) * 1e-9, c.seconds);
    }
    if (!parts.empty()) s += " (" + parts + ")";
  }
  return s;
}

void Comm::check_args(const char* what, const void* a, const void* b, int64_t count) const {
  RLHF_CHECK(count >= 0, "{}: {} with count {} < 0", name_, what, count);
  RLHF_CHECK(count == 0 || (a != nullptr && b != nullptr), "{}: {} with a null buffer", name_,
             what);
}

void Comm::check_reduction(const char* what, DType dt) const {
  RLHF_CHECK(dt != DType::kBfloat16 || kind() == CommKind::kNccl,
             "{}: {} of bfloat16 needs an NCCL communicator (this one is {})", name_, what,
             comm_kind_name(kind()));
}

void Comm::all_gather(const void* send, void* recv, int64_t count, DType dt) {
  check_args("all_gather", send, recv, count);
  WatchScope watch("all_gather", name_);
  double t0 = now_s();
  do_all_gather(send, recv, count, dt);
  account(CollOp::kAllGather, count * size_ * static_cast<int64_t>(dtype_size(dt)), now_s() - t0);
}

void Comm::reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op) {
  check_args("reduce_scatter", send, recv, count);
  check_reduction("reduce_scatter", dt);
  WatchScope watch("reduce_scatter", name_);
  double t0 = now_s();
  do_reduce_scatter(send, recv, count, dt, op);
  account(CollOp::kReduceScatter, count * size_ * static_cast<int64_t>(dtype_size(dt)),
          now_s() - t0);
}

void Comm::all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op) {
  check_args("all_reduce", send, recv, count);
  check_reduction("all_reduce", dt);
  WatchScope watch("all_reduce", name_);
  double t0 = now_s();
  do_all_reduce(send, recv, count, dt, op);
  account(CollOp::kAllReduce, count * static_cast<int64_t>(dtype_size(dt)), now_s() - t0);
}

void Comm::broadcast(void* buf, int64_t count, DType dt, int root) {
  check_args("broadcast", buf, buf, count);
  RLHF_CHECK(root >= 0 && root < size_, "{}: broadcast root {} outside [0, {})", name_, root,
             size_);
  WatchScope watch("broadcast", name_);
  double t0 = now_s();
  do_broadcast(buf, count, dt, root);
  account(CollOp::kBroadcast, count * static_cast<int64_t>(dtype_size(dt)), now_s() - t0);
}

void Comm::barrier() {
  WatchScope watch("barrier", name_);
  double t0 = now_s();
  do_barrier();
  account(CollOp::kBarrier, 0, now_s() - t0);
}

std::vector<std::vector<uint8_t>> Comm::all_gather_bytes(const std::vector<uint8_t>& mine) {
  WatchScope watch("all_gather_bytes", name_);
  const double t0 = now_s();
  const int64_t my = int64_t(mine.size());
  std::vector<int64_t> sizes(static_cast<size_t>(size_));
  MPI_CHECK(MPI_Allgather(&my, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, mpi_comm()));
  std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
  int64_t total = 0;
  for (int j = 0; j < size_; ++j) {
    RLHF_CHECK(total + sizes[size_t(j)] < std::numeric_limits<int>::max(),
               "{}: all_gather_bytes of {} bytes or more (2 GiB is the limit)", name_,
               total + sizes[size_t(j)]);
    counts[size_t(j)] = int(sizes[size_t(j)]);
    displs[size_t(j)] = int(total);
    total += sizes[size_t(j)];
  }
  std::vector<uint8_t> all(static_cast<size_t>(total));
  MPI_CHECK(MPI_Allgatherv(mine.data(), int(my), MPI_BYTE, all.data(), counts.data(), displs.data(),
                           MPI_BYTE, mpi_comm()));
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(size_));
  for (int j = 0; j < size_; ++j)
    out[size_t(j)].assign(all.begin() + displs[size_t(j)],
                          all.begin() + displs[size_t(j)] + counts[size_t(j)]);
  account(CollOp::kAllGather, total, now_s() - t0);
  return out;
}

void Comm::all_gather_strided(const void* send, void* recv, int64_t count, int64_t stride,
                              DType dt) {
  check_args("all_gather_strided", send, recv, count);
  RLHF_CHECK(stride >= count, "{}: all_gather_strided with stride {} < count {}", name_, stride,
             count);
  WatchScope watch("all_gather_strided", name_);
  double t0 = now_s();
  do_all_gather_strided(send, recv, count, stride, dt);
  account(CollOp::kAllGather, count * size_ * static_cast<int64_t>(dtype_size(dt)), now_s() - t0);
}

void Comm::do_all_gather_strided(const void* send, void* recv, int64_t count, int64_t stride,
                                 DType dt) {
  const size_t es = dtype_size(dt), b = static_cast<size_t>(count) * es;
  std::vector<char> tmp(b * static_cast<size_t>(size_));
  do_all_gather(send, tmp.data(), count, dt);
  for (int j = 0; j < size_; ++j)
    std::memcpy(
        static_cast<char*>(recv) + static_cast<size_t>(j) * static_cast<size_t>(stride) * es,
        tmp.data() + static_cast<size_t>(j) * b, b);
}

CommRequest Comm::iall_gather(const void* send, void* recv, int64_t count, DType dt) {
  check_args("iall_gather", send, recv, count);
  // Posting may itself block (ShmComm completes at post time): watched as the collective.
  WatchScope watch("all_gather", name_);
  double t0 = now_s();
  auto impl = do_iall_gather(send, recv, count, dt);
  account(CollOp::kAllGather, count * size_ * static_cast<int64_t>(dtype_size(dt)), now_s() - t0);
  return CommRequest(std::move(impl), this, CollOp::kAllGather);
}

CommRequest Comm::ireduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                  ReduceOp op) {
  check_args("ireduce_scatter", send, recv, count);
  check_reduction("ireduce_scatter", dt);
  // Posting may itself block (ShmComm completes at post time): watched as the collective.
  WatchScope watch("reduce_scatter", name_);
  double t0 = now_s();
  auto impl = do_ireduce_scatter(send, recv, count, dt, op);
  account(CollOp::kReduceScatter, count * size_ * static_cast<int64_t>(dtype_size(dt)),
          now_s() - t0);
  return CommRequest(std::move(impl), this, CollOp::kReduceScatter);
}

CommRequest Comm::iall_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op) {
  check_args("iall_reduce", send, recv, count);
  check_reduction("iall_reduce", dt);
  // Posting may itself block (ShmComm completes at post time): watched as the collective.
  WatchScope watch("all_reduce", name_);
  double t0 = now_s();
  auto impl = do_iall_reduce(send, recv, count, dt, op);
  account(CollOp::kAllReduce, count * static_cast<int64_t>(dtype_size(dt)), now_s() - t0);
  return CommRequest(std::move(impl), this, CollOp::kAllReduce);
}

CommRequest Comm::ibroadcast(void* buf, int64_t count, DType dt, int root) {
  check_args("ibroadcast", buf, buf, count);
  RLHF_CHECK(root >= 0 && root < size_, "{}: ibroadcast root {} outside [0, {})", name_, root,
             size_);
  // Posting may itself block (ShmComm completes at post time): watched as the collective.
  WatchScope watch("broadcast", name_);
  double t0 = now_s();
  auto impl = do_ibroadcast(buf, count, dt, root);
  account(CollOp::kBroadcast, count * static_cast<int64_t>(dtype_size(dt)), now_s() - t0);
  return CommRequest(std::move(impl), this, CollOp::kBroadcast);
}

// ---------------------------------------------------------------------------------------------
// MpiComm

MpiComm::MpiComm(MPI_Comm comm, std::string name)
    : Comm(std::move(name), comm_rank(comm), comm_size(comm)) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
}

MpiComm::~MpiComm() {
  free_comm_quietly(&comm_);
}

void MpiComm::do_all_gather(const void* send, void* recv, int64_t count, DType dt) {
  int n = mpi_count(count, name(), "all_gather");
  const char* own = static_cast<const char*>(recv) +
                    static_cast<size_t>(rank()) * static_cast<size_t>(count) * dtype_size(dt);
  if (send == own) {
    MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, mpi_dtype(dt), comm_));
  } else {
    MPI_CHECK(MPI_Allgather(send, n, mpi_dtype(dt), recv, n, mpi_dtype(dt), comm_));
  }
}

void MpiComm::do_all_gather_strided(const void* send, void* recv, int64_t count, int64_t stride,
                                    DType dt) {
  const int n = mpi_count(count, name(), "all_gather_strided");
  if (stride * static_cast<int64_t>(size()) > std::numeric_limits<int>::max())
    return Comm::do_all_gather_strided(send, recv, count, stride, dt);
  std::vector<int> counts(static_cast<size_t>(size()), n), displs(static_cast<size_t>(size()));
  for (int j = 0; j < size(); ++j) displs[static_cast<size_t>(j)] = static_cast<int>(j * stride);
  MPI_CHECK(MPI_Allgatherv(send, n, mpi_dtype(dt), recv, counts.data(), displs.data(),
                           mpi_dtype(dt), comm_));
}

void MpiComm::do_reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                ReduceOp op) {
  int n = mpi_count(count, name(), "reduce_scatter");
  MPI_CHECK(MPI_Reduce_scatter_block(send, recv, n, mpi_dtype(dt), mpi_op(op), comm_));
}

void MpiComm::do_all_reduce(const void* send, void* recv, int64_t count, DType dt, ReduceOp op) {
  int n = mpi_count(count, name(), "all_reduce");
  MPI_CHECK(
      MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, mpi_dtype(dt), mpi_op(op), comm_));
}

void MpiComm::do_broadcast(void* buf, int64_t count, DType dt, int root) {
  int n = mpi_count(count, name(), "broadcast");
  MPI_CHECK(MPI_Bcast(buf, n, mpi_dtype(dt), root, comm_));
}

void MpiComm::do_barrier() {
  MPI_CHECK(MPI_Barrier(comm_));
}

std::unique_ptr<CommRequest::Impl> MpiComm::do_iall_gather(const void* send, void* recv,
                                                           int64_t count, DType dt) {
  int n = mpi_count(count, name(), "iall_gather");
  auto r = std::make_unique<MpiRequest>();
  const char* own = static_cast<const char*>(recv) +
                    static_cast<size_t>(rank()) * static_cast<size_t>(count) * dtype_size(dt);
  if (send == own) {
    MPI_CHECK(
        MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, mpi_dtype(dt), comm_, &r->req));
  } else {
    MPI_CHECK(MPI_Iallgather(send, n, mpi_dtype(dt), recv, n, mpi_dtype(dt), comm_, &r->req));
  }
  return r;
}

std::unique_ptr<CommRequest::Impl> MpiComm::do_ireduce_scatter(const void* send, void* recv,
                                                               int64_t count, DType dt,
                                                               ReduceOp op) {
  int n = mpi_count(count, name(), "ireduce_scatter");
  auto r = std::make_unique<MpiRequest>();
  MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, n, mpi_dtype(dt), mpi_op(op), comm_, &r->req));
  return r;
}

std::unique_ptr<CommRequest::Impl> MpiComm::do_iall_reduce(const void* send, void* recv,
                                                           int64_t count, DType dt, ReduceOp op) {
  int n = mpi_count(count, name(), "iall_reduce");
  auto r = std::make_unique<MpiRequest>();
  MPI_CHECK(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, mpi_dtype(dt), mpi_op(op),
                           comm_, &r->req));
  return r;
}

std::unique_ptr<CommRequest::Impl> MpiComm::do_ibroadcast(void* buf, int64_t count, DType dt,
                                                          int root) {
  int n = mpi_count(count, name(), "ibroadcast");
  auto r = std::make_unique<MpiRequest>();
  MPI_CHECK(MPI_Ibcast(buf, n, mpi_dtype(dt), root, comm_, &r->req));
  return r;
}

// ---------------------------------------------------------------------------------------------
// Factory

bool is_node_local(MPI_Comm comm) {
  RLHF_CHECK(comm != MPI_COMM_NULL, "is_node_local: MPI_COMM_NULL");
  MPI_Comm shm = MPI_COMM_NULL;
  int rank = 0, size = 0, shm_size = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm));
  int rc = MPI_Comm_size(shm, &shm_size);
  MPI_Comm_free(&shm);
  MPI_CHECK(rc);
  return shm_size == size;
}

CommKind comm_kind_from_name(const std::string& name) {
  if (name == "auto") return CommKind::kAuto;
  if (name == "mpi") return CommKind::kMpi;
  if (name == "shm") return CommKind::kShm;
  RLHF_FAIL("unknown communicator kind '{}' (auto, mpi or shm)", name);
}

std::unique_ptr<Comm> make_comm(MPI_Comm comm, const std::string& name, CommKind kind,
                                const ShmCommOptions& opts, double nccl_timeout_s) {
  if (comm == MPI_COMM_NULL) return nullptr;
  WatchScope watch("communicator setup", name);  // collective (MPI_Comm_dup, shared window)
  if (kind == CommKind::kNccl) {
#ifdef RLHF_NCCL
    NcclCommOptions nccl_opts;
    nccl_opts.timeout_s = nccl_timeout_s;
    return std::make_unique<NcclComm>(comm, name, nccl_opts);
#else
    (void)nccl_timeout_s;
    RLHF_FAIL(
        "{}: an NCCL communicator was requested, but this build has no NCCL\nhint: rebuild where "
        "CUDA and NCCL are found (cmake -DRLHF_CUDA=ON -DRLHF_NCCL=ON), or use the mpi or shm "
        "backend",
        name);
#endif
  }
  if (kind == CommKind::kAuto) {
    if (const char* env = std::getenv("RLHF_COMM_KIND"); env != nullptr && *env != '\0') {
      const std::string v = env;
      RLHF_CHECK(v == "mpi" || v == "shm" || v == "auto",
                 "environment variable RLHF_COMM_KIND='{}' must be mpi, shm or auto", v);
      kind = comm_kind_from_name(v);
    }
  }
  if (kind == CommKind::kAuto) kind = is_node_local(comm) ? CommKind::kShm : CommKind::kMpi;
  if (kind == CommKind::kShm) return std::make_unique<ShmComm>(comm, name, opts);
  return std::make_unique<MpiComm>(comm, name);
}

}  // namespace rlhf::parallel

// NcclComm against MpiComm: every collective (blocking and not, in place and not, every dtype and
// reduce op, counts 0, 1, odd and large) on device buffers with guard regions, compared element
// by element with the same collective by MPI on host buffers (values whose sums are exact, so any
// summation order agrees); the accounting matches MpiComm's; wait_for/signal_to order the
// communicator's stream against other streams; the watchdog reports a collective that cannot
// complete (through its test hook); make_comm builds kind "nccl".
//
// Needs a CUDA device per rank of a communicator (NCCL refuses two ranks on one device). Every
// rank always runs the size-1 communicators (MPI_COMM_SELF), which need one device per node only;
// the world communicator runs when each node has at least as many devices as ranks. Without NCCL
// or without a device the cases report themselves skipped.
#include <doctest/doctest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "parallel/comm.h"
#include "parallel/comm_nccl.h"
#include "parallel/mpi_check.h"
#include "tests/ops/cuda_test_util.h"

using namespace rlhf;
using namespace rlhf::parallel;

namespace {

// Devices usable by every rank (min over the world), 0 without NCCL. Collective.
int world_min_devices() {
#ifdef RLHF_NCCL
  int n = cuda_device_count();
#else
  int n = 0;
#endif
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &n, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  return n;
}

#ifdef RLHF_NCCL

// Selects device local_rank % ndev; returns true if every node has a device per rank (so the
// world communicator can run on NCCL). Collective.
bool select_device(int ndev) {
  MPI_Comm node = MPI_COMM_NULL;
  const int me = comm_rank(MPI_COMM_WORLD);
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node));
  const int local_rank = comm_rank(node), local_size = comm_size(node);
  free_comm_quietly(&node);
  CUDA_CHECK(cudaSetDevice(local_rank % ndev));
  int fits = local_size <= ndev ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &fits, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  return fits == 1;
}

// Values exactly representable in every dtype whose sums over up to 8 ranks stay exact.
template <typename T>
T pattern(int rank, int64_t i) {
  const int64_t k = (rank * 31 + i * 7 + 3) % 29;  // 0..28
  if constexpr (std::is_same_v<T, uint8_t>) {
    return static_cast<T>(k);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(k - 14) / T(8);
  } else {
    return static_cast<T>(k - 14);
  }
}

template <typename T>
std::vector<T> pattern_vec(int rank, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = pattern<T>(rank, i);
  return v;
}

template <typename T>
int64_t mismatches(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(a.size() + b.size());
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += a[i] != b[i];
  return bad;
}

// Every collective on `nc` (device buffers) against `mc` (host buffers); returns the number of
// wrong elements, incomplete requests and overwritten guards.
template <typename T>
int64_t compare_with_mpi(NcclComm& nc, MpiComm& mc, int64_t count, bool nonblocking) {
  using test::DeviceBuffer;
  const int n = nc.size(), me = nc.rank();
  int64_t wrong = 0;
  auto finish = [&](CommRequest req) {
    for (int spins = 0; !req.test() && spins < 2000000; ++spins) std::this_thread::yield();
    req.wait();
    wrong += !req.done();
  };
  auto guards = [&](const auto&... bufs) { wrong += !(bufs.guards_intact() && ...); };

  // --- all_gather, out of place and in place
  {
    const auto send = pattern_vec<T>(me, count);
    std::vector<T> ref(static_cast<size_t>(n * count));
    mc.all_gather(send.data(), ref.data(), count);
    DeviceBuffer<T> d_send(send), d_recv(n * count);
    if (nonblocking) {
      finish(nc.iall_gather(d_send.get(), d_recv.get(), count));
    } else {
      nc.all_gather(d_send.get(), d_recv.get(), count);
    }
    wrong += mismatches(d_recv.download(), ref);
    std::vector<T> own(static_cast<size_t>(n * count), T(0));
    std::copy(send.begin(), send.end(), own.begin() + me * count);
    DeviceBuffer<T> d_inplace(own);
    mc.all_gather(own.data() + me * count, own.data(), count);  // MPI in place too (same calls)
    wrong += mismatches(own, ref);
    if (nonblocking) {
      finish(nc.iall_gather(d_inplace.get() + me * count, d_inplace.get(), count));
    } else {
      nc.all_gather(d_inplace.get() + me * count, d_inplace.get(), count);
    }
    wrong += mismatches(d_inplace.download(), ref);
    guards(d_send, d_recv, d_inplace);
  }
  // --- reduce_scatter and all_reduce (out of place and in place), every op
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    const auto send = pattern_vec<T>(me, n * count);
    std::vector<T> ref(static_cast<size_t>(count));
    mc.reduce_scatter(send.data(), ref.data(), count, op);
    DeviceBuffer<T> d_send(send), d_recv(count);
    if (nonblocking) {
      finish(nc.ireduce_scatter(d_send.get(), d_recv.get(), count, dtype_of<T>(), op));
    } else {
      nc.reduce_scatter(d_send.get(), d_recv.get(), count, op);
    }
    wrong += mismatches(d_recv.download(), ref);

    const auto in = pattern_vec<T>(me, count);
    std::vector<T> ref_ar(static_cast<size_t>(count));
    mc.all_reduce(in.data(), ref_ar.data(), count, op);
    DeviceBuffer<T> d_in(in), d_out(count), d_inplace(in);
    auto in_host = in;
    mc.all_reduce(in_host.data(), in_host.data(), count, op);  // MPI in place too (same calls)
    wrong += mismatches(in_host, ref_ar);
    if (nonblocking) {
      finish(nc.iall_reduce(d_in.get(), d_out.get(), count, dtype_of<T>(), op));
      finish(nc.iall_reduce(d_inplace.get(), d_inplace.get(), count, dtype_of<T>(), op));
    } else {
      nc.all_reduce(d_in.get(), d_out.get(), count, op);
      nc.all_reduce(d_inplace.get(), d_inplace.get(), count, op);
    }
    wrong += mismatches(d_out.download(), ref_ar);
    wrong += mismatches(d_inplace.download(), ref_ar);
    wrong += mismatches(d_in.download(), in);  // out of place leaves the input alone
    guards(d_send, d_recv, d_in, d_out, d_inplace);
  }
  // --- broadcast from the first and the last rank
  for (int root : {0, n - 1}) {
    auto ref = pattern_vec<T>(me, count);
    DeviceBuffer<T> d_buf(ref);
    mc.broadcast(ref.data(), count, root);
    if (nonblocking) {
      finish(nc.ibroadcast(d_buf.get(), count, root));
    } else {
      nc.broadcast(d_buf.get(), count, root);
    }
    wrong += mismatches(d_buf.download(), ref);
    guards(d_buf);
  }
  return wrong;
}

int64_t compare_all_dtypes(NcclComm& nc, MpiComm& mc, int64_t count, bool nonblocking) {
  return compare_with_mpi<float>(nc, mc, count, nonblocking) +
         compare_with_mpi<double>(nc, mc, count, nonblocking) +
         compare_with_mpi<int32_t>(nc, mc, count, nonblocking) +
         compare_with_mpi<int64_t>(nc, mc, count, nonblocking) +
         compare_with_mpi<uint8_t>(nc, mc, count, nonblocking);
}

void run_suite(MPI_Comm base, const std::string& what) {
  NcclComm nc(base, "nccl_" + what);
  MpiComm mc(base, "mpi_" + what);
  CHECK(nc.kind() == CommKind::kNccl);
  CHECK(nc.size() == mc.size());
  CHECK(nc.rank() == mc.rank());
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1001}, int64_t{1} << 18}) {
    for (int nb = 0; nb < 2; ++nb) {
      const int64_t wrong = compare_all_dtypes(nc, mc, count, nb == 1);
      INFO(what << " n=" << nc.size() << " count=" << count
                << (nb ? " non-blocking" : " blocking"));
      CHECK(wrong == 0);
    }
  }
  nc.barrier();
  mc.barrier();
  // Same calls on both: same accounting (calls and bytes per collective; seconds differ).
  for (int i = 0; i < kNumCollOps; ++i) {
    const auto op = static_cast<CollOp>(i);
    INFO(coll_op_name(op));
    CHECK(nc.stats(op).calls == mc.stats(op).calls);
    CHECK(nc.stats(op).bytes == mc.stats(op).bytes);
  }
  MESSAGE(nc.summary(true));
}

// A host function on a stream that blocks it until *flag is set (CUDA may not be called inside).
void CUDART_CB block_until(void* flag) {
  auto* f = static_cast<std::atomic<bool>*>(flag);
  while (!f->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void CUDART_CB sleep_50ms(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

#endif  // RLHF_NCCL

}  // namespace

TEST_CASE("nccl comm: collectives match MPI on size-1 and world communicators") {
  const int ndev = world_min_devices();
  if (ndev == 0) {
    MESSAGE("skipped: no CUDA device (or built without NCCL)");
    return;
  }
#ifdef RLHF_NCCL
  const bool world_fits = select_device(ndev);
  run_suite(MPI_COMM_SELF, "self");
  if (world_fits) {
    run_suite(MPI_COMM_WORLD, "world");
  } else {
    MESSAGE("world part skipped: more ranks per node than CUDA devices (" << ndev << ")");
  }
#endif
}

TEST_CASE("nccl comm: wait_for and signal_to order the communicator's stream") {
  const int ndev = world_min_devices();
  if (ndev == 0) {
    MESSAGE("skipped: no CUDA device (or built without NCCL)");
    return;
  }
#ifdef RLHF_NCCL
  select_device(ndev);
  const int64_t count = 1 << 16;
  NcclComm nc(MPI_COMM_SELF, "nccl_order");
  test::TestStream producer, consumer;
  const std::vector<float> fresh(count, 3.0f);
  test::DeviceBuffer<float> d_fresh(fresh), d_send(std::vector<float>(count, -1.0f)), d_recv(count);
  // The producer writes d_send only after a 50 ms host delay; without wait_for the all-reduce
  // would read the stale -1s.
  CUDA_CHECK(cudaLaunchHostFunc(producer.get(), sleep_50ms, nullptr));
  CUDA_CHECK(cudaMemcpyAsync(d_send.get(), d_fresh.get(), count * sizeof(float),
                             cudaMemcpyDeviceToDevice, producer.get()));
  nc.wait_for(producer.get());
  auto req = nc.iall_reduce(d_send.get(), d_recv.get(), count);
  // The consumer copies the result out after signal_to, without a host wait on the request.
  test::DeviceBuffer<float> d_copy(count);
  nc.signal_to(consumer.get());
  CUDA_CHECK(cudaMemcpyAsync(d_copy.get(), d_recv.get(), count * sizeof(float),
                             cudaMemcpyDeviceToDevice, consumer.get()));
  consumer.sync();
  CHECK(mismatches(d_copy.download(), fresh) == 0);
  req.wait();
  test::check_guards("nccl order", d_fresh, d_send, d_recv, d_copy);
#endif
}

TEST_CASE("nccl comm: the watchdog reports a collective that does not complete") {
  const int ndev = world_min_devices();
  if (ndev == 0) {
    MESSAGE("skipped: no CUDA device (or built without NCCL)");
    return;
  }
#ifdef RLHF_NCCL
  select_device(ndev);
  std::atomic<int> fired{0};
  std::mutex mu;
  std::string reason;
  NcclCommOptions o;
  o.timeout_s = 0.3;
  o.poll_s = 0.02;
  o.on_timeout = [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    reason = why;
    ++fired;
  };
  NcclComm nc(MPI_COMM_SELF, "nccl_watchdog", o);
  test::TestStream blocker;
  std::atomic<bool> release{false};
  test::DeviceBuffer<float> d(std::vector<float>(4, 1.0f));
  // The communicator's stream waits behind a host function that blocks until `release`.
  CUDA_CHECK(cudaLaunchHostFunc(blocker.get(), block_until, &release));
  nc.wait_for(blocker.get());
  auto req = nc.iall_reduce(d.get(), d.get(), 4);
  for (int i = 0; i < 500 && fired.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(fired.load() == 1);
  CHECK_FALSE(req.test());  // still pending: the watchdog only reported it
  {
    std::lock_guard<std::mutex> lock(mu);
    INFO(reason);
    CHECK(reason.find("all_reduce") != std::string::npos);
    CHECK(reason.find("has not completed") != std::string::npos);
  }
  release.store(true);
  req.wait();
  CHECK(req.done());
  CHECK(mismatches(d.download(), std::vector<float>(4, 1.0f)) == 0);  // size 1: sum = input
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(fired.load() == 1);  // reported once, and a completed collective is not reported
#endif
}

TEST_CASE("nccl comm: make_comm builds kind nccl, or says the build has no NCCL") {
#ifdef RLHF_NCCL
  const int ndev = world_min_devices();
  if (ndev == 0) {
    MESSAGE("skipped: no CUDA device");
    return;
  }
  select_device(ndev);
  auto c = make_comm(MPI_COMM_SELF, "self_nccl", CommKind::kNccl, {}, 30.0);
  REQUIRE(c != nullptr);
  CHECK(c->kind() == CommKind::kNccl);
  CHECK(std::string(comm_kind_name(c->kind())) == "nccl");
  CHECK(make_comm(MPI_COMM_NULL, "none", CommKind::kNccl) == nullptr);
#else
  CHECK_THROWS_AS(make_comm(MPI_COMM_SELF, "self_nccl", CommKind::kNccl), rlhf::Error);
  CHECK(std::string(comm_kind_name(CommKind::kNccl)) == "nccl");
#endif
}

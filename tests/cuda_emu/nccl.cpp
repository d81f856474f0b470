// The emulator's NCCL: communicators between the processes of one host through a POSIX shared
// memory segment named by the ncclUniqueId. Arguments are checked at the call; the collective
// itself runs in the order of its stream (on the stream's worker thread when the stream is
// asynchronous, so the host goes on as with real NCCL), and the operations of one communicator run
// one at a time in the order they were issued, as NCCL serialises them. Data moves through one
// staging slot per rank in chunks, with a counting barrier between the phases. Reductions are in
// rank order with an fp32 (or wider) accumulator and one rounding to the element type, so every
// rank gets the same bits.
//
// A peer that never arrives is reported after RLHF_CUDA_EMU_NCCL_TIMEOUT seconds (default 600)
// as ncclSystemError (and ncclCommGetAsyncError says so); ncclCommAbort on any rank makes every
// rank's waiting collective end with ncclRemoteError (in ncclCommGetAsyncError).
#include <cuda_bf16.h>
#include <fcntl.h>
#include <nccl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>

#include "tests/cuda_emu/runtime.h"

namespace rlhf::emu {
namespace {

constexpr size_t kSlotBytes = size_t{1} << 20;
constexpr int kMaxRanks = 256;

struct alignas(64) Header {
  std::atomic<uint64_t> arrivals;
  std::atomic<int> aborted;
  int nranks;
};
static_assert(std::is_trivially_destructible_v<Header>);

struct EmuComm {
  int nranks = 0, rank = 0;
  Header* header = nullptr;
  char* slots = nullptr;  // nranks × kSlotBytes
  size_t map_bytes = 0;
  uint64_t barriers = 0;  // barriers this rank has entered
  std::atomic<int> async_error{ncclSuccess};
  std::string name;
  // Issue-order serialisation of the collectives (issued = tickets handed out, done = finished).
  std::mutex mu;
  std::condition_variable cv;
  uint64_t issued = 0, done = 0;
  char* slot(int r) const { return slots + static_cast<size_t>(r) * kSlotBytes; }
};

double timeout_s() {
  static const double t = [] {
    const char* v = std::getenv("RLHF_CUDA_EMU_NCCL_TIMEOUT");
    return v != nullptr ? std::atof(v) : 600.0;
  }();
  return t;
}

// Every rank arrives; returns when all have (ncclSuccess), when a rank aborted (ncclRemoteError)
// or after the timeout (ncclSystemError).
ncclResult_t barrier(EmuComm& c) {
  const uint64_t target = ++c.barriers * static_cast<uint64_t>(c.nranks);
  c.header->arrivals.fetch_add(1, std::memory_order_acq_rel);
  const auto start = std::chrono::steady_clock::now();
  for (int spin = 0;; ++spin) {
    if (c.header->arrivals.load(std::memory_order_acquire) >= target) return ncclSuccess;
    if (c.header->aborted.load(std::memory_order_acquire) != 0) {
      c.async_error = ncclRemoteError;
      return ncclRemoteError;
    }
    if (spin < 64) continue;
    if (spin < 1024) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    if ((spin & 1023) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
            timeout_s()) {
      std::fprintf(stderr,
                   "CUDA emulator: NCCL rank %d of %d: a peer did not arrive within %.0f s\n",
                   c.rank, c.nranks, timeout_s());
      c.async_error = ncclSystemError;
      return ncclSystemError;
    }
  }
}

size_t elem_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

template <typename T>
void reduce_typed(void* out, const EmuComm& c, size_t offset_bytes, size_t n, ncclRedOp_t op) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, T>;
  for (size_t i = 0; i < n; ++i) {
    Acc acc{};
    for (int j = 0; j < c.nranks; ++j) {
      T x;
      std::memcpy(&x, c.slot(j) + offset_bytes + i * sizeof(T), sizeof(T));
      const Acc a = static_cast<Acc>(x);
      if (j == 0)
        acc = a;
      else if (op == ncclSum || op == ncclAvg)
        acc = static_cast<Acc>(acc + a);
      else if (op == ncclProd)
        acc = static_cast<Acc>(acc * a);
      else if (op == ncclMax)
        acc = a > acc ? a : acc;
      else
        acc = a < acc ? a : acc;
    }
    if (op == ncclAvg) acc = static_cast<Acc>(acc / static_cast<Acc>(c.nranks));
    const T r = static_cast<T>(acc);
    std::memcpy(static_cast<char*>(out) + i * sizeof(T), &r, sizeof(T));
  }
}

void reduce_bf16(void* out, const EmuComm& c, size_t offset_bytes, size_t n, ncclRedOp_t op) {
  for (size_t i = 0; i < n; ++i) {
    float acc = 0;
    for (int j = 0; j < c.nranks; ++j) {
      __nv_bfloat16 x;
      std::memcpy(&x, c.slot(j) + offset_bytes + i * 2, 2);
      const float a = __bfloat162float(x);
      if (j == 0)
        acc = a;
      else if (op == ncclSum || op == ncclAvg)
        acc += a;
      else if (op == ncclProd)
        acc *= a;
      else if (op == ncclMax)
        acc = a > acc ? a : acc;
      else
        acc = a < acc ? a : acc;
    }
    if (op == ncclAvg) acc /= static_cast<float>(c.nranks);
    const __nv_bfloat16 r = __float2bfloat16_rn(acc);
    std::memcpy(static_cast<char*>(out) + i * 2, &r, 2);
  }
}

// out[0, n) = op over ranks j of slot(j)[offset_bytes, + n elements), in rank order.
bool reduce_slots(void* out, const EmuComm& c, size_t offset_bytes, size_t n, ncclDataType_t t,
                  ncclRedOp_t op) {
  switch (t) {
    case ncclFloat32:
      reduce_typed<float>(out, c, offset_bytes, n, op);
      return true;
    case ncclFloat64:
      reduce_typed<double>(out, c, offset_bytes, n, op);
      return true;
    case ncclInt32:
      reduce_typed<int32_t>(out, c, offset_bytes, n, op);
      return true;
    case ncclUint32:
      reduce_typed<uint32_t>(out, c, offset_bytes, n, op);
      return true;
    case ncclInt64:
      reduce_typed<int64_t>(out, c, offset_bytes, n, op);
      return true;
    case ncclUint64:
      reduce_typed<uint64_t>(out, c, offset_bytes, n, op);
      return true;
    case ncclUint8:
      reduce_typed<uint8_t>(out, c, offset_bytes, n, op);
      return true;
    case ncclInt8:
      reduce_typed<int8_t>(out, c, offset_bytes, n, op);
      return true;
    case ncclBfloat16:
      reduce_bf16(out, c, offset_bytes, n, op);
      return true;
    default:
      return false;
  }
}

// Common argument checks of a collective: a live communicator, a valid stream, device-accessible
// buffers of the given byte sizes.
ncclResult_t check(ncclComm_t comm, cudaStream_t stream, const void* a, size_t a_bytes,
                   const void* b, size_t b_bytes) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (!stream_valid(stream)) return ncclInvalidArgument;
  if (reinterpret_cast<EmuComm*>(comm)->header->aborted.load() != 0) return ncclRemoteError;
  if (a_bytes > 0 && memory_kind(a, a_bytes) == MemKind::kNone) return ncclInvalidArgument;
  if (b_bytes > 0 && memory_kind(b, b_bytes) == MemKind::kNone) return ncclInvalidArgument;
  return ncclSuccess;
}

#define EMU_NCCL_TRY(expr)            \
  do {                                \
    const ncclResult_t r_ = (expr);   \
    if (r_ != ncclSuccess) return r_; \
  } while (0)

// Runs the collective `body` in the order of `stream`, after every collective issued before it on
// the communicator; a failure becomes the communicator's asynchronous error.
// (A collective recorded into a CUDA graph runs at each replay without that ordering.)
void enqueue(EmuComm* c, cudaStream_t stream, std::function<ncclResult_t()> body) {
  // Runs the collective; its first failure becomes the communicator's asynchronous error.
  auto run = [c, body = std::move(body)] {
    const ncclResult_t r = body();
    int expected = ncclSuccess;
    if (r != ncclSuccess) c->async_error.compare_exchange_strong(expected, r);
  };
  if (capturing(stream)) {
    submit(stream, std::move(run));
    return;
  }
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    ticket = c->issued++;
  }
  submit(stream, [c, ticket, run = std::move(run)] {
    {
      std::unique_lock<std::mutex> lock(c->mu);
      c->cv.wait(lock, [&] { return c->done == ticket; });
    }
    run();
    std::lock_guard<std::mutex> lock(c->mu);
    ++c->done;
    c->cv.notify_all();
  });
}

// Blocks until every collective issued on c has finished.
void wait_idle(EmuComm* c) {
  std::unique_lock<std::mutex> lock(c->mu);
  c->cv.wait(lock, [&] { return c->done == c->issued; });
}

}  // namespace
}  // namespace rlhf::emu

using rlhf::emu::EmuComm;
using rlhf::emu::kSlotBytes;

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (emulator)";
    case ncclSystemError:
      return "unhandled system error (emulator: a peer did not arrive in time)";
    case ncclInternalError:
      return "internal error (emulator)";
    case ncclInvalidArgument:
      return "invalid argument (emulator: null communicator, bad stream or buffer not in device "
             "memory)";
    case ncclInvalidUsage:
      return "invalid usage (emulator)";
    case ncclRemoteError:
      return "remote process exited or there was a network error (emulator: a rank aborted)";
    default:
      return "unknown result (emulator)";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id, 0, sizeof(*id));
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  std::snprintf(id->internal, sizeof(id->internal), "/rlhf_emu_nccl_%d_%llu_%08x",
                static_cast<int>(getpid()), static_cast<unsigned long long>(counter++), rd());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (comm == nullptr || nranks < 1 || nranks > rlhf::emu::kMaxRanks || rank < 0 ||
      rank >= nranks || id.internal[0] != '/')
    return ncclInvalidArgument;
  auto* c = new EmuComm();
  c->nranks = nranks;
  c->rank = rank;
  c->name.assign(id.internal, strnlen(id.internal, sizeof(id.internal)));
  c->map_bytes = 4096 + static_cast<size_t>(nranks) * kSlotBytes;
  const int fd = shm_open(c->name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(c->map_bytes)) != 0) {
    if (fd >= 0) close(fd);
    delete c;
    return ncclSystemError;
  }
  void* p = mmap(nullptr, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    delete c;
    return ncclSystemError;
  }
  c->header = static_cast<rlhf::emu::Header*>(p);
  c->slots = static_cast<char*>(p) + 4096;
  // Everyone has mapped the segment after this barrier; then its name can go.
  const ncclResult_t r = rlhf::emu::barrier(*c);
  if (rank == 0) shm_unlink(c->name.c_str());
  if (r != ncclSuccess) {
    munmap(p, c->map_bytes);
    delete c;
    return r;
  }
  *comm = reinterpret_cast<ncclComm_t>(c);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm != nullptr ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  auto* c = reinterpret_cast<EmuComm*>(comm);
  rlhf::emu::wait_idle(c);  // as NCCL, destroying waits for the communicator's pending work
  munmap(c->header, c->map_bytes);
  delete c;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  auto* c = reinterpret_cast<EmuComm*>(comm);
  c->header->aborted.store(1);
  // The mapping and the object stay: a stream may still be inside a collective on them.
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) return ncclInvalidArgument;
  *async_error = static_cast<ncclResult_t>(reinterpret_cast<EmuComm*>(comm)->async_error.load());
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = reinterpret_cast<const EmuComm*>(comm)->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = reinterpret_cast<const EmuComm*>(comm)->rank;
  return ncclSuccess;
}
ncclResult_t ncclGroupStart() {
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t stream) {
  const size_t es = rlhf::emu::elem_size(t);
  if (es == 0) return ncclInvalidArgument;
  auto* c = reinterpret_cast<EmuComm*>(comm);
  const size_t bytes = count * es;
  EMU_NCCL_TRY(rlhf::emu::check(comm, stream, send, bytes, recv, bytes * (c ? c->nranks : 0)));
  rlhf::emu::enqueue(c, stream, [=]() -> ncclResult_t {
    for (size_t off = 0; off < bytes; off += kSlotBytes) {
      const size_t len = std::min(kSlotBytes, bytes - off);
      std::memcpy(c->slot(c->rank), static_cast<const char*>(send) + off, len);
      EMU_NCCL_TRY(rlhf::emu::barrier(*c));
      for (int j = 0; j < c->nranks; ++j)
        std::memcpy(static_cast<char*>(recv) + static_cast<size_t>(j) * bytes + off, c->slot(j),
                    len);
      EMU_NCCL_TRY(rlhf::emu::barrier(*c));
    }
    return ncclSuccess;
  });
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const size_t es = rlhf::emu::elem_size(t);
  if (es == 0) return ncclInvalidArgument;
  auto* c = reinterpret_cast<EmuComm*>(comm);
  EMU_NCCL_TRY(
      rlhf::emu::check(comm, stream, send, count * es * (c ? c->nranks : 0), recv, count * es));
  rlhf::emu::enqueue(c, stream, [=]() -> ncclResult_t {
    const size_t chunk = kSlotBytes / (es * static_cast<size_t>(c->nranks));
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      for (int j = 0; j < c->nranks; ++j)  // block j of send goes to rank j
        std::memcpy(c->slot(c->rank) + static_cast<size_t>(j) * len * es,
                    static_cast<const char*>(send) + (static_cast<size_t>(j) * count + off) * es,
                    len * es);
      EMU_NCCL_TRY(rlhf::emu::barrier(*c));
      if (!rlhf::emu::reduce_slots(static_cast<char*>(recv) + off * es, *c,
                                   static_cast<size_t>(c->rank) * len * es, len, t, op))
        return ncclInvalidArgument;
      EMU_NCCL_TRY(rlhf::emu::barrier(*c));
    }
    return ncclSuccess;
  });
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const size_t es = rlhf::emu::elem_size(t);
  if (es == 0) return ncclInvalidArgument;
  EMU_NCCL_TRY(rlhf::emu::check(comm, stream, send, count * es, recv, count * es));
  auto* c = reinterpret_cast<EmuComm*>(comm);
  rlhf::emu::enqueue(c, stream, [=]() -> ncclResult_t {
    const size_t chunk = kSlotBytes / es;
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      std::memcpy(c->slot(c->rank), static_cast<const char*>(send) + off * es, len * es);
      EMU_NCCL_TRY(rlhf::emu::barrier(*c));
      if (!rlhf::emu::reduce_slots(static_cast<char*>(recv) + off * es, *c, 0, len, t, op))
        return ncclInvalidArgument;
      EMU_NCCL_TRY(rlhf::emu::barrier(*c));
    }
    return ncclSuccess;
  });
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  const size_t es = rlhf::emu::elem_size(t);
  if (es == 0) return ncclInvalidArgument;
  auto* c = reinterpret_cast<EmuComm*>(comm);
  if (c != nullptr && (root < 0 || root >= c->nranks)) return ncclInvalidArgument;
  const size_t bytes = count * es;
  EMU_NCCL_TRY(
      rlhf::emu::check(comm, stream, c && c->rank == root ? send : recv, bytes, recv, bytes));
  rlhf::emu::enqueue(c, stream, [=]() -> ncclResult_t {
    for (size_t off = 0; off < bytes; off += kSlotBytes) {
      const size_t len = std::min(kSlotBytes, bytes - off);
      if (c->rank == root) std::memcpy(c->slot(root), static_cast<const char*>(send) + off, len);
      EMU_NCCL_TRY(rlhf::emu::barrier(*c));
      std::memcpy(static_cast<char*>(recv) + off, c->slot(root), len);
      EMU_NCCL_TRY(rlhf::emu::barrier(*c));
    }
    return ncclSuccess;
  });
  return ncclSuccess;
}

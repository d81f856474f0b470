// The emulator's streams, events and CUDA graphs.
//
// Streams made by cudaStreamCreate* run their operations asynchronously, in order, on a worker
// thread of their own (RLHF_CUDA_EMU_ASYNC=0 makes new streams synchronous: every operation runs
// when it is submitted). So, as on a GPU, a kernel or copy on one stream runs concurrently with the
// host and with other streams, cudaStreamWaitEvent really makes a stream wait, and a missing
// synchronisation between streams shows up as a race (more often with RLHF_CUDA_EMU_JITTER_US,
// which delays each operation by a random amount). The legacy default stream runs operations on
// the calling thread, after every blocking stream (created without cudaStreamNonBlocking) has
// drained.
//
// An operation that fails on a worker (a kernel that misuses a barrier, say) sets a sticky error,
// as a GPU's launch failure does: every later runtime call returns cudaErrorLaunchFailure, whose
// string carries the emulator's message.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuda_emu/emu.h"
#include "tests/cuda_emu/runtime.h"

namespace rlhf::emu {
namespace {

// The operations a capture recorded, in stream order (a graph and its executable alike).
struct GraphOps {
  std::vector<std::function<void()>> ops;
};

struct Stream {
  unsigned flags = 0;
  bool async = false;
  // Capture (touched by the capturing thread only).
  GraphOps* capture = nullptr;
  bool invalidated = false;
  // The worker (async streams).
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool running = false, stop = false;
  std::thread worker;
};

// One cudaEventRecord: done once its stream reaches it. Waits hold the record they were issued
// against, so the event may be recorded again or destroyed meanwhile (as CUDA allows).
struct Record {
  bool done = false;
  std::chrono::steady_clock::time_point t;
};

struct Event {
  unsigned flags = 0;
  std::shared_ptr<Record> last;  // the most recent record; null before the first
};

struct Registry {
  std::mutex mu;
  std::condition_variable event_cv;  // signalled when a record completes
  std::set<Stream*> streams;
  std::set<Event*> events;
  std::mutex sticky_mu;
  std::string sticky;  // the first asynchronous failure
  std::atomic<bool> has_sticky{false};
};

Registry& reg() {
  static Registry* r = new Registry();  // never destroyed: workers may outlive main's statics
  return *r;
}

std::atomic<bool>& async_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("RLHF_CUDA_EMU_ASYNC");
    return v == nullptr || std::string(v) != "0";
  }()};
  return on;
}

thread_local std::vector<Stream*> tl_capturing;  // streams this thread is capturing

bool is_default(cudaStream_t st) {
  return st == nullptr || st == cudaStreamPerThread || st == cudaStreamLegacy;
}

void run_guarded(std::function<void()>& op) {
  try {
    op();
  } catch (const std::exception& e) {
    set_sticky_error(e.what());
  } catch (...) {
    set_sticky_error("unknown failure in an asynchronous operation");
  }
}

// RLHF_CUDA_EMU_JITTER_US: each operation on an asynchronous stream starts after a random delay
// below this many microseconds, so that the streams interleave in many orders and a missing
// dependency between them shows up more often.
int jitter_us() {
  static const int us = [] {
    const char* v = std::getenv("RLHF_CUDA_EMU_JITTER_US");
    return v != nullptr ? std::max(0, std::atoi(v)) : 0;
  }();
  return us;
}

void worker_loop(Stream* s) {
  std::minstd_rand rng(static_cast<unsigned>(reinterpret_cast<uintptr_t>(s) >> 4));
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
    if (s->queue.empty()) return;  // stop, drained
    std::function<void()> op = std::move(s->queue.front());
    s->queue.pop_front();
    s->running = true;
    lock.unlock();
    if (jitter_us() > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % unsigned(jitter_us())));
    run_guarded(op);
    lock.lock();
    s->running = false;
    s->cv.notify_all();
  }
}

void drain_stream(Stream* s) {
  if (!s->async) return;
  std::unique_lock<std::mutex> lock(s->mu);
  s->cv.wait(lock, [&] { return s->queue.empty() && !s->running; });
}

std::vector<Stream*> live_streams() {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return {r.streams.begin(), r.streams.end()};
}

Event* live_event(cudaEvent_t ev) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  auto* e = reinterpret_cast<Event*>(ev);
  return r.events.count(e) != 0 ? e : nullptr;
}

cudaError_t err(cudaError_t e) {
  return set_last_error(e);
}

}  // namespace

// --- the interface of runtime.h --------------------------------------------------------------

bool stream_valid(cudaStream_t st) {
  if (is_default(st)) return true;
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.streams.count(reinterpret_cast<Stream*>(st)) != 0;
}

bool capturing(cudaStream_t st) {
  return !tl_capturing.empty() && !is_default(st) &&
         reinterpret_cast<Stream*>(st)->capture != nullptr;
}

void submit(cudaStream_t st, std::function<void()> op) {
  if (capturing(st)) {
    reinterpret_cast<Stream*>(st)->capture->ops.push_back(std::move(op));
    return;
  }
  if (is_default(st)) {
    // The legacy default stream: after every blocking stream, on the caller.
    for (Stream* s : live_streams())
      if ((s->flags & cudaStreamNonBlocking) == 0) drain_stream(s);
    op();
    return;
  }
  auto* s = reinterpret_cast<Stream*>(st);
  if (!s->async) {
    op();
    return;
  }
  std::lock_guard<std::mutex> lock(s->mu);
  s->queue.push_back(std::move(op));
  s->cv.notify_all();
}

void drain(cudaStream_t st) {
  if (is_default(st)) {
    for (Stream* s : live_streams())
      if ((s->flags & cudaStreamNonBlocking) == 0) drain_stream(s);
    return;
  }
  drain_stream(reinterpret_cast<Stream*>(st));
}

void drain_all() {
  for (Stream* s : live_streams()) drain_stream(s);
}

bool async_streams() {
  return async_flag().load();
}
void set_async_streams(bool on) {
  async_flag().store(on);
}

cudaError_t check_not_capturing() {
  if (tl_capturing.empty()) return cudaSuccess;
  for (Stream* s : tl_capturing) s->invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

void set_sticky_error(const std::string& what) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.sticky_mu);
  if (r.has_sticky.load()) return;
  r.sticky = what;
  r.has_sticky.store(true);
  std::fprintf(stderr, "CUDA emulator: an asynchronous operation failed: %s\n", what.c_str());
}

cudaError_t sticky_error() {
  return reg().has_sticky.load() ? cudaErrorLaunchFailure : cudaSuccess;
}

std::string sticky_message() {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.sticky_mu);
  return r.sticky;
}

void clear_sticky_error() {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.sticky_mu);
  r.sticky.clear();
  r.has_sticky.store(false);
}

bool defer_launch(cudaStream_t stream, std::function<void()> op) {
  submit(stream, std::move(op));
  return true;
}

}  // namespace rlhf::emu

using rlhf::emu::err;
using rlhf::emu::Event;
using rlhf::emu::reg;
using rlhf::emu::Stream;

// --- streams ---------------------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* st, unsigned int flags) {
  if (st == nullptr) return err(cudaErrorInvalidValue);
  auto* s = new Stream();
  s->flags = flags;
  s->async = rlhf::emu::async_streams();
  if (s->async) s->worker = std::thread(rlhf::emu::worker_loop, s);
  auto& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.streams.insert(s);
  *st = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* st) {
  return cudaStreamCreateWithFlags(st, cudaStreamDefault);
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* st, unsigned int flags, int) {
  return cudaStreamCreateWithFlags(st, flags);
}
cudaError_t cudaStreamDestroy(cudaStream_t st) {
  auto* s = reinterpret_cast<Stream*>(st);
  {
    auto& r = reg();
    std::lock_guard<std::mutex> lock(r.mu);
    if (st == nullptr || r.streams.erase(s) == 0) return err(cudaErrorInvalidResourceHandle);
  }
  // Work already submitted completes, as on a GPU; then the worker ends.
  if (s->async) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      s->stop = true;
      s->cv.notify_all();
    }
    s->worker.join();
  }
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t st) {
  if (!rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  if (rlhf::emu::check_not_capturing() != cudaSuccess)
    return err(cudaErrorStreamCaptureUnsupported);
  rlhf::emu::drain(st);
  return err(rlhf::emu::sticky_error());
}
cudaError_t cudaStreamQuery(cudaStream_t st) {
  if (!rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  if (rlhf::emu::sticky_error() != cudaSuccess) return err(rlhf::emu::sticky_error());
  if (rlhf::emu::is_default(st)) return cudaSuccess;
  auto* s = reinterpret_cast<Stream*>(st);
  std::lock_guard<std::mutex> lock(s->mu);
  return s->queue.empty() && !s->running ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaDeviceSynchronize(void) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
  rlhf::emu::drain_all();
  return err(rlhf::emu::sticky_error());
}
cudaError_t cudaLaunchHostFunc(cudaStream_t st, cudaHostFn_t fn, void* user_data) {
  if (!rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  if (fn == nullptr) return err(cudaErrorInvalidValue);
  rlhf::emu::submit(st, [fn, user_data] { fn(user_data); });
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t st, enum cudaStreamCaptureStatus* status) {
  if (!rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  if (status != nullptr)
    *status =
        rlhf::emu::capturing(st) ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

// --- events ----------------------------------------------------------------------------------

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* ev, unsigned int flags) {
  if (ev == nullptr) return err(cudaErrorInvalidValue);
  auto* e = new Event();
  e->flags = flags;
  auto& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.insert(e);
  *ev = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* ev) {
  return cudaEventCreateWithFlags(ev, cudaEventDefault);
}
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  auto& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  auto* e = reinterpret_cast<Event*>(ev);
  if (r.events.erase(e) == 0) return err(cudaErrorInvalidResourceHandle);
  delete e;  // pending records and waits hold their Record
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st) {
  Event* e = rlhf::emu::live_event(ev);
  if (e == nullptr || !rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  auto& r = reg();
  auto rec = std::make_shared<rlhf::emu::Record>();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    e->last = rec;
  }
  rlhf::emu::submit(st, [rec] {
    auto& rr = reg();
    std::lock_guard<std::mutex> lock(rr.mu);
    rec->done = true;
    rec->t = std::chrono::steady_clock::now();
    rr.event_cv.notify_all();
  });
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned int) {
  Event* e = rlhf::emu::live_event(ev);
  if (e == nullptr || !rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  std::shared_ptr<rlhf::emu::Record> rec;
  {
    std::lock_guard<std::mutex> lock(reg().mu);
    rec = e->last;  // the most recent record at the time of the call
  }
  if (rec == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  rlhf::emu::submit(st, [rec] {
    auto& rr = reg();
    std::unique_lock<std::mutex> lock(rr.mu);
    rr.event_cv.wait(lock, [&] { return rec->done; });
  });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t ev) {
  Event* e = rlhf::emu::live_event(ev);
  if (e == nullptr) return err(cudaErrorInvalidResourceHandle);
  if (rlhf::emu::sticky_error() != cudaSuccess) return err(rlhf::emu::sticky_error());
  std::lock_guard<std::mutex> lock(reg().mu);
  return e->last == nullptr || e->last->done ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  if (const cudaError_t c = rlhf::emu::check_not_capturing(); c != cudaSuccess) return err(c);
  Event* e = rlhf::emu::live_event(ev);
  if (e == nullptr) return err(cudaErrorInvalidResourceHandle);
  auto& r = reg();
  {
    std::unique_lock<std::mutex> lock(r.mu);
    const std::shared_ptr<rlhf::emu::Record> rec = e->last;
    if (rec != nullptr) r.event_cv.wait(lock, [&] { return rec->done; });
  }
  return err(rlhf::emu::sticky_error());
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Event *a = rlhf::emu::live_event(start), *b = rlhf::emu::live_event(end);
  if (ms == nullptr) return err(cudaErrorInvalidValue);
  if (a == nullptr || b == nullptr || (a->flags & cudaEventDisableTiming) != 0 ||
      (b->flags & cudaEventDisableTiming) != 0)
    return err(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(reg().mu);
  if (a->last == nullptr || b->last == nullptr) return err(cudaErrorInvalidResourceHandle);
  if (!a->last->done || !b->last->done) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->last->t - a->last->t).count();
  return cudaSuccess;
}

// --- graphs (stream capture) -----------------------------------------------------------------

cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode) {
  if (!rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  if (rlhf::emu::is_default(st))
    return err(cudaErrorStreamCaptureUnsupported);  // the legacy default stream cannot capture
  auto* s = reinterpret_cast<Stream*>(st);
  if (s->capture != nullptr) return err(cudaErrorIllegalState);
  s->capture = new rlhf::emu::GraphOps();
  s->invalidated = false;
  rlhf::emu::tl_capturing.push_back(s);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t* graph) {
  if (!rlhf::emu::stream_valid(st) || rlhf::emu::is_default(st))
    return err(cudaErrorInvalidResourceHandle);
  auto* s = reinterpret_cast<Stream*>(st);
  if (s->capture == nullptr) return err(cudaErrorIllegalState);
  auto& caps = rlhf::emu::tl_capturing;
  caps.erase(std::remove(caps.begin(), caps.end(), s), caps.end());
  std::unique_ptr<rlhf::emu::GraphOps> ops(s->capture);
  s->capture = nullptr;
  if (graph != nullptr) *graph = nullptr;
  if (s->invalidated) return err(cudaErrorStreamCaptureInvalidated);
  if (graph == nullptr) return err(cudaErrorInvalidValue);
  *graph = reinterpret_cast<cudaGraph_t>(ops.release());
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (exec == nullptr || graph == nullptr) return err(cudaErrorInvalidValue);
  *exec = reinterpret_cast<cudaGraphExec_t>(
      new rlhf::emu::GraphOps(*reinterpret_cast<rlhf::emu::GraphOps*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t st) {
  if (exec == nullptr) return err(cudaErrorInvalidValue);
  if (!rlhf::emu::stream_valid(st)) return err(cudaErrorInvalidResourceHandle);
  auto* g = reinterpret_cast<rlhf::emu::GraphOps*>(exec);
  rlhf::emu::submit(st, [g] {
    for (auto& op : g->ops) op();
  });
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<rlhf::emu::GraphOps*>(graph);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  // A launch still queued reads it: let the streams reach it first.
  rlhf::emu::drain_all();
  delete reinterpret_cast<rlhf::emu::GraphOps*>(exec);
  return cudaSuccess;
}

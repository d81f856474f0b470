#include "parallel/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "core/log.h"

namespace rlhf::parallel {

namespace {

using Clock = std::chrono::steady_clock;

struct State {
  std::atomic<double> timeout_s{0};
  std::atomic<int64_t> started_ns{0};  // 0: no watched operation
  std::atomic<int> depth{0};
  std::atomic<bool> thread_started{false};
  int rank = 0;
  std::mutex mu;
  std::string op, comm, context;
};

State& state() {
  static State* s = new State();  // never destroyed: the detached thread may outlive main
  return *s;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void abort_job(const std::string& culprit) {
  State& s = state();
  std::string context;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    context = s.context;
  }
  const std::string msg = fmt::format(
      "[rlhf watchdog] rank {}: {}{}; another rank is probably stopped, hung or dead\nhint: "
      "--comm_timeout sets this limit (0 = none). Ending the job on every rank (MPI_Abort)",
      s.rank, culprit, context.empty() ? "" : " (" + context + ")");
  LOG_CRITICAL("{}", msg);  // the console and the rank's log file
  flush_logs();
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(1);  // MPI_Abort did not return in time
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

[[noreturn]] void fire(double waited_s) {
  State& s = state();
  std::string op, comm;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    op = s.op;
    comm = s.comm;
  }
  abort_job(fmt::format("{} on {} has not completed after {:.0f} s", op, comm, waited_s));
}

void loop() {
  State& s = state();
  for (;;) {
    const double t = s.timeout_s.load();
    const double poll = t > 0 ? std::clamp(t / 10, 0.05, 1.0) : 1.0;
    std::this_thread::sleep_for(std::chrono::duration<double>(poll));
    const int64_t started = s.started_ns.load();
    if (t <= 0 || started == 0) continue;
    const double waited = double(now_ns() - started) * 1e-9;
    if (waited > t && s.started_ns.load() == started) fire(waited);
  }
}

}  // namespace

void start_comm_watchdog(double timeout_s, int rank) {
  State& s = state();
  s.rank = rank;
  s.timeout_s = timeout_s;
  if (timeout_s > 0 && !s.thread_started.exchange(true)) std::thread(loop).detach();
}

double comm_watch_timeout() {
  return state().timeout_s.load();
}

void comm_watch_abort(const std::string& what) {
  abort_job(what);
}

void set_watch_context(const std::string& context) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.context = context;
}

WatchScope::WatchScope(const char* op, const std::string& comm) {
  State& s = state();
  if (s.depth.fetch_add(1) != 0) return;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.op = op;
    s.comm = comm;
  }
  s.started_ns = now_ns();
}

WatchScope::~WatchScope() {
  State& s = state();
  if (s.depth.fetch_sub(1) == 1) s.started_ns = 0;
}

}  // namespace rlhf::parallel

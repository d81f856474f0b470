#include "parallel/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "core/log.h"
#include "core/phase.h"

namespace rlhf::parallel {

namespace {

using Clock = std::chrono::steady_clock;

struct State {
  std::atomic<double> timeout_s{0};
  std::atomic<int64_t> started_ns{0};  // 0: no watched operation
  std::atomic<int> depth{0};
  std::atomic<bool> thread_started{false};
  std::atomic<int> peer{-1};  // world rank the watched operation waits for; -1: unknown
  int rank = 0;
  std::mutex mu;
  std::string op, comm, context;
  std::vector<int64_t> pids;       // every rank's pid (publish_watch_peers)
  std::vector<std::string> hosts;  // every rank's host
};

State& state() {
  static State* s = new State();  // never destroyed: the detached thread may outlive main
  return *s;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void abort_job(const std::string& culprit, const std::string& tail = "") {
  State& s = state();
  std::string context;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    context = s.context;
  }
  const std::string msg = fmt::format(
      "[rlhf watchdog] rank {}: {}{}{}; another rank is probably stopped, hung or dead\nhint: "
      "--comm_timeout sets this limit (0 = none). Ending the job on every rank (MPI_Abort)",
      s.rank, culprit, context.empty() ? "" : " (" + context + ")", tail);
  LOG_CRITICAL("{}", msg);  // the console and the rank's log file
  flush_logs();
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(1);  // MPI_Abort did not return in time
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

// The state letter of /proc/<pid>/stat (after the parenthesised command name); 0 if unreadable
// (no such process).
char proc_state(int64_t pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(f, line)) return 0;
  const size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? 0 : line[close + 2];
}

[[noreturn]] void fire(double waited_s) {
  State& s = state();
  std::string op, comm;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    op = s.op;
    comm = s.comm;
  }
  const int peer = s.peer.load(std::memory_order_relaxed);
  const std::string stuck = describe_stuck_peers();
  std::string tail;
  if (peer >= 0) tail += fmt::format("; waiting for rank {}", peer);
  if (!stuck.empty()) tail += "; " + stuck;
  // abort_job appends the context in parentheses after the first part.
  abort_job(fmt::format("{} on {} has not completed after {:.0f} s", op, comm, waited_s), tail);
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
  const std::string stuck = describe_stuck_peers();
  abort_job(what, stuck.empty() ? "" : "; " + stuck);
}

void set_watch_peer(int world_rank) {
  state().peer.store(world_rank, std::memory_order_relaxed);
}

void publish_watch_peers(MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  const int64_t pid = getpid();
  std::vector<int64_t> pids(static_cast<size_t>(size));
  std::vector<char> hosts(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  WatchScope watch("watchdog setup", "world");
  if (MPI_Allgather(&pid, 1, MPI_INT64_T, pids.data(), 1, MPI_INT64_T, world) != MPI_SUCCESS ||
      MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(), MPI_MAX_PROCESSOR_NAME,
                    MPI_CHAR, world) != MPI_SUCCESS)
    return;  // diagnostics only: the watchdog works without them
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.pids = std::move(pids);
  s.hosts.clear();
  for (int r = 0; r < size; ++r)
    s.hosts.emplace_back(hosts.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
}

std::string describe_stuck_peers() {
  State& s = state();
  std::vector<int64_t> pids;
  std::vector<std::string> hosts;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    pids = s.pids;
    hosts = s.hosts;
  }
  if (pids.empty() || s.rank >= int(pids.size())) return "";
  std::string out;
  for (int r = 0; r < int(pids.size()); ++r) {
    if (r == s.rank || hosts[size_t(r)] != hosts[size_t(s.rank)]) continue;
    const char st = proc_state(pids[size_t(r)]);
    const char* what = st == 0                  ? "gone (no such process)"
                       : st == 'T'              ? "stopped (SIGSTOP)"
                       : st == 't'              ? "stopped by a debugger"
                       : st == 'Z' || st == 'X' ? "dead (a zombie)"
                                                : nullptr;
    if (what == nullptr) continue;
    out +=
        fmt::format("{}rank {} (pid {}) is {}", out.empty() ? "" : "; ", r, pids[size_t(r)], what);
  }
  return out;
}

std::vector<int> world_ranks_of(MPI_Comm comm) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  std::vector<int> in(static_cast<size_t>(n)), out(static_cast<size_t>(n), -1);
  for (int i = 0; i < n; ++i) in[size_t(i)] = i;
  MPI_Group g = MPI_GROUP_NULL, w = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &w);
  MPI_Group_translate_ranks(g, n, in.data(), w, out.data());
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  return out;
}

void set_watch_context(const std::string& context) {
  State& s = state();
  set_phase(context);  // for errors raised far from the loop (a GPU out-of-memory)
  std::lock_guard<std::mutex> lock(s.mu);
  s.context = context;
}

WatchScope::WatchScope(const char* op, const std::string& comm) {
  State& s = state();
  if (s.depth.fetch_add(1) != 0) return;
  s.peer.store(-1, std::memory_order_relaxed);
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

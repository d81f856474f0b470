// The CPU collective watchdog (--comm_timeout): a thread that ends the job when one blocking
// collective or wait of this process has not completed within the timeout — a stopped rank
// (SIGSTOP, a hung node that keeps its sockets open) otherwise leaves every other rank spinning in
// a collective forever. The GPU path has its own NCCL watchdog (parallel/comm_nccl.h).
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace rlhf::parallel {

/// Starts the watchdog thread of this process (idempotent: a second call only changes the
/// timeout). timeout_s <= 0 disables it. When a watched operation has run longer than timeout_s,
/// the thread writes one line to stderr and the log — "rank R: <op> on <communicator> has not
/// completed after T s (<context>)" — and ends the job with MPI_Abort(MPI_COMM_WORLD, 1) (and, if
/// that does not return within 10 s, _exit(1)).
void start_comm_watchdog(double timeout_s, int rank);

/// The timeout start_comm_watchdog set (s; 0 = none).
double comm_watch_timeout();

/// Ends the job as the watchdog does, with `what` as the culprit ("engine 3 has sent no progress
/// for 1800 s"): one line on stderr and in the log, then MPI_Abort on every rank. For waits that
/// are legitimately long but whose peers report progress, so silence (not duration) is the fault.
[[noreturn]] void comm_watch_abort(const std::string& what);

/// What the process is doing, for the watchdog's message ("step 12/100 train"). Thread-safe.
void set_watch_context(const std::string& context);

/// The world rank the current watched operation is waiting for, when the communicator knows it
/// (the shared-memory flag barrier does; MPI and NCCL collectives do not). Reset to "unknown" when
/// an outermost WatchScope begins. One relaxed atomic store: cheap enough for a spin loop.
void set_watch_peer(int world_rank);

/// Collective over `world` (MPI_COMM_WORLD): every rank's pid and host, so that a firing watchdog
/// can say which peer on its own host is stopped (SIGSTOP), a zombie or gone, from /proc. Optional:
/// without it the message names only the peer the communicator knows.
void publish_watch_peers(MPI_Comm world);

/// The state of the peers on this host, from /proc/<pid>/stat: "rank 1 (pid 4242) is stopped
/// (SIGSTOP)"; "; "-separated; empty when every peer on this host runs (or publish_watch_peers was
/// not called). For watchdog messages (the NCCL watchdog's too).
std::string describe_stuck_peers();

/// Ranks of `comm` translated to MPI_COMM_WORLD ranks (MPI_Group_translate_ranks), index = rank
/// in `comm`. Not collective.
std::vector<int> world_ranks_of(MPI_Comm comm);

/// Watches one blocking operation for its lifetime (nested scopes watch the outermost). Cheap:
/// two atomic stores and, on the outermost scope, a short mutex-protected copy of two strings.
class WatchScope {
 public:
  WatchScope(const char* op, const std::string& comm);
  ~WatchScope();
  WatchScope(const WatchScope&) = delete;
  WatchScope& operator=(const WatchScope&) = delete;
};

}  // namespace rlhf::parallel

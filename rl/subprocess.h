// The process plumbing of the external programs rlhf talks to (`--reward_command`, one process
// per batch; `--env_command`, one long-lived process per generation engine): pipes, a child in a
// process group of its own that is always killed and reaped, SIGPIPE kept from killing us, and the
// quoting of a program's output in error messages.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

#include <signal.h>

namespace rlhf::rl::subprocess {

/// A file descriptor that closes itself.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  /// Closes the descriptor held (if any) and holds fd.
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

/// A pipe whose ends are close-on-exec and numbered >= 3 (so that dup2 onto 0, 1, 2 in the child
/// cannot clobber another end, even when this process runs with a standard stream closed); either
/// end optionally non-blocking. `what` names the program's flag in errors (rlhf::Error).
void make_pipe(Fd& read_end, Fd& write_end, bool nonblocking_read, bool nonblocking_write,
               std::string_view what);

/// Blocks SIGPIPE in this thread for its lifetime, so that a write to a program that closed its
/// stdin fails with EPIPE instead of killing the process; a SIGPIPE raised meanwhile is consumed.
/// (Unlike signal(SIGPIPE, SIG_IGN), this changes nothing for the other threads.)
class SigpipeBlock {
 public:
  SigpipeBlock();
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;
  ~SigpipeBlock();

 private:
  sigset_t set_, old_;
  bool was_pending_ = false;
};

/// `/bin/sh -c command` with stdin, stdout, stderr on the given descriptors: the leader of its own
/// process group, with default signal dispositions and an empty signal mask. The destructor kills
/// the group and reaps the leader unless reap() did; the leader is only ever reaped last, so its
/// pid (which is the group id) cannot be reused while the group may still be signalled. Throws
/// rlhf::Error naming `what` when /bin/sh cannot start.
class ChildGroup {
 public:
  ChildGroup(const std::string& command, int in_fd, int out_fd, int err_fd, std::string_view what);
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;
  ~ChildGroup();

  pid_t pid() const { return pid_; }
  /// A pidfd of the leader (readable when it exits), or -1 on kernels without pidfd_open.
  int pidfd() const { return pidfd_.get(); }
  /// Whether the leader has exited (it stays a zombie until reap()).
  bool exited();
  /// Reaps the exited leader (without signalling its group) and returns its wait status. When this
  /// process ignores SIGCHLD the kernel reaps it and its status is lost: 0 then.
  int reap();
  /// SIGTERM to the group, up to 250 ms for the leader to exit, SIGKILL to the group, reap.
  void kill_and_reap();
  /// Whether reap() or kill_and_reap() ran.
  bool reaped() const { return reaped_; }

 private:
  pid_t pid_ = -1;
  Fd pidfd_;
  bool reaped_ = false;
};

/// The last `max` bytes of s on one line, for an error message: newlines become " | ", other
/// control characters '?', a cut multi-byte character is dropped.
std::string quote_tail(std::string_view s, size_t max = 600);

/// Appends n bytes to a buffer that keeps (at least) its last `keep` bytes, at most 2·keep.
void append_tail(std::string& tail, const char* data, size_t n, size_t keep);

/// The last `keep` bytes of tail.
std::string last_bytes(const std::string& tail, size_t keep);

/// "64 MiB", "4 KiB" or "1000 bytes".
std::string fmt_bytes(size_t n);

/// A wait status as words: "exit status 3" or "killed by signal 9".
std::string describe_status(int status);

}  // namespace rlhf::rl::subprocess

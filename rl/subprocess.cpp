#include "rl/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "io/text_util.h"

namespace rlhf::rl::subprocess {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void make_pipe(Fd& read_end, Fd& write_end, bool nonblocking_read, bool nonblocking_write,
               std::string_view what) {
  int p[2];
  RLHF_CHECK(::pipe2(p, O_CLOEXEC) == 0, "{}: pipe failed: {}", what, std::strerror(errno));
  for (int i = 0; i < 2; ++i) {
    if (p[i] < 3) {
      const int moved = ::fcntl(p[i], F_DUPFD_CLOEXEC, 3);
      const int err = errno;
      if (moved < 0) {
        ::close(p[0]);
        ::close(p[1]);
        RLHF_FAIL("{}: fcntl(F_DUPFD_CLOEXEC) failed: {}", what, std::strerror(err));
      }
      ::close(p[i]);
      p[i] = moved;
    }
  }
  read_end.reset(p[0]);
  write_end.reset(p[1]);
  if (nonblocking_read) ::fcntl(p[0], F_SETFL, ::fcntl(p[0], F_GETFL) | O_NONBLOCK);
  if (nonblocking_write) ::fcntl(p[1], F_SETFL, ::fcntl(p[1], F_GETFL) | O_NONBLOCK);
}

SigpipeBlock::SigpipeBlock() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set_, &old_);
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  was_pending_ = sigismember(&pending, SIGPIPE) == 1;
}

SigpipeBlock::~SigpipeBlock() {
  if (!was_pending_) {
    const timespec zero{};
    while (sigtimedwait(&set_, nullptr, &zero) == SIGPIPE) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

ChildGroup::ChildGroup(const std::string& command, int in_fd, int out_fd, int err_fd,
                       std::string_view what) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  // Signals this process ignores or blocks would stay ignored or blocked in the command.
  sigset_t def, mask;
  sigemptyset(&def);
  for (int s : {SIGPIPE, SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGCHLD, SIGUSR1, SIGUSR2, SIGALRM})
    sigaddset(&def, s);
  sigemptyset(&mask);
  posix_spawnattr_setsigdefault(&attr, &def);
  posix_spawnattr_setsigmask(&attr, &mask);
  std::string arg0 = "sh", arg1 = "-c", arg2 = command;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  const int rc = posix_spawn(&pid_, "/bin/sh", &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  RLHF_CHECK(rc == 0, "{} '{}': cannot start /bin/sh: {}", what, command, std::strerror(rc));
#ifdef SYS_pidfd_open
  pidfd_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));  // -1 on old kernels
#endif
}

ChildGroup::~ChildGroup() {
  if (!reaped_) kill_and_reap();
}

bool ChildGroup::exited() {
  siginfo_t info{};
  while (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0)
    if (errno != EINTR) return true;  // ECHILD: someone else reaped it
  return info.si_pid == pid_;
}

int ChildGroup::reap() {
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0) {
    if (errno == EINTR) continue;
    status = 0;
    break;
  }
  reaped_ = true;
  return status;
}

void ChildGroup::kill_and_reap() {
  constexpr int kTermGraceMs = 250;
  ::kill(-pid_, SIGTERM);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTermGraceMs);
  while (!exited() && std::chrono::steady_clock::now() < until) {
    pollfd p{pidfd_.get(), POLLIN, 0};
    if (pidfd_.open())
      ::poll(&p, 1, 10);
    else
      ::usleep(5000);
  }
  ::kill(-pid_, SIGKILL);  // the rest of the group (the leader may have gone on SIGTERM)
  reap();
}

std::string quote_tail(std::string_view s, size_t max) {
  s = io::trim_whitespace(s);
  bool cut = false;
  if (s.size() > max) {
    s = s.substr(s.size() - max);
    while (!s.empty() && (static_cast<unsigned char>(s.front()) & 0xC0) == 0x80) s.remove_prefix(1);
    cut = true;
  }
  std::string out = cut ? "..." : "";
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\n') {
      out += " | ";
    } else if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') {
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += c == '\t' || c == '\r' ? ' ' : '?';
    } else {
      out += c;
    }
  }
  return out;
}

void append_tail(std::string& tail, const char* data, size_t n, size_t keep) {
  if (n >= keep) {
    tail.assign(data + n - keep, keep);
    return;
  }
  tail.append(data, n);
  if (tail.size() > 2 * keep) tail.erase(0, tail.size() - keep);
}

std::string last_bytes(const std::string& tail, size_t keep) {
  return tail.size() > keep ? tail.substr(tail.size() - keep) : tail;
}

std::string fmt_bytes(size_t n) {
  if (n % (size_t(1) << 20) == 0) return fmt::format("{} MiB", n >> 20);
  if (n % (size_t(1) << 10) == 0) return fmt::format("{} KiB", n >> 10);
  return fmt::format("{} bytes", n);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return fmt::format("wait status {}", status);
}

}  // namespace rlhf::rl::subprocess

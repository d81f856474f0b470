// --env_command: the long-lived environment program (rl/env_command.h).
//
// One poll() loop per batch serves the program's stdin (non-blocking writes), stdout (answers,
// parsed as they arrive: memory stays within one line) and stderr (its last few KiB, quoted by the
// errors), under one deadline. Between batches nothing reads the pipes; the next batch first
// checks that the program is still alive and wrote nothing unasked.
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "io/text_util.h"
#include "rl/env_command.h"
#include "rl/subprocess.h"

namespace rlhf::rl {

using subprocess::append_tail;
using subprocess::ChildGroup;
using subprocess::Fd;
using subprocess::fmt_bytes;
using subprocess::last_bytes;
using subprocess::quote_tail;

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kStderrKeep = 4096;
constexpr const char* kWhat = "--env_command";

}  // namespace

struct CommandEnvironment::Process {
  Fd in_w, out_r, err_r;
  std::unique_ptr<ChildGroup> child;
  std::string line;      // the answer line being read (bytes after the last newline)
  std::string err_tail;  // the end of its stderr

  // Reads what stderr holds now (non-blocking); false at its end.
  bool drain_stderr() {
    char buf[65536];
    while (err_r.open()) {
      const ssize_t n = ::read(err_r.get(), buf, sizeof(buf));
      if (n > 0) {
        append_tail(err_tail, buf, size_t(n), kStderrKeep);
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) err_r.reset();
      break;
    }
    return err_r.open();
  }
  // "; stderr: '...'" or "".
  std::string stderr_quote() {
    drain_stderr();
    const std::string e = last_bytes(err_tail, kStderrKeep);
    return io::trim_whitespace(e).empty() ? "" : fmt::format("; stderr: '{}'", quote_tail(e));
  }
  // Waits up to ms for the leader to exit.
  bool wait_exit(int ms) {
    const auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (!child->exited()) {
      if (Clock::now() >= until) return false;
      pollfd p{child->pidfd(), POLLIN, 0};
      if (child->pidfd() >= 0)
        ::poll(&p, 1, 10);
      else
        ::usleep(5000);
    }
    return true;
  }
  // Why the program is gone, once its stdout has closed: its exit status, else "closed its stdout".
  std::string gone() {
    if (wait_exit(1000))
      return fmt::format("exited ({})", subprocess::describe_status(child->reap()));
    return "closed its stdout";
  }
};

CommandEnvironment::CommandEnvironment(std::string command, double timeout_s)
    : command_(std::move(command)), timeout_s_(timeout_s), proc_(std::make_unique<Process>()) {
  RLHF_CHECK(timeout_s > 0, "--env_timeout must be > 0, got {}", timeout_s);
  Fd in_r, out_w, err_w;
  subprocess::make_pipe(in_r, proc_->in_w, false, true, kWhat);
  subprocess::make_pipe(proc_->out_r, out_w, true, false, kWhat);
  subprocess::make_pipe(proc_->err_r, err_w, true, false, kWhat);
  proc_->child =
      std::make_unique<ChildGroup>(command_, in_r.get(), out_w.get(), err_w.get(), kWhat);
}

CommandEnvironment::~CommandEnvironment() {
  if (!proc_) return;
  proc_->in_w.reset();  // end of input: a well-behaved program exits now
  if (!proc_->wait_exit(1000)) proc_->child->kill_and_reap();
  // ~ChildGroup kills the rest of the group and reaps the leader unless that happened above.
}

void CommandEnvironment::fail(const std::string& message) {
  if (proc_) {
    if (!proc_->child->reaped()) proc_->child->kill_and_reap();
    proc_.reset();
  }
  broken_ = message;
  throw Error(message, "rl/env_command.cpp");
}

std::vector<EnvAnswer> CommandEnvironment::step(const std::vector<EnvQuery>& queries) {
  if (!broken_.empty()) throw Error(broken_, "rl/env_command.cpp");
  if (queries.empty()) return {};
  Process& p = *proc_;
  subprocess::SigpipeBlock sigpipe_block;
  const size_t N = queries.size();
  const std::string& cmd = command_;

  // Still there, and silent since the last batch?
  {
    pollfd f{p.out_r.get(), POLLIN, 0};
    if (::poll(&f, 1, 0) > 0) {
      char buf[256];
      const ssize_t n = ::read(p.out_r.get(), buf, sizeof(buf));
      if (n > 0)
        fail(
            fmt::format("{} '{}' wrote output nobody asked for, between two batches of turns: "
                        "'{}'\nhint: answer each request line with exactly one line; write logs "
                        "to stderr",
                        kWhat, cmd, quote_tail(std::string_view(buf, size_t(n)), 200)));
      if (n == 0)
        fail(fmt::format("{} '{}' {} before it was asked anything more{}", kWhat, cmd, p.gone(),
                         p.stderr_quote()));
    }
  }

  std::string input;
  for (const EnvQuery& q : queries) {
    input += env_query_line(q);
    input += '\n';
  }
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::min(timeout_s_, 1e8)));
  std::vector<EnvAnswer> answers;
  answers.reserve(N);
  size_t written = 0, out_total = 0;
  char buf[65536];
  // A complete answer line: parse it (blank lines are skipped).
  auto end_line = [&]() {
    const std::string_view l = io::trim_whitespace(p.line);
    if (!l.empty()) {
      if (answers.size() == N)
        fail(
            fmt::format("{} '{}' wrote more answer lines than asked ({} request(s)): "
                        "'{}'\nhint: answer each request line with exactly one line; write logs "
                        "to stderr",
                        kWhat, cmd, N, quote_tail(l, 200)));
      try {
        answers.push_back(
            parse_env_answer(l, cmd, int64_t(answers.size()) + 1, queries[answers.size()].id));
      } catch (const Error& e) {
        fail(e.what());
      }
    }
    p.line.clear();
  };
  while (answers.size() < N) {
    const auto now = Clock::now();
    if (now >= deadline) {
      const std::string stage =
          written < input.size()
              ? fmt::format("while writing its input ({} of {} bytes taken; does it read stdin?)",
                            written, input.size())
              : fmt::format("waiting for its answers ({} of {} read)", answers.size(), N);
      fail(
          fmt::format("{} '{}' timed out after {:g}s (--env_timeout) at turn {} of episode {} "
                      "{}{}\nhint: raise --env_timeout, or make the program answer each request "
                      "line with one line and flush its stdout; the whole process group was "
                      "killed",
                      kWhat, cmd, timeout_s_, queries[answers.size()].turn,
                      queries[answers.size()].id, stage, p.stderr_quote()));
    }
    pollfd fds[3];
    int nfds = 0, i_in = -1, i_out = -1, i_err = -1;
    if (written < input.size()) fds[i_in = nfds++] = {p.in_w.get(), POLLOUT, 0};
    fds[i_out = nfds++] = {p.out_r.get(), POLLIN, 0};
    if (p.err_r.open()) fds[i_err = nfds++] = {p.err_r.get(), POLLIN, 0};
    const double left_ms = std::chrono::duration<double, std::milli>(deadline - now).count();
    const int wait_ms = std::max(1, static_cast<int>(std::min(std::ceil(left_ms), 1e6)));
    if (::poll(fds, nfds_t(nfds), wait_ms) < 0) {
      if (errno != EINTR) fail(fmt::format("{}: poll failed: {}", kWhat, std::strerror(errno)));
      continue;
    }
    if (i_in >= 0 && fds[i_in].revents) {
      const ssize_t n = ::write(p.in_w.get(), input.data() + written, input.size() - written);
      if (n > 0) written += size_t(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR)  // EPIPE: it closed its stdin or exited
        fail(
            fmt::format("{} '{}' stopped reading its stdin ({} of {} bytes of requests taken): "
                        "it {}{}",
                        kWhat, cmd, written, input.size(), p.gone(), p.stderr_quote()));
    }
    if (i_err >= 0 && fds[i_err].revents) p.drain_stderr();
    if (fds[i_out].revents) {
      const ssize_t n = ::read(p.out_r.get(), buf, sizeof(buf));
      if (n == 0)
        fail(fmt::format("{} '{}' {} after {} of {} answers{}", kWhat, cmd, p.gone(),
                         answers.size(), N, p.stderr_quote()));
      if (n < 0) {
        if (errno != EAGAIN && errno != EINTR)
          fail(fmt::format("{}: reading its stdout failed: {}", kWhat, std::strerror(errno)));
        continue;
      }
      out_total += size_t(n);
      if (out_total > kEnvMaxOutputBytes)
        fail(
            fmt::format("{} '{}' wrote more than {} on stdout for {} request(s) (the bound of one "
                        "batch's answers)",
                        kWhat, cmd, fmt_bytes(kEnvMaxOutputBytes), N));
      const char* c = buf;
      size_t left = size_t(n);
      while (left > 0) {
        const char* nl = static_cast<const char*>(std::memchr(c, '\n', left));
        const size_t len = nl ? size_t(nl - c) : left;
        if (p.line.size() + len > kEnvMaxLineBytes)
          fail(fmt::format("{} '{}': answer {} is longer than {} (the bound of one line)", kWhat,
                           cmd, answers.size() + 1, fmt_bytes(kEnvMaxLineBytes)));
        p.line.append(c, len);
        if (!nl) break;
        end_line();
        c += len + 1;
        left -= len + 1;
      }
    }
  }
  if (!io::trim_whitespace(p.line).empty())
    fail(
        fmt::format("{} '{}' wrote more than the {} answer line(s) it was asked for: '{}'\nhint: "
                    "answer each request line with exactly one line; write logs to stderr",
                    kWhat, cmd, N, quote_tail(p.line, 200)));
  return answers;
}

}  // namespace rlhf::rl

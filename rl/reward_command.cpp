// --reward_command: the external scoring program (rl/rewards.h run_reward_command).
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "io/text_util.h"
#include "rl/rewards.h"
#include "rl/subprocess.h"

namespace rlhf::rl {

using io::trim_whitespace;

// --- external command ------------------------------------------------------------------------
//
// One deadline covers the whole exchange: writing the input, reading the output, and the exit.
// The pipes are non-blocking and one poll() loop serves all of them (stdin, stdout, stderr, and a
// pidfd for the exit), so neither side can deadlock on a full pipe. The child runs /bin/sh -c in a
// process group of its own; any path that leaves it unreaped (the deadline, a bound, an exception)
// sends the group SIGTERM, then SIGKILL, and reaps the child. stdout is parsed as it arrives, so
// memory stays within one line (kRewardCommandMaxLineBytes); stderr keeps its last few KiB, which
// the errors quote.

namespace {

using subprocess::append_tail;
using subprocess::ChildGroup;
using subprocess::Fd;
using subprocess::fmt_bytes;
using subprocess::last_bytes;
using subprocess::make_pipe;
using subprocess::quote_tail;
using subprocess::SigpipeBlock;

// A score: a decimal or scientific number, nothing else on the line. Non-finite values (nan, inf,
// 1e999) are rejected with `not_finite` set.
std::optional<double> parse_score(std::string_view s, bool& not_finite) {
  not_finite = false;
  if (!s.empty() && s.front() == '+') {  // from_chars takes no '+'
    s.remove_prefix(1);
    if (s.empty() || s.front() == '-' || s.front() == '+') return std::nullopt;
  }
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (end != s.data() + s.size()) return std::nullopt;
  if (ec == std::errc::result_out_of_range) {
    // Overflow is not finite; underflow (1e-999) rounds to 0 as strtod does.
    const double r = std::strtod(std::string(s).c_str(), nullptr);
    if (!std::isfinite(r)) {
      not_finite = true;
      return std::nullopt;
    }
    return r;
  }
  if (ec != std::errc()) return std::nullopt;
  if (!std::isfinite(v)) {
    not_finite = true;
    return std::nullopt;
  }
  return v;
}

constexpr const char* kOutputHint =
    "hint: the command must write one number per line on stdout, one line per input line, in "
    "order; write logs to stderr";

}  // namespace

std::vector<double> run_reward_command(const std::string& command,
                                       const std::vector<RewardInput>& batch, double timeout_s) {
  RLHF_CHECK(timeout_s > 0, "--reward_command_timeout must be > 0, got {}", timeout_s);
  constexpr size_t kStderrKeep = 4096, kStdoutKeep = 1024;
  std::string input;
  for (const RewardInput& r : batch) {
    nlohmann::json j = {{"prompt", std::string(r.prompt)},
                        {"completion", std::string(r.completion)},
                        {"label", r.label ? *r.label : nlohmann::json()}};
    input += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    input += '\n';
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(std::min(timeout_s, 1e8)));

  Fd in_r, in_w, out_r, out_w, err_r, err_w;
  make_pipe(in_r, in_w, false, true, "--reward_command");
  make_pipe(out_r, out_w, true, false, "--reward_command");
  make_pipe(err_r, err_w, true, false, "--reward_command");
  SigpipeBlock sigpipe_block;
  ChildGroup child(command, in_r.get(), out_w.get(), err_w.get(), "--reward_command");
  in_r.reset();
  out_w.reset();
  err_w.reset();

  // stdout, parsed line by line as it arrives.
  std::vector<double> scores;
  std::string line, out_tail, err_tail;
  int64_t line_no = 0;
  size_t out_total = 0;
  std::string bad_line;  // the first line that is not a score (reported after the exit status)
  auto end_line = [&]() {
    ++line_no;
    const std::string_view l = trim_whitespace(line);
    if (!l.empty() && bad_line.empty()) {
      bool not_finite = false;
      if (auto v = parse_score(l, not_finite)) {
        scores.push_back(*v);
      } else {
        bad_line = fmt::format("--reward_command '{}': line {} is not a {}number: '{}'\n{}",
                               command, line_no, not_finite ? "finite " : "",
                               std::string(l.substr(0, 80)), kOutputHint);
      }
    }
    line.clear();
  };
  auto take_output = [&](const char* p, size_t n) {
    out_total += n;
    RLHF_CHECK(out_total <= kRewardCommandMaxOutputBytes,
               "--reward_command '{}' wrote more than {} on stdout for {} samples (the bound of "
               "one batch's output)\n{}",
               command, fmt_bytes(kRewardCommandMaxOutputBytes), batch.size(), kOutputHint);
    append_tail(out_tail, p, n, kStdoutKeep);
    while (n > 0) {
      const char* nl = static_cast<const char*>(std::memchr(p, '\n', n));
      const size_t len = nl ? size_t(nl - p) : n;
      RLHF_CHECK(line.size() + len <= kRewardCommandMaxLineBytes,
                 "--reward_command '{}': line {} of its output is longer than {} (the bound of one "
                 "line)\n{}",
                 command, line_no + 1, fmt_bytes(kRewardCommandMaxLineBytes), kOutputHint);
      line.append(p, len);
      if (!nl) break;
      end_line();
      p += len + 1;
      n -= len + 1;
    }
  };
  auto stderr_quote = [&](const char* what) -> std::string {
    const std::string e = last_bytes(err_tail, kStderrKeep);
    return trim_whitespace(e).empty() ? "" : fmt::format("; {}: '{}'", what, quote_tail(e));
  };

  char buf[65536];
  size_t written = 0;
  bool out_eof = false, err_eof = false;
  if (input.empty()) in_w.reset();
  while (true) {
    if (out_eof && child.exited()) break;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::string stage;
      if (in_w.open())
        stage = fmt::format("while writing its input ({} of {} bytes taken; does it read stdin?)",
                            written, input.size());
      else if (!out_eof && child.exited())
        stage = fmt::format(
            "after it exited: a process it started still holds its stdout open ({} of {} scores "
            "read)",
            scores.size(), batch.size());
      else if (!out_eof)
        stage = fmt::format("while reading its output ({} of {} scores read)", scores.size(),
                            batch.size());
      else
        stage = fmt::format("waiting for it to exit after it closed its stdout ({} of {} scores)",
                            scores.size(), batch.size());
      RLHF_FAIL(
          "--reward_command '{}' timed out after {:g}s (--reward_command_timeout) {}{}\nhint: "
          "raise --reward_command_timeout, or make the command read all its input, write one "
          "number per line and exit; the whole process group was killed",
          command, timeout_s, stage, stderr_quote("stderr"));
    }
    pollfd fds[4];
    int nfds = 0, i_in = -1, i_out = -1, i_err = -1;
    if (in_w.open()) fds[i_in = nfds++] = {in_w.get(), POLLOUT, 0};
    if (!out_eof) fds[i_out = nfds++] = {out_r.get(), POLLIN, 0};
    if (!err_eof) fds[i_err = nfds++] = {err_r.get(), POLLIN, 0};
    const bool wait_exit = out_eof;  // stdout closed: what is left is the exit
    if (wait_exit && child.pidfd() >= 0) fds[nfds++] = {child.pidfd(), POLLIN, 0};
    const double left_ms = std::chrono::duration<double, std::milli>(deadline - now).count();
    int wait_ms = static_cast<int>(std::min(std::ceil(left_ms), 1e6));
    if (wait_exit && child.pidfd() < 0) wait_ms = std::min(wait_ms, 10);
    if (::poll(fds, nfds_t(nfds), std::max(wait_ms, 1)) < 0) {
      RLHF_CHECK(errno == EINTR, "--reward_command: poll failed: {}", std::strerror(errno));
      continue;
    }
    if (i_in >= 0 && fds[i_in].revents) {
      const ssize_t n = ::write(in_w.get(), input.data() + written, input.size() - written);
      if (n > 0) written += size_t(n);
      // EPIPE: the command closed its stdin (or exited) without reading all of it; its output
      // decides.
      if (n < 0 && errno != EAGAIN && errno != EINTR) in_w.reset();
      if (written >= input.size()) in_w.reset();
    }
    if (i_out >= 0 && fds[i_out].revents) {
      const ssize_t n = ::read(out_r.get(), buf, sizeof(buf));
      if (n > 0) take_output(buf, size_t(n));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        out_eof = true;
        out_r.reset();
        in_w.reset();  // the command can no longer answer: do not wait on its stdin
      }
    }
    if (i_err >= 0 && fds[i_err].revents) {
      const ssize_t n = ::read(err_r.get(), buf, sizeof(buf));
      if (n > 0) append_tail(err_tail, buf, size_t(n), kStderrKeep);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        err_eof = true;
        err_r.reset();
      }
    }
  }
  // The command exited and closed its stdout: take what is left on stderr (a bounded amount: a
  // process it started may still be writing there), then reap it.
  for (size_t drained = 0; !err_eof && drained < (size_t(1) << 20);) {
    const ssize_t n = ::read(err_r.get(), buf, sizeof(buf));
    if (n <= 0) break;
    append_tail(err_tail, buf, size_t(n), kStderrKeep);
    drained += size_t(n);
  }
  const int status = child.reap();
  if (!line.empty()) end_line();  // a last line without '\n'
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    std::string quote = stderr_quote("stderr");
    if (quote.empty() && !trim_whitespace(out_tail).empty())
      quote = fmt::format("; stdout: '{}'", quote_tail(out_tail));
    RLHF_FAIL("--reward_command '{}' failed ({}{}){}", command,
              WIFEXITED(status) ? "exit status " : "killed by signal ",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), quote);
  }
  if (!bad_line.empty()) throw_error(__FILE__, __LINE__, bad_line);
  RLHF_CHECK(scores.size() == batch.size(),
             "--reward_command '{}' wrote {} scores for {} samples (one number per line "
             "expected){}",
             command, scores.size(), batch.size(), stderr_quote("stderr"));
  return scores;
}

}  // namespace rlhf::rl

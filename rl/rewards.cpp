#include "rl/rewards.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <regex>

#include "core/error.h"

namespace rlhf::rl {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Content of the brace group starting at s[open] == '{', or npos if unbalanced.
size_t matching_brace(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return i;
  }
  return std::string_view::npos;
}

std::optional<double> parse_plain(std::string_view s) {
  std::string t;
  for (char c : s)
    if (c != ',' && c != ' ') t += c;
  if (t.empty() || t.size() > 64) return std::nullopt;
  size_t i = 0;
  if (t[i] == '+' || t[i] == '-') ++i;
  bool digits = false, dot = false;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits = true;
    } else if (c == '.' && !dot) {
      dot = true;
    } else if ((c == 'e' || c == 'E') && digits) {
      size_t j = i + 1;
      if (j < t.size() && (t[j] == '+' || t[j] == '-')) ++j;
      if (j >= t.size()) return std::nullopt;
      for (; j < t.size(); ++j)
        if (!std::isdigit(static_cast<unsigned char>(t[j]))) return std::nullopt;
      break;
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  const double v = std::strtod(t.c_str(), nullptr);
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace

std::optional<double> parse_math_number(std::string_view s) {
  s = trim(s);
  if (s.size() > 64 || s.empty()) return std::nullopt;
  // \frac{a}{b}, \dfrac, \tfrac
  for (std::string_view f : {"\\dfrac", "\\tfrac", "\\frac"}) {
    if (s.substr(0, f.size()) == f) {
      const size_t a0 = f.size();
      if (a0 >= s.size() || s[a0] != '{') return std::nullopt;
      const size_t a1 = matching_brace(s, a0);
      if (a1 == std::string_view::npos || a1 + 1 >= s.size() || s[a1 + 1] != '{')
        return std::nullopt;
      const size_t b1 = matching_brace(s, a1 + 1);
      if (b1 == std::string_view::npos || b1 + 1 != s.size()) return std::nullopt;
      auto num = parse_plain(s.substr(a0 + 1, a1 - a0 - 1));
      auto den = parse_plain(s.substr(a1 + 2, b1 - a1 - 2));
      if (!num || !den || *den == 0) return std::nullopt;
      return *num / *den;
    }
  }
  if (s.front() == '-' && s.size() > 1 && s[1] == '\\') {
    auto v = parse_math_number(s.substr(1));
    if (v) return -*v;
    return std::nullopt;
  }
  if (s.front() == '$') s.remove_prefix(1);
  while (!s.empty() && (s.back() == '.' || s.back() == '%' || s.back() == '$')) s.remove_suffix(1);
  if (const size_t slash = s.find('/'); slash != std::string_view::npos) {
    auto num = parse_plain(s.substr(0, slash));
    auto den = parse_plain(s.substr(slash + 1));
    if (!num || !den || *den == 0) return std::nullopt;
    return *num / *den;
  }
  return parse_plain(s);
}

namespace {

// The last number-looking token of a text (digits with optional sign, commas, decimal point).
std::optional<double> last_number(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t i = end;
    while (i > 0 && !std::isdigit(static_cast<unsigned char>(s[i - 1]))) --i;
    if (i == 0) return std::nullopt;
    size_t j = i;
    while (j > 0 &&
           (std::isdigit(static_cast<unsigned char>(s[j - 1])) || s[j - 1] == '.' ||
            (s[j - 1] == ',' && j >= 2 && std::isdigit(static_cast<unsigned char>(s[j - 2])))))
      --j;
    if (j > 0 && s[j - 1] == '-') --j;
    if (auto v = parse_math_number(s.substr(j, i - j))) return v;
    end = j;
  }
  return std::nullopt;
}

}  // namespace

std::optional<double> extract_math_answer(std::string_view c) {
  if (const size_t b = c.rfind("\\boxed{"); b != std::string_view::npos) {
    const size_t open = b + 6;
    const size_t close = matching_brace(c, open);
    if (close != std::string_view::npos) {
      std::string_view inner = c.substr(open + 1, close - open - 1);
      if (auto v = parse_math_number(inner)) return v;
      return last_number(inner);
    }
  }
  if (const size_t h = c.rfind("####"); h != std::string_view::npos) {
    std::string_view rest = trim(c.substr(h + 4));
    size_t end = 0;
    while (end < rest.size() && !std::isspace(static_cast<unsigned char>(rest[end]))) ++end;
    if (auto v = parse_math_number(rest.substr(0, end))) return v;
  }
  return last_number(c);
}

std::optional<double> math_label_value(const nlohmann::json& label) {
  if (label.is_number()) {
    const double v = label.get<double>();
    return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
  }
  if (!label.is_string()) return std::nullopt;
  const std::string s = label.get<std::string>();
  if (s.find("####") != std::string::npos || s.find("\\boxed{") != std::string::npos)
    return extract_math_answer(s);
  return parse_math_number(s);
}

double math_reward(std::string_view completion, const nlohmann::json& label) {
  const auto ref = math_label_value(label);
  RLHF_CHECK(ref.has_value(), "math reward: label {} has no number", label.dump().substr(0, 80));
  const auto got = extract_math_answer(completion);
  if (!got) return 0.0;
  return std::fabs(*got - *ref) <= 1e-6 * std::max(1.0, std::fabs(*ref)) ? 1.0 : 0.0;
}

// --- countdown ------------------------------------------------------------------------------

namespace {

// Recursive-descent evaluator: expr = term (('+'|'-') term)*, term = factor (('*'|'/') factor)*,
// factor = ('+'|'-') factor | number | '(' expr ')'.
struct Evaluator {
  std::string_view s;
  size_t i = 0;
  int depth = 0;
  bool ok = true;
  void skip() {
    while (i < s.size() && s[i] == ' ') ++i;
  }
  double expr() {
    double v = term();
    for (skip(); ok && i < s.size() && (s[i] == '+' || s[i] == '-'); skip()) {
      const char op = s[i++];
      const double r = term();
      v = op == '+' ? v + r : v - r;
    }
    return v;
  }
  double term() {
    double v = factor();
    for (skip(); ok && i < s.size() && (s[i] == '*' || s[i] == '/'); skip()) {
      const char op = s[i++];
      const double r = factor();
      if (op == '/' && r == 0) {
        ok = false;
        return 0;
      }
      v = op == '*' ? v * r : v / r;
    }
    return v;
  }
  double factor() {
    skip();
    if (!ok || i >= s.size() || ++depth > 200) {
      ok = false;
      return 0;
    }
    double v = 0;
    if (s[i] == '+' || s[i] == '-') {
      const char op = s[i++];
      v = factor();
      v = op == '-' ? -v : v;
    } else if (s[i] == '(') {
      ++i;
      v = expr();
      skip();
      if (i >= s.size() || s[i] != ')') ok = false;
      ++i;
    } else if (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.') {
      const size_t j = i;
      while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
      auto p = parse_plain(s.substr(j, i - j));
      if (!p || i - j > 18) ok = false;
      v = p.value_or(0);
    } else {
      ok = false;
    }
    --depth;
    return v;
  }
};

}  // namespace

std::optional<double> eval_arithmetic(std::string_view expr) {
  Evaluator e{expr};
  const double v = e.expr();
  e.skip();
  if (!e.ok || e.i != expr.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

double countdown_reward(std::string_view completion, double target,
                        const std::vector<int64_t>& nums) {
  const size_t close = completion.rfind("</answer>");
  if (close == std::string_view::npos) return 0.0;
  const size_t open = completion.rfind("<answer>", close);
  if (open == std::string_view::npos) return 0.0;
  std::string_view eq = trim(completion.substr(open + 8, close - open - 8));
  // TinyZero's answers may be "expr = target": keep the left side.
  if (const size_t e = eq.find('='); e != std::string_view::npos) eq = trim(eq.substr(0, e));
  constexpr double kFormat = 0.1;
  for (char c : eq)
    if (!std::strchr("0123456789+-*/(). ", c)) return kFormat;
  std::vector<int64_t> used;
  for (size_t i = 0; i < eq.size();) {
    if (std::isdigit(static_cast<unsigned char>(eq[i]))) {
      size_t j = i;
      while (j < eq.size() && std::isdigit(static_cast<unsigned char>(eq[j]))) ++j;
      if (j - i > 18) return kFormat;
      used.push_back(std::stoll(std::string(eq.substr(i, j - i))));
      i = j;
    } else {
      ++i;
    }
  }
  std::vector<int64_t> want = nums;
  std::sort(used.begin(), used.end());
  std::sort(want.begin(), want.end());
  if (used != want) return kFormat;
  const auto v = eval_arithmetic(eq);
  if (!v) return kFormat;
  return std::fabs(*v - target) < 1e-5 ? 1.0 : kFormat;
}

std::pair<double, std::vector<int64_t>> countdown_label(const nlohmann::json* label,
                                                        const nlohmann::json* record) {
  auto nums_of = [](const nlohmann::json& j) -> std::optional<std::vector<int64_t>> {
    for (const char* k : {"nums", "numbers"}) {
      if (j.is_object() && j.contains(k) && j[k].is_array()) {
        std::vector<int64_t> v;
        for (const auto& x : j[k]) {
          if (!x.is_number_integer()) return std::nullopt;
          v.push_back(x.get<int64_t>());
        }
        return v;
      }
    }
    return std::nullopt;
  };
  auto number_of = [](const nlohmann::json& j) -> std::optional<double> {
    if (j.is_number()) return j.get<double>();
    if (j.is_string()) return parse_math_number(j.get<std::string>());
    return std::nullopt;
  };
  if (label) {
    const nlohmann::json* obj = label;
    if (obj->is_object() && obj->contains("ground_truth")) obj = &(*obj)["ground_truth"];
    if (obj->is_object() && obj->contains("target")) {
      auto t = number_of((*obj)["target"]);
      auto n = nums_of(*obj);
      if (!n && record) n = nums_of(*record);
      if (t && n) return {*t, *n};
    }
    if (auto t = number_of(*label)) {
      if (record) {
        if (auto n = nums_of(*record)) return {*t, *n};
        if (record->contains("input") && (*record)["input"].is_string()) {
          std::vector<int64_t> v;
          const std::string in = (*record)["input"].get<std::string>();
          for (size_t i = 0; i < in.size();) {
            if (std::isdigit(static_cast<unsigned char>(in[i]))) {
              size_t j = i;
              while (j < in.size() && std::isdigit(static_cast<unsigned char>(in[j]))) ++j;
              v.push_back(std::stoll(in.substr(i, std::min<size_t>(j - i, 18))));
              i = j;
            } else {
              ++i;
            }
          }
          if (!v.empty()) return {*t, v};
        }
      }
    }
  }
  RLHF_FAIL(
      "countdown reward: cannot find the target and numbers in label {}\nhint: the label must be "
      "{{\"target\": t, \"nums\": [...]}} or a target with \"nums\" in the prompt record",
      label ? label->dump().substr(0, 80) : "(none)");
}

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

// A file descriptor that closes itself.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// A pipe whose ends are close-on-exec and numbered >= 3 (so that dup2 onto 0, 1, 2 in the child
// cannot clobber another end, even when this process runs with a standard stream closed).
void make_pipe(Fd& read_end, Fd& write_end, bool nonblocking_read, bool nonblocking_write) {
  int p[2];
  RLHF_CHECK(::pipe2(p, O_CLOEXEC) == 0, "--reward_command: pipe failed: {}", std::strerror(errno));
  for (int i = 0; i < 2; ++i) {
    if (p[i] < 3) {
      const int moved = ::fcntl(p[i], F_DUPFD_CLOEXEC, 3);
      const int err = errno;
      if (moved < 0) {
        ::close(p[0]);
        ::close(p[1]);
        RLHF_FAIL("--reward_command: fcntl(F_DUPFD_CLOEXEC) failed: {}", std::strerror(err));
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

// Blocks SIGPIPE in this thread for its lifetime, so that a write to a command that closed its
// stdin fails with EPIPE instead of killing the process; a SIGPIPE raised meanwhile is consumed.
// (Unlike signal(SIGPIPE, SIG_IGN), this changes nothing for the other threads.)
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;
  ~SigpipeBlock() {
    if (!was_pending_) {
      const timespec zero{};
      while (sigtimedwait(&set_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t set_, old_;
  bool was_pending_ = false;
};

// The spawned command: the leader of its own process group. The destructor kills the group and
// reaps the leader unless reap() did; the leader is only ever reaped last, so its pid (which is
// the group id) cannot be reused while the group may still be signalled.
class ChildGroup {
 public:
  ChildGroup(const std::string& command, int in_fd, int out_fd, int err_fd) {
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
    posix_spawnattr_setflags(
        &attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
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
    RLHF_CHECK(rc == 0, "--reward_command '{}': cannot start /bin/sh: {}", command,
               std::strerror(rc));
#ifdef SYS_pidfd_open
    pidfd_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));  // -1 on old kernels
#endif
  }
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;
  ~ChildGroup() {
    if (!reaped_) kill_and_reap();
  }

  pid_t pid() const {
    return pid_;
  }
  int pidfd() const {
    return pidfd_.get();
  }

  // Whether the leader has exited (it stays a zombie until reap()).
  bool exited() {
    siginfo_t info{};
    while (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0)
      if (errno != EINTR) return true;  // ECHILD: someone else reaped it
    return info.si_pid == pid_;
  }

  // Reaps the exited leader (without signalling its group) and returns its wait status. When this
  // process ignores SIGCHLD the kernel reaps it and its status is lost: 0 then, as the output
  // decides.
  int reap() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0) {
      if (errno == EINTR) continue;
      status = 0;
      break;
    }
    reaped_ = true;
    return status;
  }

  // SIGTERM to the group, up to kTermGraceMs for the leader to exit, SIGKILL to the group, reap.
  void kill_and_reap() {
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

 private:
  pid_t pid_ = -1;
  Fd pidfd_;
  bool reaped_ = false;
};

// The last `max` bytes of s on one line, for an error message: newlines become " | ", other
// control characters '?', a cut multi-byte character is dropped.
std::string quote_tail(std::string_view s, size_t max = 600) {
  s = trim(s);
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

// Appends data to a buffer that keeps only its last `keep` bytes.
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

std::string fmt_bytes(size_t n) {
  if (n % (size_t(1) << 20) == 0) return fmt::format("{} MiB", n >> 20);
  if (n % (size_t(1) << 10) == 0) return fmt::format("{} KiB", n >> 10);
  return fmt::format("{} bytes", n);
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
  make_pipe(in_r, in_w, false, true);
  make_pipe(out_r, out_w, true, false);
  make_pipe(err_r, err_w, true, false);
  SigpipeBlock sigpipe_block;
  ChildGroup child(command, in_r.get(), out_w.get(), err_w.get());
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
    const std::string_view l = trim(line);
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
    return trim(e).empty() ? "" : fmt::format("; {}: '{}'", what, quote_tail(e));
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
    if (quote.empty() && !trim(out_tail).empty())
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

// --- reward functions --------------------------------------------------------------------------

namespace {

class MathReward final : public RewardFn {
 public:
  std::string name() const override { return "math"; }
  std::vector<double> score(const std::vector<RewardInput>& b) override {
    std::vector<double> s;
    for (const RewardInput& r : b) {
      RLHF_CHECK(r.label != nullptr, "math reward needs a label\nhint: set --label_key");
      s.push_back(math_reward(r.completion, *r.label));
    }
    return s;
  }
};

class CountdownReward final : public RewardFn {
 public:
  std::string name() const override { return "countdown"; }
  std::vector<double> score(const std::vector<RewardInput>& b) override {
    std::vector<double> s;
    for (const RewardInput& r : b) {
      const auto [target, nums] = countdown_label(r.label, r.record);
      s.push_back(countdown_reward(r.completion, target, nums));
    }
    return s;
  }
};

class FormatReward final : public RewardFn {
 public:
  explicit FormatReward(const std::string& pattern) : pattern_(pattern) {
    try {
      re_ = std::regex(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      RLHF_FAIL("--reward_format_pattern '{}' is not a valid regex: {}", pattern, e.what());
    }
  }
  std::string name() const override { return "format"; }
  std::vector<double> score(const std::vector<RewardInput>& b) override {
    std::vector<double> s;
    for (const RewardInput& r : b)
      s.push_back(std::regex_search(r.completion.begin(), r.completion.end(), re_) ? 1.0 : 0.0);
    return s;
  }

 private:
  std::string pattern_;
  std::regex re_;
};

class LengthReward final : public RewardFn {
 public:
  explicit LengthReward(int64_t target) : target_(target) {
    RLHF_CHECK(target > 0, "--reward_length_target must be > 0, got {}", target);
  }
  std::string name() const override { return "length"; }
  std::vector<double> score(const std::vector<RewardInput>& b) override {
    std::vector<double> s;
    for (const RewardInput& r : b)
      s.push_back(
          1.0 - std::min(1.0, std::fabs(double(r.completion_tokens - target_)) / double(target_)));
    return s;
  }

 private:
  int64_t target_;
};

std::string lower(std::string_view s) {
  std::string t(s);
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return t;
}

class KeywordReward final : public RewardFn {
 public:
  explicit KeywordReward(std::vector<std::string> kw) : kw_(std::move(kw)) {
    RLHF_CHECK(!kw_.empty(), "the keyword reward needs --reward_keywords");
    for (auto& k : kw_) k = lower(k);
  }
  std::string name() const override { return "keyword"; }
  std::vector<double> score(const std::vector<RewardInput>& b) override {
    std::vector<double> s;
    for (const RewardInput& r : b) {
      const std::string c = lower(r.completion);
      int hit = 0;
      for (const auto& k : kw_) hit += c.find(k) != std::string::npos;
      s.push_back(double(hit) / double(kw_.size()));
    }
    return s;
  }

 private:
  std::vector<std::string> kw_;
};

class CommandReward final : public RewardFn {
 public:
  CommandReward(std::string cmd, double timeout) : cmd_(std::move(cmd)), timeout_(timeout) {
    RLHF_CHECK(!cmd_.empty(), "--reward command needs --reward_command");
  }
  std::string name() const override { return "command"; }
  std::vector<double> score(const std::vector<RewardInput>& b) override {
    return run_reward_command(cmd_, b, timeout_);
  }

 private:
  std::string cmd_;
  double timeout_;
};

class WeightedSum final : public RewardFn {
 public:
  std::string name() const override {
    std::string n;
    for (size_t i = 0; i < parts_.size(); ++i)
      n += fmt::format("{}{}:{}", i ? "," : "", parts_[i].second->name(), parts_[i].first);
    return n;
  }
  std::vector<double> score(const std::vector<RewardInput>& b) override {
    std::vector<double> s(b.size(), 0.0);
    for (auto& [w, fn] : parts_) {
      auto part = fn->score(b);
      for (size_t i = 0; i < s.size(); ++i) s[i] += w * part[i];
    }
    return s;
  }
  std::vector<std::pair<double, std::unique_ptr<RewardFn>>> parts_;
};

std::unique_ptr<RewardFn> make_one(const std::string& name, const RewardOptions& o) {
  if (name == "math") return std::make_unique<MathReward>();
  if (name == "countdown") return std::make_unique<CountdownReward>();
  if (name == "format") return std::make_unique<FormatReward>(o.format_pattern);
  if (name == "length") return std::make_unique<LengthReward>(o.length_target);
  if (name == "keyword") return std::make_unique<KeywordReward>(o.keywords);
  if (name == "command") return std::make_unique<CommandReward>(o.command, o.command_timeout_s);
  RLHF_FAIL(
      "--reward: unknown reward '{}'\nhint: math, countdown, format, length, keyword, command, or "
      "a weighted sum like math:1.0,format:0.2",
      name);
}

}  // namespace

std::unique_ptr<RewardFn> make_reward(const std::string& spec, const RewardOptions& options) {
  RLHF_CHECK(!spec.empty(), "--reward is empty");
  if (spec.find(',') == std::string::npos && spec.find(':') == std::string::npos)
    return make_one(spec, options);
  auto sum = std::make_unique<WeightedSum>();
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item(trim(std::string_view(spec).substr(pos, comma - pos)));
    pos = comma + 1;
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    double w = 1.0;
    std::string name = item;
    if (colon != std::string::npos) {
      name = std::string(trim(std::string_view(item).substr(0, colon)));
      auto pw = parse_plain(std::string_view(item).substr(colon + 1));
      RLHF_CHECK(pw.has_value(), "--reward '{}': weight of '{}' is not a number", spec, name);
      w = *pw;
    }
    sum->parts_.emplace_back(w, make_one(name, options));
  }
  RLHF_CHECK(!sum->parts_.empty(), "--reward '{}' names no reward", spec);
  return sum;
}

double overlong_penalty(int64_t length, int64_t max_len, int64_t buffer_len, double factor) {
  RLHF_CHECK(buffer_len >= 0 && buffer_len < max_len,
             "--overlong_buffer_len {} must be in [0, --generate_max_len {})", buffer_len, max_len);
  if (buffer_len == 0) return 0.0;
  const int64_t expected = max_len - buffer_len;
  if (length <= expected) return 0.0;
  if (length <= max_len) return factor * double(expected - length) / double(buffer_len);
  return -factor;
}

std::pair<double, double> score_mean_std(const std::vector<double>& scores) {
  double m = 0;
  for (double v : scores) m = std::max(m, std::fabs(v));
  if (scores.empty() || m == 0) return {0.0, 0.0};
  if (!std::isfinite(m)) m = 1;
  const double n = double(scores.size());
  double mean = 0, var = 0;
  for (double v : scores) mean += (v / m) / n;
  for (double v : scores) var += (v / m - mean) * (v / m - mean) / std::max(n - 1, 1.0);
  return {mean * m, std::sqrt(var) * m};
}

}  // namespace rlhf::rl

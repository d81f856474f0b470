// Rule rewards on real and adversarial strings: GSM8K answers from ../shared/data/gsm8k, \boxed{},
// malformed and huge numbers, empty completions, unicode; Countdown on TinyZero's and d1's data;
// format/length/keyword; weighted sums; the external reward command and its failure modes.
#include "rl/rewards.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "io/jsonl.h"
#include "tests/test_util.h"

using namespace rlhf;
using nlohmann::json;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rlhf::Error& e) {
    return e.what();
  }
  return "";
}
rl::RewardInput input(std::string_view completion, const json* label = nullptr,
                      const json* record = nullptr, int64_t tokens = 0) {
  rl::RewardInput r;
  r.prompt = "p";
  r.completion = completion;
  r.label = label;
  r.record = record;
  r.completion_tokens = tokens;
  return r;
}
}  // namespace

TEST_CASE("math reward on GSM8K's own answers") {
  const std::string dir = test::shared_data_dir();
  if (dir.empty()) {
    MESSAGE("skipped: ../shared/data not found");
    return;
  }
  int checked = 0;
  io::for_each_jsonl(dir + "/gsm8k/test.jsonl", [&](const json& rec, int64_t) {
    const json label = rec["answer"];
    const std::string answer = label.get<std::string>();
    CAPTURE(answer);
    // The reference solution itself scores 1.
    CHECK(rl::math_reward(answer, label) == 1.0);
    // The same text with a different final number scores 0.
    const size_t h = answer.rfind("####");
    const double v = *rl::math_label_value(label);
    const std::string wrong = answer.substr(0, h) + "#### " + std::to_string(int64_t(v) + 7);
    CHECK(rl::math_reward(wrong, label) == 0.0);
    // \boxed{} and a flexible last number work too.
    CHECK(rl::math_reward("so the answer is \\boxed{" + std::to_string(int64_t(v)) + "}", label) ==
          (v == double(int64_t(v)) ? 1.0 : 0.0));
    return ++checked < 200;
  });
  CHECK(checked == 200);
}

TEST_CASE("math reward: number formats and adversarial strings") {
  CHECK(*rl::parse_math_number("1,234") == 1234.0);
  CHECK(*rl::parse_math_number("$18.") == 18.0);
  CHECK(*rl::parse_math_number("-5") == -5.0);
  CHECK(*rl::parse_math_number("2.5e3") == 2500.0);
  CHECK(*rl::parse_math_number("3/4") == 0.75);
  CHECK(*rl::parse_math_number("\\frac{1}{2}") == 0.5);
  CHECK(*rl::parse_math_number("\\dfrac{3}{4}") == 0.75);
  CHECK(*rl::parse_math_number("50%") == 50.0);
  for (const char* bad : {"", "12..3", "1e", "--5", "abc", "1e999", "1/0", "\\frac{1}{0}", "+",
                          "1234567890123456789012345678901234567890123456789012345678901234567890"})
    CHECK_MESSAGE(!rl::parse_math_number(bad).has_value(), bad);
  const json l42 = "42";
  CHECK(rl::math_reward("", l42) == 0.0);
  CHECK(rl::math_reward("no numbers at all", l42) == 0.0);
  CHECK(rl::math_reward("答案是 42。", l42) == 1.0);        // unicode around the number
  CHECK(rl::math_reward("４２", l42) == 0.0);               // full-width digits are not digits
  CHECK(rl::math_reward("first 42 then 7", l42) == 0.0);    // the last number counts
  CHECK(rl::math_reward("#### 42\nthen 7", l42) == 1.0);    // #### wins over the last number
  CHECK(rl::math_reward("\\boxed{42} and 7", l42) == 1.0);  // \boxed{} wins over both
  CHECK(rl::math_reward("#### 1e999", l42) == 0.0);
  CHECK(rl::math_reward(std::string(100000, '9'), l42) == 0.0);  // huge: no crash
  CHECK(rl::math_reward("\\boxed{4", l42) == 0.0);               // unbalanced
  CHECK(rl::math_reward("the answer: -3", json(-3)) == 1.0);
  CHECK(rl::math_reward("it is 0.1 + 0.2 = 0.30000001", json(0.3)) == 1.0);  // 1e-6 rel.
  CHECK(error_of([] { rl::math_reward("1", json("none")); }).find("label") != std::string::npos);
}

TEST_CASE("countdown reward (TinyZero's rule)") {
  const std::vector<int64_t> nums = {3, 5, 7};
  CHECK(rl::countdown_reward("<think>x</think><answer>3*5+7</answer>", 22, nums) == 1.0);
  CHECK(rl::countdown_reward("<answer> (7 + 3) * 5 - 28 </answer>", 22, nums) == 0.1);
  CHECK(rl::countdown_reward("<answer>3*5+7 = 22</answer>", 22, nums) == 1.0);
  CHECK(rl::countdown_reward("<answer>3*5</answer>", 22, nums) == 0.1);      // a number unused
  CHECK(rl::countdown_reward("<answer>3*5+7+7</answer>", 22, nums) == 0.1);  // used twice
  CHECK(rl::countdown_reward("<answer>(7-5)*3</answer>", 22, nums) == 0.1);  // wrong value
  CHECK(rl::countdown_reward("3*5+7", 22, nums) == 0.0);                     // no tags
  CHECK(rl::countdown_reward("<answer>__import__('os')</answer>", 22, nums) == 0.1);
  CHECK(rl::countdown_reward("<answer>7/(5-5)*3</answer>", 22, nums) == 0.1);
  CHECK(rl::countdown_reward("<answer>" + std::string(5000, '(') + "3</answer>", 3, {3}) ==
        0.1);  // nesting limit: no stack overflow
  CHECK(*rl::eval_arithmetic("2+3*4") == 14.0);
  CHECK(*rl::eval_arithmetic("(2+3)*4") == 20.0);
  CHECK(*rl::eval_arithmetic("-3+5") == 2.0);
  CHECK(*rl::eval_arithmetic("96/(74-37)*7") == doctest::Approx(96.0 / 37 * 7));
  CHECK(!rl::eval_arithmetic("8/0").has_value());
  CHECK(!rl::eval_arithmetic("2+").has_value());
  CHECK(!rl::eval_arithmetic("(2").has_value());
}

TEST_CASE("countdown labels from the real datasets") {
  const std::string dir = test::shared_data_dir();
  if (dir.empty()) {
    MESSAGE("skipped: ../shared/data not found");
    return;
  }
  // TinyZero: record {target, nums, ...}; the label may be the record's reward_model or target.
  io::JsonlReader tz(dir + "/countdown/tinyzero_pr93_test.jsonl");
  json rec;
  REQUIRE(tz.next(rec));
  const json target = rec["target"];
  auto [t, n] = rl::countdown_label(&target, &rec);
  CHECK(t == 55.0);
  CHECK(n == std::vector<int64_t>{96, 7, 37, 74});
  const json gt = rec["reward_model"];
  auto [t2, n2] = rl::countdown_label(&gt, &rec);
  CHECK(t2 == 55.0);
  CHECK(n2.size() == 4);
  // d1: {"input": "30,100,93", "output": "23"}.
  io::JsonlReader d1(dir + "/countdown/countdown_cd3_test.jsonl");
  REQUIRE(d1.next(rec));
  const json out = rec["output"];
  auto [t3, n3] = rl::countdown_label(&out, &rec);
  CHECK(t3 == 23.0);
  CHECK(n3 == std::vector<int64_t>{30, 100, 93});
  CHECK(rl::countdown_reward("<answer>100-93+30-... </answer>", t3, n3) == 0.1);
  CHECK(rl::countdown_reward("<answer>30-(100-93)</answer>", t3, n3) == 1.0);
  const json nothing = "x";
  CHECK(error_of([&] { rl::countdown_label(&nothing, nullptr); }).find("countdown") !=
        std::string::npos);
}

TEST_CASE("format, length, keyword and weighted sums") {
  rl::RewardOptions o;
  o.keywords = {"dragon", "Castle"};
  o.length_target = 10;
  auto fmt = rl::make_reward("format", o);
  auto sc =
      fmt->score({input("<think>a\nb</think> <answer>5</answer>"), input("<answer>5</answer>")});
  CHECK(sc == std::vector<double>{1.0, 0.0});
  auto len = rl::make_reward("length", o);
  sc = len->score({input("", nullptr, nullptr, 10), input("", nullptr, nullptr, 15),
                   input("", nullptr, nullptr, 40)});
  CHECK(sc == std::vector<double>{1.0, 0.5, 0.0});
  auto kw = rl::make_reward("keyword", o);
  sc = kw->score({input("The DRAGON flew."), input("a castle and a dragon"), input("")});
  CHECK(sc == std::vector<double>{0.5, 1.0, 0.0});
  const json l = "5";
  auto sum = rl::make_reward("math:1.0, format:0.5", o);
  sc = sum->score({input("<think>x</think><answer>5</answer>", &l), input("5", &l)});
  CHECK(sc[0] == doctest::Approx(1.5));
  CHECK(sc[1] == doctest::Approx(1.0));
  CHECK(error_of([&] { rl::make_reward("maths", o); }).find("unknown reward 'maths'") !=
        std::string::npos);
  CHECK(error_of([&] { rl::make_reward("math:x", o); }).find("weight") != std::string::npos);
  o.format_pattern.assign(1, '(');  // assign: GCC 12 -Wrestrict false positive on operator=
  CHECK(error_of([&] { rl::make_reward("format", o); }).find("regex") != std::string::npos);
}

TEST_CASE("external reward command") {
  const json l = "7";
  std::vector<rl::RewardInput> b = {input("a", &l), input("b\n\"quoted\" \xff", &l),
                                    input("c", &l)};
  // Reads JSON lines, writes one score per line (here: the completion's length via wc).
  auto s =
      rl::run_reward_command("while IFS= read -r line; do echo \"$line\" | wc -c; done", b, 10);
  REQUIRE(s.size() == 3);
  CHECK(s[0] > 0);
  CHECK(rl::run_reward_command("cat > /dev/null; printf '1\\n0.5\\n-2\\n'", b, 10) ==
        std::vector<double>{1.0, 0.5, -2.0});
  CHECK(error_of([&] {
          rl::run_reward_command("cat > /dev/null; exit 3", b, 10);
        }).find("exit status 3") != std::string::npos);
  CHECK(error_of([&] {
          rl::run_reward_command("cat > /dev/null; echo abc", b, 10);
        }).find("not a number: 'abc'") != std::string::npos);
  CHECK(error_of([&] {
          rl::run_reward_command("cat > /dev/null; echo 1", b, 10);
        }).find("wrote 1 scores for 3 samples") != std::string::npos);
  CHECK(error_of([&] { rl::run_reward_command("sleep 5", b, 0.3); }).find("timed out") !=
        std::string::npos);
  CHECK(error_of([&] {
          rl::run_reward_command("no-such-program-xyz", b, 10);
        }).find("exit status 127") != std::string::npos);
}

// --- the reward command under adversarial programs ---------------------------------------------

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A fresh directory for the pid files the scripts write.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "rlhf_reward_XXXXXX").string();
    REQUIRE(mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const char* name) const { return (path / name).string(); }
};

pid_t read_pid(const std::string& file) {
  std::ifstream f(file);
  long pid = 0;
  f >> pid;
  return static_cast<pid_t>(pid);
}

// State letter of /proc/<pid>/stat ('R', 'S', 'Z', ...), or 0 when there is no such process.
char proc_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  return close == std::string::npos || close + 2 >= s.size() ? 0 : s[close + 2];
}

// True once `pid` no longer runs (gone, or a zombie awaiting a reaper that is not us), polling up
// to `wait_s` (SIGKILL is delivered asynchronously).
bool process_gone(pid_t pid, double wait_s = 2.0) {
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    const bool gone = (::kill(pid, 0) != 0 && errno == ESRCH) || proc_state(pid) == 'Z';
    if (gone || seconds_since(t0) > wait_s) return gone;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Our own zombie children (what a missing waitpid leaves behind).
int zombie_children() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "stat");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = s.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    std::istringstream rest(s.substr(close + 1));
    rest >> state >> ppid;
    n += state == 'Z' && ppid == long(::getpid());
  }
  return n;
}

long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// `n` samples whose completions are `bytes` long: more than a pipe holds when n * bytes is large.
struct BigBatch {
  json label = "7";
  std::string text;
  std::vector<rl::RewardInput> batch;
  BigBatch(size_t n, size_t bytes) : text(bytes, 'x') {
    for (size_t i = 0; i < n; ++i) batch.push_back(input(text, &label));
  }
  BigBatch(const BigBatch&) = delete;  // batch points into label and text
};

}  // namespace

TEST_CASE("external reward command: one deadline covers input, output and exit") {
  const int zombies_before = zombie_children();  // (other suites' children)
  const json l = "7";
  const std::vector<rl::RewardInput> b = {input("a", &l), input("b", &l), input("c", &l)};
  TempDir tmp;

  SUBCASE("closes its stdout and keeps running") {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of([&] { rl::run_reward_command("exec >&-; sleep 30", b, 1); });
    CAPTURE(e);
    CHECK(seconds_since(t0) < 3.0);
    CHECK(e.find("timed out after 1s (--reward_command_timeout)") != std::string::npos);
    CHECK(e.find("after it closed its stdout") != std::string::npos);
  }
  SUBCASE("never reads its stdin while the input is larger than a pipe") {
    BigBatch big(40, 64 << 10);  // 2.6 MB of JSON lines
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of([&] { rl::run_reward_command("sleep 30", big.batch, 1); });
    CAPTURE(e);
    CHECK(seconds_since(t0) < 3.0);
    CHECK(e.find("timed out after 1s") != std::string::npos);
    CHECK(e.find("while writing its input") != std::string::npos);
  }
  SUBCASE("its children are killed with it (the process group)") {
    const std::string cmd = fmt::format("echo $$ > {}; sleep 100 & echo $! > {}; sleep 100",
                                        tmp.file("leader"), tmp.file("grandchild"));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of([&] { rl::run_reward_command(cmd, b, 1); });
    CAPTURE(e);
    CHECK(seconds_since(t0) < 3.0);
    CHECK(e.find("timed out after 1s") != std::string::npos);
    const pid_t leader = read_pid(tmp.file("leader")),
                grandchild = read_pid(tmp.file("grandchild"));
    REQUIRE(leader > 0);
    REQUIRE(grandchild > 0);
    CHECK((::kill(leader, 0) != 0 && errno == ESRCH));  // reaped, not a zombie
    CHECK(process_gone(grandchild));
  }
  SUBCASE("it exits but a process it started holds its stdout open") {
    const std::string cmd = fmt::format(
        "cat > /dev/null; sleep 100 & echo $! > {}; printf '1\\n2\\n3\\n'", tmp.file("grandchild"));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of([&] { rl::run_reward_command(cmd, b, 1); });
    CAPTURE(e);
    CHECK(seconds_since(t0) < 3.0);
    CHECK(e.find("timed out after 1s") != std::string::npos);
    CHECK(e.find("still holds its stdout open (3 of 3 scores read)") != std::string::npos);
    const pid_t grandchild = read_pid(tmp.file("grandchild"));
    REQUIRE(grandchild > 0);
    CHECK(process_gone(grandchild));
  }
  SUBCASE("slow answers within the deadline") {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(rl::run_reward_command("while IFS= read -r l; do sleep 0.2; echo 1; done", b, 5) ==
          std::vector<double>{1, 1, 1});
    CHECK(rl::run_reward_command("cat > /dev/null; sleep 0.5; printf '1\\n0.5\\n-2\\n'", b, 3) ==
          std::vector<double>{1.0, 0.5, -2.0});
    CHECK(seconds_since(t0) > 1.0);
  }
  SUBCASE("input and output interleave: no deadlock when both exceed a pipe") {
    // sed answers as it reads: 100k lines in (4.5 MB), 100k out (500 kB). Written first and read
    // after, both sides would block on a full pipe.
    BigBatch big(100000, 1);
    auto s = rl::run_reward_command("sed 's/.*/0.25/'", big.batch, 30);
    REQUIRE(s.size() == 100000);
    CHECK(std::all_of(s.begin(), s.end(), [](double v) { return v == 0.25; }));
    // Echoing 2.6 MB of input back: the exchange completes, and the output is rejected.
    BigBatch wide(40, 64 << 10);
    const std::string e = error_of([&] { rl::run_reward_command("cat", wide.batch, 30); });
    CHECK(e.find("line 1 is not a number: '{\"completion\":\"xxx") != std::string::npos);
  }
  SUBCASE("exits without reading its input: SIGPIPE does not kill us") {
    BigBatch huge(3, 1 << 20);
    struct sigaction before {
    }, after{};
    sigaction(SIGPIPE, nullptr, &before);
    CHECK(rl::run_reward_command("echo 1; echo 2; echo 3", huge.batch, 10) ==
          std::vector<double>{1, 2, 3});
    sigaction(SIGPIPE, nullptr, &after);
    const bool unchanged = before.sa_handler == after.sa_handler;
    CHECK(unchanged);  // no process-wide change
  }
  SUBCASE("an empty batch") {
    CHECK(rl::run_reward_command("cat > /dev/null", {}, 5).empty());
  }
  CHECK(zombie_children() <= zombies_before);
}

TEST_CASE("external reward command: output bounds") {
  const int zombies_before = zombie_children();  // (other suites' children)
  const json l = "7";
  const std::vector<rl::RewardInput> b = {input("a", &l), input("b", &l), input("c", &l)};

  SUBCASE("a flood on stdout stops at the bound of a batch, in bounded memory") {
    const long rss0 = max_rss_kib();
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of([&] { rl::run_reward_command("yes", b, 60); });
    CAPTURE(e);
    CHECK(seconds_since(t0) < 20.0);
    CHECK(e.find("--reward_command 'yes' wrote more than 64 MiB on stdout for 3 samples") !=
          std::string::npos);
    CHECK(e.find("hint:") != std::string::npos);
    CHECK(max_rss_kib() - rss0 < 32 * 1024);  // the output is parsed as it comes, not kept
  }
  SUBCASE("one endless line stops at the bound of a line") {
    const auto t0 = std::chrono::steady_clock::now();
    std::string e = error_of([&] {
      rl::run_reward_command("cat > /dev/null; printf '1\\n'; yes 2 | tr -d '\\n'", b, 60);
    });
    CAPTURE(e);
    CHECK(seconds_since(t0) < 20.0);
    CHECK(e.find("line 2 of its output is longer than 1 MiB (the bound of one line)") !=
          std::string::npos);
  }
  SUBCASE("a flood on stderr is drained (no deadlock) and quoted") {
    const long rss0 = max_rss_kib();
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e =
        error_of([&] { rl::run_reward_command("cat > /dev/null; yes noise >&2", b, 1); });
    CAPTURE(e.substr(0, 300));
    CHECK(seconds_since(t0) < 3.0);
    CHECK(e.find("timed out after 1s") != std::string::npos);
    CHECK(e.find("stderr: '...") != std::string::npos);  // its last 600 bytes, on one line
    CHECK(e.find("noise | noise") != std::string::npos);
    CHECK(max_rss_kib() - rss0 < 32 * 1024);
  }
  CHECK(zombie_children() <= zombies_before);
}

TEST_CASE("external reward command: exit status, scores, no zombies") {
  const int zombies_before = zombie_children();  // (other suites' children)
  const json l = "7";
  const std::vector<rl::RewardInput> b = {input("a", &l), input("b", &l), input("c", &l)};
  TempDir tmp;

  // A non-zero exit quotes stderr, else stdout.
  std::string e = error_of([&] {
    rl::run_reward_command("cat > /dev/null; echo 'boom: bad label' >&2; echo 1; exit 3", b, 10);
  });
  CHECK(e.find("failed (exit status 3); stderr: 'boom: bad label'") != std::string::npos);
  e = error_of([&] { rl::run_reward_command("cat > /dev/null; echo 'on stdout'; exit 4", b, 10); });
  CHECK(e.find("failed (exit status 4); stdout: 'on stdout'") != std::string::npos);
  e = error_of([&] { rl::run_reward_command("cat > /dev/null; kill -9 $$", b, 10); });
  CHECK(e.find("failed (killed by signal 9)") != std::string::npos);

  // Non-finite numbers are errors naming the line.
  for (const char* bad : {"nan", "inf", "-inf", "infinity", "1e999", "-1e999"}) {
    CAPTURE(bad);
    e = error_of([&] {
      rl::run_reward_command(fmt::format("cat > /dev/null; printf '1\\n{}\\n2\\n'", bad), b, 10);
    });
    CHECK(e.find(fmt::format("line 2 is not a finite number: '{}'", bad)) != std::string::npos);
  }
  // A score is one number alone on its line.
  for (const char* bad : {"1 2", "1,5", "0x10", "+-1", "--1", "1e", "."}) {
    CAPTURE(bad);
    e = error_of([&] {
      rl::run_reward_command(fmt::format("cat > /dev/null; printf '1\\n{}\\n2\\n'", bad), b, 10);
    });
    CHECK(e.find(fmt::format("line 2 is not a number: '{}'", bad)) != std::string::npos);
  }
  // Blank lines, CRLF, '+', exponents, a last line without '\n'.
  CHECK(rl::run_reward_command("cat > /dev/null; printf '+1\\r\\n\\n 2.5e-1 \\n-3.'", b, 10) ==
        std::vector<double>{1.0, 0.25, -3.0});
  CHECK(rl::run_reward_command("cat > /dev/null; printf '1\\n1e-999\\n.5\\n'", b, 10) ==
        std::vector<double>{1.0, 0.0, 0.5});

  // Every path reaps the command: success, exit status, bad line, count, timeout, bounds.
  const std::string pidfile = tmp.file("leader");
  for (const std::string body :
       {"cat > /dev/null; printf '1\\n2\\n3\\n'", "cat > /dev/null; exit 3",
        "cat > /dev/null; echo abc", "cat > /dev/null; echo 1", "sleep 30", "yes",
        "cat > /dev/null; yes | tr -d '\\n'"}) {
    CAPTURE(body);
    std::filesystem::remove(pidfile);
    error_of([&] { rl::run_reward_command(fmt::format("echo $$ > {}; {}", pidfile, body), b, 1); });
    const pid_t leader = read_pid(pidfile);
    REQUIRE(leader > 0);
    CHECK((::kill(leader, 0) != 0 && errno == ESRCH));
  }
  CHECK(zombie_children() <= zombies_before);
}

TEST_CASE("rewards: score mean and std stay finite for scores near the double range") {
  using rlhf::rl::score_mean_std;
  // Closed form: {1, 2, 3, 4} has mean 2.5 and unbiased std sqrt(5/3).
  auto [m, s] = score_mean_std({1, 2, 3, 4});
  CHECK(m == doctest::Approx(2.5).epsilon(1e-12));
  CHECK(s == doctest::Approx(std::sqrt(5.0 / 3.0)).epsilon(1e-12));
  // ±1e308: the naive sum of squares overflows to inf (a JSON null); scaled it is 1e308·sqrt(4/3).
  std::tie(m, s) = score_mean_std({1e308, -1e308, 1e308, -1e308});
  CHECK(m == 0.0);
  CHECK(std::isfinite(s));
  CHECK(s == doctest::Approx(1e308 * std::sqrt(4.0 / 3.0)).epsilon(1e-12));
  std::tie(m, s) = score_mean_std({});
  CHECK((m == 0.0 && s == 0.0));
  std::tie(m, s) = score_mean_std({7});
  CHECK((m == 7.0 && s == 0.0));
  // A non-finite score stays visible.
  std::tie(m, s) = score_mean_std({1, std::numeric_limits<double>::infinity()});
  CHECK_FALSE(std::isfinite(m));
}

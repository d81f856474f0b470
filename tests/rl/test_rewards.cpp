// Rule rewards on real and adversarial strings: GSM8K answers from ../shared/data/gsm8k, \boxed{},
// malformed and huge numbers, empty completions, unicode; Countdown on TinyZero's and d1's data;
// format/length/keyword; weighted sums; the external reward command and its failure modes.
#include "rl/rewards.h"

#include <fstream>

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
  o.format_pattern = "(";
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

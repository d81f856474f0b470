#include "rl/rewards.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <regex>

#include "core/error.h"
#include "core/strings.h"
#include "io/text_util.h"

namespace rlhf::rl {

namespace {

using io::trim_whitespace;

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
  s = trim_whitespace(s);
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
    std::string_view rest = trim_whitespace(c.substr(h + 4));
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
  std::string_view eq = trim_whitespace(completion.substr(open + 8, close - open - 8));
  // TinyZero's answers may be "expr = target": keep the left side.
  if (const size_t e = eq.find('='); e != std::string_view::npos)
    eq = trim_whitespace(eq.substr(0, e));
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

class KeywordReward final : public RewardFn {
 public:
  explicit KeywordReward(std::vector<std::string> kw) : kw_(std::move(kw)) {
    RLHF_CHECK(!kw_.empty(), "the keyword reward needs --reward_keywords");
    for (auto& k : kw_) k = to_lower_ascii(k);
  }
  std::string name() const override { return "keyword"; }
  std::vector<double> score(const std::vector<RewardInput>& b) override {
    std::vector<double> s;
    for (const RewardInput& r : b) {
      const std::string c = to_lower_ascii(r.completion);
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
    const std::string item(trim_whitespace(std::string_view(spec).substr(pos, comma - pos)));
    pos = comma + 1;
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    double w = 1.0;
    std::string name = item;
    if (colon != std::string::npos) {
      name = std::string(trim_whitespace(std::string_view(item).substr(0, colon)));
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

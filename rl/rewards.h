// Rule rewards and the external reward command (`--reward`, `--reward_command`).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rlhf::rl {

/// What a reward function sees of one sample.
struct RewardInput {
  std::string_view prompt;                 ///< prompt text (as given to the model)
  std::string_view completion;             ///< generated text (without the prompt)
  const nlohmann::json* label = nullptr;   ///< value of --label_key in the prompt record, or null
  const nlohmann::json* record = nullptr;  ///< the whole prompt record, or null
  int64_t completion_tokens = 0;
  bool stopped = false;  ///< ended with EOS (not cut by --generate_max_len)
};

/// Options of the built-in rewards.
struct RewardOptions {
  std::string format_pattern = R"(<think>[\s\S]*</think>\s*<answer>[\s\S]*</answer>)";
  std::vector<std::string> keywords;  ///< keyword: the fraction of these present (case-insensitive)
  int64_t length_target = 64;         ///< length: 1 − min(1, |tokens − target| / target)
  std::string command;                ///< --reward_command (see ExternalReward)
  double command_timeout_s = 60;
};

/// A scalar reward per sample.
class RewardFn {
 public:
  virtual ~RewardFn() = default;
  virtual std::string name() const = 0;
  /// Scores a batch; the result has one finite value per input. Throws rlhf::Error when the reward
  /// cannot be computed (an external command failed, a label is missing where required).
  virtual std::vector<double> score(const std::vector<RewardInput>& batch) = 0;
};

/// Builds the reward from `spec`: one of math, countdown, format, length, keyword, command, or a
/// weighted sum "math:1.0,format:0.2" (a bare name has weight 1). "command" runs
/// options.command. Throws rlhf::Error naming --reward for an unknown name or bad weight.
std::unique_ptr<RewardFn> make_reward(const std::string& spec, const RewardOptions& options);

/// DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the score of a response of
/// `length` tokens with L_max = max_len (--generate_max_len), L_c = buffer_len
/// (--overlong_buffer_len), f = factor (--overlong_penalty_factor):
///   0 if length <= L_max − L_c;  f·((L_max − L_c) − length)/L_c if L_max − L_c < length <= L_max;
///   −f beyond. buffer_len 0 gives 0. Throws rlhf::Error unless 0 <= buffer_len < max_len.
double overlong_penalty(int64_t length, int64_t max_len, int64_t buffer_len, double factor);

// --- the pieces, exposed for tests ---------------------------------------------------------------

/// Parses a number as written in math answers: optional sign, digits with thousands commas,
/// decimals, scientific notation, a leading '$' or trailing '%' / '.', a fraction a/b or
/// \frac{a}{b} (\dfrac, \tfrac). nullopt when it is not a number, longer than 64 characters, or
/// not finite.
std::optional<double> parse_math_number(std::string_view s);

/// The final answer of a completion: the content of the last \boxed{...}, else the number after
/// the last "####", else (flexible) the last number in the text. nullopt if there is none.
std::optional<double> extract_math_answer(std::string_view completion);

/// The reference of a label: a number, or a GSM8K answer text (the number after "####"), or a
/// string holding \boxed{...} or a bare number.
std::optional<double> math_label_value(const nlohmann::json& label);

/// math: 1 when the completion's final answer equals the label within 1e-6·max(1, |label|).
double math_reward(std::string_view completion, const nlohmann::json& label);

/// Countdown (TinyZero's rule): the last <answer>...</answer> must hold an arithmetic expression
/// (digits, + − × ÷, parentheses) that uses every given number exactly once and evaluates to the
/// target (within 1e-5): 1.0; an <answer> that fails: 0.1 (format credit); no <answer>: 0.
/// Returns nullopt when the label does not give the target and numbers.
double countdown_reward(std::string_view completion, double target,
                        const std::vector<int64_t>& nums);

/// Target and numbers from a countdown label: {"target": t, "nums"|"numbers": [...]} (also under
/// "ground_truth"), or a target number/string with the numbers from record["nums"|"numbers"] or a
/// comma list in record["input"]. Throws rlhf::Error when neither is found.
std::pair<double, std::vector<int64_t>> countdown_label(const nlohmann::json* label,
                                                        const nlohmann::json* record);

/// Evaluates + − * / and parentheses over integers/decimals exactly as written (left to right,
/// usual precedence, unary minus); nullopt on a syntax error or division by zero.
std::optional<double> eval_arithmetic(std::string_view expr);

/// Bounds of the output of the reward command: one line, and the whole stdout of one batch.
inline constexpr size_t kRewardCommandMaxLineBytes = size_t(1) << 20;     // 1 MiB
inline constexpr size_t kRewardCommandMaxOutputBytes = size_t(64) << 20;  // 64 MiB

/// A program (`/bin/sh -c command`) that reads one JSON object per line on stdin ({"prompt",
/// "completion", "label"}) and writes one finite number per line on stdout (blank lines are
/// skipped). One process per batch, in a process group of its own. One deadline of `timeout_s`
/// covers writing the input, reading the output and the exit; at the deadline, or when stdout
/// passes a line of kRewardCommandMaxLineBytes or kRewardCommandMaxOutputBytes in all, the whole
/// group gets SIGTERM, then SIGKILL, and is reaped. Each of these, a non-zero exit (quoting the end
/// of its stderr, else of its stdout), a line that is not a finite number, or a count other than
/// batch.size() is an rlhf::Error naming the command.
std::vector<double> run_reward_command(const std::string& command,
                                       const std::vector<RewardInput>& batch, double timeout_s);

/// Mean and unbiased standard deviation of `scores` (the step's reward_mean and reward_std),
/// computed on the scores divided by their largest magnitude, so that scores near ±1e308 do not
/// overflow the squares (an infinite std would be a JSON null in metrics.jsonl). Empty: {0, 0};
/// one score: std 0. A non-finite score makes the result non-finite (it must stay visible).
std::pair<double, double> score_mean_std(const std::vector<double>& scores);

}  // namespace rlhf::rl

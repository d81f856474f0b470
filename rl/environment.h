// Environments of multi-turn rollouts (`--env_command`): at the end of each model turn (EOS or a
// stop string) the environment reads the episode so far and answers with an observation to
// append, whether the episode is done, and optionally a reward. An external program speaks the
// JSON-lines protocol of docs/environments.md; `builtin:toy` is a deterministic one
// in the binary, for tests.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlhf::rl {

/// One turn end, as the environment sees it (one line of the protocol).
struct EnvQuery {
  std::string id;        ///< the episode: "<prompt index>-<sample index>"
  int64_t turn = 0;      ///< 0-based index of the turn that ended
  std::string prompt;    ///< the prompt text
  std::string text;      ///< the completion so far (every turn and observation), decoded
  std::string action;    ///< the text of the turn that just ended (the model's, decoded)
  nlohmann::json label;  ///< the prompt's --label_key value, or null
  bool eos = false;      ///< the turn ended with EOS: the episode ends whatever the answer
};

/// The environment's answer to one query.
struct EnvAnswer {
  std::string observation;       ///< text to append (tokenized, masked out of the loss)
  bool done = false;             ///< the episode is over
  std::optional<double> reward;  ///< the episode's reward, if given (the last one given counts)
};

/// A multi-turn environment. Not thread-safe.
class Environment {
 public:
  virtual ~Environment() = default;
  /// "builtin:toy" or the command line, for messages.
  virtual std::string name() const = 0;
  /// Answers a batch of turn ends, one answer per query, in order. Throws rlhf::Error when it
  /// cannot (the program crashed, timed out, or wrote something that is not an answer).
  virtual std::vector<EnvAnswer> step(const std::vector<EnvQuery>& queries) = 0;
};

/// Bounds of an environment program's output: one answer line, and one batch's answers.
inline constexpr size_t kEnvMaxLineBytes = size_t(1) << 20;     // 1 MiB
inline constexpr size_t kEnvMaxOutputBytes = size_t(64) << 20;  // 64 MiB

/// The environment of `spec` (--env_command): "builtin:toy" (ToyEnvironment), else a program run
/// by `/bin/sh -c spec`, started now and kept for the run (CommandEnvironment) with a deadline of
/// timeout_s per batch of turn ends (--env_timeout). tp_rank: this rank's place in its
/// tensor-parallel engine; on a rank other than 0 nothing is started and the result is a stand-in
/// whose step() throws (generate_episodes never calls it there: TP rank 0 asks the environment and
/// sends its answers to the other ranks). Throws rlhf::Error for an empty spec, an unknown builtin
/// name (on every rank) or a program that cannot start.
std::unique_ptr<Environment> make_environment(const std::string& spec, double timeout_s,
                                              int tp_rank = 0);

/// The protocol's request line of a query (JSON, no newline): {"id", "turn", "prompt", "text",
/// "action", "label", "eos"}; invalid UTF-8 in the texts becomes U+FFFD.
std::string env_query_line(const EnvQuery& q);

/// Parses one answer line: a JSON object with optional "observation" (string, default ""),
/// "done" (bool, default false), "reward" (finite number or null) and "id" (if given, it must be
/// `expected_id`, the request's: answers come in request order); other keys are ignored. Throws
/// rlhf::Error naming `program` and the 1-based query number `line_no` (and quoting the line) for
/// anything else.
EnvAnswer parse_env_answer(std::string_view line, const std::string& program, int64_t line_no,
                           const std::string& expected_id = "");

/// builtin:toy — a deterministic plumbing environment (no program, no state). At the end of turn
/// k of episode "<p>-<s>" (p = prompt index, s = sample index) it answers:
///   observation "<d>" with d = (p + s + k) mod 10 (a digit in angle brackets);
///   reward (k + 1) / 4 — the share of the 4 turns the episode may take that it completed;
///   done when k + 1 = 4 (EOS ends the episode in any case).
/// So the model earns reward by ending turns (with a stop string or EOS) quickly and often within
/// its length budget: a dense signal a tiny model learns in tens of steps. It does not check what
/// the model wrote; examples/env/calculator.py is the real-task example.
class ToyEnvironment : public Environment {
 public:
  /// Turns an episode may take (the reward's denominator).
  static constexpr int64_t kTurns = 4;
  std::string name() const override { return "builtin:toy"; }
  /// Throws rlhf::Error for an id that is not "<int>-<int>".
  std::vector<EnvAnswer> step(const std::vector<EnvQuery>& queries) override;
};

}  // namespace rlhf::rl

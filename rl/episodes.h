// Generation of whole episodes: one engine call that, with an environment (--env_command), runs
// multi-turn episodes — the turn hooks that end a turn at a stop string (--stop_strings), ask the
// environment, tokenize its observation — and turns the engine's results into Samples. Training
// steps, `rlhf generate` and `rlhf eval` all generate through it, so they run the same loop.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "rl/environment.h"
#include "rollout/engine.h"
#include "rollout/samples.h"

namespace rlhf::rl {

/// Multi-turn settings (--env_command, --env_max_turns, --stop_strings).
struct EpisodeOptions {
  /// null: single-turn (stop strings alone still end samples). With a tensor-parallel engine
  /// only TP rank 0's is asked; the other ranks' must be non-null too (make_environment's
  /// stand-in for tp_rank > 0) and take rank 0's answers (rl/env_share.h).
  Environment* env = nullptr;
  std::vector<std::string> stop_strings;  ///< a turn (or, without env, the sample) ends at one
  int64_t max_turns = 1;                  ///< --env_max_turns: model turns per episode (>= 1)
  /// Whether any of this is on: otherwise generation is the plain single-turn engine call.
  bool multi_turn() const { return env != nullptr || !stop_strings.empty(); }
};

/// What the environment cost on this rank during one generate_episodes call.
struct EpisodeStats {
  /// Wall time inside Environment::step and its tokenization (a tensor-parallel engine: on TP
  /// rank 0 with the broadcast of its answers, on the other ranks the wait for them)
  double env_s = 0;
  int64_t env_calls = 0;  ///< turn ends answered
};

/// The context of one request the environment sees (its prompt text and label).
struct EpisodeContext {
  const std::string* prompt_text = nullptr;
  const nlohmann::json* label = nullptr;  ///< null: no label
};

/// Parses --stop_strings: a comma-separated list where "\," is a comma, "\n" a newline, "\t" a
/// tab and "\\" a backslash; empty items are dropped. Throws rlhf::Error naming the flag for
/// another escape or a trailing backslash.
std::vector<std::string> parse_stop_strings(const std::string& spec);

/// Generates every sample of `requests` on `engine` (GenerationRequest::id is the episode's
/// prompt id, "<id>-<sample>" for the environment) and returns them as Samples with prompt_pos =
/// pos_offset + request_index, the action mask, turns, finish reason and the environment's last
/// reward (Sample::has_env_reward). contexts: one per request (prompt text, label), used only with
/// an environment. Samples are returned on every rank of a tensor-parallel engine (collective
/// over its group): after each engine step in which turns ended, TP rank 0 asks the environment
/// and broadcasts the tokenized observations, done flags and rewards — or the environment's error,
/// which every rank then throws — on the engine's TP communicator, so every rank feeds the same
/// observation tokens at the same step. Throws what the engine and the environment throw;
/// rlhf::Error when contexts has another size.
std::vector<rollout::Sample> generate_episodes(
    rollout::Engine& engine, const std::vector<rollout::GenerationRequest>& requests,
    const std::vector<EpisodeContext>& contexts, int64_t pos_offset, const io::Tokenizer& tokenizer,
    const EpisodeOptions& options, const rollout::ProgressFn& progress = {},
    EpisodeStats* stats = nullptr);

}  // namespace rlhf::rl

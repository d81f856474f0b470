// Why a generated sample stopped (the engine's result, a sample's record, `finish_reason` in the
// output of `rlhf generate`).
#pragma once

namespace rlhf::rollout {

/// Why a sample stopped.
enum class FinishReason { kStop, kLength, kStopString, kEnvDone, kMaxTurns };

/// "stop" (EOS sampled) | "length" (max_new_tokens or the position limit reached) |
/// "stop_string" (a stop string ended it, no environment) | "env_done" (the environment ended the
/// episode) | "max_turns" (TurnHooks::max_turns turns were taken).
const char* to_string(FinishReason r);

/// True when the sample ended on its own — EOS, a stop string, or the environment's done — and
/// was not cut by a length or turn limit.
inline bool ended_naturally(FinishReason r) {
  return r == FinishReason::kStop || r == FinishReason::kStopString || r == FinishReason::kEnvDone;
}

}  // namespace rlhf::rollout

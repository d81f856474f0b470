// The environment of a tensor-parallel engine (--env_command with --vllm_tensor_parallel_size > 1):
// only the engine's TP rank 0 runs the environment; after each engine step in which turns ended it
// sends the other ranks of the group its answers — observation tokens, done flags, rewards — or the
// environment's error, so that every rank appends the same observation tokens at the same step and
// the group stays in lock step (rl/episodes.cpp uses this).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rlhf::rl {

/// The environment's answer to one turn end, tokenized.
struct TurnAnswer {
  std::vector<int32_t> observation;  ///< tokens to append (empty: none)
  bool done = false;                 ///< the episode is over
  std::optional<double> reward;      ///< the reward it gave, if any
};

/// One engine step's turn ends and their answers, as TP rank 0 sends them.
struct SharedTurnAnswers {
  /// Non-empty: asking the environment failed on rank 0 with this message (answers then empty).
  std::string error;
  /// Per turn end, 3 entries: request index, sample index, response length — what the ranks
  /// check they agree on before taking the answers.
  std::vector<int64_t> keys;
  std::vector<TurnAnswer> answers;  ///< one per turn end (keys.size() / 3), unless error
};

/// The bytes share_turn_answers sends (little-endian host layout; the ranks of one engine share
/// a node).
std::vector<uint8_t> encode_turn_answers(const SharedTurnAnswers& a);
/// Inverse of encode_turn_answers. Throws rlhf::Error when the bytes are cut short or have bytes
/// left over.
SharedTurnAnswers decode_turn_answers(const std::vector<uint8_t>& bytes);

/// Collective over `comm` (the engine's TP group, e.g. parallel::Comm::mpi_comm()): rank 0's `a`
/// is copied into every other rank's (two MPI_Ibcast, its size then its bytes). A waiting rank
/// polls with short sleeps (it waits idle while rank 0's environment works) inside a
/// parallel::WatchScope that names comm_name, so --comm_timeout's watchdog ends a job whose rank 0
/// never answers. Throws rlhf::Error when an MPI call fails or the message reaches 2 GiB.
void share_turn_answers(MPI_Comm comm, const std::string& comm_name, SharedTurnAnswers& a);

}  // namespace rlhf::rl

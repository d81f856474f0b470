// Samples and experience of one RL step: what the engines generated, gathered to every rank in a
// canonical order, and what the trainers derive from it (old/ref log-probs, values, advantages).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

namespace rlhf::rollout {

/// One generated sample.
struct Sample {
  int64_t prompt_pos = 0;    ///< global position of its prompt in the step (0..rollout_batch−1)
  int64_t sample_index = 0;  ///< 0..n_samples_per_prompt−1
  std::vector<int32_t> prompt;      ///< prompt token ids (BOS included)
  std::vector<int32_t> response;    ///< generated ids (ends with EOS when stopped)
  std::vector<float> gen_logprobs;  ///< the engine's sampling log-probs, one per response token
  bool stopped = false;             ///< ended with EOS
};

/// Bytes of a sample list (for MPI); deserialize(serialize(x)) == x.
std::vector<uint8_t> serialize_samples(const std::vector<Sample>& samples);
/// Throws rlhf::Error on a malformed buffer.
std::vector<Sample> deserialize_samples(const uint8_t* data, size_t size);

/// Gathers every rank's samples to every rank of `comm` (MPI_Allgatherv of the serialized bytes)
/// and sorts them by (prompt_pos, sample_index): the result does not depend on which engine made
/// which sample. Collective.
std::vector<Sample> allgather_samples(const std::vector<Sample>& local, MPI_Comm comm);

/// Per-sample and per-token training data of one RL step, in the canonical sample order.
/// Per-token arrays are (B, Tr) row-major with Tr = the longest response; entries past a
/// sample's response are 0.
struct Experience {
  int64_t B = 0, Tr = 0;
  std::vector<const Sample*> samples;
  std::vector<int32_t> resp_len;  ///< (B)
  std::vector<double> score;      ///< (B) reward per sample (after normalisation if asked)
  std::vector<float> lp_old, lp_ref, values, kl, advantages, returns;  ///< (B, Tr)
  int64_t response_tokens() const;
};

}  // namespace rlhf::rollout

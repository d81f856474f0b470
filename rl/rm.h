// `rlhf rm`: reward-model training on preference pairs with the Bradley–Terry loss (Ouyang et al.
// 2022, eq. 1), on the shared trainer skeleton (rl/supervised.h):
//   loss = −(1 / TB) · Σ_pairs log σ(r_chosen − r_rejected),
// the reward read at the last token (EOS) of each sequence by a scalar head (`score.weight`) on the
// model's final norm. The step also reports acc (share of pairs with r_chosen > r_rejected) and
// reward_margin (mean of r_chosen − r_rejected).
#pragma once

#include <string>

#include "io/preference_dataset.h"
#include "parallel/runtime.h"
#include "parallel/train_model.h"
#include "rl/supervised.h"

namespace rlhf::rl {

/// Everything a reward-model run needs, as plain values (app/cmd_rm.cpp maps the flags).
struct RmConfig {
  parallel::RuntimeOptions runtime;  ///< placement, threads, device, communicator
  parallel::ZeroOptions zero;        ///< --zero_stage, --adam_offload, ...
  /// The model: random init from model_config, or pretrain (an LM trunk gets a new score head).
  std::string model_config, pretrain, tokenizer;  ///< --model_config, --pretrain, --tokenizer
  std::string dataset;                            ///< --dataset: JSONL of preference pairs
  io::PreferenceDatasetOptions data;  ///< --chosen_key, --rejected_key, --prompt_key, --max_len
  SupervisedOptions train;            ///< batches, epochs, AdamW, schedule (train.name = "rm")
};

/// Runs reward-model training on every rank of MPI_COMM_WORLD (collective), with the byte
/// tokenizer; saves <save_path>/model.h5 (head `reward`, what --reward_pretrain takes). Returns 0.
/// Throws rlhf::Error naming the flag, file or line at fault.
int run_rm(const RmConfig& config);

}  // namespace rlhf::rl

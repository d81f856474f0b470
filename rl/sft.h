// `rlhf sft`: supervised fine-tuning / pre-training with next-token cross-entropy, on the shared
// trainer skeleton (rl/supervised.h). The loss of an optimizer step is the token mean of the
// cross-entropy over every loss token of the whole step (docs/algorithms.md "agg"):
//   loss = −(1 / N_loss) · Σ log p(target),  N_loss = loss tokens of the step over every rank,
// so the gradient does not depend on how the batch splits into micro-batches or ranks (N ranks
// train exactly like 1).
#pragma once

#include <string>

#include "io/sft_dataset.h"
#include "parallel/runtime.h"
#include "parallel/train_model.h"
#include "rl/supervised.h"

namespace rlhf::rl {

/// Everything an SFT run needs, as plain values (app/cmd_sft.cpp maps the flags).
struct SftConfig {
  parallel::RuntimeOptions runtime;  ///< placement, threads, device, communicator
  parallel::ZeroOptions zero;        ///< --zero_stage, --adam_offload, ...
  /// The model: random init from model_config, or pretrain (any format); tokenizer overrides.
  std::string model_config, pretrain, tokenizer;  ///< --model_config, --pretrain, --tokenizer
  /// --dataset: JSONL/JSON (prompt + response) or plain text, or a builtin:<task> spec, which is
  /// first written to <save_path>/data.
  std::string dataset;
  io::SftDatasetOptions data;  ///< --input_key, --output_key, --max_len, --truncation, ...
  SupervisedOptions train;     ///< batches, epochs, AdamW, schedule, saves (train.name = "sft")
};

/// Runs SFT on every rank of MPI_COMM_WORLD (collective): the model (saved with its tokenizer),
/// the data, plan_batches, train_supervised, and the final model <save_path>/model.h5. Returns 0,
/// or parallel::kExitPreempted when SIGTERM/SIGUSR1 stopped it after a step and its checkpoint.
/// Throws rlhf::Error naming the flag or file at fault (--max_len above the model's context, an
/// unreadable dataset, batch sizes that do not split, a step without loss tokens, a non-finite
/// loss, ...).
int run_sft(const SftConfig& config);

}  // namespace rlhf::rl

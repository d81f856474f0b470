// The trainer skeleton `rlhf sft` and `rlhf rm` share (docs/design.md, "Layout"): OpenRLHF's batch
// arithmetic, the epoch order, and per optimizer step the failure-injection hook, zero_grad, the
// micro-batches (a task callback: forward, loss, backward, metric sums), one all-reduce of the
// metric sums, the finite-loss check, the rl::Optimizer step, the step line and metrics.jsonl
// record, and the periodic and final saves. The task (rl/sft.h, rl/rm.h) owns the data, the model's
// forward and backward and the loss.
//
// Batches (OpenRLHF): an optimizer step takes --train_batch_size samples (TB, global); each rank
// takes TB / N of them in micro-batches of --micro_train_batch_size (MB) samples; gradient
// accumulation fills the rest (TB / (MB · N) micro-batches per rank). Step s of epoch e takes the
// samples at global positions e·n + (s mod steps_per_epoch)·TB + [0, TB) of rl::EpochOrder, rank r
// the r-th TB / N of them — the same samples for any rank count.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>

#include "io/tokenizer.h"
#include "optim/adamw.h"
#include "parallel/comm.h"
#include "parallel/train_model.h"
#include "rl/tracking.h"

namespace rlhf::rl {

/// The loop's flags as plain values (OpenRLHF names; app/cli.h maps them one to one).
struct SupervisedOptions {
  std::string name = "sft";        ///< "sft" | "rm": the failure-injection point is "<name>_step"
  int64_t seed = 42;               ///< --seed: the epoch order
  int64_t train_batch_size = 128;  ///< --train_batch_size: samples per optimizer step, global
  int64_t micro_train_batch_size = 8;  ///< --micro_train_batch_size: per rank, per forward
  int64_t max_epochs = 1;              ///< --max_epochs
  int64_t max_steps = -1;              ///< --max_steps: > 0 caps the step count
  optim::AdamWConfig adam;             ///< AdamW; adam.lr is the peak --learning_rate
  std::string lr_scheduler = "cosine_with_min_lr";  ///< --lr_scheduler
  double lr_warmup_ratio = 0.03;                    ///< --lr_warmup_ratio
  double max_norm = 1.0;             ///< --max_norm: global grad-norm clip; <= 0: none
  std::string save_path = "./ckpt";  ///< --save_path: metrics.jsonl, model.h5, model_stepN.h5
  int64_t save_steps = -1;           ///< --save_steps: model_stepN.h5 every N steps (<= 0: none)
  int64_t logging_steps = 1;         ///< --logging_steps: step line + record every N steps
  /// --ckpt_path: resumable checkpoints (weights, AdamW moments, step) every --save_steps steps
  /// and on SIGTERM/SIGUSR1
  std::string ckpt_path = "./ckpt/checkpoints_sft";
  int64_t max_ckpt_num = 3;      ///< --max_ckpt_num: keep the last K
  bool save_hf_ckpt = false;     ///< --save_hf_ckpt: a Hugging Face folder with each checkpoint
  bool load_checkpoint = false;  ///< --load_checkpoint: resume from the newest valid one
  TrackingOptions tracking;      ///< --use_tensorboard, --use_wandb (rank 0)
  /// --ckpt_format: single | sharded | auto (rl/checkpoint.h sharded_checkpoints)
  std::string ckpt_format = "single";
};

/// The batch arithmetic of a run (see the top of this file).
struct BatchPlan {
  int64_t n_samples = 0;         ///< usable samples (SFT) or pairs (RM): n
  int64_t train_batch_size = 0;  ///< TB, global per optimizer step
  int64_t micro_batch_size = 0;  ///< MB, per rank per forward/backward
  int world = 1;                 ///< N, training ranks
  int64_t accumulation = 0;      ///< micro-batches per rank per step: TB / (MB · N)
  int64_t steps_per_epoch = 0;   ///< floor(n / TB): an epoch's tail is dropped
  int64_t total_steps = 0;       ///< steps_per_epoch · max_epochs, capped by max_steps > 0

  /// Samples each rank takes per step: TB / N.
  int64_t per_rank() const { return train_batch_size / world; }
  /// The 0-based epoch of 0-based `step`.
  int64_t epoch_of(int64_t step) const { return step / steps_per_epoch; }
  /// The EpochOrder position of rank `rank`'s first sample in 0-based `step`; its samples are
  /// the positions [first_position, first_position + per_rank()).
  int64_t first_position(int64_t step, int rank) const {
    return epoch_of(step) * n_samples + (step % steps_per_epoch) * train_batch_size +
           int64_t(rank) * per_rank();
  }
};

/// The batch arithmetic for `n_samples` usable samples on `world` ranks. Throws rlhf::Error
/// "--train_batch_size TB must be a multiple of --micro_train_batch_size MB x N rank(s)", or
/// "<dataset>: n usable <unit>, fewer than one --train_batch_size (TB)" (unit: "samples",
/// "pairs") with a hint.
BatchPlan plan_batches(const SupervisedOptions& o, int64_t n_samples, int world,
                       const std::string& dataset, const char* unit);

/// The values of one finished optimizer step, for the task's step line and metrics record.
struct StepReport {
  int64_t step = 0;         ///< 1-based (= AdamW's t)
  int64_t total_steps = 0;  ///< of the run
  int64_t epoch = 0;        ///< 0-based
  double loss = 0;          ///< SupervisedTask::loss of the global sums
  double lr = 0;            ///< learning rate of this step
  double grad_norm = 0;     ///< global gradient norm before clipping
  double step_s = 0;        ///< wall seconds from the failure hook to the end of the optimizer step
  double comm_s = 0;        ///< seconds in the communicator's collectives during the step
  double comm_gb = 0;       ///< bytes through the communicator during the step, / 1e9
  double elapsed_s = 0;     ///< seconds since the loop began
  double eta_s = 0;         ///< elapsed_s / step · (total_steps − step)
  int64_t peak_rss_bytes = 0;    ///< the step's peak resident size, bytes, max over ranks
  std::span<const double> sums;  ///< the metric sums over every rank (num_metrics() values)
};

/// What SFT and RM put into the skeleton. Every method but step_line and add_metrics runs on every
/// rank; those two run on rank 0 only.
class SupervisedTask {
 public:
  virtual ~SupervisedTask() = default;
  /// Number of per-step metric sums micro_batch adds to (the first is conventionally the loss
  /// sum); they are summed over ranks with one all-reduce after the micro-batches.
  virtual int num_metrics() const = 0;
  /// Called at the start of 0-based `step`, before zero_grad, with this rank's TB / N sample
  /// indices of the step (in micro-batch order): a collective pre-pass (SFT: the global number
  /// of loss tokens, so the loss is the token mean over the whole optimizer step).
  virtual void begin_step(int64_t step, std::span<const int64_t> samples, parallel::Comm& comm) {
    (void)step, (void)samples, (void)comm;
  }
  /// Forward, loss and backward of one micro-batch of MB sample indices; parameter gradients
  /// accumulate in the model's store (+=), and the micro-batch's metric contributions are added
  /// to `sums` (num_metrics() values, zeroed by the skeleton at the start of a step).
  virtual void micro_batch(std::span<const int64_t> samples, std::span<double> sums) = 0;
  /// The step's loss from the global sums (checked finite before the optimizer step).
  virtual double loss(std::span<const double> sums) const = 0;
  /// The step line (rank 0, every --logging_steps steps and at the last step).
  virtual std::string step_line(const StepReport& r) const = 0;
  /// Adds the task's fields to a metrics.jsonl record that already holds step, epoch, loss, lr,
  /// grad_norm, step_time_s, elapsed_s (rank 0).
  virtual void add_metrics(const StepReport& r, nlohmann::json& record) const = 0;
  /// The tokenizer written with every saved model (nullptr: none).
  virtual const io::Tokenizer* saved_tokenizer() const { return nullptr; }
};

/// What a finished loop did.
struct SupervisedResult {
  int64_t steps = 0;       ///< optimizer steps done (plan.total_steps unless preempted)
  int signal = 0;          ///< the SIGTERM/SIGUSR1 that stopped the loop early (0 = finished)
  double seconds = 0;      ///< wall time of the loop, final save included
  std::string model_path;  ///< <save_path>/model.h5
};

/// Trains `net` for plan.total_steps optimizer steps of `task` (see the top of this file), with
/// AdamW at LrSchedule::openrlhf(o.lr_scheduler, o.adam.lr, plan.total_steps, o.lr_warmup_ratio)
/// and clipping at o.max_norm. Rank 0 writes <save_path>/metrics.jsonl (truncated first, or
/// continued from the resumed step); every o.save_steps steps (except the last) the model is saved
/// to model_stepN.h5 and a resumable checkpoint to <ckpt_path>/step_N.h5, and at the end the model
/// to model.h5. With o.load_checkpoint the newest valid checkpoint's weights, moments and step are
/// loaded first (a warning lists changed settings). After a step in which any rank received
/// SIGTERM or SIGUSR1 (parallel/preemption.h) it writes the checkpoint and returns early with
/// `signal` set (no model.h5). Collective over `comm` (net's communicator). Throws rlhf::Error
/// "loss is not finite (x) at step s" before an optimizer step with a non-finite loss, and whatever
/// the task throws.
SupervisedResult train_supervised(const SupervisedOptions& o, const BatchPlan& plan,
                                  SupervisedTask& task, parallel::TrainModel& net,
                                  parallel::Comm& comm);

}  // namespace rlhf::rl

// Experiment tracking next to metrics.jsonl (rank 0 only): TensorBoard event files written
// natively (--use_tensorboard DIR, io/tensorboard.h) and Weights & Biases through W&B's own client
// in a sidecar process (--use_wandb: scripts/wandb_sidecar.py follows metrics.jsonl and
// samples.jsonl and logs every record; WANDB_MODE=offline is honoured).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rlhf::io {
class TensorBoardWriter;
}

namespace rlhf::rl {

namespace subprocess {
class ChildGroup;
class Fd;
}  // namespace subprocess

/// The tracking flags of a training command.
struct TrackingOptions {
  std::string tensorboard_dir;  ///< --use_tensorboard: event files here ("" = off)
  /// --use_wandb: "" = off; "true" = on with the environment's W&B login; anything else is an
  /// API key (OpenRLHF's --use_wandb {token}), passed to the sidecar as WANDB_API_KEY
  std::string wandb;
  std::string wandb_project = "rlhf";  ///< --wandb_project
  std::string wandb_group;             ///< --wandb_group ("" = none)
  std::string wandb_run_name;          ///< --wandb_run_name ("" = W&B's generated name)
  std::string wandb_org;               ///< --wandb_org: the W&B entity ("" = the default)
  bool enabled() const { return !tensorboard_dir.empty() || !wandb.empty(); }
};

/// Where the W&B sidecar script is: $RLHF_WANDB_SIDECAR, else scripts/wandb_sidecar.py next to
/// the build folder holding this executable (<exe dir>/../scripts), else
/// <exe dir>/../share/rlhf/wandb_sidecar.py. Throws rlhf::Error naming the places tried.
std::string wandb_sidecar_path();

/// Rank 0's trackers of one run. Construct after metrics.jsonl is opened (the sidecar follows it
/// from its first line); destroy (or finish()) at the end of the run.
class RunTracker {
 public:
  /// Opens the TensorBoard writer and starts the W&B sidecar as `options` ask. `save_path` holds
  /// metrics.jsonl and samples.jsonl; `config` (the resolved run settings) becomes the W&B run's
  /// config. Throws rlhf::Error when W&B is asked for but `python3 -c "import wandb"` fails, or the
  /// sidecar cannot start.
  RunTracker(const TrackingOptions& options, const std::string& save_path,
             const std::string& command, const nlohmann::json& config);
  ~RunTracker();
  RunTracker(const RunTracker&) = delete;
  RunTracker& operator=(const RunTracker&) = delete;

  /// Mirrors one metrics.jsonl record (every number a scalar at its "step").
  void record(const nlohmann::json& record);
  /// One step's logged completions (--log_completions) as a Markdown table, tag "completions".
  void text(int64_t step, const std::string& markdown);
  /// Ends the sidecar: closes its stdin (it then reads the files to their end, calls
  /// wandb.finish() and exits), waits up to `timeout_s` seconds, then kills it. Idempotent.
  void finish(double timeout_s = 300);

 private:
  std::unique_ptr<io::TensorBoardWriter> tb_;
  std::unique_ptr<subprocess::Fd> sidecar_stdin_;
  std::unique_ptr<subprocess::ChildGroup> sidecar_;
};

/// A Markdown table of logged completions: one row per sample with its prompt, completion and
/// score (cells escaped: '|' → '\|', newlines → <br>).
std::string completions_markdown(const std::vector<std::string>& prompts,
                                 const std::vector<std::string>& completions,
                                 const std::vector<double>& scores);

}  // namespace rlhf::rl

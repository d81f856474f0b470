// The subcommands' entry points, one per `rlhf <command>`, each taking its parsed arguments.
//
// Each returns the process exit status (0 on success) and throws rlhf::Error on failure; main()
// turns the exception into a logged error and an MPI_Abort. They run on every rank, after MPI is
// initialised and logging is set up (app/log.h).
#pragma once

#include "app/cli.h"
#include "rl/rl_run.h"

namespace rlhf::app {

/// `rlhf sft`: supervised fine-tuning / pre-training.
int run_sft(const SftArgs& args);
/// `rlhf rm`: reward-model training.
int run_rm(const RmArgs& args);
/// `rlhf grpo`: GRPO training.
int run_grpo(const GrpoArgs& args);
/// `rlhf ppo`: PPO training.
int run_ppo(const PpoArgs& args);
/// The RL run of `rlhf ppo` / `rlhf grpo` (cmd = "ppo" | "grpo") from its flags.
rl::RlRunConfig rl_run_config(const PpoArgs& args, const char* cmd);
/// `rlhf generate`: sampling from a checkpoint.
int run_generate(const GenerateArgs& args);
/// `rlhf eval`: sampling from a checkpoint, scored by a rule reward (accuracy, pass@k).
int run_eval(const EvalArgs& args);
/// `rlhf score`: teacher-forced NLL / log-probs of given responses, or a text's perplexity.
int run_score(const ScoreArgs& args);
/// `rlhf export`: any supported model -> Hugging Face folder (safetensors), HDF5 or GGUF.
int run_export(const ExportArgs& args);
/// `rlhf import`: any supported model -> HDF5 checkpoint.
int run_import(const ImportArgs& args);
/// `rlhf bench`: benchmarks.
int run_bench(const BenchArgs& args);

/// Calls the run_* function of whichever command `args` holds.
int run_command(const CommandArgs& args);

}  // namespace rlhf::app

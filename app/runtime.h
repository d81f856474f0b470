// The command line's option groups turned into the plain option structs of the layers below
// (placement, ZeRO, model source, generation engine, AdamW).
#pragma once

#include <string>
#include <vector>

#include "app/cli.h"
#include "io/model_source.h"
#include "optim/adamw.h"
#include "parallel/comm.h"
#include "parallel/runtime.h"
#include "parallel/train_model.h"
#include "rl/rewards.h"
#include "rl/supervised.h"
#include "rl/tracking.h"
#include "rollout/engine.h"

namespace rlhf::app {

/// --ranks_per_node, --gen_ranks_per_node, --threads, --comm_backend, --device, --nccl_timeout,
/// --attn_implementation, the engines' tensor-parallel size, and --param_dtype resolved for the CPU
/// (app::cpu_bf16; throws UsageError like it).
parallel::RuntimeOptions runtime_options(const ParallelArgs& args, int tensor_parallel = 1);

/// --zero_stage, --adam_offload, --gradient_checkpointing, --zero_keep_params.
parallel::ZeroOptions zero_options(const ZeroArgs& z);

/// --lora_rank, --lora_alpha, --target_modules, --lora_dropout as a model::LoraConfig. Throws
/// UsageError naming the flag for an unknown --target_modules name.
model::LoraConfig lora_options(const LoraArgs& a);

/// --use_tensorboard, --use_wandb and --wandb_* as rl::TrackingOptions ("false" = off).
rl::TrackingOptions tracking_options(const TrackingArgs& a);

/// io::resolve_model_source of --model_config / --pretrain / --tokenizer.
io::ModelSource model_source(const ModelArgs& args, model::HeadKind want_head);

/// The generation engine's options from the generation flags and the device: --gen_kv_cache_mb
/// (CPU), --vllm_gpu_memory_utilization and --enforce_eager (GPU), --gen_max_num_seqs; bf16: a
/// CPU engine computes in bf16 (app::cpu_bf16 of the command's --param_dtype).
rollout::EngineOptions engine_options(const GenerationArgs& gen, parallel::Device device,
                                      parallel::Comm* tp_comm, int32_t eos_token_id, bool bf16);

/// The rule rewards' options from --reward_format_pattern, --reward_keywords (comma-separated),
/// --reward_length_target, --reward_command, --reward_command_timeout (--reward itself is the spec
/// given to rl::make_reward).
rl::RewardOptions reward_options(const RewardArgs& args);

/// The non-empty comma-separated items of `s` ("a,,b" → {"a", "b"}).
std::vector<std::string> split_commas(const std::string& s);

/// AdamW hyper-parameters from --learning_rate (or `lr`), --adam_betas, --l2 (validated).
optim::AdamWConfig make_adamw(const OptimArgs& args, double lr);

/// The loop, optimizer and checkpoint flags of `rlhf sft` and `rlhf rm` (name: "sft" | "rm").
rl::SupervisedOptions supervised_options(const char* name, const CommonArgs& common,
                                         const TrainLoopArgs& loop, const OptimArgs& optim,
                                         const CheckpointArgs& ckpt);

}  // namespace rlhf::app

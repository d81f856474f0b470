// The option groups and subcommands of the command line: one registration line per option
// (flag, TOML key, help text, check) and the cross-option checks of each command. The registry
// and the parser they use are in app/cli.cpp.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <utility>

#include "app/cli.h"
#include "core/log.h"
#include "io/hf_shards.h"
#include "rl/episodes.h"

namespace rlhf::app {

// -------------------------------------------------------------------------------------------------
// Option groups: one line per option.

void CommonArgs::bind(OptionSet& o) {
  // --config is the only option that is not a TOML key; the parser reads it specially.
  o.app()
      ->add_option("--config", config, "TOML file with option values (keys = flag names)")
      ->type_name("PATH");
  const std::string& cmd = o.command();
  const bool trains = cmd == "sft" || cmd == "rm" || cmd == "grpo" || cmd == "ppo";
  if (cmd != "export" && cmd != "import")  // they draw no random numbers
    o.add("seed", seed, "Random seed (data order, init, sampling)").check(ge(0));
  o.add("log_level", log_level, "Console log level on rank 0")
      .check(one_of({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  o.add("log_dir", log_dir,
        trains ? "Directory of per-rank log files (\"\" = <save_path>/logs)"
               : "Directory of per-rank log files (\"\" = none: rank 0's console only)");
  o.add("disable_progress", disable_progress, "Do not print progress lines");
}

void ModelArgs::bind(OptionSet& o) {
  o.add("model_config", model_config, "Model config (JSON/TOML) for random init");
  o.add("pretrain", pretrain,
        "Model to start from: rlhf HDF5 checkpoint, Hugging Face folder (safetensors), llama2.c "
        ".bin or GGUF file");
  o.add("tokenizer", tokenizer,
        "Tokenizer file or folder (tokenizer.json, tokenizer.model, llama2.c tokenizer.bin, GGUF) "
        "when the model has none (\"\" = the model's own, else bytes)");
}

void ModelArgs::validate() const {
  if (model_config.empty() == pretrain.empty())
    usage_fail(
        "exactly one of --model_config (random init) and --pretrain (checkpoint) is required, "
        "got {}",
        model_config.empty() ? "neither" : "both");
}

void ExportArgs::bind(OptionSet& o) {
  common.bind(o);
  o.add("pretrain", pretrain,
        "Model to export: rlhf HDF5 checkpoint, Hugging Face folder, llama2.c .bin or GGUF file")
      .required();
  o.add("tokenizer", tokenizer, "Tokenizer to ship with the model (\"\" = the model's own)");
  o.add("format", format,
        "Output format (safetensors, or hf: a Hugging Face folder; peft: the LoRA adapter of a "
        "LoRA training checkpoint given as --pretrain)")
      .check(one_of({"safetensors", "hf", "hdf5", "gguf", "peft"}));
  o.add("lora_path", lora_path,
        "A PEFT LoRA adapter folder to merge into --pretrain (--merge_lora)");
  o.add("merge_lora", merge_lora,
        "Write --pretrain with the --lora_path adapter merged: W + (alpha/r)·B·A");
  o.add("output_path", output_path,
        "Output: a folder for safetensors, a file for hdf5 (a folder means <folder>/model.h5) "
        "and gguf")
      .required();
  o.add("dtype", dtype, "Element type of the written tensors (hdf5 is always float32)")
      .check(one_of({"float32", "bfloat16", "float16"}));
  o.add("max_shard_size", max_shard_size,
        "Largest safetensors file of a Hugging Face export (5GB, 500MB, 2GiB): a bigger model is "
        "split into model-0000k-of-0000n.safetensors + model.safetensors.index.json as "
        "transformers' save_pretrained splits it");
}

void ExportArgs::validate() {
  if (merge_lora && lora_path.empty())
    usage_fail("--merge_lora needs --lora_path (the PEFT adapter folder to merge)");
  if (!lora_path.empty() && !merge_lora)
    usage_fail("--lora_path {} without --merge_lora: add --merge_lora to write the merged model",
               lora_path);
  if (format == "peft" && merge_lora)
    usage_fail("--format peft writes an adapter; --merge_lora writes a merged model: pick one");
  try {
    io::parse_shard_size(max_shard_size);
  } catch (const Error& e) {
    usage_fail("--max_shard_size {}: {}", max_shard_size, e.what());
  }
  if (format == "hdf5" && dtype != "float32")
    usage_fail("--dtype {} with --format hdf5: checkpoints store float32\nhint: drop --dtype",
               dtype);
}

void ImportArgs::bind(OptionSet& o) {
  common.bind(o);
  o.add("pretrain", pretrain,
        "Model to import: Hugging Face folder, llama2.c .bin, GGUF file or rlhf HDF5 checkpoint")
      .required();
  o.add("tokenizer", tokenizer, "Tokenizer to store with it (\"\" = the model's own)");
  o.add("output_path", output_path, "The rlhf HDF5 checkpoint to write (.h5)").required();
}

void DatasetArgs::bind(OptionSet& o) {
  o.add("dataset", dataset, "Training data: JSONL (prompt/response) or plain text").required();
  o.add("max_len", max_len, "Max tokens per sample (prompt + response)").check(ge(1));
  o.add("truncation", truncation, "What to do with samples longer than max_len")
      .check(one_of({"truncate", "skip"}));
  o.add("max_samples", max_samples, "Use at most this many samples").check(ge(1));
}

void TrainLoopArgs::bind(OptionSet& o) {
  o.add("micro_train_batch_size", micro_train_batch_size, "Samples per rank per forward pass")
      .check(ge(1));
  o.add("train_batch_size", train_batch_size, "Global samples per optimizer step").check(ge(1));
  o.add("max_epochs", max_epochs, "Passes over the dataset").check(ge(1));
  o.add("max_steps", max_steps, "Optimizer steps (-1 = from max_epochs)").check(minus_one_or_ge(1));
}

void OptimArgs::bind(OptionSet& o) {
  o.add("learning_rate", learning_rate, "Peak learning rate").check(gt(0));
  o.add("lr_scheduler", lr_scheduler, "Learning-rate schedule")
      .check(one_of({"cosine_with_min_lr", "constant", "constant_with_warmup", "linear"}));
  o.add("lr_warmup_ratio", lr_warmup_ratio, "Warm-up steps as a fraction of all steps")
      .check(range(0, 1));
  o.add("adam_betas", adam_betas, "AdamW beta1 beta2").check(ge(0)).check(below(1));
  o.add("l2", l2, "AdamW weight decay").check(ge(0));
  o.add("max_norm", max_norm, "Clip the global gradient norm to this (0 = off)").check(ge(0));
}

void ZeroArgs::bind(OptionSet& o) {
  o.add("zero_stage", zero_stage, "ZeRO stage: 0 = replicated, 3 = sharded")
      .check(one_of_int({0, 3}));
  o.add("adam_offload", adam_offload, "Keep Adam state in host memory and step on the host");
  o.add("gradient_checkpointing", gradient_checkpointing, "Recompute activations in backward");
  o.add("zero_keep_params", zero_keep_params,
        "ZeRO-3: keep the units gathered in forward for backward (no second all-gather)");
  o.add("packing_samples", packing_samples,
        "Pack each micro-batch's samples into one row without padding (block-diagonal causal "
        "attention, positions from 0 per sample)");
}

void LoraArgs::bind(OptionSet& o) {
  o.add("lora_rank", lora_rank,
        "LoRA rank r (0 = train every weight; > 0 = freeze the base, train "
        "adapters)")
      .check(ge(0));
  o.add("lora_alpha", lora_alpha, "LoRA alpha: the adapters are scaled by alpha / rank")
      .check(gt(0));
  o.add("target_modules", target_modules,
        "LoRA targets: all-linear or a comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,"
        "up_proj,down_proj");
  o.add("lora_path", lora_path,
        "A PEFT LoRA adapter folder to start from (adapter_config.json + "
        "adapter_model.safetensors); its r, alpha and targets are used");
  o.add("lora_dropout", lora_dropout,
        "Dropout on the LoRA branch's input in training passes (PEFT's lora_dropout; masks from "
        "--seed)")
      .check(ge(0))
      .check(below(1));
}

void ParallelArgs::bind(OptionSet& o) {
  o.add("ranks_per_node", ranks_per_node, "Ranks per node (0 = detect from shared memory)")
      .check(ge(0))
      .env("RLHF_RANKS_PER_NODE");
  const std::string& cmd = o.command();
  if (cmd != "sft" && cmd != "rm" && cmd != "score")  // commands that generate
    o.add("gen_ranks_per_node", gen_ranks_per_node,
          "Generation-only ranks per node (0 = colocated)")
        .check(ge(0));
  o.add("threads", threads, "OpenMP threads per rank (0 = cores / ranks on the node)").check(ge(0));
  o.add("comm_backend", comm_backend,
        "Collectives: auto (shared memory inside a node, else MPI), mpi, shm")
      .check(one_of({"auto", "mpi", "shm"}))
      .env("RLHF_COMM_KIND");
  o.add("device", device,
        "Where the models train: auto (cuda when built with CUDA and a GPU is visible), cpu, "
        "cuda")
      .check(one_of({"auto", "cpu", "cuda"}))
      .env("RLHF_DEVICE");
  o.add("attn_implementation", attn_implementation,
        "Attention in training and scoring passes: auto (GPU: cudnn where cuDNN's fused attention "
        "runs, else flash; CPU in bf16: onednn where the CPU's bf16 GEMMs beat fp32 ones, else "
        "the fp32 kernels), cudnn (GPU: cuDNN's tensor-core attention where it serves the shape), "
        "flash (this project's kernels: deterministic; on the CPU its fp32 kernels), onednn (CPU "
        "with --param_dtype bf16: attention's products as bf16 oneDNN GEMMs); Hugging Face's "
        "names as OpenRLHF passes them: flash_attention_2, flash_attention_3 and sdpa = auto, "
        "eager = flash (also --ds.attn_implementation)")
      .check(one_of({"auto", "flash", "cudnn", "onednn", "flash_attention_2", "flash_attention_3",
                     "sdpa", "eager"}));
  o.add("param_dtype", param_dtype,
        "Compute precision of the models' GEMMs: bf16 (bf16 weights and activations, fp32 "
        "accumulation, fp32 master weights, gradients and AdamW moments), fp32, or auto = bf16 on "
        "GPUs and on CPUs whose bf16 GEMMs beat fp32 (AMX, or AVX512-BF16 off Intel; oneDNN), "
        "fp32 elsewhere; bf16 on a CPU without them runs slower than fp32 (emulated by oneDNN, or "
        "AVX512-BF16 on an Intel core without AMX); a build without oneDNN refuses bf16 on the "
        "CPU")
      .check(one_of({"auto", "bf16", "fp32"}));
  o.add("bf16", bf16, "Same as --param_dtype bf16 (OpenRLHF's switch)");
  o.add("comm_timeout", comm_timeout,
        "Seconds one collective or wait may block before the watchdog names it and ends the job "
        "on every rank (0 = none; a stopped or hung rank otherwise hangs the job)")
      .check(ge(0));
  o.add("nccl_timeout", nccl_timeout,
        "Seconds a GPU (NCCL) collective may take before the watchdog aborts the job (0 = none, "
        "-1 = --comm_timeout)")
      .check(minus_one_or_ge(0));
}

void TrackingArgs::bind(OptionSet& o) {
  o.add("use_tensorboard", use_tensorboard,
        "Also write every metric (and --log_completions samples) as TensorBoard event files in "
        "this directory (\"\" = off)");
  o.add("use_wandb", use_wandb,
        "Also log to Weights & Biases through its client (python3 must import wandb): bare or "
        "true = the environment's login, another value = an API key; WANDB_MODE=offline logs "
        "offline")
      .implicit("true");
  o.add("wandb_project", wandb_project, "W&B project");
  o.add("wandb_group", wandb_group, "W&B group (\"\" = none)");
  o.add("wandb_run_name", wandb_run_name, "W&B run name (\"\" = W&B's generated name)");
  o.add("wandb_org", wandb_org, "W&B entity (\"\" = the login's default)");
}

void CheckpointArgs::bind(OptionSet& o) {
  o.add("save_path", save_path, "Checkpoint directory");
  o.add("save_steps", save_steps, "Checkpoint every N steps (-1 = at the end only)")
      .check(minus_one_or_ge(1));
  o.add("logging_steps", logging_steps, "Log a step line every N steps").check(ge(1));
  o.add("ckpt_path", ckpt_path,
        "Directory of resumable training checkpoints (weights, optimizer moments, step): written "
        "every --save_steps and on SIGTERM/SIGUSR1");
  o.add("max_ckpt_num", max_ckpt_num, "Keep the last K training checkpoints (0 = all)")
      .check(ge(0));
  o.add("load_checkpoint", load_checkpoint,
        "Resume from the newest valid checkpoint in --ckpt_path (a damaged one is skipped)");
  o.add("save_hf_ckpt", save_hf_ckpt,
        "With each training checkpoint, also write a Hugging Face folder <ckpt_path>/step_N_hf "
        "(config.json, model.safetensors, tokenizer files)");
  o.add("ckpt_format", ckpt_format,
        "Training checkpoint form: single (one HDF5 file written by rank 0), sharded (every "
        "training rank writes its own shard in parallel, <ckpt_path>/step_N_shards/, indexed by "
        "step_N.h5), auto (sharded with more than one training rank, else single). Either "
        "resumes on any rank count")
      .check(one_of({"single", "sharded", "auto"}));
}

void SftArgs::bind(OptionSet& o) {
  common.bind(o);
  model.bind(o);
  data.bind(o);
  o.add("input_key", input_key, "JSON key of the prompt");
  o.add("output_key", output_key, "JSON key of the response");
  o.add("apply_chat_template", apply_chat_template,
        "Render input (with the generation prompt) and output with the tokenizer's Jinja chat "
        "template (built-in ChatML or Llama 2 format when it has none)");
  loop.bind(o);
  optim.bind(o);
  zero.bind(o);
  lora.bind(o);
  parallel.bind(o);
  ckpt.bind(o);
  tracking.bind(o);
}

void SftArgs::validate() {
  model.validate();
  if (common.log_dir.empty())
    common.log_dir = (std::filesystem::path(ckpt.save_path) / "logs").string();
}

void RmArgs::bind(OptionSet& o) {
  common.bind(o);
  model.bind(o);
  o.add("dataset", dataset, "Preference pairs (JSONL)").required();
  o.add("chosen_key", chosen_key, "JSON key of the preferred response (or transcript)");
  o.add("rejected_key", rejected_key, "JSON key of the rejected response (or transcript)");
  o.add("prompt_key", prompt_key, "JSON key of the prompt (\"\" = the texts are transcripts)");
  o.add("apply_chat_template", apply_chat_template,
        "Render prompt + chosen/rejected with the tokenizer's Jinja chat template (built-in "
        "ChatML or Llama 2 format when it has none)");
  o.add("max_len", max_len, "Max tokens per side (longer sides are cut, EOS kept)").check(ge(3));
  o.add("max_samples", max_samples, "Use at most this many pairs").check(ge(1));
  loop.bind(o);
  optim.bind(o);
  zero.bind(o);
  lora.bind(o);
  parallel.bind(o);
  ckpt.bind(o);
  tracking.bind(o);
}

void RmArgs::validate() {
  model.validate();
  if (common.log_dir.empty())
    common.log_dir = (std::filesystem::path(ckpt.save_path) / "logs").string();
}

// -------------------------------------------------------------------------------------------------
// rlhf generate

void GenerationArgs::bind(OptionSet& o) {
  o.add("generate_max_len", generate_max_len, "Max new tokens per sample").check(ge(1));
  o.add("temperature", temperature, "Sampling temperature (0 = greedy)").check(ge(0));
  o.add("top_p", top_p, "Nucleus sampling: smallest set with probability >= top_p (1 = off)")
      .check(gt(0))
      .check(le(1));
  o.add("top_k", top_k, "Sample from the k most likely tokens (-1 = off)").check(ge(-1));
  o.add("greedy", greedy, "Greedy decoding (argmax)");
  o.add("n_samples_per_prompt", n_samples_per_prompt, "Completions per prompt").check(ge(1));
  o.add("gen_kv_cache_mb", gen_kv_cache_mb, "KV cache budget of a generation engine (MiB)")
      .check(ge(1));
  o.add("kv_cache_dtype", kv_cache_dtype,
        "KV cache element type of CPU engines: auto or fp16 (half the bytes attention reads), "
        "fp32 (exact, twice the bytes); GPU engines keep bf16")
      .check(one_of({"auto", "fp16", "fp32"}));
  o.add("kv_block_size", kv_block_size,
        "Positions per KV block of a generation engine (0 = 256 on the CPU, where longer "
        "contiguous runs read faster; 16 on a GPU)")
      .check(ge(0));
  o.add("gen_max_num_seqs", gen_max_num_seqs, "Most sequences a generation engine decodes at once")
      .check(ge(1));
  o.add("vllm_tensor_parallel_size", vllm_tensor_parallel_size,
        "Ranks per generation engine (tensor parallel, inside one node)")
      .check(ge(1));
  o.add("vllm_gpu_memory_utilization", vllm_gpu_memory_utilization,
        "GPU engines: share of the GPU's memory the engine may hold (weights, buffers, KV "
        "cache; capped by what is free); --gen_kv_cache_mb sizes CPU engines")
      .check(gt(0))
      .check(le(1));
  o.add("enforce_eager", enforce_eager,
        "GPU engines: launch every decode step's kernels instead of replaying CUDA graphs");
  o.add("env_command", env_command,
        "Multi-turn episodes: environment program, one per engine (on its first rank), JSON "
        "lines on stdin/stdout (docs/environments.md), or builtin:toy");
  o.add("env_timeout", env_timeout, "Seconds the environment may take per batch of turn ends")
      .check(gt(0));
  o.add("env_max_turns", env_max_turns, "With --env_command: model turns per episode").check(ge(1));
  o.add("stop_strings", stop_strings,
        "Comma-separated stop strings (\\, = comma, \\n = newline): end a turn, or the sample "
        "without --env_command (alias --vllm_stop_strings)")
      .alias("vllm_stop_strings");
}

void GenerationArgs::validate() const {
  try {
    (void)rl::parse_stop_strings(stop_strings);
  } catch (const Error& e) {
    usage_fail("{}", e.what());
  }
  if (env_command.empty()) return;
  if (stop_strings.empty() && env_max_turns > 1)
    LOG0_WARN(
        "--env_command without --stop_strings: a turn ends only at EOS or --generate_max_len, "
        "and neither lets the environment answer, so every episode has one turn\nhint: pass the "
        "strings that end an action, e.g. --stop_strings \"</calc>\"");
}

void GenerateArgs::bind(OptionSet& o) {
  common.bind(o);
  o.add("pretrain", pretrain,
        "Model to sample from: rlhf HDF5 checkpoint, Hugging Face folder, llama2.c .bin or GGUF "
        "file")
      .required();
  o.add("tokenizer", tokenizer,
        "Tokenizer file or folder when the model has none (\"\" = the model's own, else bytes)");
  o.add("dataset", dataset, "Prompts: JSONL, one object per line").required();
  o.add("input_key", input_key, "JSON key of the prompt: text or chat messages");
  o.add("apply_chat_template", apply_chat_template,
        "Render prompts with the tokenizer's Jinja chat template (built-in ChatML or Llama 2 "
        "format when it has none)");
  o.add("output_path", output_path, "Completions out: JSONL, one object per sample").required();
  o.add("max_samples", max_samples, "Use at most this many prompts").check(ge(1));
  gen.bind(o);
  parallel.bind(o);
}

// -------------------------------------------------------------------------------------------------
// rlhf ppo / grpo / eval

void RewardArgs::bind(OptionSet& o) {
  o.add("reward", reward,
        "Rule reward: math, countdown, format, length, keyword, command, or a weighted sum "
        "\"math:1,format:0.2\"");
  o.add("reward_command", reward_command,
        "The program of --reward command (alone, it implies --reward command): reads JSON lines "
        "{prompt, completion, label}, writes one score per line");
  o.add("reward_command_timeout", reward_command_timeout, "Seconds per scoring batch").check(gt(0));
  o.add("reward_format_pattern", reward_format_pattern, "Regex of the format reward");
  o.add("reward_keywords", reward_keywords, "Comma-separated keywords of the keyword reward");
  o.add("reward_length_target", reward_length_target, "Target tokens of the length reward")
      .check(ge(1));
}

void RewardArgs::validate(const std::string& label_key) const {
  if ((reward == "math" || reward == "countdown") && label_key.empty())
    usage_fail("--reward {} needs --label_key (the reference answer in the prompt data)", reward);
}

void PpoArgs::bind(OptionSet& o) {
  common.bind(o);
  model.bind(o);
  o.add("reward_pretrain", reward_pretrain, "Reward model checkpoint (rlhf rm)");
  o.add("critic_pretrain", critic_pretrain,
        "Critic initialisation (\"\" = --reward_pretrain, else --pretrain)");
  o.add("prompt_data", prompt_data, "Prompts: JSONL, or builtin:<task>").required();
  o.add("input_key", input_key, "JSON key of the prompt text");
  o.add("label_key", label_key, "JSON key of the reference answer (rule rewards)");
  o.add("apply_chat_template", apply_chat_template,
        "Render prompts with the tokenizer's Jinja chat template (built-in ChatML or Llama 2 "
        "format when it has none)");
  o.add("input_template", input_template,
        "Without --apply_chat_template: the prompt text is put in this template at {} (e.g. "
        "\"User: {}\\nAssistant: \"; \\n = newline; \"\" = the prompt as is)");
  o.add("prompt_max_len", prompt_max_len, "Longer prompts (tokens) are skipped").check(ge(1));
  o.add("max_len", max_len,
        "Prompt + response tokens per sample (OpenRLHF's): new tokens stop at max_len - prompt "
        "length, prompts with no room are skipped; without --generate_max_len it alone decides "
        "(0 = off)")
      .check(ge(0));
  o.add("max_samples", max_samples, "Use at most this many prompts").check(ge(1));
  rewards.bind(o);
  o.add("normalize_reward", normalize_reward, "Normalise scores by their running mean and std");
  o.add("rollout_batch_size", rollout_batch_size, "Prompts per RL step").check(ge(1));
  o.add("micro_rollout_batch_size", micro_rollout_batch_size,
        "Samples per rank per forward-only pass (log-probs, values)")
      .check(ge(1));
  o.add("train_batch_size", train_batch_size, "Samples per optimizer step (global)").check(ge(1));
  o.add("micro_train_batch_size", micro_train_batch_size, "Samples per rank per forward/backward")
      .check(ge(1));
  o.add("max_epochs", max_epochs, "Training passes over each rollout").check(ge(1));
  o.add("num_episodes", num_episodes, "Passes over the prompt data").check(ge(1));
  o.add("max_steps", max_steps, "RL steps (-1 = --num_episodes passes over the prompts)")
      .check(minus_one_or_ge(1));
  o.add("advantage_estimator", advantage_estimator, "Advantage estimator")
      .check(one_of({"gae", "reinforce", "reinforce_baseline", "rloo", "group_norm", "dr_grpo"}));
  o.add("gamma", gamma, "Discount").check(ge(0)).check(le(1));
  o.add("lambd", lambd, "GAE lambda").check(ge(0)).check(le(1));
  o.add("init_kl_coef", init_kl_coef, "KL coefficient beta (0 = no KL, no reference model)")
      .check(ge(0));
  o.add("kl_estimator", kl_estimator, "KL estimator").check(one_of({"k1", "k2", "k3"}));
  o.add("use_kl_loss", use_kl_loss, "KL as a loss term instead of in the reward (GRPO)");
  o.add("kl_target", kl_target, "Adaptive KL target (0 = fixed coefficient)").check(ge(0));
  o.add("kl_horizon", kl_horizon, "Adaptive KL horizon").check(gt(0));
  o.add("eps_clip", eps_clip, "PPO clip range").check(gt(0));
  o.add("eps_clip_low_high", eps_clip_low_high,
        "Asymmetric clip: eps_low eps_high (0 0 = --eps_clip both)")
      .check(ge(0));
  o.add("dual_clip", dual_clip, "Dual-clip bound c > 1 for negative advantages (0 = off)")
      .check(ge(0));
  o.add("value_clip", value_clip, "Critic value clip (0 = off)").check(ge(0));
  o.add("entropy_loss_coef", entropy_loss_coef, "Entropy bonus coefficient").check(ge(0));
  o.add("freezing_actor_steps", freezing_actor_steps, "RL steps that train only the critic");
  o.add("actor_learning_rate", actor_learning_rate, "Actor learning rate").check(gt(0));
  o.add("critic_learning_rate", critic_learning_rate, "Critic learning rate").check(gt(0));
  o.add("dynamic_filtering", dynamic_filtering,
        "DAPO dynamic sampling: drop groups whose mean score is not strictly inside "
        "--dynamic_filtering_reward_range, generate for more prompts until the rollout batch is "
        "full");
  o.add("dynamic_filtering_reward_range", dynamic_filtering_reward_range,
        "With --dynamic_filtering: lo hi; a group is kept iff lo < mean score < hi");
  o.add("max_num_gen_batches", max_num_gen_batches,
        "With --dynamic_filtering: most generation rounds per step (the first included); when "
        "reached, the step trains on the groups kept")
      .check(ge(1));
  o.add("overlong_buffer_len", overlong_buffer_len,
        "DAPO overlong shaping: the last L_c tokens before --generate_max_len are penalised "
        "linearly (0 = off)")
      .check(ge(0));
  o.add("overlong_penalty_factor", overlong_penalty_factor,
        "DAPO overlong shaping: the penalty at --generate_max_len (and beyond)")
      .check(ge(0));
  o.add("policy_loss_type", policy_loss_type,
        "Policy loss: ppo (token ratios) or gspo (sequence ratios, GSPO)")
      .check(one_of({"ppo", "gspo"}));
  o.add("loss_agg_mode", loss_agg_mode,
        "How token losses are aggregated over the optimizer step (veRL's names)")
      .check(one_of(
          {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}));
  o.add("no_advantage_std_norm", no_advantage_std_norm,
        "group_norm without the division by the group's std (Dr. GRPO)");
  o.add("enable_vllm_is_correction", enable_vllm_is_correction,
        "Weight each token's policy loss by the engine-vs-trainer ratio exp(lp_old - lp_rollout) "
        "(--vllm_is_correction_type)");
  o.add("vllm_is_correction_type", vllm_is_correction_type,
        "tis (ratio clamped to the thresholds), icepop (tokens outside them dropped) or "
        "seq-mask-tis (samples whose geometric-mean ratio is outside them dropped)")
      .check(one_of({"tis", "icepop", "seq-mask-tis"}));
  o.add("vllm_is_truncated_threshold", vllm_is_truncated_threshold,
        "With --enable_vllm_is_correction: lo hi bounds of the ratio")
      .check(ge(0));
  o.add("use_decoupled_loss", use_decoupled_loss,
        "Decoupled PPO (AReaL): the clipped ratio against lp_old times the behaviour weight "
        "exp(lp_old - lp_rollout)");
  o.add("behav_imp_weight_cap", behav_imp_weight_cap,
        "With --use_decoupled_loss: tokens whose behaviour weight exceeds this (> 1) are dropped "
        "(0 = no cap)")
      .check(ge(0));
  o.add("use_dynamic_batch", use_dynamic_batch,
        "Micro-batches by a token budget (padded tokens per rank) instead of a sample count");
  o.add("train_max_tokens_per_gpu", train_max_tokens_per_gpu,
        "With --use_dynamic_batch: padded tokens per rank per forward/backward")
      .check(ge(1));
  o.add("rollout_max_tokens_per_gpu", rollout_max_tokens_per_gpu,
        "With --use_dynamic_batch: padded tokens per rank per forward-only pass (0 = "
        "--train_max_tokens_per_gpu)")
      .check(ge(0));
  o.add("lr_scheduler", optim.lr_scheduler, "Learning-rate schedule")
      .check(one_of({"cosine_with_min_lr", "constant", "constant_with_warmup", "linear"}));
  o.add("lr_warmup_ratio", optim.lr_warmup_ratio, "Warm-up steps as a fraction of all steps")
      .check(ge(0))
      .check(le(1));
  o.add("adam_betas", optim.adam_betas, "AdamW beta1 beta2").check(ge(0)).check(below(1));
  o.add("l2", optim.l2, "AdamW weight decay").check(ge(0));
  o.add("max_norm", optim.max_norm, "Clip the global gradient norm to this (0 = off)").check(ge(0));
  gen.bind(o);
  o.add("sync_bucket_mb", sync_bucket_mb, "Weight-sync bucket size (MiB)").check(ge(1));
  zero.bind(o);
  lora.bind(o);
  parallel.bind(o);
  ckpt.bind(o);
  o.add("eval_dataset", eval_dataset,
        "Held-out prompts to evaluate on: JSONL (same --input_key/--label_key) or builtin:<task> "
        "(\"\" = no evaluation)");
  o.add("eval_steps", eval_steps,
        "Evaluate every N steps (-1 = only at the end when --eval_dataset is set)")
      .check(minus_one_or_ge(1));
  o.add("eval_temperature", eval_temperature, "Sampling temperature of evaluation (0 = greedy)")
      .check(ge(0));
  o.add("eval_n_samples_per_prompt", eval_n_samples_per_prompt,
        "Completions per evaluation prompt (pass@k up to this k)")
      .check(ge(1));
  o.add("eval_before_training", eval_before_training, "Also evaluate before the first step");
  o.add("async_train", async_train,
        "Off-policy by up to --async_queue_size steps: generation ranks generate the next "
        "rollouts while the training ranks train (needs --gen_ranks_per_node >= 1)");
  o.add("async_queue_size", async_queue_size,
        "With --async_train: a rollout made with weights of version v is trained at version <= "
        "v + this (0 = synchronous)")
      .check(ge(0));
  o.add("partial_rollout", partial_rollout,
        "Partial rollouts: a step's generation stops once --rollout_batch_size groups finished; "
        "the unfinished samples keep their tokens and continue next step under the new weights "
        "(each token records its weight version)");
  o.add("max_staleness", max_staleness,
        "With --partial_rollout: a sample whose oldest token is more than this many weight "
        "versions old is dropped and generated again")
      .check(ge(0))
      .alias("max_head_offpolicyness");
  o.add("partial_rollout_kv", partial_rollout_kv,
        "With --partial_rollout: keep = a carried sample continues from the KV blocks its engine "
        "kept (computed under the weights that sampled its tokens, as a vLLM engine paused across "
        "a weight update); recompute = it is prefilled again under the new weights (AReaL)")
      .check(one_of({"keep", "recompute"}));
  o.add("vllm_enable_sleep", vllm_enable_sleep,
        "Colocated engines free their KV cache and weight copies after generating and take them "
        "back before the weight sync (no effect with --gen_ranks_per_node >= 1)");
  o.add("log_completions", log_completions,
        "Every N steps, the step's prompts, completions, scores and advantages to "
        "<save_path>/samples.jsonl (0 = off; bare --log_completions = every step)")
      .check(ge(0))
      .implicit("1");
  o.add("colocate_all_models", colocate_all_models,
        "OpenRLHF's: every rank trains and generates (rlhf's default, --gen_ranks_per_node 0)");
  tracking.bind(o);
}

void PpoArgs::validate() {
  model.validate();
  if (colocate_all_models && parallel.gen_ranks_per_node > 0)
    usage_fail(
        "--colocate_all_models puts training and generation on every rank, but "
        "--gen_ranks_per_node {} asks for generation-only ranks\nhint: drop one of them",
        parallel.gen_ranks_per_node);
  if (max_len > 0 && max_len < 2)
    usage_fail("--max_len {} leaves no room for a prompt and a response", max_len);
  if (!input_template.empty() && input_template.find("{}") == std::string::npos)
    usage_fail(
        "--input_template '{}' has no {{}} (where the prompt goes)\nhint: e.g. "
        "--input_template \"User: {{}}\\nAssistant: \"",
        input_template);
  // --reward_command alone means --reward command (its program scores every sample).
  if (rewards.reward.empty() && !rewards.reward_command.empty()) rewards.reward = "command";
  if (common.log_dir.empty())
    common.log_dir = (std::filesystem::path(ckpt.save_path) / "logs").string();
  if (rewards.reward.empty() && reward_pretrain.empty() && gen.env_command.empty())
    usage_fail(
        "no reward: give --reward (a rule: math, countdown, ...), --reward_pretrain, or an "
        "--env_command that gives rewards");
  gen.validate();
  rewards.validate(label_key);
  const bool group = advantage_estimator != "gae" && advantage_estimator != "reinforce";
  if (group && gen.n_samples_per_prompt < 2)
    usage_fail(
        "--advantage_estimator {} needs --n_samples_per_prompt > 1 (got {})\nhint: e.g. "
        "--n_samples_per_prompt 8",
        advantage_estimator, gen.n_samples_per_prompt);
  if ((rollout_batch_size * gen.n_samples_per_prompt) % train_batch_size != 0)
    usage_fail(
        "--rollout_batch_size {} x --n_samples_per_prompt {} = {} samples is not a multiple of "
        "--train_batch_size {}",
        rollout_batch_size, gen.n_samples_per_prompt, rollout_batch_size * gen.n_samples_per_prompt,
        train_batch_size);
  if (!use_dynamic_batch && train_batch_size % micro_train_batch_size != 0)
    usage_fail("--train_batch_size {} is not a multiple of --micro_train_batch_size {}",
               train_batch_size, micro_train_batch_size);
  if (dual_clip != 0 && dual_clip <= 1)
    usage_fail("--dual_clip must be > 1 (or 0 = off), got {}", dual_clip);
  if (!(vllm_is_truncated_threshold[0] < vllm_is_truncated_threshold[1]))
    usage_fail("--vllm_is_truncated_threshold {} {}: lo must be < hi",
               vllm_is_truncated_threshold[0], vllm_is_truncated_threshold[1]);
  if (enable_vllm_is_correction && use_decoupled_loss)
    usage_fail(
        "--enable_vllm_is_correction and --use_decoupled_loss both weight the loss by "
        "exp(lp_old - lp_rollout): choose one");
  if (behav_imp_weight_cap != 0 && (!use_decoupled_loss || behav_imp_weight_cap <= 1))
    usage_fail("--behav_imp_weight_cap {} needs --use_decoupled_loss and a value > 1",
               behav_imp_weight_cap);
  if (use_decoupled_loss && policy_loss_type != "ppo")
    usage_fail("--use_decoupled_loss needs --policy_loss_type ppo (token ratios)");
  const auto& [lo, hi] = dynamic_filtering_reward_range;
  if (!(lo < hi))
    usage_fail(
        "--dynamic_filtering_reward_range {} {}: lo must be < hi (a group is kept iff lo < "
        "its mean score < hi)",
        lo, hi);
  if (overlong_buffer_len >= gen.generate_max_len)
    usage_fail(
        "--overlong_buffer_len {} must be < --generate_max_len {} (the buffer is the last "
        "L_c tokens before the limit)",
        overlong_buffer_len, gen.generate_max_len);
  if (partial_rollout && dynamic_filtering)
    usage_fail(
        "--partial_rollout with --dynamic_filtering: both decide when a step has its groups; "
        "choose one");
  if (partial_rollout && !gen.env_command.empty())
    usage_fail(
        "--partial_rollout with --env_command: multi-turn episodes are not interrupted and "
        "continued; drop one of them");
  if (!partial_rollout && partial_rollout_kv != "keep")
    usage_fail("--partial_rollout_kv {} needs --partial_rollout", partial_rollout_kv);
  if (!partial_rollout && max_staleness != 8)
    usage_fail("--max_staleness {} needs --partial_rollout (it bounds the age of carried samples)",
               max_staleness);
  if (eval_before_training && eval_dataset.empty())
    usage_fail("--eval_before_training needs --eval_dataset (the prompts to evaluate on)");
  if (!eval_dataset.empty() && rewards.reward.empty())
    usage_fail(
        "--eval_dataset needs a rule --reward (evaluation checks answers with it; a reward model "
        "from --reward_pretrain cannot say what is correct)\nhint: e.g. --reward math "
        "--label_key label");
}

void GenerateArgs::validate() {
  gen.validate();
}

void EvalArgs::bind(OptionSet& o) {
  common.bind(o);
  o.add("pretrain", pretrain,
        "Model to evaluate: rlhf HDF5 checkpoint, Hugging Face folder, llama2.c .bin or GGUF file")
      .required();
  o.add("tokenizer", tokenizer,
        "Tokenizer file or folder when the model has none (\"\" = the model's own, else bytes)");
  o.add("dataset", dataset, "Prompts with reference answers: JSONL, or builtin:<task>").required();
  o.add("input_key", input_key, "JSON key of the prompt text");
  o.add("label_key", label_key, "JSON key of the reference answer (rule rewards)");
  o.add("apply_chat_template", apply_chat_template,
        "Render prompts with the tokenizer's Jinja chat template (built-in ChatML or Llama 2 "
        "format when it has none)");
  o.add("input_template", input_template,
        "Without --apply_chat_template: the prompt text is put in this template at {} (\"\" = "
        "as is)");
  o.add("prompt_max_len", prompt_max_len, "Longer prompts (tokens) are skipped").check(ge(1));
  o.add("max_samples", max_samples, "Use at most this many prompts").check(ge(1));
  rewards.bind(o);
  o.add("output_path", output_path,
        "Scored completions out: JSONL, one object per sample, then a summary line")
      .required();
  gen.bind(o);
  parallel.bind(o);
}

void EvalArgs::validate() {
  gen.validate();
  if (rewards.reward.empty() && !rewards.reward_command.empty()) rewards.reward = "command";
  if (rewards.reward.empty())
    usage_fail(
        "--reward is required: rlhf eval scores every completion with a rule reward\nhint: e.g. "
        "--reward math --label_key label");
  rewards.validate(label_key);
}

void ScoreArgs::bind(OptionSet& o) {
  common.bind(o);
  o.add(
       "pretrain", pretrain,
       "Model to score with: rlhf HDF5 checkpoint, Hugging Face folder, llama2.c .bin or GGUF file")
      .required();
  o.add("tokenizer", tokenizer,
        "Tokenizer file or folder when the model has none (\"\" = the model's own, else bytes)");
  o.add("dataset", dataset,
        "Records to score (JSONL: prompt under --input_key, response under --output_key), or a "
        "plain-text file (its perplexity)")
      .required();
  o.add("input_key", input_key, "JSON key of the prompt (a string or chat messages)");
  o.add("output_key", output_key, "JSON key of the response to score");
  o.add("apply_chat_template", apply_chat_template,
        "Render the prompt with the model's chat template (with the generation prompt)");
  o.add("max_len", max_len,
        "Tokens per sequence (records longer are skipped) and per window of a text (0 = the "
        "model's context)")
      .check(ge(0));
  o.add("stride", stride, "Plain text: tokens between window starts (0 = max_len / 2)")
      .check(ge(0));
  o.add("max_samples", max_samples, "Score at most this many records").check(ge(1));
  o.add("output_path", output_path, "Scores out: JSONL, one object per record, then a summary line")
      .required();
  parallel.bind(o);
}

void ScoreArgs::validate() {
  if (stride > 0 && max_len > 0 && stride > max_len)
    usage_fail("--stride {} must not exceed --max_len {}", stride, max_len);
}

}  // namespace rlhf::app

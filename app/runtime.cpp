#include "app/runtime.h"

#include "app/param_dtype.h"
#include "io/peft_adapter.h"

namespace rlhf::app {

parallel::RuntimeOptions runtime_options(const ParallelArgs& args, int tensor_parallel) {
  parallel::RuntimeOptions o;
  o.ranks_per_node = args.ranks_per_node;
  o.gen_ranks_per_node = args.gen_ranks_per_node;
  o.threads = args.threads;
  o.comm_backend = args.comm_backend;
  o.device = args.device;
  o.comm_timeout = args.comm_timeout;
  o.nccl_timeout = args.nccl_timeout < 0 ? args.comm_timeout : args.nccl_timeout;
  o.attn_implementation = args.attn_implementation;
  o.tensor_parallel = tensor_parallel;
  const bool gpu = parallel::resolve_device(args.device) == parallel::Device::kCuda;
  o.bf16 = cpu_bf16(args, gpu);
  if (args.attn_implementation == "onednn" && gpu)
    throw UsageError(
        "--attn_implementation onednn is the CPU's bf16 attention; this run trains on the GPU\n"
        "hint: --attn_implementation auto, cudnn or flash there, or --device cpu");
  if (args.attn_implementation == "onednn" && !o.bf16)
    throw UsageError(
        "--attn_implementation onednn computes attention's products in bf16, but this run's "
        "models compute in fp32 on the CPU\nhint: --param_dtype bf16, or --attn_implementation "
        "auto");
  return o;
}

rl::TrackingOptions tracking_options(const TrackingArgs& a) {
  rl::TrackingOptions t;
  t.tensorboard_dir = a.use_tensorboard;
  t.wandb = a.use_wandb == "false" ? "" : a.use_wandb;
  t.wandb_project = a.wandb_project;
  t.wandb_group = a.wandb_group;
  t.wandb_run_name = a.wandb_run_name;
  t.wandb_org = a.wandb_org;
  return t;
}

parallel::ZeroOptions zero_options(const ZeroArgs& z) {
  parallel::ZeroOptions o;
  o.zero_stage = z.zero_stage;
  o.adam_offload = z.adam_offload;
  o.gradient_checkpointing = z.gradient_checkpointing;
  o.zero_keep_params = z.zero_keep_params;
  o.packing_samples = z.packing_samples;
  return o;
}

model::LoraConfig lora_options(const LoraArgs& a) {
  model::LoraConfig c;
  c.rank = a.lora_rank;
  c.alpha = a.lora_alpha;
  c.dropout = a.lora_dropout;
  try {
    c.targets = model::parse_target_modules(a.target_modules);
    c.validate();
    if (!a.lora_path.empty()) {
      // The adapter's own settings; flags given besides must agree with them.
      const model::LoraConfig f = io::read_peft_adapter_config(a.lora_path);
      if (a.lora_rank != 0 && a.lora_rank != f.rank)
        throw UsageError(fmt::format("--lora_rank {} but the --lora_path adapter has r = {}",
                                     a.lora_rank, f.rank));
      if (a.lora_alpha != 16.0 && a.lora_alpha != f.alpha)
        throw UsageError(
            fmt::format("--lora_alpha {} but the --lora_path adapter has lora_alpha = {}",
                        a.lora_alpha, f.alpha));
      if (a.target_modules != "all-linear" && c.targets != f.targets)
        throw UsageError(fmt::format("--target_modules {} but the --lora_path adapter targets {}",
                                     a.target_modules, model::target_modules_string(f.targets)));
      c.rank = f.rank;
      c.alpha = f.alpha;
      c.targets = f.targets;
      c.path = a.lora_path;
    }
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return c;
}

io::ModelSource model_source(const ModelArgs& args, model::HeadKind want_head) {
  return io::resolve_model_source(args.model_config, args.pretrain, args.tokenizer, want_head);
}

rollout::EngineOptions engine_options(const GenerationArgs& gen, parallel::Device device,
                                      parallel::Comm* tp_comm, int32_t eos_token_id, bool bf16) {
  rollout::EngineOptions o;
  o.bf16 = bf16 && device == parallel::Device::kCpu;
  o.tp_comm = tp_comm;
  o.kv_cache_bytes = gen.gen_kv_cache_mb * (int64_t(1) << 20);
  o.max_batch = gen.gen_max_num_seqs;
  o.eos_token_id = eos_token_id;
  o.cuda = device == parallel::Device::kCuda;
  o.gpu_memory_utilization = gen.vllm_gpu_memory_utilization;
  o.cuda_graphs = !gen.enforce_eager;
  // auto and fp16 mean fp16 in a CPU engine; a GPU engine keeps bf16 whatever this says.
  o.kv_cache_dtype = rollout::kv_dtype_from_string(gen.kv_cache_dtype);
  o.block_size = gen.kv_block_size;
  return o;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t c = s.find(',', pos);
    if (c == std::string::npos) c = s.size();
    if (c > pos) out.push_back(s.substr(pos, c - pos));
    pos = c + 1;
  }
  return out;
}

rl::RewardOptions reward_options(const RewardArgs& args) {
  rl::RewardOptions o;
  o.format_pattern = args.reward_format_pattern;
  o.keywords = split_commas(args.reward_keywords);
  o.length_target = args.reward_length_target;
  o.command = args.reward_command;
  o.command_timeout_s = args.reward_command_timeout;
  return o;
}

optim::AdamWConfig make_adamw(const OptimArgs& args, double lr) {
  optim::AdamWConfig adam;
  adam.lr = lr;
  adam.beta1 = args.adam_betas[0];
  adam.beta2 = args.adam_betas[1];
  adam.weight_decay = args.l2;
  adam.validate("--adam_betas/--l2");
  return adam;
}

rl::SupervisedOptions supervised_options(const char* name, const CommonArgs& common,
                                         const TrainLoopArgs& loop, const OptimArgs& optim,
                                         const CheckpointArgs& ckpt) {
  rl::SupervisedOptions t;
  t.name = name;
  t.seed = common.seed;
  t.train_batch_size = loop.train_batch_size;
  t.micro_train_batch_size = loop.micro_train_batch_size;
  t.max_epochs = loop.max_epochs;
  t.max_steps = loop.max_steps;
  t.adam = make_adamw(optim, optim.learning_rate);
  t.lr_scheduler = optim.lr_scheduler;
  t.lr_warmup_ratio = optim.lr_warmup_ratio;
  t.max_norm = optim.max_norm;
  t.save_path = ckpt.save_path;
  t.save_steps = ckpt.save_steps;
  t.logging_steps = ckpt.logging_steps;
  t.ckpt_path = ckpt.ckpt_path;
  t.max_ckpt_num = ckpt.max_ckpt_num;
  t.save_hf_ckpt = ckpt.save_hf_ckpt;
  t.ckpt_format = ckpt.ckpt_format;
  t.load_checkpoint = ckpt.load_checkpoint;
  return t;
}

}  // namespace rlhf::app

// `rlhf export`: writes a model that --pretrain can read (HDF5 checkpoint, Hugging Face folder,
// llama2.c, GGUF) as a Hugging Face folder (config.json, model.safetensors, tokenizer files), our
// HDF5 checkpoint, or a GGUF file. Runs on rank 0; other ranks return at once.
#include <mpi.h>

#include <filesystem>

#include "app/commands.h"
#include "app/runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "io/dtype.h"
#include "io/hf_shards.h"
#include "io/peft_adapter.h"
#include "io/pretrained.h"
#include "rl/checkpoint.h"

namespace rlhf::app {

namespace {

namespace fs = std::filesystem;

io::DType dtype_of(const std::string& s) {
  if (s == "bfloat16") return io::DType::kBF16;
  if (s == "float16") return io::DType::kF16;
  return io::DType::kF32;
}

bool same_path(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::exists(a) && fs::exists(b) && fs::equivalent(a, b, ec);
}

}  // namespace

int run_export(const ExportArgs& args) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return 0;
  if (args.format == "peft") {
    // A LoRA training checkpoint's adapters as a PEFT folder.
    const rl::LoraCheckpoint ck = rl::read_lora_checkpoint(args.pretrain);
    const model::LoraLayout ll(model::layer_spec(ck.config), int(ck.config.num_hidden_layers),
                               ck.lora);
    io::write_peft_adapter(args.output_path, ll, ck.adapters.data(), "");
    LOG0_INFO("wrote {} (peft: {})", args.output_path, ll.describe());
    if (rl::has_lora_group(args.pretrain, "critic")) {  // a PPO run's LoRA critic, beside it
      const rl::LoraCheckpoint cc = rl::read_lora_checkpoint(args.pretrain, "critic");
      const model::LoraLayout cl(model::layer_spec(cc.config), int(cc.config.num_hidden_layers),
                                 cc.lora);
      const std::string dir = (fs::path(args.output_path) / "critic_adapter").string();
      io::write_peft_adapter(dir, cl, cc.adapters.data(), "");
      LOG0_INFO("wrote {} (peft, the critic: {})", dir, cl.describe());
    }
    return 0;
  }
  io::PretrainedModel m = io::open_pretrained_arg(args.pretrain, args.tokenizer);
  if (args.merge_lora) {
    const model::LoraConfig c = io::read_peft_adapter_config(args.lora_path);
    // A sequence-classification adapter's score head trains fully (modules_to_save): an LM base
    // has no score head to put it in, and merging the trunk alone would drop it.
    RLHF_CHECK(!c.save_score || m.head != model::HeadKind::kLM,
               "--merge_lora: {} is a sequence-classification adapter (task_type SEQ_CLS, "
               "modules_to_save score: its score head was trained) and --pretrain {} has an LM "
               "head; merging would drop the trained score head\nhint: merge it into the reward "
               "model (or critic) it was trained on",
               args.lora_path, args.pretrain);
    const model::LoraLayout ll(model::layer_spec(m.config), int(m.config.num_hidden_layers), c);
    m.tensors =
        io::merge_lora_tensors(m.tensors, ll, io::read_peft_adapter_weights(args.lora_path, ll));
    LOG0_INFO("merging {} from {}", ll.describe(), args.lora_path);
  }
  LOG0_INFO("export: {}", m.describe());
  LOG0_INFO("model: {} | {} parameters | {} layers, hidden {}, heads {}/{}, RoPE {}",
            m.config.model_type, m.config.num_parameters(m.head), m.config.num_hidden_layers,
            m.config.hidden_size, m.config.num_attention_heads, m.config.num_key_value_heads,
            model::to_string(m.config.rope_style));
  const io::DType dt = dtype_of(args.dtype);
  std::string out = args.output_path;
  if (args.format == "safetensors" || args.format == "hf") {
    RLHF_CHECK(!fs::exists(out) || fs::is_directory(out),
               "--output_path {}: exists and is not a folder (safetensors export writes a "
               "Hugging Face folder)",
               out);
    RLHF_CHECK(!same_path(out, m.path), "--output_path {} is the model's own folder", out);
    io::export_hf_folder(out, m, dt, io::parse_shard_size(args.max_shard_size));
  } else if (args.format == "hdf5") {
    if (fs::is_directory(out) || (!out.empty() && out.back() == '/'))
      out = (fs::path(out) / "model.h5").string();
    RLHF_CHECK(!same_path(out, m.path), "--output_path {} is the model being read", out);
    io::export_hdf5(out, m);
  } else {
    RLHF_CHECK(!fs::is_directory(out), "--output_path {}: a folder; GGUF export writes a file",
               out);
    RLHF_CHECK(!same_path(out, m.path), "--output_path {} is the model being read", out);
    io::export_gguf(out, m, dt);
  }
  LOG0_INFO("wrote {} ({}, {}){}", out, args.format, args.dtype,
            m.tokenizer ? fmt::format(" with tokenizer {}", m.tokenizer->name()) : "");
  return 0;
}

}  // namespace rlhf::app

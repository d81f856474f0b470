// A trainer's weights from and to files: the initial weights of a store (a pretrained model of any
// format, or a deterministic random init), and the consolidated model written as an HDF5
// checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "io/model_source.h"
#include "io/tokenizer.h"
#include "parallel/param_store.h"

namespace rlhf::rl {

/// Fills the store's master weights: from the pretrained model (shapes checked) or a deterministic
/// random init with `seed` (the same weights for any rank count). A value/reward model started
/// from an LM keeps the trunk and the final norm and initialises score.weight randomly. A LoRA
/// store (parallel/lora_store.h) also gets its adapters: the PEFT folder of its config's path
/// (--lora_path), else fresh ones (model::lora_init with `seed`).
/// Collective over the store's communicator.
void initialize_weights(parallel::ParamStore& store, const io::ModelSource& src, uint64_t seed);

/// Writes the store's consolidated model to `path` (HDF5, .tmp + rename) from rank 0; collective.
/// With a tokenizer, its files go under /tokenizer so the checkpoint restores it. A LoRA store
/// (parallel/lora_store.h) writes the merged model there and its adapter as a PEFT folder,
/// lora_adapter_dir(path).
/// Returns (and rank 0 logs) a fingerprint of the weights: FNV-1a 64 over the fp32 bytes of every
/// tensor in layout order — equal fingerprints mean bit-identical weights.
/// Where save_model puts a LoRA run's PEFT adapter: "<dir>/model.h5" -> "<dir>/model_adapter".
std::string lora_adapter_dir(const std::string& model_path);

uint64_t save_model(parallel::ParamStore& store, const std::string& path, int rank,
                    const io::Tokenizer* tokenizer = nullptr);

/// Writes the store's consolidated model as a Hugging Face folder `dir` from rank 0 (collective):
/// config.json, model.safetensors (float32), generation_config.json and, with a tokenizer, the
/// tokenizer files of io/tokenizer_export.h — what io::export_hf_folder writes. The folder is
/// written as `<dir>.tmp` and renamed over `dir` (an older one is replaced). Throws rlhf::Error
/// when the tokenizer cannot be written (naming its kind).
void save_hf_model(parallel::ParamStore& store, const std::string& dir, int rank,
                   const io::Tokenizer* tokenizer);

}  // namespace rlhf::rl

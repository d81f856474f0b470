// Pretrained models from any supported file format, behind one interface: the architecture
// (ModelConfig + head), the tensors by Hugging Face name (fp32), and the tokenizer that came with
// the model.
//
// Formats (detected from the path and the file's first bytes):
//   hdf5         our checkpoint (io/hdf5_ckpt.h): a file, or a directory holding model.h5
//   safetensors  a Hugging Face folder: config.json + model.safetensors, or shards
//                model-0000x-of-0000y.safetensors listed in model.safetensors.index.json
//                (F32/BF16/F16; a tied embedding stored as model.embed_tokens.weight or
//                lm_head.weight; Llama, Mistral, Qwen2 with q/k/v bias, SmolLM)
//   llama2c      a llama2.c checkpoint, legacy or v1 (io/llama2c.h; interleaved RoPE)
//   gguf         a GGUF v2/v3 file (io/gguf.h; F32/F16/BF16/Q8_0/Q4_0/Q4_1; rotate-half RoPE
//                after undoing llama.cpp's Q/K permutation)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "io/tensor_source.h"
#include "io/tokenizer.h"
#include "model/config.h"
#include "model/layout.h"

namespace rlhf::io {

/// A model opened from disk: everything but the weights is read eagerly, the weights lazily
/// (through `tensors`, which keeps the files mapped).
struct PretrainedModel {
  std::string path;    ///< the model file (or HF folder) actually read
  std::string format;  ///< "hdf5" | "safetensors" | "llama2c" | "gguf"
  std::string detail;  ///< e.g. "llama2.c v1", "GGUF v3 (F16, F32)", "safetensors BF16, 1 file"
  model::ModelConfig config;
  model::HeadKind head = model::HeadKind::kLM;
  std::shared_ptr<const TensorSource> tensors;
  /// The model's own tokenizer (or the one named by tokenizer_path); null when none was found.
  std::shared_ptr<const Tokenizer> tokenizer;
  std::string tokenizer_origin;  ///< where the tokenizer came from ("" when none)

  /// One line for logs: "<format detail> <path> | tokenizer <name> (<origin>)".
  std::string describe() const;
};

/// The format of `path` ("hdf5", "safetensors", "llama2c", "gguf") from its name and first bytes;
/// throws rlhf::Error "<path>: no such file" or "<path>: unrecognised model format (...)" with a
/// hint listing the formats.
std::string detect_model_format(const std::string& path);

/// Opens a pretrained model (see the file comment for formats). `tokenizer_path` ("" = none)
/// overrides the tokenizer: a file or folder for make_tokenizer. Without it, the model's own
/// tokenizer is used: the HDF5 checkpoint's /tokenizer group; tokenizer.json (else
/// tokenizer.model, else a llama2.c tokenizer.bin) in an HF folder; the vocabulary embedded in a
/// GGUF file; for llama2.c, a tokenizer.bin or tok<vocab_size>.bin next to the checkpoint.
/// A tokenizer whose vocabulary is larger than the model's is an error, and so is a llama2.c
/// tokenizer.bin whose token count differs from the model's vocab_size. Errors name the file and
/// what is wrong (missing config.json, a shard listed in the index but absent, a tensor whose shape
/// disagrees with the config, ...).
PretrainedModel open_pretrained(const std::string& path, const std::string& tokenizer_path = "");

/// Fills unit `unit`'s flat buffer (layout.unit(unit).numel fp32) from `m.tensors`: every
/// tensor of the unit after a shape check (read_checked), zeros in the gaps.
void load_pretrained_unit(const PretrainedModel& m, const model::ParamLayout& layout, int unit,
                          float* unit_buffer);

// --- export ----------------------------------------------------------------------------------

/// Key that export_hf_folder adds to config.json when it permuted interleaved Q/K rows to HF's
/// rotate-half order; the safetensors reader then permutes them back, so import(export(x)) is
/// bitwise x while Hugging Face transformers computes the same function as our model.
inline constexpr const char* kRopePermutedKey = "rlhf_rope_permuted_from";

/// Writes a Hugging Face folder `dir`: config.json (ModelConfig::to_json with the head's
/// architecture; "torch_dtype" = dtype), the weights (every tensor of the layout, stored as
/// `dtype` F32/BF16/F16) as model.safetensors when they fit `max_shard_bytes`, else sharded as
/// transformers shards them (io/hf_shards.h: model-0000k-of-0000n.safetensors +
/// model.safetensors.index.json; weight files of an earlier export in `dir` are removed),
/// generation_config.json (the tokenizer's BOS/EOS/PAD ids, else the
/// config's) and, when m.tokenizer is set, tokenizer.json + tokenizer_config.json that
/// transformers' AutoTokenizer loads (io/tokenizer_export.h hf_tokenizer_files; an error naming the
/// tokenizer kind when it cannot be written); without a tokenizer, a warning. An interleaved-RoPE
/// model is written with Q/K rows permuted to rotate-half (see kRopePermutedKey). Files are written
/// to .tmp names and renamed.
void export_hf_folder(const std::string& dir, const PretrainedModel& m, DType dtype,
                      int64_t max_shard_bytes = 5'000'000'000);

/// Writes our HDF5 checkpoint at `path` (the model and, when m.tokenizer is set, its tokenizer
/// files under /tokenizer; io/hdf5_ckpt.h write_tokenizer_hdf5), streaming one tensor at a time.
void export_hdf5(const std::string& path, const PretrainedModel& m);

/// Writes a GGUF v3 file at `path`: llama.cpp metadata for the architecture, tensors under GGUF
/// names with Q/K rows in llama.cpp's (interleaved) order for "llama" models, stored as `dtype`
/// (F32, F16 or BF16; norms stay F32 as llama.cpp keeps them), <arch>.vocab_size, and the
/// tokenizer as tokenizer.ggml.* metadata with tokenizer.chat_template (io/tokenizer_export.h
/// write_gguf_tokenizer; a warning when the model has none). Throws for a non-LM head.
void export_gguf(const std::string& path, const PretrainedModel& m, DType dtype);

}  // namespace rlhf::io

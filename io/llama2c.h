// llama2.c model checkpoints (Karpathy's llama2.c, export.py): fp32 weights in Meta's layout, whose
// Q/K rows pair dimensions (2i, 2i+1) for RoPE (RopeStyle::kInterleaved).
//
// Legacy layout ("version 0"): 7 x int32 header (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size, seq_len; a negative vocab_size means the classifier is not tied to the embedding),
// then token embedding, attention norms, wq, wk, wv, wo (all layers each), ffn norms, w1, w2, w3,
// final norm, two unused RoPE tables (seq_len x head_dim/2 floats each), then the classifier if
// untied.
// v1 layout: 256-byte header (uint32 magic 0x616b3432 "ak42", int32 version = 1, the 7 ints,
// uint8 shared_classifier, zero padding), then attention norms, ffn norms, final norm, embedding,
// wq, wk, wv, wo, w1, w2, w3 (all layers each), then the classifier if not shared.
// w1 = gate_proj, w2 = down_proj, w3 = up_proj.
#pragma once

#include <memory>
#include <string>

#include "io/bytes.h"
#include "io/tensor_source.h"
#include "model/config.h"

namespace rlhf::io {

/// The magic number of llama2.c's versioned exports ("ak42" read as a little-endian uint32).
inline constexpr uint32_t kLlama2cMagic = 0x616b3432;

/// A parsed llama2.c checkpoint header.
struct Llama2cHeader {
  int version = 0;  ///< 0 = legacy, 1 = v1
  int64_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0,
          seq_len = 0;
  bool shared_classifier = true;
  int64_t weights_offset = 0;  ///< byte offset of the first weight
  int64_t expected_bytes = 0;  ///< exact file size the header implies
};

/// True if the blob starts like a llama2.c checkpoint: the v1 magic, or a legacy header whose
/// fields are plausible and (with `check_size`) whose implied size equals the blob's size.
/// Never throws.
bool looks_like_llama2c(const Blob& blob, bool check_size = true);

/// Parses and validates the header against the blob's size: positive dimensions within sane limits
/// (each < 2^24, n_layers < 4096), n_heads divisible by n_kv_heads, dim divisible by n_heads, even
/// head dim, and a file size exactly equal to what the header implies. Throws rlhf::Error naming
/// blob.source and the field.
Llama2cHeader parse_llama2c_header(const Blob& blob);

/// The ModelConfig of a llama2.c header: RopeStyle::kInterleaved, rms_norm_eps 1e-5,
/// rope_theta 1e4, tie_word_embeddings = shared classifier, BOS 1, EOS 2, PAD 0 (llama2.c's).
model::ModelConfig llama2c_model_config(const Llama2cHeader& h);

/// TensorSource over a llama2.c checkpoint (HF names; fp32). Keeps the blob alive.
std::unique_ptr<TensorSource> open_llama2c_tensors(Blob blob, const Llama2cHeader& h);

}  // namespace rlhf::io

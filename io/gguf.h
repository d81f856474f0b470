// GGUF files (ggml / llama.cpp), versions 2 and 3: a header ("GGUF", uint32 version, uint64 tensor
// count, uint64 metadata count), typed key/value metadata, tensor infos (name, dims in ggml order
// — ne[0] is the contiguous one —, ggml type, offset), then the tensor data, each tensor aligned to
// `general.alignment` (32 by default). Format reference: ggml's docs/gguf.md.
//
// Reading maps llama.cpp's tensor names to Hugging Face names and undoes the Q/K row permutation
// that llama.cpp's converter applies for the "llama" architecture (HF rotate-half rows → Meta's
// interleaved rows), so the weights come out in HF layout with RopeStyle::kRotateHalf; "qwen2"
// files are stored unpermuted (llama.cpp runs them with NeoX = rotate-half RoPE) and are read as
// they are.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/bytes.h"
#include "io/dtype.h"
#include "io/tensor_source.h"
#include "model/config.h"

namespace rlhf::io {

/// "GGUF" as a little-endian uint32.
inline constexpr uint32_t kGgufMagic = 0x46554747;

/// GGUF metadata value types (gguf_type).
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

/// One tensor's info.
struct GgufTensorInfo {
  std::vector<int64_t> ne;  ///< ggml order: ne[0] is the contiguous dimension
  DType type = DType::kF32;
  uint64_t offset = 0;  ///< from the start of the data section
  int64_t numel = 0;
  int64_t bytes = 0;
  /// HF-order shape (ne reversed).
  std::vector<int64_t> shape() const { return {ne.rbegin(), ne.rend()}; }
};

/// A parsed GGUF file. Metadata values are JSON (numbers, bools, strings, arrays); strings keep
/// their raw bytes. The Blob stays alive with it.
struct GgufFile {
  Blob blob;
  uint32_t version = 0;
  nlohmann::json metadata = nlohmann::json::object();
  std::map<std::string, GgufType> metadata_types;  ///< stored type of each key (array: kArray)
  std::map<std::string, GgufTensorInfo> tensors;
  std::vector<std::string> tensor_order;  ///< tensor names in file order
  uint64_t alignment = 32;
  int64_t data_offset = 0;

  /// Converts tensor `name` (GGUF name) to fp32 (numel floats), in the file's row order.
  void read_f32(const std::string& name, float* out) const;
};

/// Parses and validates a GGUF blob: magic, version 2 or 3, counts that fit the remaining bytes
/// before anything is allocated, string and array lengths within the file, nested arrays at most
/// 2 deep, a power-of-two alignment <= 1 MiB, tensor names unique, at most 4 dims each, known types
/// (F32, F16, BF16, Q8_0, Q4_0, Q4_1; others rejected by name), element counts that do not
/// overflow and fill whole quantisation blocks, aligned offsets, and every tensor's bytes inside
/// the file. Errors are rlhf::Error naming blob.source and the key or tensor.
GgufFile parse_gguf(Blob blob);

/// map_file + parse_gguf.
GgufFile open_gguf(const std::string& path);

/// The ModelConfig from GGUF metadata (general.architecture "llama" or "qwen2"; "mistral" files
/// use "llama"): <arch>.embedding_length, .block_count, .feed_forward_length,
/// .attention.head_count(_kv), .attention.key_length, .attention.layer_norm_rms_epsilon,
/// .rope.freq_base (default 1e4), .context_length; vocab size from the embedding tensor; tied when
/// there is no "output.weight"; BOS/EOS/PAD from tokenizer.ggml.*_token_id. rope_style is
/// kRotateHalf (the reader undoes llama.cpp's permutation). Throws on a missing key, an
/// unsupported architecture, or rope scaling.
model::ModelConfig gguf_model_config(const GgufFile& f);

/// TensorSource with HF names over a GGUF file of a llama/qwen2 model (see the file comment).
std::unique_ptr<TensorSource> open_gguf_tensors(std::shared_ptr<const GgufFile> f,
                                                const model::ModelConfig& config);

/// The GGUF name of an HF tensor name ("model.layers.3.self_attn.q_proj.weight" →
/// "blk.3.attn_q.weight"), or "" if it has none.
std::string hf_to_gguf_name(const std::string& hf_name);
/// The HF name of a GGUF tensor name, or "" if it has none.
std::string gguf_to_hf_name(const std::string& gguf_name);

/// Reorders the rows of a Q or K projection (rows = n_heads·D, `cols` columns; cols = 1 for a bias)
/// in place. to_interleaved: HF rotate-half rows (pair i, i + D/2) → Meta/GGUF interleaved rows
/// (pair 2i, 2i+1), as llama.cpp's converter does; else the inverse. Exact (a permutation).
void permute_qk_rows(float* w, int64_t n_heads, int64_t D, int64_t cols, bool to_interleaved);

/// Builds a GGUF file (version 3) in memory-light steps: metadata first, then tensors whose data
/// is produced by callbacks when write() streams them out.
class GgufWriter {
 public:
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_f32_array(const std::string& key, const std::vector<float>& v);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
  /// A tensor with ggml-order dims `ne`, stored as `type` (F32, F16 or BF16); `fill` writes its
  /// numel fp32 values in the file's row order.
  void add_tensor(const std::string& name, const std::vector<int64_t>& ne, DType type,
                  std::function<void(float*)> fill);
  /// Writes the file (via .tmp + rename). alignment = general.alignment (32).
  void write(const std::string& path) const;
  /// The whole file as bytes (for small files, e.g. a tokenizer-only GGUF).
  std::string to_bytes() const;

 private:
  struct Kv {
    std::string key;
    std::string bytes;  // type tag + value, encoded
  };
  struct Tensor {
    std::string name;
    std::vector<int64_t> ne;
    DType type;
    std::function<void(float*)> fill;
  };
  void emit(const std::function<void(const void*, size_t)>& sink, const std::string& what) const;

  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace rlhf::io

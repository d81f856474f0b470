#include "io/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <regex>

#include "core/error.h"
#include "io/file_util.h"

namespace rlhf::io {

namespace {

constexpr uint64_t kMaxAlignment = uint64_t{1} << 20;
constexpr int kMaxArrayDepth = 2;

// ggml_type ids (ggml.h).
std::optional<DType> dtype_of_ggml(uint32_t t) {
  switch (t) {
    case 0:
      return DType::kF32;
    case 1:
      return DType::kF16;
    case 2:
      return DType::kQ4_0;
    case 3:
      return DType::kQ4_1;
    case 8:
      return DType::kQ8_0;
    case 30:
      return DType::kBF16;
    default:
      return std::nullopt;
  }
}

uint32_t ggml_of_dtype(DType t) {
  switch (t) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kQ4_0:
      return 2;
    case DType::kQ4_1:
      return 3;
    case DType::kQ8_0:
      return 8;
    case DType::kBF16:
      return 30;
  }
  return 0;
}

std::string ggml_type_name(uint32_t t) {
  static const char* names[] = {"F32",  "F16",  "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1",
                                "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"};
  if (t < 16) return names[t];
  if (t == 30) return "BF16";
  return fmt::format("ggml type {}", t);
}

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    default:
      return 0;
  }
}

std::string read_gguf_string(ByteReader& r, const char* what) {
  const uint64_t n = r.read<uint64_t>(what);
  RLHF_CHECK(n <= r.remaining(),
             "{}: truncated or corrupt: {} of {} bytes at byte {}, only {} remain", r.source(),
             what, n, r.pos(), r.remaining());
  return r.read_string(n, what);
}

nlohmann::json read_value(ByteReader& r, GgufType type, const std::string& key, int depth) {
  switch (type) {
    case GgufType::kU8:
      return r.read<uint8_t>("metadata value");
    case GgufType::kI8:
      return r.read<int8_t>("metadata value");
    case GgufType::kU16:
      return r.read<uint16_t>("metadata value");
    case GgufType::kI16:
      return r.read<int16_t>("metadata value");
    case GgufType::kU32:
      return r.read<uint32_t>("metadata value");
    case GgufType::kI32:
      return r.read<int32_t>("metadata value");
    case GgufType::kF32: {
      // The shortest decimal that rounds to this float: 1e-5 stored as f32 reads back as 1e-5.
      const float f = r.read<float>("metadata value");
      return std::strtod(fmt::format("{}", f).c_str(), nullptr);
    }
    case GgufType::kBool: {
      const uint8_t b = r.read<uint8_t>("metadata value");
      RLHF_CHECK(b <= 1, "{}: corrupt metadata '{}': bool value {}", r.source(), key, b);
      return b != 0;
    }
    case GgufType::kString:
      return read_gguf_string(r, "metadata string");
    case GgufType::kU64:
      return r.read<uint64_t>("metadata value");
    case GgufType::kI64:
      return r.read<int64_t>("metadata value");
    case GgufType::kF64:
      return r.read<double>("metadata value");
    case GgufType::kArray: {
      RLHF_CHECK(depth < kMaxArrayDepth, "{}: corrupt metadata '{}': arrays nested too deep",
                 r.source(), key);
      const uint32_t et = r.read<uint32_t>("array type");
      RLHF_CHECK(et <= 12, "{}: corrupt metadata '{}': unknown array element type {}", r.source(),
                 key, et);
      const uint64_t n = r.read<uint64_t>("array length");
      const GgufType elem = static_cast<GgufType>(et);
      // Every element takes at least this many bytes: check before allocating anything.
      const uint64_t min_bytes = elem == GgufType::kString  ? 8
                                 : elem == GgufType::kArray ? 12
                                                            : scalar_size(elem);
      RLHF_CHECK(n <= r.remaining() / min_bytes,
                 "{}: truncated or corrupt: metadata '{}' claims {} array elements, the file has "
                 "{} bytes left",
                 r.source(), key, n, r.remaining());
      nlohmann::json a = nlohmann::json::array();
      a.get_ref<nlohmann::json::array_t&>().reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) a.push_back(read_value(r, elem, key, depth + 1));
      return a;
    }
  }
  RLHF_FAIL("{}: corrupt metadata '{}': unknown value type {}", r.source(), key,
            static_cast<uint32_t>(type));
}

// --- writer encoding -----------------------------------------------------------------------

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_str(std::string& s, const std::string& v) {
  put<uint64_t>(s, v.size());
  s += v;
}

}  // namespace

void GgufFile::read_f32(const std::string& name, float* out) const {
  auto it = tensors.find(name);
  RLHF_CHECK(it != tensors.end(), "{}: no tensor '{}'", blob.source, name);
  convert_to_f32(it->second.type, blob.data + data_offset + it->second.offset, out,
                 it->second.numel);
}

GgufFile parse_gguf(Blob blob) {
  GgufFile f;
  ByteReader r(blob);
  const std::string& src = blob.source;
  const uint32_t magic = r.read<uint32_t>("magic");
  RLHF_CHECK(magic == kGgufMagic, "{}: not a GGUF file (magic {:#010x})", src, magic);
  f.version = r.read<uint32_t>("version");
  RLHF_CHECK(f.version == 2 || f.version == 3,
             "{}: GGUF version {} is not supported (2 and 3 are){}", src, f.version,
             f.version == 1 ? "\nhint: convert GGUF v1 files with a newer llama.cpp" : "");
  const uint64_t n_tensors = r.read<uint64_t>("tensor count");
  const uint64_t n_kv = r.read<uint64_t>("metadata count");
  // A key/value takes >= 8 (key length) + 4 (type) + 1 bytes; a tensor info >= 8 + 4 + 8 + 4 + 8.
  RLHF_CHECK(n_kv <= r.remaining() / 13,
             "{}: truncated or corrupt: {} metadata entries cannot fit in {} bytes", src, n_kv,
             r.remaining());
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = read_gguf_string(r, "metadata key");
    const uint32_t t = r.read<uint32_t>("metadata type");
    RLHF_CHECK(t <= 12, "{}: corrupt metadata '{}': unknown value type {}", src, key, t);
    RLHF_CHECK(!f.metadata.contains(key), "{}: corrupt: metadata key '{}' appears twice", src, key);
    f.metadata[key] = read_value(r, static_cast<GgufType>(t), key, 0);
    f.metadata_types[key] = static_cast<GgufType>(t);
  }
  if (f.metadata.contains("general.alignment")) {
    const auto& a = f.metadata["general.alignment"];
    RLHF_CHECK(a.is_number_unsigned(), "{}: general.alignment must be an unsigned integer", src);
    f.alignment = a.get<uint64_t>();
    RLHF_CHECK(
        f.alignment > 0 && f.alignment <= kMaxAlignment && (f.alignment & (f.alignment - 1)) == 0,
        "{}: corrupt general.alignment {} (must be a power of two <= {})", src, f.alignment,
        kMaxAlignment);
  }
  RLHF_CHECK(n_tensors <= r.remaining() / 32,
             "{}: truncated or corrupt: {} tensor infos cannot fit in {} bytes", src, n_tensors,
             r.remaining());
  for (uint64_t i = 0; i < n_tensors; ++i) {
    std::string name = read_gguf_string(r, "tensor name");
    const uint32_t nd = r.read<uint32_t>("tensor dimension count");
    RLHF_CHECK(nd >= 1 && nd <= 4, "{}: corrupt tensor '{}': {} dimensions (1..4 allowed)", src,
               name, nd);
    GgufTensorInfo info;
    info.numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t ne = r.read<uint64_t>("tensor dimension");
      RLHF_CHECK(ne <= (uint64_t{1} << 62), "{}: corrupt tensor '{}': dimension {}", src, name, ne);
      info.ne.push_back(static_cast<int64_t>(ne));
      info.numel =
          checked_mul(info.numel, info.ne.back(), src + ": tensor '" + name + "'", "element count");
    }
    const uint32_t t = r.read<uint32_t>("tensor type");
    const auto dt = dtype_of_ggml(t);
    RLHF_CHECK(dt.has_value(),
               "{}: tensor '{}' has type {}, which is not supported\nhint: F32, F16, BF16, Q8_0, "
               "Q4_0 and Q4_1 are; requantise with llama.cpp's llama-quantize",
               src, name, ggml_type_name(t));
    info.type = *dt;
    RLHF_CHECK(info.ne[0] % dtype_block_elems(info.type) == 0,
               "{}: corrupt tensor '{}': row length {} is not a multiple of the {} block size", src,
               name, info.ne[0], to_string(info.type));
    info.bytes = dtype_bytes(info.type, info.numel, src + ": tensor '" + name + "'");
    info.offset = r.read<uint64_t>("tensor offset");
    RLHF_CHECK(info.offset % f.alignment == 0,
               "{}: corrupt tensor '{}': offset {} is not a multiple of the alignment {}", src,
               name, info.offset, f.alignment);
    RLHF_CHECK(!f.tensors.count(name), "{}: corrupt: tensor '{}' appears twice", src, name);
    f.tensor_order.push_back(name);
    f.tensors.emplace(std::move(name), std::move(info));
  }
  const uint64_t pos = r.pos();
  const uint64_t data = (pos + f.alignment - 1) / f.alignment * f.alignment;
  RLHF_CHECK(data <= blob.size || f.tensors.empty(),
             "{}: truncated: the tensor data should start at byte {}, the file has {}", src, data,
             blob.size);
  f.data_offset = static_cast<int64_t>(data);
  const uint64_t data_size = blob.size > data ? blob.size - data : 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, info] : f.tensors) {
    const uint64_t b = static_cast<uint64_t>(info.bytes);
    RLHF_CHECK(info.offset <= data_size && b <= data_size - info.offset,
               "{}: truncated or corrupt: tensor '{}' ({} bytes at data offset {}) ends past the "
               "end of the file ({} data bytes)",
               src, name, b, info.offset, data_size);
    if (b > 0) ranges.emplace_back(info.offset, info.offset + b);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    RLHF_CHECK(ranges[i].first >= ranges[i - 1].second,
               "{}: corrupt: tensor data ranges overlap at data offset {}", src, ranges[i].first);
  f.blob = std::move(blob);
  return f;
}

GgufFile open_gguf(const std::string& path) {
  return parse_gguf(map_file(path));
}

// --- names -----------------------------------------------------------------------------------

namespace {

struct NamePair {
  const char* gguf;
  const char* hf;
};
// Per-layer tensors (without the "blk.N." / "model.layers.N." prefix and the .weight/.bias
// suffix).
constexpr NamePair kLayerNames[] = {
    {"attn_norm", "input_layernorm"},    {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},      {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},       {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"},
};
constexpr NamePair kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// "<prefix><digits>.<rest>" → (layer, rest); false if no match.
bool split_layer(const std::string& s, const std::string& prefix, int64_t* layer,
                 std::string* rest) {
  if (s.rfind(prefix, 0) != 0) return false;
  size_t i = prefix.size(), j = i;
  while (j < s.size() && j - i < 9 && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
  if (j == i || j >= s.size() || s[j] != '.') return false;
  *layer = std::stoll(s.substr(i, j - i));
  *rest = s.substr(j + 1);
  return true;
}

}  // namespace

std::string hf_to_gguf_name(const std::string& hf) {
  for (const auto& p : kGlobalNames)
    if (hf == p.hf) return p.gguf;
  int64_t l = 0;
  std::string rest;
  if (!split_layer(hf, "model.layers.", &l, &rest)) return "";
  for (const auto& p : kLayerNames) {
    for (const char* suffix : {".weight", ".bias"})
      if (rest == std::string(p.hf) + suffix) return fmt::format("blk.{}.{}{}", l, p.gguf, suffix);
  }
  return "";
}

std::string gguf_to_hf_name(const std::string& g) {
  for (const auto& p : kGlobalNames)
    if (g == p.gguf) return p.hf;
  int64_t l = 0;
  std::string rest;
  if (!split_layer(g, "blk.", &l, &rest)) return "";
  for (const auto& p : kLayerNames) {
    for (const char* suffix : {".weight", ".bias"})
      if (rest == std::string(p.gguf) + suffix)
        return fmt::format("model.layers.{}.{}{}", l, p.hf, suffix);
  }
  return "";
}

void permute_qk_rows(float* w, int64_t n_heads, int64_t D, int64_t cols, bool to_interleaved) {
  const int64_t half = D / 2;
  std::vector<float> tmp(static_cast<size_t>(D * cols));
  for (int64_t h = 0; h < n_heads; ++h) {
    float* head = w + h * D * cols;
    std::copy(head, head + D * cols, tmp.begin());
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t hf_row = j * half + i, il_row = 2 * i + j;
        const int64_t dst = to_interleaved ? il_row : hf_row;
        const int64_t src = to_interleaved ? hf_row : il_row;
        std::copy(tmp.begin() + src * cols, tmp.begin() + (src + 1) * cols, head + dst * cols);
      }
    }
  }
}

// --- config ----------------------------------------------------------------------------------

model::ModelConfig gguf_model_config(const GgufFile& f) {
  const std::string& src = f.blob.source;
  const nlohmann::json& m = f.metadata;
  RLHF_CHECK(m.contains("general.architecture") && m["general.architecture"].is_string(),
             "{}: no general.architecture in the GGUF metadata", src);
  const std::string arch = m["general.architecture"].get<std::string>();
  RLHF_CHECK(arch == "llama" || arch == "qwen2" || arch == "qwen3",
             "{}: GGUF architecture '{}' is not supported\nhint: llama (also Mistral, SmolLM, "
             "TinyLlama), qwen2 and qwen3 are",
             src, arch);
  auto num = [&](const std::string& key, bool required, double def) -> double {
    const std::string k = arch + "." + key;
    if (!m.contains(k)) {
      RLHF_CHECK(!required, "{}: GGUF metadata lacks {}", src, k);
      return def;
    }
    RLHF_CHECK(m[k].is_number(), "{}: GGUF metadata {} is not a number", src, k);
    return m[k].get<double>();
  };
  // A count, at most `limit` (the ModelConfig bound of the field it becomes: model/config.h).
  auto integer = [&](const std::string& key, bool required, int64_t def, int64_t limit,
                     const char* field) -> int64_t {
    const double v = num(key, required, static_cast<double>(def));
    RLHF_CHECK(v >= 0 && v < 9.0e15 && v == std::floor(v),
               "{}: GGUF metadata {}.{} = {} is not a "
               "valid count",
               src, arch, key, v);
    RLHF_CHECK(v <= static_cast<double>(limit),
               "{}: GGUF metadata {}.{} = {:.0f} exceeds the limit {} ({})\nhint: every model we "
               "run is far below it; the file is probably corrupt",
               src, arch, key, v, limit, field);
    return static_cast<int64_t>(v);
  };
  model::ModelConfig c;
  c.model_type = arch;
  c.hidden_size = integer("embedding_length", true, 0, model::kMaxHiddenSize, "hidden_size");
  c.num_hidden_layers =
      integer("block_count", true, 0, model::kMaxHiddenLayers, "num_hidden_layers");
  c.intermediate_size =
      integer("feed_forward_length", true, 0, model::kMaxIntermediateSize, "intermediate_size");
  c.num_attention_heads =
      integer("attention.head_count", true, 0, model::kMaxAttentionHeads, "num_attention_heads");
  c.num_key_value_heads = integer("attention.head_count_kv", false, c.num_attention_heads,
                                  model::kMaxAttentionHeads, "num_key_value_heads");
  c.max_position_embeddings = integer("context_length", false, 2048, model::kMaxPositionEmbeddings,
                                      "max_position_embeddings");
  c.rms_norm_eps = num("attention.layer_norm_rms_epsilon", false, 1e-5);
  c.rope_theta = num("rope.freq_base", false, 10000.0);
  const int64_t key_len = integer("attention.key_length", false, 0, model::kMaxHeadDim, "head_dim");
  RLHF_CHECK(c.num_attention_heads > 0, "{}: {}.attention.head_count is 0", src, arch);
  if (key_len > 0 && key_len * c.num_attention_heads != c.hidden_size) c.head_dim = key_len;
  const int64_t rope_dims =
      integer("rope.dimension_count", false, c.D(), model::kMaxHiddenSize, "head_dim");
  RLHF_CHECK(rope_dims == c.D(),
             "{}: partial RoPE ({}.rope.dimension_count {} < head dim {}) is not supported", src,
             arch, rope_dims, c.D());
  for (const char* k : {".rope.scaling.type", ".rope.scaling.factor"}) {
    const std::string key = arch + k;
    if (!m.contains(key)) continue;
    const bool none = (m[key].is_string() && m[key] == "none") ||
                      (m[key].is_number() && m[key].get<double>() == 1.0);
    RLHF_CHECK(none, "{}: RoPE scaling ({} = {}) is not supported", src, key, m[key].dump());
  }
  RLHF_CHECK(!f.tensors.count("rope_freqs.weight"),
             "{}: the model carries rope_freqs (RoPE scaling), which is not supported", src);
  auto emb = f.tensors.find("token_embd.weight");
  RLHF_CHECK(emb != f.tensors.end() && emb->second.ne.size() == 2,
             "{}: no 2-D token_embd.weight tensor", src);
  c.vocab_size = emb->second.ne[1];
  RLHF_CHECK(c.vocab_size <= model::kMaxVocabSize,
             "{}: token_embd.weight has {} rows (the vocabulary), more than the limit {} "
             "(vocab_size)\nhint: every model we run is far below it; the file is probably corrupt",
             src, c.vocab_size, model::kMaxVocabSize);
  c.tie_word_embeddings = !f.tensors.count("output.weight");
  c.attention_bias = false;  // llama with attention_bias is not produced by llama.cpp converters
  c.rope_style = model::RopeStyle::kRotateHalf;
  auto token = [&](const char* key, int64_t def) -> int64_t {
    if (!m.contains(key) || !m[key].is_number_integer()) return def;
    const int64_t v = m[key].get<int64_t>();
    return v >= 0 && v < c.vocab_size ? v : def;
  };
  c.bos_token_id = token("tokenizer.ggml.bos_token_id", c.vocab_size > 1 ? 1 : -1);
  c.eos_token_id = token("tokenizer.ggml.eos_token_id", c.vocab_size > 2 ? 2 : -1);
  c.pad_token_id = token("tokenizer.ggml.padding_token_id", c.vocab_size > 0 ? 0 : -1);
  c.validate(src);
  return c;
}

namespace {

class GgufTensors final : public TensorSource {
 public:
  GgufTensors(std::shared_ptr<const GgufFile> f, const model::ModelConfig& c)
      : f_(std::move(f)), config_(c) {
    permute_ = f_->metadata.value("general.architecture", std::string()) == "llama";
    for (const auto& [name, info] : f_->tensors) {
      const std::string hf = gguf_to_hf_name(name);
      if (!hf.empty()) map_[hf] = name;
    }
  }
  const std::string& source() const override { return f_->blob.source; }
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const auto& [hf, g] : map_) n.push_back(hf);
    return n;
  }
  std::optional<TensorMeta> find(const std::string& name) const override {
    auto it = map_.find(name);
    if (it == map_.end()) return std::nullopt;
    const GgufTensorInfo& info = f_->tensors.at(it->second);
    return TensorMeta{info.shape(), to_string(info.type)};
  }
  void read(const std::string& name, float* out) const override {
    auto it = map_.find(name);
    RLHF_CHECK(it != map_.end(), "{}: no tensor '{}'", source(), name);
    f_->read_f32(it->second, out);
    if (!permute_) return;
    const bool q = name.find("self_attn.q_proj.") != std::string::npos;
    const bool k = name.find("self_attn.k_proj.") != std::string::npos;
    if (!q && !k) return;
    const GgufTensorInfo& info = f_->tensors.at(it->second);
    const int64_t heads = q ? config_.num_attention_heads : config_.num_key_value_heads;
    const int64_t D = config_.D();
    const int64_t rows = info.ne.size() == 1 ? info.ne[0] : info.ne[1];
    const int64_t cols = info.ne.size() == 1 ? 1 : info.ne[0];
    RLHF_CHECK(rows == heads * D && info.ne.size() <= 2,
               "{}: tensor '{}' has shape {}, the config needs {} rows", source(), it->second,
               shape_to_string(info.shape()), heads * D);
    permute_qk_rows(out, heads, D, cols, /*to_interleaved=*/false);
  }

 private:
  std::shared_ptr<const GgufFile> f_;
  model::ModelConfig config_;
  bool permute_ = false;
  std::map<std::string, std::string> map_;  // HF name → GGUF name
};

}  // namespace

std::unique_ptr<TensorSource> open_gguf_tensors(std::shared_ptr<const GgufFile> f,
                                                const model::ModelConfig& config) {
  return std::make_unique<GgufTensors>(std::move(f), config);
}

// --- writer ----------------------------------------------------------------------------------

void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  std::string s;
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::kU32));
  put(s, v);
  kvs_.push_back({key, s});
}
void GgufWriter::add_i32(const std::string& key, int32_t v) {
  std::string s;
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::kI32));
  put(s, v);
  kvs_.push_back({key, s});
}
void GgufWriter::add_f32(const std::string& key, float v) {
  std::string s;
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::kF32));
  put(s, v);
  kvs_.push_back({key, s});
}
void GgufWriter::add_bool(const std::string& key, bool v) {
  std::string s;
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::kBool));
  put<uint8_t>(s, v ? 1 : 0);
  kvs_.push_back({key, s});
}
void GgufWriter::add_string(const std::string& key, const std::string& v) {
  std::string s;
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::kString));
  put_str(s, v);
  kvs_.push_back({key, s});
}
void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  std::string s;
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::kArray));
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::kString));
  put<uint64_t>(s, v.size());
  for (const auto& x : v) put_str(s, x);
  kvs_.push_back({key, s});
}
void GgufWriter::add_f32_array(const std::string& key, const std::vector<float>& v) {
  std::string s;
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::kArray));
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::kF32));
  put<uint64_t>(s, v.size());
  for (float x : v) put(s, x);
  kvs_.push_back({key, s});
}
void GgufWriter::add_i32_array(const std::string& key, const std::vector<int32_t>& v) {
  std::string s;
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::kArray));
  put<uint32_t>(s, static_cast<uint32_t>(GgufType::kI32));
  put<uint64_t>(s, v.size());
  for (int32_t x : v) put(s, x);
  kvs_.push_back({key, s});
}

void GgufWriter::add_tensor(const std::string& name, const std::vector<int64_t>& ne, DType type,
                            std::function<void(float*)> fill) {
  RLHF_CHECK(type == DType::kF32 || type == DType::kF16 || type == DType::kBF16,
             "GGUF export of {} tensors is not supported (F32, F16, BF16 are)", to_string(type));
  RLHF_CHECK(!ne.empty() && ne.size() <= 4, "GGUF tensor '{}' needs 1..4 dims", name);
  tensors_.push_back({name, ne, type, std::move(fill)});
}

void GgufWriter::emit(const std::function<void(const void*, size_t)>& sink,
                      const std::string& what) const {
  constexpr uint64_t kAlign = 32;
  std::string head;
  put<uint32_t>(head, kGgufMagic);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kvs_.size());
  for (const Kv& kv : kvs_) {
    put_str(head, kv.key);
    head += kv.bytes;
  }
  uint64_t offset = 0;
  std::vector<int64_t> numels;
  for (const Tensor& t : tensors_) {
    put_str(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    int64_t n = 1;
    for (int64_t d : t.ne) {
      put<uint64_t>(head, static_cast<uint64_t>(d));
      n = checked_mul(n, d, what, "element count");
    }
    numels.push_back(n);
    put<uint32_t>(head, ggml_of_dtype(t.type));
    put<uint64_t>(head, offset);
    offset += (static_cast<uint64_t>(dtype_bytes(t.type, n, what)) + kAlign - 1) / kAlign * kAlign;
  }
  if (!tensors_.empty())
    while (head.size() % kAlign != 0) head.push_back('\0');
  sink(head.data(), head.size());
  std::vector<float> buf;
  std::vector<uint8_t> conv;
  const char zeros[kAlign] = {};
  for (size_t i = 0; i < tensors_.size(); ++i) {
    buf.assign(static_cast<size_t>(numels[i]), 0.0f);
    tensors_[i].fill(buf.data());
    conv.assign(static_cast<size_t>(dtype_bytes(tensors_[i].type, numels[i], what)), 0);
    convert_from_f32(tensors_[i].type, buf.data(), conv.data(), numels[i]);
    sink(conv.data(), conv.size());
    sink(zeros, (kAlign - conv.size() % kAlign) % kAlign);
  }
}

void GgufWriter::write(const std::string& path) const {
  AtomicFile out(path);
  emit([&](const void* p, size_t n) { out.write(p, n); }, path);
  out.commit();
}

std::string GgufWriter::to_bytes() const {
  std::string s;
  emit([&](const void* p, size_t n) { s.append(static_cast<const char*>(p), n); }, "GGUF");
  return s;
}

}  // namespace rlhf::io

#include "io/llama2c.h"

#include <cstring>
#include <map>

#include "core/error.h"

namespace rlhf::io {

namespace {

constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kV1HeaderBytes = 256;
constexpr int64_t kLegacyHeaderBytes = 28;

struct Entry {
  std::vector<int64_t> shape;
  int64_t offset = 0;  // bytes
};

// The tensor table (HF name → shape, byte offset) of a checkpoint with header h.
std::map<std::string, Entry> tensor_table(const Llama2cHeader& h, int64_t* end_bytes) {
  const int64_t C = h.dim, F = h.hidden_dim, L = h.n_layers, V = h.vocab_size;
  const int64_t D = h.dim / h.n_heads, KV = h.n_kv_heads * D;
  std::map<std::string, Entry> t;
  int64_t off = h.weights_offset;
  auto layer = [](int64_t l, const char* s) { return fmt::format("model.layers.{}.{}", l, s); };
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    t[name] = Entry{std::move(shape), off};
    off += 4 * n;
  };
  auto per_layer = [&](const char* s, std::vector<int64_t> shape) {
    for (int64_t l = 0; l < L; ++l) add(layer(l, s), shape);
  };
  if (h.version == 0) {
    add("model.embed_tokens.weight", {V, C});
    per_layer("input_layernorm.weight", {C});
    per_layer("self_attn.q_proj.weight", {C, C});
    per_layer("self_attn.k_proj.weight", {KV, C});
    per_layer("self_attn.v_proj.weight", {KV, C});
    per_layer("self_attn.o_proj.weight", {C, C});
    per_layer("post_attention_layernorm.weight", {C});
    per_layer("mlp.gate_proj.weight", {F, C});
    per_layer("mlp.down_proj.weight", {C, F});
    per_layer("mlp.up_proj.weight", {F, C});
    add("model.norm.weight", {C});
    off += 4 * h.seq_len * D;  // freq_cis_real + freq_cis_imag: seq_len x D/2 each, unused
    if (!h.shared_classifier) add("lm_head.weight", {V, C});
  } else {
    per_layer("input_layernorm.weight", {C});
    per_layer("post_attention_layernorm.weight", {C});
    add("model.norm.weight", {C});
    add("model.embed_tokens.weight", {V, C});
    per_layer("self_attn.q_proj.weight", {C, C});
    per_layer("self_attn.k_proj.weight", {KV, C});
    per_layer("self_attn.v_proj.weight", {KV, C});
    per_layer("self_attn.o_proj.weight", {C, C});
    per_layer("mlp.gate_proj.weight", {F, C});
    per_layer("mlp.down_proj.weight", {C, F});
    per_layer("mlp.up_proj.weight", {F, C});
    if (!h.shared_classifier) add("lm_head.weight", {V, C});
  }
  *end_bytes = off;
  return t;
}

// Total bytes the header implies, with overflow checks (all dims are < 2^24, layers < 4096, so
// every product below fits in int64; checked anyway).
int64_t implied_bytes(const Llama2cHeader& h, const std::string& src) {
  const int64_t C = h.dim, F = h.hidden_dim, L = h.n_layers, V = h.vocab_size;
  const int64_t D = h.dim / h.n_heads, KV = h.n_kv_heads * D;
  int64_t per_layer = 0;
  per_layer = checked_add(per_layer, 2 * C, src, "layer size");
  per_layer = checked_add(per_layer, checked_mul(2 * C, C, src, "wq+wo"), src, "layer size");
  per_layer = checked_add(per_layer, checked_mul(2 * KV, C, src, "wk+wv"), src, "layer size");
  per_layer = checked_add(per_layer, checked_mul(3 * F, C, src, "w1+w2+w3"), src, "layer size");
  int64_t n = checked_mul(per_layer, L, src, "weights");
  n = checked_add(n, checked_mul(V, C, src, "embedding"), src, "weights");
  n = checked_add(n, C, src, "weights");
  if (!h.shared_classifier)
    n = checked_add(n, checked_mul(V, C, src, "classifier"), src, "weights");
  if (h.version == 0)
    n = checked_add(n, checked_mul(h.seq_len, D, src, "RoPE tables"), src, "weights");
  return checked_add(checked_mul(n, 4, src, "weights"), h.weights_offset, src, "file size");
}

// Field checks shared by parse and sniff; returns "" if plausible, else the reason.
std::string implausible(const Llama2cHeader& h) {
  auto in = [](int64_t v) { return v > 0 && v < kMaxDim; };
  if (!in(h.dim)) return fmt::format("dim {} is not in [1, 2^24)", h.dim);
  if (!in(h.hidden_dim)) return fmt::format("hidden_dim {} is not in [1, 2^24)", h.hidden_dim);
  if (h.n_layers <= 0 || h.n_layers >= kMaxLayers)
    return fmt::format("n_layers {} is not in [1, {})", h.n_layers, kMaxLayers);
  if (!in(h.n_heads) || h.dim % h.n_heads != 0)
    return fmt::format("n_heads {} does not divide dim {}", h.n_heads, h.dim);
  if (!in(h.n_kv_heads) || h.n_heads % h.n_kv_heads != 0)
    return fmt::format("n_kv_heads {} does not divide n_heads {}", h.n_kv_heads, h.n_heads);
  if ((h.dim / h.n_heads) % 2 != 0)
    return fmt::format("head dim {} is odd (RoPE needs it even)", h.dim / h.n_heads);
  if (!in(h.vocab_size)) return fmt::format("vocab_size {} is not in [1, 2^24)", h.vocab_size);
  if (!in(h.seq_len)) return fmt::format("seq_len {} is not in [1, 2^24)", h.seq_len);
  return "";
}

Llama2cHeader read_header(const Blob& blob) {
  ByteReader r(blob);
  Llama2cHeader h;
  const uint32_t first = r.read<uint32_t>("header");
  int32_t v[7];
  if (first == kLlama2cMagic) {
    const int32_t version = r.read<int32_t>("version");
    RLHF_CHECK(version == 1,
               "{}: llama2.c checkpoint version {} is not supported\nhint: version 1 (fp32) and "
               "the legacy layout are; version 2 (int8) is not — export with --version 1",
               blob.source, version);
    for (int32_t& x : v) x = r.read<int32_t>("header");
    h.shared_classifier = r.read<uint8_t>("shared_classifier flag") != 0;
    r.seek(kV1HeaderBytes, "end of the 256-byte header");
    h.version = 1;
    h.weights_offset = kV1HeaderBytes;
  } else {
    std::memcpy(&v[0], &first, 4);
    for (int i = 1; i < 7; ++i) v[i] = r.read<int32_t>("header");
    h.version = 0;
    h.weights_offset = kLegacyHeaderBytes;
  }
  h.dim = v[0];
  h.hidden_dim = v[1];
  h.n_layers = v[2];
  h.n_heads = v[3];
  h.n_kv_heads = v[4];
  h.vocab_size = v[5];
  h.seq_len = v[6];
  if (h.version == 0) {
    h.shared_classifier = h.vocab_size > 0;
    if (h.vocab_size < 0 && h.vocab_size != INT32_MIN) h.vocab_size = -h.vocab_size;
  }
  return h;
}

class Llama2cTensors final : public TensorSource {
 public:
  Llama2cTensors(Blob blob, const Llama2cHeader& h) : blob_(std::move(blob)) {
    int64_t end = 0;
    table_ = tensor_table(h, &end);
    RLHF_CHECK(end <= static_cast<int64_t>(blob_.size), "{}: truncated: needs {} bytes, has {}",
               blob_.source, end, blob_.size);
  }
  const std::string& source() const override { return blob_.source; }
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const auto& [k, e] : table_) n.push_back(k);
    return n;
  }
  std::optional<TensorMeta> find(const std::string& name) const override {
    auto it = table_.find(name);
    if (it == table_.end()) return std::nullopt;
    return TensorMeta{it->second.shape, "F32"};
  }
  void read(const std::string& name, float* out) const override {
    auto it = table_.find(name);
    RLHF_CHECK(it != table_.end(), "{}: no tensor '{}'", blob_.source, name);
    int64_t n = 1;
    for (int64_t d : it->second.shape) n *= d;
    std::memcpy(out, blob_.data + it->second.offset, static_cast<size_t>(n) * 4);
  }

 private:
  Blob blob_;
  std::map<std::string, Entry> table_;
};

}  // namespace

bool looks_like_llama2c(const Blob& blob, bool check_size) {
  if (blob.size < static_cast<size_t>(kLegacyHeaderBytes)) return false;
  try {
    const Llama2cHeader h = read_header(blob);
    if (h.version == 1) return true;
    if (!implausible(h).empty()) return false;
    return !check_size || implied_bytes(h, blob.source) == static_cast<int64_t>(blob.size);
  } catch (const Error&) {
    return false;
  }
}

Llama2cHeader parse_llama2c_header(const Blob& blob) {
  Llama2cHeader h = read_header(blob);
  const std::string why = implausible(h);
  RLHF_CHECK(why.empty(), "{}: not a valid llama2.c checkpoint ({} header): {}", blob.source,
             h.version == 1 ? "v1" : "legacy", why);
  // The model bounds (model/config.h), by the header's own names: seq_len sizes no weights in a
  // v1 file, so the file size below does not bound it.
  auto at_most = [&](int64_t v, int64_t limit, const char* name, const char* field) {
    RLHF_CHECK(v <= limit,
               "{}: llama2.c header: {} {} exceeds the limit {} ({})\nhint: every model we run "
               "is far below it; the file is probably corrupt",
               blob.source, name, v, limit, field);
  };
  at_most(h.dim, model::kMaxHiddenSize, "dim", "hidden_size");
  at_most(h.hidden_dim, model::kMaxIntermediateSize, "hidden_dim", "intermediate_size");
  at_most(h.n_layers, model::kMaxHiddenLayers, "n_layers", "num_hidden_layers");
  at_most(h.n_heads, model::kMaxAttentionHeads, "n_heads", "num_attention_heads");
  at_most(h.vocab_size, model::kMaxVocabSize, "vocab_size", "vocab_size");
  at_most(h.seq_len, model::kMaxPositionEmbeddings, "seq_len", "max_position_embeddings");
  h.expected_bytes = implied_bytes(h, blob.source);
  RLHF_CHECK(
      h.expected_bytes == static_cast<int64_t>(blob.size),
      "{}: {} llama2.c checkpoint: the header (dim {}, hidden {}, {} layers, {} heads, {} kv "
      "heads, vocab {}, seq_len {}, {} classifier) implies {} bytes, the file has {}{}",
      blob.source, h.version == 1 ? "v1" : "legacy", h.dim, h.hidden_dim, h.n_layers, h.n_heads,
      h.n_kv_heads, h.vocab_size, h.seq_len, h.shared_classifier ? "shared" : "separate",
      h.expected_bytes, blob.size,
      h.expected_bytes > static_cast<int64_t>(blob.size) ? " (truncated?)"
                                                         : " (not a llama2.c file?)");
  llama2c_model_config(h).validate(blob.source);
  return h;
}

model::ModelConfig llama2c_model_config(const Llama2cHeader& h) {
  model::ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = h.dim;
  c.intermediate_size = h.hidden_dim;
  c.num_hidden_layers = h.n_layers;
  c.num_attention_heads = h.n_heads;
  c.num_key_value_heads = h.n_kv_heads;
  c.head_dim = 0;
  c.vocab_size = h.vocab_size;
  c.max_position_embeddings = h.seq_len;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = h.shared_classifier;
  c.rope_style = model::RopeStyle::kInterleaved;
  c.bos_token_id = h.vocab_size > 1 ? 1 : -1;
  c.eos_token_id = h.vocab_size > 2 ? 2 : -1;
  c.pad_token_id = 0;
  return c;
}

std::unique_ptr<TensorSource> open_llama2c_tensors(Blob blob, const Llama2cHeader& h) {
  return std::make_unique<Llama2cTensors>(std::move(blob), h);
}

}  // namespace rlhf::io

#include "io/pretrained.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "core/checked_alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "io/bytes.h"
#include "io/file_util.h"
#include "io/gguf.h"
#include "io/hdf5_ckpt.h"
#include "io/hf_shards.h"
#include "io/hf_tokenizer.h"
#include "io/jsonl.h"
#include "io/llama2c.h"
#include "io/safetensors.h"
#include "io/sharded_ckpt.h"
#include "io/sp_tokenizer.h"
#include "io/spm_tokenizer.h"
#include "io/tokenizer_export.h"
#include "io/tokenizer_hdf5.h"

namespace rlhf::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kHdf5Signature = "\x89HDF\r\n\x1a\n";
constexpr const char* kFormatsHint =
    "\nhint: --pretrain takes an rlhf HDF5 checkpoint (file, or folder with model.h5), a Hugging "
    "Face folder (config.json + *.safetensors), a llama2.c .bin checkpoint, or a GGUF file";

std::string read_head(const std::string& path, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return "";
  std::string s(n, '\0');
  s.resize(std::fread(s.data(), 1, n, f));
  std::fclose(f);
  return s;
}

// --- HDF5 checkpoint ---------------------------------------------------------------------------

// A model checkpoint or a training checkpoint's /model; a sharded training checkpoint
// (io/sharded_ckpt.h) reads each tensor from its pieces in the shard files.
class Hdf5Tensors final : public TensorSource {
 public:
  explicit Hdf5Tensors(const std::string& path) : reader_(path), path_(path) {
    if (is_sharded_checkpoint(reader_)) {
      auto set = std::make_unique<ShardSet>(reader_);
      if (set->index()["groups"].contains("model")) shards_ = std::move(set);
    }
  }
  const std::string& source() const override { return path_; }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    if (shards_) {
      for (const auto& [name, shape] : shards_->index()["groups"]["model"]["tensors"].items())
        out.push_back(name);
      return out;
    }
    return reader_.exists("/model") ? reader_.list_datasets("/model") : out;
  }
  std::optional<TensorMeta> find(const std::string& name) const override {
    if (name.empty() || name.find('/') != std::string::npos) return std::nullopt;
    if (shards_) {
      std::vector<int64_t> shape;
      if (!shards_->tensor_shape("model", name, &shape)) return std::nullopt;
      return TensorMeta{shape, "F32"};
    }
    const std::string ds = "/model/" + name;
    if (!reader_.exists(ds)) return std::nullopt;
    return TensorMeta{reader_.shape(ds), "F32"};
  }
  void read(const std::string& name, float* out) const override {
    const std::string ds = "/model/" + name;
    if (shards_) {
      std::vector<int64_t> shape;
      RLHF_CHECK(shards_->tensor_shape("model", name, &shape), "{}: no tensor '{}'", path_, name);
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      shards_->read_range(ds, 0, n, out);
      return;
    }
    reader_.read_dataset<float>(ds, out, reader_.shape(ds));
  }
  const CheckpointReader& reader() const { return reader_; }

 private:
  CheckpointReader reader_;
  std::string path_;
  std::unique_ptr<ShardSet> shards_;
};

// --- Hugging Face folder -----------------------------------------------------------------------

class HfTensors final : public TensorSource {
 public:
  HfTensors(std::string dir, std::vector<SafetensorsFile> shards,
            std::map<std::string, size_t> where, const model::ModelConfig& config, bool permuted)
      : dir_(std::move(dir)),
        shards_(std::move(shards)),
        where_(std::move(where)),
        config_(config),
        permuted_(permuted) {
    // A tied embedding may be stored under either name (learning-lm-rs stores lm_head.weight).
    if (config_.tie_word_embeddings && !where_.count("model.embed_tokens.weight") &&
        where_.count("lm_head.weight"))
      alias_["model.embed_tokens.weight"] = "lm_head.weight";
  }
  const std::string& source() const override { return dir_; }
  std::vector<std::string> names() const override {
    std::set<std::string> n;
    for (const auto& [k, v] : where_) n.insert(k);
    for (const auto& [k, v] : alias_) n.insert(k);
    return {n.begin(), n.end()};
  }
  std::optional<TensorMeta> find(const std::string& name) const override {
    const std::string& real = resolve(name);
    auto it = where_.find(real);
    if (it == where_.end()) return std::nullopt;
    const SafetensorsEntry& e = shards_[it->second].tensors.at(real);
    return TensorMeta{e.shape, to_string(e.dtype)};
  }
  void read(const std::string& name, float* out) const override {
    const std::string& real = resolve(name);
    auto it = where_.find(real);
    RLHF_CHECK(it != where_.end(), "{}: no tensor '{}'", dir_, name);
    const SafetensorsFile& f = shards_[it->second];
    f.read_f32(real, out);
    if (!permuted_) return;
    const bool q = name.find("self_attn.q_proj.") != std::string::npos;
    const bool k = name.find("self_attn.k_proj.") != std::string::npos;
    if (!q && !k) return;
    const SafetensorsEntry& e = f.tensors.at(real);
    const int64_t heads = q ? config_.num_attention_heads : config_.num_key_value_heads;
    const int64_t D = config_.D();
    RLHF_CHECK(!e.shape.empty() && e.shape.size() <= 2 && e.shape[0] == heads * D,
               "{}: tensor '{}' has shape {}, the config needs {} rows", dir_, name,
               shape_to_string(e.shape), heads * D);
    permute_qk_rows(out, heads, D, e.shape.size() == 2 ? e.shape[1] : 1, /*to_interleaved=*/true);
  }

 private:
  const std::string& resolve(const std::string& name) const {
    auto it = alias_.find(name);
    return it == alias_.end() ? name : it->second;
  }
  std::string dir_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, size_t> where_;
  std::map<std::string, std::string> alias_;
  model::ModelConfig config_;
  bool permuted_;
};

struct HfConfig {
  model::ModelConfig config;
  model::HeadKind head = model::HeadKind::kLM;
  bool permuted = false;
};

HfConfig read_hf_config(const std::string& path) {
  json j = parse_json_file(path);
  RLHF_CHECK(j.is_object(), "{}: config.json must be a JSON object", path);
  HfConfig out;
  if (j.contains(kRopePermutedKey)) {
    RLHF_CHECK(j[kRopePermutedKey] == "interleaved", "{}: {} must be \"interleaved\"", path,
               kRopePermutedKey);
    out.permuted = true;
    j.erase(kRopePermutedKey);
  }
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  if (arch.find("ForSequenceClassification") != std::string::npos)
    out.head = model::HeadKind::kReward;
  if (j.contains("head") && j["head"].is_string())
    out.head = head_kind_from_string(j["head"].get<std::string>());
  out.config = model::ModelConfig::from_json(j, path, model::ConfigKeys::kHuggingFace);
  if (out.permuted) out.config.rope_style = model::RopeStyle::kInterleaved;
  return out;
}

std::shared_ptr<const Tokenizer> tokenizer_in_folder(const fs::path& dir, int64_t vocab_size,
                                                     std::string* origin) {
  std::vector<fs::path> candidates = {
      dir / "tokenizer.json", dir / "tokenizer.model", dir / "tokenizer.bin",
      dir / fmt::format("tok{}.bin", vocab_size), dir / "tokenizer.gguf"};
  for (const fs::path& p : candidates) {
    if (!fs::is_regular_file(p)) continue;
    *origin = p.string();
    return make_tokenizer(p.string());
  }
  return nullptr;
}

PretrainedModel open_hf_folder(const std::string& dir) {
  PretrainedModel m;
  m.path = dir;
  m.format = "safetensors";
  const fs::path d(dir);
  const fs::path cfg = d / "config.json";
  RLHF_CHECK(fs::is_regular_file(cfg), "{}: no config.json in this Hugging Face folder", dir);
  HfConfig hc = read_hf_config(cfg.string());
  m.config = hc.config;
  m.head = hc.head;
  std::vector<std::string> files;
  const fs::path index = d / "model.safetensors.index.json";
  if (fs::is_regular_file(index)) {
    const json j = parse_json_file(index.string());
    RLHF_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
               "{}: no weight_map object", index.string());
    std::set<std::string> seen;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      RLHF_CHECK(it.value().is_string(), "{}: weight_map['{}'] must be a file name", index.string(),
                 it.key());
      const std::string f = it.value().get<std::string>();
      RLHF_CHECK(f.find('/') == std::string::npos && f != ".." && !f.empty(),
                 "{}: weight_map['{}'] = '{}' is not a file name in the folder", index.string(),
                 it.key(), f);
      if (seen.insert(f).second) files.push_back(f);
    }
    RLHF_CHECK(!files.empty(), "{}: empty weight_map", index.string());
  } else if (fs::is_regular_file(d / "model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().extension() == ".safetensors") found.push_back(e.path().filename().string());
    std::sort(found.begin(), found.end());
    RLHF_CHECK(found.size() == 1, "{}: no model.safetensors and no model.safetensors.index.json{}",
               dir,
               fs::exists(d / "pytorch_model.bin")
                   ? "\nhint: only safetensors weights are read; convert pytorch_model.bin with "
                     "transformers' save_pretrained(safe_serialization=True)"
               : found.empty() ? ""
                               : " (several .safetensors files but no index)");
    files = found;
  }
  std::vector<SafetensorsFile> shards;
  std::map<std::string, size_t> where;
  std::set<std::string> dtypes;
  for (const std::string& f : files) {
    const fs::path p = d / f;
    RLHF_CHECK(fs::is_regular_file(p), "{}: shard '{}' is listed in the index but missing", dir, f);
    shards.push_back(open_safetensors(p.string()));
    for (const auto& [name, e] : shards.back().tensors) {
      RLHF_CHECK(!where.count(name), "{}: tensor '{}' appears in two shards", dir, name);
      where[name] = shards.size() - 1;
      dtypes.insert(to_string(e.dtype));
    }
  }
  m.detail = fmt::format("Hugging Face safetensors ({}, {} file{})", fmt::join(dtypes, "+"),
                         files.size(), files.size() == 1 ? "" : "s");
  m.tensors =
      std::make_shared<HfTensors>(dir, std::move(shards), std::move(where), m.config, hc.permuted);
  m.tokenizer = tokenizer_in_folder(d, m.config.vocab_size, &m.tokenizer_origin);
  return m;
}

// --- other formats ----------------------------------------------------------------------------

PretrainedModel open_hdf5(const std::string& file) {
  PretrainedModel m;
  m.path = file;
  m.format = "hdf5";
  m.detail = "rlhf HDF5 checkpoint";
  const StoredModelConfig stored = load_model_config_hdf5(file);
  m.config = stored.config;
  m.head = stored.head;
  auto t = std::make_shared<Hdf5Tensors>(file);
  std::unique_ptr<Tokenizer> tok = read_tokenizer_hdf5(t->reader());
  if (tok) {
    m.tokenizer = std::move(tok);
    m.tokenizer_origin = file + ":/tokenizer";
  }
  m.tensors = std::move(t);
  return m;
}

PretrainedModel open_llama2c(const std::string& file) {
  PretrainedModel m;
  m.path = file;
  m.format = "llama2c";
  Blob blob = map_file(file);
  const Llama2cHeader h = parse_llama2c_header(blob);
  m.detail = h.version == 1 ? "llama2.c checkpoint (v1)" : "llama2.c checkpoint (legacy)";
  m.config = llama2c_model_config(h);
  m.tensors = open_llama2c_tensors(std::move(blob), h);
  const fs::path dir = fs::path(file).parent_path();
  for (const fs::path& p : {dir / "tokenizer.bin", dir / fmt::format("tok{}.bin", h.vocab_size)}) {
    if (!fs::is_regular_file(p)) continue;
    auto tok = load_llama2c_tokenizer(map_file(p.string()));
    if (tok->vocab_size() != h.vocab_size) continue;  // a tokenizer.bin for another model
    m.tokenizer = std::move(tok);
    m.tokenizer_origin = p.string() + " (next to the checkpoint)";
    break;
  }
  return m;
}

PretrainedModel open_gguf_model(const std::string& file) {
  PretrainedModel m;
  m.path = file;
  m.format = "gguf";
  auto f = std::make_shared<GgufFile>(open_gguf(file));
  std::set<std::string> types;
  for (const auto& [name, info] : f->tensors) types.insert(to_string(info.type));
  m.detail = fmt::format("GGUF v{} ({})", f->version, fmt::join(types, "+"));
  m.config = gguf_model_config(*f);
  m.tokenizer = load_gguf_tokenizer(*f);
  if (m.tokenizer) m.tokenizer_origin = file + " (embedded vocabulary)";
  m.tensors = open_gguf_tensors(f, m.config);
  return m;
}

}  // namespace

std::string PretrainedModel::describe() const {
  std::string s = fmt::format("{} {}", detail, path);
  if (tokenizer)
    s += fmt::format(" | tokenizer {} ({})", tokenizer->name(), tokenizer_origin);
  else
    s += " | no tokenizer";
  return s;
}

std::string detect_model_format(const std::string& path) {
  RLHF_CHECK(fs::exists(path), "{}: no such file or folder", path);
  if (fs::is_directory(path)) {
    if (fs::is_regular_file(fs::path(path) / "model.h5")) return "hdf5";
    if (fs::is_regular_file(fs::path(path) / "config.json")) return "safetensors";
    RLHF_FAIL("{}: a folder without model.h5 or config.json{}", path, kFormatsHint);
  }
  const std::string head = read_head(path, 8);
  if (head.size() >= 8 && head == std::string(kHdf5Signature, 8)) return "hdf5";
  if (head.size() >= 4 && head.compare(0, 4, "GGUF") == 0) return "gguf";
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".h5" || ext == ".hdf5") return "hdf5";
  if (ext == ".gguf") return "gguf";
  if (ext == ".safetensors" || fs::path(path).filename() == "config.json") return "safetensors";
  if (head.size() >= 4) {
    uint32_t magic = 0;
    std::memcpy(&magic, head.data(), 4);
    if (magic == kLlama2cMagic) return "llama2c";
  }
  const Blob blob = map_file(path);
  if (looks_like_llama2c(blob)) return "llama2c";
  // A .bin whose legacy header is plausible: let the reader say what is wrong with its size.
  if (ext == ".bin" && looks_like_llama2c(blob, /*check_size=*/false)) return "llama2c";
  if (ext == ".bin")
    RLHF_FAIL("{}: not a llama2.c checkpoint: its header does not describe a file of this size{}",
              path, kFormatsHint);
  RLHF_FAIL("{}: unrecognised model format{}", path, kFormatsHint);
}

PretrainedModel open_pretrained(const std::string& path, const std::string& tokenizer_path) {
  const std::string format = detect_model_format(path);
  PretrainedModel m;
  try {
    if (format == "hdf5") {
      m = open_hdf5(fs::is_directory(path) ? (fs::path(path) / "model.h5").string() : path);
    } else if (format == "safetensors") {
      m = open_hf_folder(fs::is_directory(path) ? path : fs::path(path).parent_path().string());
    } else if (format == "llama2c") {
      m = open_llama2c(path);
    } else {
      m = open_gguf_model(path);
    }
  } catch (const json::exception& e) {
    RLHF_FAIL("{}: corrupt model file: {}", path, e.what());
  }
  if (!tokenizer_path.empty()) {
    m.tokenizer = make_tokenizer(tokenizer_path);
    m.tokenizer_origin = tokenizer_path;
  }
  if (m.tokenizer) {
    // A llama2.c tokenizer.bin carries no token count (llama2.c reads vocab_size entries): a file
    // cut at an entry boundary, or one of another model, shows only as a different count.
    RLHF_CHECK(m.tokenizer->kind() != "llama2c" || m.tokenizer->vocab_size() == m.config.vocab_size,
               "{}: the llama2.c tokenizer {} has {} tokens, the model's vocab_size is {}\nhint: "
               "give the tokenizer.bin this model was trained with",
               path, m.tokenizer_origin, m.tokenizer->vocab_size(), m.config.vocab_size);
    RLHF_CHECK(m.tokenizer->vocab_size() <= m.config.vocab_size,
               "{}: the tokenizer {} has {} tokens, more than the model's vocab_size {}\nhint: "
               "give the model's own tokenizer with --tokenizer",
               path, m.tokenizer_origin, m.tokenizer->vocab_size(), m.config.vocab_size);
  }
  return m;
}

void load_pretrained_unit(const PretrainedModel& m, const model::ParamLayout& layout, int unit,
                          float* unit_buffer) {
  RLHF_CHECK(unit >= 0 && unit < layout.num_units(), "unit {} out of range [0, {})", unit,
             layout.num_units());
  const model::UnitLayout& u = layout.unit(unit);
  int64_t end = 0;
  for (const model::TensorInfo& t : u.tensors) {
    std::fill(unit_buffer + end, unit_buffer + t.offset, 0.0f);
    m.tensors->read_checked(t.name, unit_buffer + t.offset, t.shape);
    end = t.offset + t.numel;
  }
  std::fill(unit_buffer + end, unit_buffer + u.numel, 0.0f);
}

// --- export ----------------------------------------------------------------------------------

namespace {

// Every tensor of the model, in layout order.
std::vector<model::TensorInfo> all_tensors(const PretrainedModel& m) {
  const model::ParamLayout layout(m.config, m.head);
  std::vector<model::TensorInfo> out;
  for (const auto& u : layout.units())
    for (const auto& t : u.tensors) out.push_back(t);
  return out;
}

bool is_qk(const std::string& name, bool* is_q) {
  *is_q = name.find("self_attn.q_proj.") != std::string::npos;
  return *is_q || name.find("self_attn.k_proj.") != std::string::npos;
}

void write_text(const fs::path& p, const std::string& text) {
  write_binary_file(p.string(), text);
}

// The weights of export_hf_folder: one model.safetensors, or transformers' shards and index.
void write_hf_weights(const std::string& dir, const std::vector<SafetensorsWriteItem>& items,
                      DType dtype, int64_t max_shard_bytes, int64_t total_parameters) {
  std::vector<std::string> names;
  std::vector<int64_t> bytes;
  int64_t total = 0;
  for (const SafetensorsWriteItem& it : items) {
    int64_t n = 1;
    for (int64_t d : it.shape) n *= d;
    names.push_back(it.name);
    bytes.push_back(dtype_bytes(dtype, n, it.name));
    total += bytes.back();
  }
  const auto shards = plan_hf_shards(bytes, hf_state_dict_order(names), max_shard_bytes);
  // Weight files of an earlier export that this one does not overwrite would be loaded instead
  // of (model.safetensors wins over an index) or beside the new ones.
  static const std::regex old_weights(R"(model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?)");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (std::regex_match(e.path().filename().string(), old_weights)) fs::remove(e.path(), ec);
  json weight_map = json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file = hf_shard_file_name(k, shards.size());
    std::vector<SafetensorsWriteItem> part;
    for (size_t i : shards[k]) {
      part.push_back(items[i]);
      weight_map[names[i]] = file;
    }
    write_safetensors((fs::path(dir) / file).string(), part, dtype, {{"format", "pt"}});
  }
  if (shards.size() <= 1) return;
  const json index = {{"metadata", {{"total_parameters", total_parameters}, {"total_size", total}}},
                      {"weight_map", weight_map}};
  write_text(fs::path(dir) / "model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace

void export_hf_folder(const std::string& dir, const PretrainedModel& m, DType dtype,
                      int64_t max_shard_bytes) {
  const bool permute = m.config.rope_style == model::RopeStyle::kInterleaved;
  std::vector<SafetensorsWriteItem> items;
  for (const model::TensorInfo& t : all_tensors(m)) {
    items.push_back({t.name, t.shape, [&m, t, permute](float* out) {
                       m.tensors->read_checked(t.name, out, t.shape);
                       bool q = false;
                       if (permute && is_qk(t.name, &q))
                         permute_qk_rows(
                             out, q ? m.config.num_attention_heads : m.config.num_key_value_heads,
                             m.config.D(), t.shape.size() == 2 ? t.shape[1] : 1,
                             /*to_interleaved=*/false);
                     }});
  }
  fs::create_directories(dir);
  write_hf_weights(dir, items, dtype, max_shard_bytes, m.config.num_parameters(m.head));
  json cfg = m.config.to_json();
  cfg["torch_dtype"] = dtype == DType::kF32    ? "float32"
                       : dtype == DType::kBF16 ? "bfloat16"
                                               : "float16";
  if (permute) {
    cfg["rope_style"] = "rotate_half";
    cfg[kRopePermutedKey] = "interleaved";
  }
  if (m.head != model::HeadKind::kLM) {
    const std::string a = cfg["architectures"][0].get<std::string>();
    cfg["architectures"] = {a.substr(0, a.find("ForCausalLM")) + "ForSequenceClassification"};
    cfg["num_labels"] = 1;
    cfg["head"] = model::to_string(m.head);
  }
  write_text(fs::path(dir) / "config.json", cfg.dump(2) + "\n");
  // Token ids: the tokenizer's when there is one (what rlhf generates with), else the config's.
  const Tokenizer* tok = m.tokenizer.get();
  const int64_t bos = tok ? tok->bos_id() : m.config.bos_token_id;
  const int64_t eos = tok ? tok->eos_id() : m.config.eos_token_id;
  const int64_t pad = tok ? tok->pad_id() : m.config.pad_token_id;
  json gen = {{"bos_token_id", bos >= 0 ? json(bos) : json(nullptr)},
              {"eos_token_id", eos >= 0 ? json(eos) : json(nullptr)}};
  if (pad >= 0) gen["pad_token_id"] = pad;
  write_text(fs::path(dir) / "generation_config.json", gen.dump(2) + "\n");
  if (tok == nullptr) {
    LOG_WARN("{}: the model has no tokenizer; {} gets no tokenizer files", m.path, dir);
    return;
  }
  for (const TokenizerFile& f : hf_tokenizer_files(*tok, m.config.max_position_embeddings))
    write_text(fs::path(dir) / f.name, f.bytes);
}

void export_hdf5(const std::string& path, const PretrainedModel& m) {
  const model::ParamLayout layout(m.config, m.head);
  CheckpointWriter w(path);
  write_model_config_hdf5(w, layout);
  std::vector<float> buf;
  for (const auto& u : layout.units()) {
    for (const auto& t : u.tensors) {
      checked_resize(buf, t.numel, fmt::format("the export buffer of tensor '{}'", t.name));
      m.tensors->read_checked(t.name, buf.data(), t.shape);
      w.write_dataset<float>("/model/" + t.name, buf.data(), t.shape);
    }
  }
  if (m.tokenizer) write_tokenizer_hdf5(w, *m.tokenizer);
  w.commit();
}

void export_gguf(const std::string& path, const PretrainedModel& m, DType dtype) {
  RLHF_CHECK(m.head == model::HeadKind::kLM,
             "{}: GGUF export needs a language model; this one has a '{}' head", m.path,
             model::to_string(m.head));
  const model::ModelConfig& c = m.config;
  // llama.cpp's architecture names; Mistral and SmolLM run as "llama".
  const std::string arch =
      c.model_type == "qwen2" || c.model_type == "qwen3" ? c.model_type : "llama";
  RLHF_CHECK(arch == "qwen2" || !c.attention_bias,
             "{}: GGUF export of a {} model with attention_bias is not supported", m.path, arch);
  RLHF_CHECK(c.rope_scaling.rope_type == "default",
             "{}: GGUF export of a model with {} RoPE scaling is not supported (the GGUF would "
             "run with unscaled frequencies)\nhint: export to safetensors",
             m.path, c.rope_scaling.rope_type);
  GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_string("general.name", fs::path(m.path).filename().string());
  w.add_u32("general.file_type", dtype == DType::kF32 ? 0 : dtype == DType::kF16 ? 1 : 32);
  w.add_u32(arch + ".context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.add_u32(arch + ".embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.add_u32(arch + ".block_count", static_cast<uint32_t>(c.num_hidden_layers));
  w.add_u32(arch + ".feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.add_u32(arch + ".attention.head_count", static_cast<uint32_t>(c.num_attention_heads));
  w.add_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(c.num_key_value_heads));
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.add_f32(arch + ".rope.freq_base", static_cast<float>(c.rope_theta));
  w.add_u32(arch + ".rope.dimension_count", static_cast<uint32_t>(c.D()));
  if (c.D() * c.num_attention_heads != c.hidden_size) {
    w.add_u32(arch + ".attention.key_length", static_cast<uint32_t>(c.D()));
    w.add_u32(arch + ".attention.value_length", static_cast<uint32_t>(c.D()));
  }
  w.add_u32(arch + ".vocab_size", static_cast<uint32_t>(c.vocab_size));
  if (m.tokenizer) {
    write_gguf_tokenizer(w, *m.tokenizer, c.vocab_size);
  } else {
    LOG_WARN("{}: the model has no tokenizer; {} gets no tokenizer.ggml.* vocabulary", m.path,
             path);
    if (c.bos_token_id >= 0)
      w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(c.bos_token_id));
    if (c.eos_token_id >= 0)
      w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(c.eos_token_id));
  }
  // llama.cpp runs "llama" with interleaved RoPE: HF-order Q/K rows are permuted; an interleaved
  // model already has that order.
  const bool permute = arch == "llama" && c.rope_style == model::RopeStyle::kRotateHalf;
  RLHF_CHECK(arch == "llama" || c.rope_style == model::RopeStyle::kRotateHalf,
             "{}: a qwen2 model with interleaved RoPE cannot be written as GGUF", m.path);
  for (const model::TensorInfo& t : all_tensors(m)) {
    const std::string g = hf_to_gguf_name(t.name);
    RLHF_ASSERT(!g.empty());
    const std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
    const DType type = t.shape.size() == 1 ? DType::kF32 : dtype;
    w.add_tensor(g, ne, type, [&m, t, permute](float* out) {
      m.tensors->read_checked(t.name, out, t.shape);
      bool q = false;
      if (permute && is_qk(t.name, &q))
        permute_qk_rows(out, q ? m.config.num_attention_heads : m.config.num_key_value_heads,
                        m.config.D(), t.shape.size() == 2 ? t.shape[1] : 1,
                        /*to_interleaved=*/true);
    });
  }
  w.write(path);
}

}  // namespace rlhf::io

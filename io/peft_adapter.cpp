#include "io/peft_adapter.h"

#include <fmt/ranges.h>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/file_util.h"
#include "io/jsonl.h"
#include "io/safetensors.h"

namespace rlhf::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

model::LoraConfig read_peft_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  RLHF_CHECK(fs::exists(path), "--lora_path {}: no adapter_config.json (not a PEFT adapter folder)",
             dir);
  const json j = parse_json_file(path);
  RLHF_CHECK(j.is_object(), "{}: not a JSON object", path);
  RLHF_CHECK(j.value("peft_type", std::string("LORA")) == "LORA",
             "{}: peft_type {} (rlhf reads LORA adapters)", path, j.value("peft_type", ""));
  auto flag = [&](const char* key) {
    return j.contains(key) && j[key].is_boolean() && j[key].get<bool>();
  };
  for (const char* k : {"use_rslora", "use_dora", "fan_in_fan_out"})
    RLHF_CHECK(!flag(k), "{}: {} = true is not supported", path, k);
  RLHF_CHECK(j.value("bias", std::string("none")) == "none",
             "{}: bias = {} is not supported (only \"none\")", path, j.value("bias", ""));
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    RLHF_CHECK(!j.contains(k) || j[k].is_null() || j[k].empty(),
               "{}: {} (per-module ranks) is not supported", path, k);
  model::LoraConfig c;
  // modules_to_save: PEFT's SEQ_CLS task lists ["classifier", "score"]; a Llama/Qwen2 sequence
  // classifier has only `score`, which trains fully (LoraConfig::save_score).
  if (j.contains("modules_to_save") && !j["modules_to_save"].is_null()) {
    RLHF_CHECK(j["modules_to_save"].is_array(), "{}: modules_to_save is not a list", path);
    for (const json& n : j["modules_to_save"]) {
      RLHF_CHECK(n.is_string() && (n == "score" || n == "classifier"),
                 "{}: modules_to_save {} is not supported (only the score head, \"score\")", path,
                 n.dump());
      if (n == "score") c.save_score = true;
    }
  }
  RLHF_CHECK(j.contains("r") && j["r"].is_number_integer(), "{}: no integer \"r\"", path);
  c.rank = j["r"].get<int>();
  c.alpha = j.value("lora_alpha", 8.0);
  c.dropout = j.value("lora_dropout", 0.0);
  const json& t = j.contains("target_modules") ? j["target_modules"] : json();
  std::string targets;
  if (t.is_string()) {
    targets = t.get<std::string>();
  } else {
    RLHF_CHECK(t.is_array() && !t.empty(), "{}: target_modules is neither a name nor a list", path);
    for (const json& n : t) {
      RLHF_CHECK(n.is_string(), "{}: target_modules holds a non-string", path);
      if (!targets.empty()) targets.push_back(',');
      targets.append(n.get<std::string>());
    }
  }
  try {
    c.targets = model::parse_target_modules(targets);
  } catch (const Error& e) {
    RLHF_FAIL("{}: {}", path, e.what());
  }
  // An adapter trained with dropout is still an adapter: dropout acts in training only.
  c.dropout = 0.0;
  c.validate();
  return c;
}

std::vector<float> read_peft_adapter_weights(const std::string& dir,
                                             const model::LoraLayout& layout) {
  const std::string path = (fs::path(dir) / "adapter_model.safetensors").string();
  RLHF_CHECK(fs::exists(path), "--lora_path {}: no adapter_model.safetensors", dir);
  const SafetensorsFile f = open_safetensors(path);
  std::vector<float> out(size_t(layout.numel()), 0.0f);
  std::set<std::string> used;
  for (const model::TensorInfo& t : layout.tensors()) {
    const std::string key = model::LoraLayout::peft_key(t.name);
    auto it = f.tensors.find(key);
    RLHF_CHECK(it != f.tensors.end(), "{}: no tensor {}{}", path, key,
               t.name == "score.weight"
                   ? " (this model's score head trains: the adapter needs modules_to_save score)"
                   : "");
    RLHF_CHECK(it->second.shape == t.shape, "{}: {} has shape [{}], the model needs [{}]", path,
               key, fmt::join(it->second.shape, ", "), fmt::join(t.shape, ", "));
    f.read_f32(key, out.data() + t.offset);
    used.insert(key);
  }
  for (const auto& [name, e] : f.tensors)
    RLHF_CHECK(used.count(name) != 0,
               "{}: tensor {} is not an adapter of this model's targets ({})", path, name,
               model::target_modules_string(layout.config().targets));
  return out;
}

void write_peft_adapter(const std::string& dir, const model::LoraLayout& layout,
                        const float* adapters, const std::string& base) {
  fs::create_directories(dir);
  const model::LoraConfig& c = layout.config();
  json targets = json::array();
  for (const model::ProjInfo& p : model::kProjections)
    if (c.targets[size_t(static_cast<int>(p.id))]) targets.push_back(p.name);
  const bool seq_cls = layout.score_offset() >= 0;
  const json cfg = {{"peft_type", "LORA"},
                    {"task_type", seq_cls ? "SEQ_CLS" : "CAUSAL_LM"},
                    {"base_model_name_or_path", base},
                    {"r", c.rank},
                    {"lora_alpha", c.alpha},
                    {"lora_dropout", c.dropout},
                    {"target_modules", targets},
                    {"bias", "none"},
                    {"fan_in_fan_out", false},
                    {"use_rslora", false},
                    {"use_dora", false},
                    {"inference_mode", true},
                    {"init_lora_weights", true},
                    {"modules_to_save", seq_cls ? json{"classifier", "score"} : json()},
                    {"layers_to_transform", nullptr},
                    {"rank_pattern", json::object()},
                    {"alpha_pattern", json::object()}};
  write_binary_file((fs::path(dir) / "adapter_config.json").string(), cfg.dump(2) + "\n");
  std::vector<SafetensorsWriteItem> items;
  for (const model::TensorInfo& t : layout.tensors())
    items.push_back({model::LoraLayout::peft_key(t.name), t.shape, [adapters, t](float* out) {
                       std::copy(adapters + t.offset, adapters + t.offset + t.numel, out);
                     }});
  write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), items, DType::kF32,
                    {{"format", "pt"}});
}

namespace {

class MergedTensors final : public TensorSource {
 public:
  MergedTensors(std::shared_ptr<const TensorSource> base, const model::LoraLayout& layout,
                std::vector<float> adapters)
      : base_(std::move(base)),
        adapters_(std::move(adapters)),
        scale_(float(layout.config().scale())),
        rank_(layout.config().rank) {
    for (int l = 0; l < layout.num_layers(); ++l)
      for (const model::ProjInfo& p : model::kProjections) {
        const model::LoraLayout::Entry& e = layout.entry(l, p.id);
        if (e.a >= 0) where_["model.layers." + std::to_string(l) + "." + p.weight_name] = e;
      }
    score_ = layout.score_offset();
    if (score_ >= 0) score_numel_ = layout.tensors().back().numel;
  }
  const std::string& source() const override { return base_->source(); }
  std::vector<std::string> names() const override { return base_->names(); }
  std::optional<TensorMeta> find(const std::string& name) const override {
    return base_->find(name);
  }
  void read(const std::string& name, float* out) const override {
    if (name == "score.weight" && score_ >= 0) {  // modules_to_save: the trained copy
      std::copy(adapters_.data() + score_, adapters_.data() + score_ + score_numel_, out);
      return;
    }
    base_->read(name, out);
    auto it = where_.find(name);
    if (it == where_.end()) return;
    const model::LoraLayout::Entry& e = it->second;
    model::lora_merge_cpu(out, adapters_.data() + e.a, adapters_.data() + e.b, scale_,
                          int64_t(rank_), e.in, e.out);
  }

 private:
  std::shared_ptr<const TensorSource> base_;
  std::vector<float> adapters_;
  float scale_;
  int rank_;
  int64_t score_ = -1, score_numel_ = 0;
  std::map<std::string, model::LoraLayout::Entry> where_;
};

}  // namespace

std::shared_ptr<const TensorSource> merge_lora_tensors(std::shared_ptr<const TensorSource> base,
                                                       const model::LoraLayout& layout,
                                                       std::vector<float> adapters) {
  return std::make_shared<MergedTensors>(std::move(base), layout, std::move(adapters));
}

}  // namespace rlhf::io

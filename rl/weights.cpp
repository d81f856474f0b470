#include "rl/weights.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "io/hdf5_ckpt.h"
#include "io/peft_adapter.h"
#include "io/pretrained.h"
#include "io/tokenizer_hdf5.h"
#include "model/init.h"
#include "parallel/lora_store.h"

namespace rlhf::rl {

void initialize_weights(parallel::ParamStore& store, const io::ModelSource& src, uint64_t seed) {
  const model::ParamLayout& layout = store.layout();
  const io::PretrainedModel* m = src.pretrained.get();
  std::vector<float> full;
  for (int u = 0; u < layout.num_units(); ++u) {
    const model::UnitLayout& unit = layout.unit(u);
    full.assign(static_cast<size_t>(unit.numel), 0.0f);
    // A pretrained LM supplies the trunk of a value/reward model; its new head is random.
    // A reward model's score head starts a critic's value head (same shape and name).
    const bool same_head =
        m && (m->head == layout.head() ||
              (layout.head() == model::HeadKind::kValue && m->head == model::HeadKind::kReward));
    const bool from_ckpt = m && (unit.kind != model::UnitKind::kHead || same_head);
    if (from_ckpt) {
      io::load_pretrained_unit(*m, layout, u, full.data());
    } else {
      model::init_unit_params(full.data(), unit, seed);
      if (m && unit.kind == model::UnitKind::kHead) {
        // Keep the pretrained final norm; only score.weight is new.
        const auto& norm = unit.at("model.norm.weight");
        m->tensors->read_checked("model.norm.weight", full.data() + norm.offset, norm.shape);
      }
    }
    store.load_unit(u, full.data());
  }
  // LoRA: the --lora_path adapter, else fresh adapters (PEFT's init) from the run's seed.
  if (auto* ls = dynamic_cast<parallel::LoraStore*>(&store)) {
    const model::LoraLayout& ll = ls->lora_layout();
    if (ll.config().path.empty()) {
      ls->init_adapters(seed);
    } else {
      ls->load_adapters(io::read_peft_adapter_weights(ll.config().path, ll).data());
      LOG0_INFO("LoRA adapters from {}", ll.config().path);
    }
  }
}

namespace {

// Every unit of the store, consolidated (collective).
std::vector<std::vector<float>> gather_units(parallel::ParamStore& store) {
  const model::ParamLayout& layout = store.layout();
  std::vector<std::vector<float>> units(static_cast<size_t>(layout.num_units()));
  for (int u = 0; u < layout.num_units(); ++u) {
    units[size_t(u)].resize(static_cast<size_t>(layout.unit(u).numel));
    store.gather_unit(u, units[size_t(u)].data());
  }
  return units;
}

// The gathered units as a TensorSource (HF names, the layout's shapes).
class UnitTensors final : public io::TensorSource {
 public:
  UnitTensors(const model::ParamLayout& layout, const std::vector<std::vector<float>>& units)
      : units_(units), source_("the trained model") {
    for (int u = 0; u < layout.num_units(); ++u)
      for (const model::TensorInfo& t : layout.unit(u).tensors) where_[t.name] = {u, t};
  }
  const std::string& source() const override { return source_; }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, e] : where_) out.push_back(name);
    return out;
  }
  std::optional<io::TensorMeta> find(const std::string& name) const override {
    auto it = where_.find(name);
    if (it == where_.end()) return std::nullopt;
    return io::TensorMeta{it->second.second.shape, "F32"};
  }
  void read(const std::string& name, float* out) const override {
    const auto& [u, t] = where_.at(name);
    const float* src = units_[size_t(u)].data() + t.offset;
    std::copy(src, src + t.numel, out);
  }

 private:
  const std::vector<std::vector<float>>& units_;
  std::string source_;
  std::map<std::string, std::pair<int, model::TensorInfo>> where_;
};

}  // namespace

void save_hf_model(parallel::ParamStore& store, const std::string& dir, int rank,
                   const io::Tokenizer* tokenizer) {
  const std::vector<std::vector<float>> units = gather_units(store);
  if (rank != 0) return;
  const model::ParamLayout& layout = store.layout();
  io::PretrainedModel m;
  m.path = dir;
  m.format = "hdf5";
  m.config = layout.config();
  m.head = layout.head();
  m.tensors = std::make_shared<UnitTensors>(layout, units);
  // Not owned: the caller's tokenizer outlives this call.
  if (tokenizer != nullptr)
    m.tokenizer = std::shared_ptr<const io::Tokenizer>(m.tensors, tokenizer);
  namespace fs = std::filesystem;
  const std::string tmp = dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  io::export_hf_folder(tmp, m, io::DType::kF32);
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  RLHF_CHECK(!ec, "cannot rename {} to {}: {}", tmp, dir, ec.message());
  LOG0_INFO("saved Hugging Face folder {}", dir);
}

std::string lora_adapter_dir(const std::string& model_path) {
  const std::filesystem::path p(model_path);
  return (p.parent_path() / (p.stem().string() + "_adapter")).string();
}

uint64_t save_model(parallel::ParamStore& store, const std::string& path, int rank,
                    const io::Tokenizer* tokenizer) {
  const model::ParamLayout& layout = store.layout();
  const std::vector<std::vector<float>> units = gather_units(store);
  std::vector<const float*> ptrs;
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the real elements' bytes, in unit order
  for (int u = 0; u < layout.num_units(); ++u) {
    ptrs.push_back(units[size_t(u)].data());
    for (const model::TensorInfo& t : layout.unit(u).tensors) {
      const auto* b = reinterpret_cast<const unsigned char*>(units[size_t(u)].data() + t.offset);
      for (size_t i = 0; i < size_t(t.numel) * sizeof(float); ++i)
        h = (h ^ b[i]) * 1099511628211ull;
    }
  }
  if (rank != 0) return h;
  io::CheckpointWriter w(path);
  io::write_model_hdf5(w, layout, ptrs);
  if (tokenizer != nullptr) io::write_tokenizer_hdf5(w, *tokenizer);
  w.commit();
  LOG0_INFO("saved {} | weights fingerprint {:016x}", path, h);
  if (auto* ls = dynamic_cast<parallel::LoraStore*>(&store)) {
    const std::string dir = lora_adapter_dir(path);
    io::write_peft_adapter(dir, ls->lora_layout(), ls->adapters(), "");
    LOG0_INFO("saved the LoRA adapter (PEFT) {}", dir);
  }
  return h;
}

}  // namespace rlhf::rl

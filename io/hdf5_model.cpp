// Model save / load on top of CheckpointWriter / CheckpointReader (io/hdf5_ckpt.h): the /model
// group's config attributes and one fp32 dataset per HF tensor.
#include <nlohmann/json.hpp>

#include <algorithm>

#include "io/hdf5_ckpt.h"

#include "core/error.h"

namespace rlhf::io {

namespace {
constexpr const char* kCorruptHint =
    "\nhint: the file may be truncated or corrupt (an interrupted copy?); use another checkpoint";
}  // namespace

model::HeadKind head_kind_from_string(const std::string& s) {
  if (s == "lm") return model::HeadKind::kLM;
  if (s == "value") return model::HeadKind::kValue;
  if (s == "reward") return model::HeadKind::kReward;
  RLHF_FAIL("unknown head kind '{}'\nhint: lm, value or reward", s);
}

void write_model_config_hdf5(CheckpointWriter& w, const model::ParamLayout& layout) {
  const nlohmann::json j = layout.config().to_json();
  w.create_group("/model");
  w.write_string_attr("/model", "config", j.dump());
  nlohmann::json scalars = nlohmann::json::object();
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.value().is_primitive() && !it.value().is_null()) scalars[it.key()] = it.value();
  w.write_attrs("/model", scalars);
  w.write_string_attr("/model", "head", model::to_string(layout.head()));
}

void write_model_unit_hdf5(CheckpointWriter& w, const model::ParamLayout& layout, int unit,
                           const float* unit_buffer) {
  RLHF_CHECK(unit >= 0 && unit < layout.num_units(), "unit {} out of range [0, {})", unit,
             layout.num_units());
  RLHF_CHECK(unit_buffer != nullptr, "null buffer for unit {}", layout.unit(unit).name);
  for (const model::TensorInfo& t : layout.unit(unit).tensors)
    w.write_dataset<float>("/model/" + t.name, unit_buffer + t.offset, t.shape);
}

void write_model_hdf5(CheckpointWriter& w, const model::ParamLayout& layout,
                      const std::vector<const float*>& unit_buffers) {
  RLHF_CHECK(static_cast<int>(unit_buffers.size()) == layout.num_units(),
             "write_model_hdf5: {} unit buffers for {} units", unit_buffers.size(),
             layout.num_units());
  write_model_config_hdf5(w, layout);
  for (int u = 0; u < layout.num_units(); ++u)
    write_model_unit_hdf5(w, layout, u, unit_buffers[static_cast<size_t>(u)]);
}

void save_model_hdf5(const std::string& path, const model::ParamLayout& layout,
                     const std::vector<const float*>& unit_buffers,
                     const nlohmann::json& extra_root_attrs) {
  RLHF_CHECK(extra_root_attrs.is_null() || extra_root_attrs.is_object(),
             "{}: extra root attributes must be a JSON object, got {}", path,
             extra_root_attrs.type_name());
  if (extra_root_attrs.is_object()) {
    RLHF_CHECK(!extra_root_attrs.contains("format") && !extra_root_attrs.contains("format_version"),
               "{}: 'format' and 'format_version' are reserved root attributes", path);
  }
  CheckpointWriter w(path);
  write_model_hdf5(w, layout, unit_buffers);
  if (extra_root_attrs.is_object()) w.write_attrs("/", extra_root_attrs);
  w.commit();
}

StoredModelConfig read_model_config_hdf5(const CheckpointReader& r) {
  check_checkpoint_format(r);
  RLHF_CHECK(r.exists("/model"), "{}: no /model group: the checkpoint holds no model", r.path());
  const std::string text = r.read_string_attr("/model", "config");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    RLHF_FAIL("{}: /model attribute 'config' is not valid JSON ({}){}", r.path(), e.what(),
              kCorruptHint);
  }
  StoredModelConfig out;
  out.config =
      model::ModelConfig::from_json(j, r.path() + ":/model", model::ConfigKeys::kHuggingFace);
  try {
    out.head = head_kind_from_string(r.read_string_attr("/model", "head"));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: /model attribute 'head': {}", r.path(), e.what()), e.where());
  }
  // The per-field attributes live in the checksummed object header; the JSON text must agree.
  const nlohmann::json attrs = r.read_attrs("/model");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const nlohmann::json& v = it.value();
    if (!v.is_primitive() || v.is_null() || !attrs.contains(it.key())) continue;
    const nlohmann::json& a = attrs[it.key()];
    bool same;
    if (v.is_boolean())
      same = a.is_number_integer() && a.get<int64_t>() == (v.get<bool>() ? 1 : 0);
    else if (v.is_number())
      same = a.is_number() && a.get<double>() == v.get<double>();
    else
      same = a == v;
    RLHF_CHECK(same, "{}: /model attribute '{}' = {} disagrees with the stored config ({}){}",
               r.path(), it.key(), a.dump(), v.dump(), kCorruptHint);
  }
  return out;
}

StoredModelConfig load_model_config_hdf5(const std::string& path) {
  CheckpointReader r(path);
  return read_model_config_hdf5(r);
}

void load_model_unit_hdf5(const CheckpointReader& r, const model::ParamLayout& layout, int unit,
                          float* unit_buffer) {
  RLHF_CHECK(unit >= 0 && unit < layout.num_units(), "unit {} out of range [0, {})", unit,
             layout.num_units());
  const model::UnitLayout& u = layout.unit(unit);
  RLHF_CHECK(unit_buffer != nullptr, "null buffer for unit {}", u.name);
  int64_t end = 0;  // zero the gaps between tensors and the padding, never touch a tensor twice
  for (const model::TensorInfo& t : u.tensors) {
    std::fill(unit_buffer + end, unit_buffer + t.offset, 0.0f);
    r.read_dataset<float>("/model/" + t.name, unit_buffer + t.offset, t.shape);
    end = t.offset + t.numel;
  }
  std::fill(unit_buffer + end, unit_buffer + u.numel, 0.0f);
}

void load_model_hdf5(const std::string& path, const model::ParamLayout& layout,
                     const std::vector<float*>& unit_buffers) {
  RLHF_CHECK(static_cast<int>(unit_buffers.size()) == layout.num_units(),
             "load_model_hdf5: {} unit buffers for {} units", unit_buffers.size(),
             layout.num_units());
  CheckpointReader r(path);
  const StoredModelConfig stored = read_model_config_hdf5(r);
  const nlohmann::json want = layout.config().to_json(), have = stored.config.to_json();
  std::vector<std::string> diffs;
  for (auto it = want.begin(); it != want.end(); ++it) {
    const nlohmann::json h = have.contains(it.key()) ? have[it.key()] : nlohmann::json();
    if (h != it.value())
      diffs.push_back(fmt::format("{} = {} (model: {})", it.key(), h.dump(), it.value().dump()));
  }
  RLHF_CHECK(diffs.empty(),
             "{}: the checkpoint's model config differs from the model being loaded: {}\nhint: "
             "use the checkpoint's config (load_model_config_hdf5), or load units one by one",
             path, fmt::join(diffs, ", "));
  RLHF_CHECK(stored.head == layout.head(),
             "{}: the checkpoint has a '{}' head, the model being loaded a '{}' head\nhint: load "
             "the shared units one by one (load_model_unit_hdf5) and initialise the head",
             path, model::to_string(stored.head), model::to_string(layout.head()));
  for (int u = 0; u < layout.num_units(); ++u)
    load_model_unit_hdf5(r, layout, u, unit_buffers[static_cast<size_t>(u)]);
}

}  // namespace rlhf::io

#include "io/model_source.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "core/error.h"
#include "io/model_config_file.h"

namespace rlhf::io {

std::string ModelSource::describe() const {
  if (checkpoint.empty()) return "random init";
  if (format == "hdf5") return "checkpoint " + checkpoint;
  return pretrained ? pretrained->detail + " " + checkpoint : format + " " + checkpoint;
}

ModelSource resolve_model_source(const std::string& model_config, const std::string& pretrain,
                                 const std::string& tokenizer, model::HeadKind want_head) {
  namespace fs = std::filesystem;
  ModelSource src;
  src.head = want_head;
  if (!model_config.empty()) {
    RLHF_CHECK(fs::exists(model_config), "--model_config {}: no such file", model_config);
    src.config = load_model_config_file(model_config);
    if (!tokenizer.empty()) src.tokenizer = make_tokenizer(tokenizer);
    return src;
  }
  // A folder is our checkpoint folder (model.h5) unless it is a Hugging Face folder.
  std::string path = pretrain;
  if (fs::is_directory(path) &&
      (fs::exists(fs::path(path) / "model.h5") || !fs::exists(fs::path(path) / "config.json")))
    path = (fs::path(path) / "model.h5").string();
  RLHF_CHECK(fs::exists(path), "--pretrain {}: no such file{}", pretrain,
             path != pretrain ? " (looked for " + path + ")" : "");
  auto m = std::make_shared<PretrainedModel>(open_pretrained_arg(path, tokenizer));
  // An LM supplies the trunk of a value/reward model; a reward model initialises a critic whole
  // (OpenRLHF's default: the critic starts from --reward_pretrain; both heads are score.weight).
  RLHF_CHECK(m->head == want_head ||
                 (want_head != model::HeadKind::kLM && m->head == model::HeadKind::kLM) ||
                 (want_head == model::HeadKind::kValue && m->head == model::HeadKind::kReward),
             "--pretrain {}: the checkpoint has a '{}' head, this command needs '{}'", path,
             model::to_string(m->head), model::to_string(want_head));
  src.config = m->config;
  src.checkpoint = m->path;
  src.format = m->format;
  src.tokenizer = m->tokenizer;
  src.pretrained = std::move(m);
  src.head = want_head;
  return src;
}

PretrainedModel open_pretrained_arg(const std::string& pretrain, const std::string& tokenizer) {
  try {
    return open_pretrained(pretrain, tokenizer);
  } catch (const Error& e) {
    throw Error(fmt::format("--pretrain {}: {}", pretrain, e.what()), e.where());
  }
}

std::shared_ptr<const Tokenizer> model_tokenizer(const ModelSource& src) {
  std::shared_ptr<const Tokenizer> tok = src.tokenizer;
  if (!tok) tok = make_tokenizer("byte");
  RLHF_CHECK(tok->vocab_size() <= src.config.vocab_size,
             "the tokenizer {} has {} tokens but the model's vocab_size is {}\nhint: set "
             "vocab_size >= {} in the model config, or give the model's own tokenizer with "
             "--tokenizer",
             tok->name(), tok->vocab_size(), src.config.vocab_size, tok->vocab_size());
  return tok;
}

void load_model_weights(const ModelSource& src, const model::ParamLayout& layout,
                        const std::vector<float*>& unit_buffers) {
  RLHF_CHECK(src.pretrained != nullptr, "no pretrained model to load weights from");
  RLHF_CHECK(static_cast<int>(unit_buffers.size()) == layout.num_units(),
             "load_model_weights: {} unit buffers for {} units", unit_buffers.size(),
             layout.num_units());
  const PretrainedModel& m = *src.pretrained;
  RLHF_CHECK(m.config.to_json() == layout.config().to_json() && m.head == layout.head(),
             "{}: the model's config or head differs from the one being loaded", m.path);
  for (int u = 0; u < layout.num_units(); ++u)
    load_pretrained_unit(m, layout, u, unit_buffers[static_cast<size_t>(u)]);
}

}  // namespace rlhf::io

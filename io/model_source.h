// Where a model comes from: a config for random init, or a pretrained model in any supported
// format (io/pretrained.h), with the tokenizer that came with it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/pretrained.h"
#include "io/tokenizer.h"
#include "model/config.h"
#include "model/layout.h"

namespace rlhf::io {

/// A model to start from (see resolve_model_source).
struct ModelSource {
  model::ModelConfig config;
  model::HeadKind head = model::HeadKind::kLM;
  std::string checkpoint;  ///< the model file/folder weights come from; "" = random init
  std::string format;      ///< "hdf5" | "safetensors" | "llama2c" | "gguf"; "" = random init
  /// The opened model (weights are read lazily); null for random init.
  std::shared_ptr<const PretrainedModel> pretrained;
  /// The model's tokenizer (or --tokenizer's); null when there is none (random init without
  /// --tokenizer, or a llama2.c file with no tokenizer next to it).
  std::shared_ptr<const Tokenizer> tokenizer;
  /// "random init", "checkpoint <path>", or the format's detail and the path.
  std::string describe() const;
};

/// Resolves --model_config / --pretrain / --tokenizer (exactly one of the first two non-empty).
/// --pretrain takes any format of open_pretrained; a directory means `<dir>/model.h5` when that
/// exists, else a Hugging Face folder. Throws rlhf::Error naming the flag when the file is
/// missing or unreadable, or when the checkpoint's head is not `want_head` (an LM trunk may start
/// a value or reward model; a reward model may start a critic).
ModelSource resolve_model_source(const std::string& model_config, const std::string& pretrain,
                                 const std::string& tokenizer, model::HeadKind want_head);

/// open_pretrained(pretrain, tokenizer) with errors prefixed by "--pretrain <path>: ".
PretrainedModel open_pretrained_arg(const std::string& pretrain, const std::string& tokenizer);

/// The tokenizer a command uses: the model's own (ModelSource::tokenizer), else the byte
/// tokenizer. Throws rlhf::Error when the tokenizer's vocabulary is larger than the model's
/// vocab_size.
std::shared_ptr<const Tokenizer> model_tokenizer(const ModelSource& src);

/// Fills full unit buffers (unit_buffers[u] has at least layout.unit(u).numel floats) from a
/// pretrained source of any format, after checking that its config and head equal the layout's
/// (e.g. a generation engine's buffers). Throws rlhf::Error for a random-init source.
void load_model_weights(const ModelSource& src, const model::ParamLayout& layout,
                        const std::vector<float*>& unit_buffers);

}  // namespace rlhf::io

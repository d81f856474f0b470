// ParamLayout: the flat-buffer layout of every ZeRO unit (embedding, each decoder layer, final
// norm + head), as a table of Hugging Face tensor names, shapes and offsets (docs/design.md, "Flat
// parameter units").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace rlhf::model {

/// Every tensor starts on a multiple of this many elements inside its unit.
inline constexpr int64_t kTensorAlignElems = 64;

/// One tensor inside a unit: HF name, shape (row-major, HF convention (out, in) for linears),
/// element offset from the start of the unit, and element count.
struct TensorInfo {
  std::string name;  ///< full HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0;  ///< elements from the start of the unit; a multiple of kTensorAlignElems
  int64_t numel = 0;
  bool weight_decay = true;  ///< false for biases and norm weights (OpenRLHF's no-decay list)
};

/// What a unit is.
enum class UnitKind { kEmbedding, kLayer, kHead };

/// One ZeRO unit: the tensors of one flat fp32 buffer.
struct UnitLayout {
  std::string name;  ///< "model.embed_tokens", "model.layers.3", "head"
  UnitKind kind = UnitKind::kLayer;
  int layer = -1;  ///< decoder layer index for kLayer, else -1
  std::vector<TensorInfo> tensors;
  int64_t numel = 0;  ///< end of the last tensor (includes inner alignment gaps, which are 0)

  /// The tensor whose name ends with `suffix` ("self_attn.q_proj.weight"); nullptr if none.
  const TensorInfo* find(std::string_view suffix) const;
  /// Same, but throws rlhf::Error if absent.
  const TensorInfo& at(std::string_view suffix) const;
};

/// The layout of a whole model, built once from its config. Unit 0 is the embedding, units
/// 1..L are the decoder layers, unit L+1 is the head (model.norm + lm_head | score).
/// With tie_word_embeddings and an LM head, the head unit holds only model.norm.weight and the
/// LM head reads the embedding unit's `model.embed_tokens.weight`.
///
/// A unit buffer holds at least `numel` elements; whoever allocates it may make it longer (ZeRO-3
/// pads units so they split evenly over ranks: parallel/shard_layout.h). The model reads and
/// writes only [0, numel). The layout knows nothing of how units are sharded.
class ParamLayout {
 public:
  /// Throws rlhf::Error when the config is invalid (ModelConfig::validate).
  ParamLayout(const ModelConfig& config, HeadKind head);

  const ModelConfig& config() const { return config_; }
  HeadKind head() const { return head_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitLayout& unit(int i) const { return units_.at(static_cast<size_t>(i)); }
  const std::vector<UnitLayout>& units() const { return units_; }
  int embedding_unit() const { return 0; }
  int layer_unit(int l) const { return 1 + l; }
  int head_unit() const { return num_units() - 1; }

  /// Where a unit's tensor starts: unit index and element offset in its flat buffer.
  struct TensorRef {
    int unit;
    int64_t offset;
  };
  /// The LM head's (V, C) weight: the embedding unit's embed_tokens.weight when
  /// tie_word_embeddings, else the head unit's lm_head.weight. Throws rlhf::Error (from
  /// UnitLayout::at) when the model has an untied value or reward head instead.
  TensorRef lm_head_weight() const;

  /// (unit index, tensor) for a full HF name; throws rlhf::Error if it is not part of the model.
  std::pair<int, const TensorInfo*> locate(std::string_view hf_name) const;
  /// Sum of numel (real parameters) over all tensors, excluding alignment gaps.
  int64_t num_parameters() const;
  /// Sum of UnitLayout::numel over all units (gaps included): the elements of every unit buffer.
  int64_t total_numel() const;

 private:
  ModelConfig config_;
  HeadKind head_;
  std::vector<UnitLayout> units_;
};

}  // namespace rlhf::model

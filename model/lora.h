// LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3),
// with PEFT's conventions: for each targeted projection of a decoder layer, W' = W + (α/r)·B·A
// with A (r, in) Kaiming-uniform(a = √5) and B (out, r) zero at initialisation, so a fresh
// adapter leaves the model unchanged. Training runs the adapter unmerged beside the frozen base
// weight: y = x·Wᵀ (+ b) + (α/r)·(x·Aᵀ)·Bᵀ; only A and B get gradients. The adapters of a model
// live in one flat fp32 buffer laid out by LoraLayout; the projection call sites
// (model/decoder_layer.cpp: project_forward_cpu / project_backward_cpu) read them through the
// layer's parameter view (LayerParams::lora).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/arch.h"
#include "model/layout.h"
#include "model/projections.h"
#include "model/provider.h"

namespace rlhf::model {

/// The LoRA flags of a training command (OpenRLHF names): --lora_rank (0 = off), --lora_alpha,
/// --target_modules, --lora_dropout.
struct LoraConfig {
  int rank = 0;
  double alpha = 16.0;
  /// targets[p]: projection p (Proj order) carries an adapter.
  std::array<bool, kNumProj> targets{};
  /// Dropout probability on the adapter branch's input (PEFT's lora_dropout): in training passes
  /// only, inverted (kept inputs scaled by 1/(1−p)), masks drawn from `seed` (lora_dropout_keep).
  double dropout = 0.0;
  /// The run's seed (--seed), which the dropout masks derive from.
  uint64_t seed = 0;
  /// --lora_path: a PEFT adapter folder (io/peft_adapter.h) the adapters start from instead of
  /// PEFT's fresh init; "" = fresh.
  std::string path;
  /// PEFT's modules_to_save for a sequence-classification model (task_type SEQ_CLS: a reward
  /// model or a critic): the score head `score.weight` (1, hidden) trains fully — a copy kept
  /// among the adapters (LoraLayout::score_offset), with gradients and AdamW moments like theirs —
  /// while the base's own copy stays frozen. Set for models with a scalar head.
  bool save_score = false;

  bool enabled() const { return rank > 0; }
  /// α / r, PEFT's `scaling` (use_rslora = false).
  double scale() const { return alpha / double(rank); }
  /// Throws rlhf::Error naming the flag on rank < 0, alpha ≤ 0, dropout outside [0, 1), or
  /// (rank > 0) no target.
  void validate() const;
};

/// Parses --target_modules: "all-linear" (every projection of model/projections.h) or a comma
/// list of HF projection names ("q_proj,v_proj"). Throws rlhf::Error naming the flag and the
/// unknown name.
std::array<bool, kNumProj> parse_target_modules(std::string_view s);

/// The comma list of the targeted projections' names, in Proj order ("q_proj,k_proj").
std::string target_modules_string(const std::array<bool, kNumProj>& targets);

/// Where every adapter of a model lies in one flat buffer: layer by layer, each targeted
/// projection's A (r, in) then B (out, r), row-major, then (LoraConfig::save_score) the trained
/// copy of the score head "score.weight" (1, C); each tensor starts on a multiple of
/// kTensorAlignElems (gaps are zero). in/out are the projection's (model/projections.h).
class LoraLayout {
 public:
  /// One projection's adapter: element offsets of A and B (−1 when not targeted) and dims.
  struct Entry {
    int64_t a = -1, b = -1;
    int64_t in = 0, out = 0;
  };
  /// Throws rlhf::Error from cfg.validate(), or when cfg is not enabled.
  LoraLayout(const LayerSpec& spec, int num_layers, const LoraConfig& cfg);

  const LoraConfig& config() const { return cfg_; }
  int num_layers() const { return int(entries_.size()); }
  /// Layer l's adapter for projection p.
  const Entry& entry(int l, Proj p) const {
    return entries_.at(size_t(l))[size_t(static_cast<int>(p))];
  }
  /// Elements of the flat buffer (gaps included).
  int64_t numel() const { return numel_; }
  /// Offset of the trained score head "score.weight" (1, C) in the flat buffer; −1 without
  /// LoraConfig::save_score.
  int64_t score_offset() const { return score_; }
  /// The adapter tensors with their Hugging Face-style names ("model.layers.3.self_attn.q_proj.
  /// lora_A.weight"), shapes, offsets in the flat buffer and weight decay on (as PEFT's
  /// parameters are decayed by OpenRLHF's AdamW).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// Adapter parameters (Σ numel, no gaps).
  int64_t num_parameters() const {
    int64_t n = 0;
    for (const TensorInfo& t : tensors_) n += t.numel;
    return n;
  }
  /// "LoRA r=16 alpha=16 on q_proj,...: N adapter parameters" (+ " and the score head").
  std::string describe() const;
  /// PEFT's key of a tensor named as in tensors(): "base_model.model." + name — what
  /// save_pretrained writes, also for the score head of modules_to_save ("base_model.model.
  /// score.weight"; in memory PEFT names it "base_model.model.score.modules_to_save.default.
  /// weight").
  static std::string peft_key(const std::string& name) { return "base_model.model." + name; }

 private:
  LoraConfig cfg_;
  std::vector<std::array<Entry, kNumProj>> entries_;
  std::vector<TensorInfo> tensors_;
  int64_t numel_ = 0;
  int64_t score_ = -1;
};

/// One projection's adapter as the call site sees it: A (r, in), B (out, r) and, when training,
/// their gradients dA, dB (accumulated +=; nullptr: no gradient wanted). A == nullptr: the
/// projection has no adapter.
template <typename T>
struct LoraProjView {
  const T* A = nullptr;
  const T* B = nullptr;
  T* dA = nullptr;
  T* dB = nullptr;
  int64_t r = 0;
  /// Dropout on the branch's input for this pass (0 = none) and the key of its mask
  /// (lora_dropout_keep).
  double dropout = 0.0;
  uint64_t key = 0;
};

/// Whether element (n, i) of a branch input (rows of `in` elements) is kept by the dropout mask
/// of `key` at probability p: a uniform u ∈ (0, 1) from a counter-based hash of (key, n·in + i),
/// kept when u ≥ p. The same key gives the same mask in forward, recompute and backward.
bool lora_dropout_keep(uint64_t key, int64_t n, int64_t i, int64_t in, double p);

/// The mask key of layer l, projection p in a training pass `pass` of a run with `seed`.
uint64_t lora_dropout_key(uint64_t seed, uint64_t pass, int l, Proj p);

/// A training pass's dropout id (≠ 0): a hash of the adapters' bytes (`bytes` at `adapters`) and
/// the micro-batch's n tokens. The masks are thus a function of (seed, weights, batch): the same
/// after a resume (the adapters are restored bit for bit) and whichever rank runs the batch, and
/// new at every optimizer step.
uint64_t lora_dropout_pass(const void* adapters, size_t bytes, const int32_t* tokens, int64_t n);

/// A decoder layer's adapters (LayerParams::lora) and the scale α/r.
template <typename T>
struct LoraLayerView {
  std::array<LoraProjView<T>, kNumProj> proj{};
  T scale = T(0);
  const LoraProjView<T>& operator[](Proj p) const { return proj[size_t(static_cast<int>(p))]; }
};

/// Layer l's view over the flat adapter buffer `params` (LoraLayout::numel elements of T) and
/// optionally its gradient buffer `grads` (same layout; nullptr: no gradients). dropout_pass > 0:
/// a training pass with the config's dropout, masks keyed by (config seed, dropout_pass, l, p);
/// 0: no dropout (evaluation, experience passes).
template <typename T>
LoraLayerView<T> lora_layer_view(const LoraLayout& layout, int l, const T* params, T* grads,
                                 uint64_t dropout_pass = 0);

/// PEFT's initialisation into the flat buffer (numel floats): every A ~ U(−1/√in, 1/√in)
/// (torch.nn.init.kaiming_uniform_(a = √5): gain √(2/(1+5)), bound = gain·√(3/fan_in)), every B =
/// 0, gaps 0. Each value depends only on (seed, tensor name, element index), like
/// init_unit_params (model/init.h). The score head's copy (score_offset) is left as it is: PEFT
/// starts modules_to_save from the base's module (LoraStore::load_unit copies it there).
void lora_init(const LoraLayout& layout, float* params, uint64_t seed);

/// Adds the adapter branch to a projection's output: y (N, out) += scale·(d(x)·Aᵀ)·Bᵀ for x (N,
/// in), d = PEFT's inverted dropout (x·mask/(1−p), mask from a.key; identity when a.dropout is 0).
/// Two BLAS GEMMs through an (N, r) intermediate. No-op when a.A is nullptr.
template <typename T>
void lora_forward_cpu(T* y, const T* x, const LoraProjView<T>& a, T scale, int64_t N, int64_t in,
                      int64_t out);

/// Backward of lora_forward_cpu for dy (N, out): with x' = d(x), h = x'·Aᵀ and g = scale·dy·B
/// (N, r), dB += scale·dyᵀ·h, dA += gᵀ·x', and dx (N, in) += d(g·A) (the same mask; skipped when
/// dx is nullptr). The base weight's gradient is not touched. No-op when a.A is nullptr.
template <typename T>
void lora_backward_cpu(T* dx, const T* dy, const T* x, const LoraProjView<T>& a, T scale, int64_t N,
                       int64_t in, int64_t out);

/// Merges an adapter into its base weight: w (out, in) += sign·scale·B·A (sign = −1 unmerges).
/// Accumulates in T.
template <typename T>
void lora_merge_cpu(T* w, const T* A, const T* B, T scale, int64_t r, int64_t in, int64_t out,
                    T sign = T(1));

/// A base model frozen under LoRA: parameters come from `base`, and no gradient buffer is handed
/// out (acquire_grads returns nullptr, which the model reads as "skip every base gradient";
/// release_grads does nothing), so a weights-only store (Zero3Options::frozen) can be trained
/// through its adapters.
template <typename T>
class FrozenBaseProvider final : public UnitProvider<T> {
 public:
  explicit FrozenBaseProvider(UnitProvider<T>& base) : base_(base) {}
  const T* acquire_params(int u) override { return base_.acquire_params(u); }
  void release_params(int u) override { base_.release_params(u); }
  T* acquire_grads(int) override { return nullptr; }
  void release_grads(int) override {}
  void begin_pass(bool backward) override { base_.begin_pass(backward); }
  void end_pass(bool backward) override { base_.end_pass(backward); }

 private:
  UnitProvider<T>& base_;
};

}  // namespace rlhf::model

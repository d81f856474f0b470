// The CPU backend of the generation engine (rollout/engine_backend.h): fp32 weights read from the
// engine's host unit buffers, their linears packed for the batch-invariant decode kernel
// (model::linear_decode_pack), a paged fp32 or fp16 KV cache in host memory, prompt rows and
// decode rows through linear_decode_packed_cpu, attention_decode_cpu for decode. Tensor parallel
// (Megatron style) over a parallel::Comm.
// In bf16 (EngineOptions::bf16, the trainer's --param_dtype bf16): the linears' weights are bf16
// copies instead (model/layer_bf16.h numerics: bf16 operands, fp32 accumulation, outputs rounded
// to bf16) — prompts through oneDNN, decode rows through linear_decode_packed_bf16_cpu (half the
// bytes per step, still batch-invariant); no packed fp32 copy is kept.
#include <algorithm>
#include <array>
#include <string>
#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include "core/checked_alloc.h"
#include "core/error.h"
#include "model/layer_bf16.h"
#include "model/layer_params.h"
#include "model/ops/attention.h"
#include "model/ops/attention_decode.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "model/ops/linear_decode.h"
#include "model/ops/matmul_bf16.h"
#include "model/ops/rmsnorm.h"
#include "model/ops/rope.h"
#include "rollout/engine.h"
#include "rollout/engine_backend.h"
#include "rollout/tp_slice.h"

namespace rlhf::rollout {

namespace {

// Prefill attention through attention_forward_cpu needs an (H, P, P) probability scratch; above
// this many floats it goes through attention_decode_cpu over the cache instead (one query row per
// "sequence", lengths 1..P), which needs no P×P memory.
constexpr int64_t kMaxPrefillAttFloats = int64_t(1) << 24;  // 64 MiB

// Pointers to the tensors of one decoder layer inside its unit buffer.
using LayerW = model::LayerParams<const float>;
using Acts = model::LayerActs<float>;

template <typename T>
void grow(std::vector<T>& v, int64_t n, const char* what) {
  checked_grow(v, n, what);
}

// Frees v's storage; returns the bytes it held.
template <typename T>
int64_t free_vector(std::vector<T>& v) {
  const int64_t bytes = int64_t(v.capacity() * sizeof(T));
  std::vector<T>().swap(v);
  return bytes;
}

/// The activations of one forward over up to `rows` rows (one layer at a time), grown on demand
/// and reused across steps (first touch of fresh memory is expensive here).
struct Rows {
  std::vector<float> x;  // (rows, C) residual stream
  std::array<std::vector<float>, 14> bufs;
  Acts a;
  int64_t rows = 0;

  /// Room for n rows of s's (this rank's) shapes; the layer routine's view of them. The one place
  /// the activations are listed: each LayerActs buffer with its floats per row (0: unused).
  Acts& acts(int64_t n, const model::LayerSpec& s) {
    if (n <= rows) return a;
    const int64_t C = s.C, Q = s.q_dim(), KV = s.kv_dim(), F = s.F;
    const std::array<std::pair<float * Acts::*, int64_t>, 14> table = {{
        {&Acts::ln1, C},
        {&Acts::rstd1, 1},
        {&Acts::q, Q},
        {&Acts::k, KV},
        {&Acts::v, KV},
        {&Acts::q_rstd, s.qk_norm ? s.H : 0},
        {&Acts::k_rstd, s.qk_norm ? s.Hkv : 0},
        {&Acts::atty, Q},
        {&Acts::x_mid, C},
        {&Acts::ln2, C},
        {&Acts::rstd2, 1},
        {&Acts::gate, F},
        {&Acts::up, F},
        {&Acts::h, F},
    }};
    checked_resize(x, n * C, "engine activations");
    for (size_t i = 0; i < table.size(); ++i)
      checked_resize(bufs[i], n * table[i].second, "engine activations");
    for (size_t i = 0; i < table.size(); ++i)
      a.*table[i].first = table[i].second > 0 ? bufs[i].data() : nullptr;
    rows = n;  // after the allocations: a failed one leaves the old size in force
    return a;
  }
};

class EngineCpu final : public EngineBackend {
 public:
  EngineCpu(const model::ParamLayout& layout, const EngineOptions& o, const EngineWeights& weights,
            const TpGroup& tp)
      : layout_(layout),
        weights_(weights),
        tp_(tp),
        spec_(tp_layer_spec(layout.config(), tp)),
        projections_(model::layer_projections(spec_)),
        cache_(tp_kv_config(layout.config(), tp), o.kv_cache_bytes, o.block_size,
               kv_element_bytes(o.kv_cache_dtype)),
        bf16_(o.bf16) {
    RLHF_CHECK(!bf16_ || model::onednn_available(),
               "a bf16 CPU engine needs oneDNN, and this build has none (libdnnl-dev; CMake "
               "RLHF_ONEDNN)");
    const model::ModelConfig& c = layout.config();
    // P <= kMaxPositionEmbeddings and D <= kMaxHeadDim (ModelConfig::validate): P·D/2 <= 2^35.
    const int64_t P = c.max_position_embeddings, D = c.D();
    const std::string rope = fmt::format("({} positions x {} frequencies)", P, D / 2);
    checked_resize(rope_cos_, P * D / 2, "the engine's RoPE cos table " + rope);
    checked_resize(rope_sin_, P * D / 2, "the engine's RoPE sin table " + rope);
    model::rope_tables_cpu(rope_cos_.data(), rope_sin_.data(), P, D,
                           model::rope_inv_freq(c).data());
  }

  KvCache& kv_cache() override { return cache_; }
  bool feeds_observations() const override { return tp_.size == 1; }
  int64_t weight_element_bytes() const override {
    return bf16_ ? int64_t(sizeof(model::bfloat16)) : int64_t(sizeof(float));
  }

  void set_lora(const model::LoraLayout* layout, const float* adapters) override {
    lora_views_.clear();
    if (layout == nullptr) return;
    for (int l = 0; l < layout->num_layers(); ++l)
      lora_views_.push_back(model::lora_layer_view<float>(*layout, l, adapters, nullptr));
  }

  void prepare_weights(bool) override {
    if (tp_.size > 1) slice_weights();  // the unit buffers may have changed (weight sync)
    if (bf16_)
      convert_weights_bf16();
    else
      pack_weights();
  }
  const float* prefill(const int32_t* prompt, int64_t P, const int32_t* blocks) override;
  const float* prefill_batch(const PrefillBatch& batch) override;
  void copy_prefix(const int32_t* src, const int32_t* dst, int64_t n) override {
    cache_.copy_prefix(src, dst, n);
  }
  const float* decode(const DecodeBatch& batch) override;
  EngineMemoryPlan memory_plan() const override;
  int64_t sleep() override;
  int64_t wake() override { return cache_.restore_storage(); }

 private:
  /// A layer's weights with their linears replaced by packed panels.
  struct LayerCopy {
    std::array<std::vector<float>, model::kNumProj> w;  // by Proj
    LayerW view;  // the copies, with the source's other tensors
  };
  /// Tensor parallel: this rank's slices of a layer's linears and of their LoRA adapters.
  struct LayerSlice {
    std::array<TpProjSlice, model::kNumProj> proj;  // by Proj
    model::LoraLayerView<float> lora;               // the adapters' slices (view.lora)
    LayerW view;  // the slices, with the full buffer's norms; lora: the adapters' (or nullptr)
  };
  /// A layer's linears in bf16: plain (oneDNN, prefill) and packed (decode) copies, by Proj.
  struct LayerBf16Copy {
    std::array<std::vector<model::bfloat16>, model::kNumProj> plain, packed;
    model::LayerBf16 plain_view, packed_view;
  };
  void slice_weights();
  void pack_weights();
  void convert_weights_bf16();
  // Layer l's weights as the unit buffer holds them (this rank's slices under TP), with its LoRA
  // adapters (this rank's slices under TP; applied unmerged, beside the base GEMM: the prefill's
  // path, and bf16 decode's).
  LayerW layer_weights(int l) const {
    if (tp_.size > 1) return sliced_[size_t(l)].view;
    const int u = layout_.layer_unit(l);
    LayerW w(layout_.unit(u), weights_.unit_buffer(u));
    if (!lora_views_.empty()) w.lora = &lora_views_[size_t(l)];
    return w;
  }
  const float* unit_tensor(int u, const char* name) const {
    return weights_.unit_buffer(u) + layout_.unit(u).at(name).offset;
  }
  model::LayerRun<float> layer_run(int64_t N, const int32_t* pos,
                                   model::LinearFn<float> linear) const;
  void attend_cached(float* out, const float* q, int l, const int32_t* table, const int32_t* lens,
                     int64_t B, int64_t max_blocks) const;
  const float* head_logits(const float* x, int64_t N, Rows& r, float* logits);
  // The prompts' forward (fp32: all in one; bf16: G = 1) into their KV blocks; (G, V) logits.
  const float* forward_prompts(const PrefillBatch& b);
  // Layer l's causal attention of one prompt (P rows of q, k, v; this rank's heads) into atty,
  // after writing its K/V into the blocks `blocks`.
  void attend_prompt(float* atty, const float* q, const float* k, const float* v, int l,
                     const int32_t* blocks, int64_t P);

  const model::ParamLayout& layout_;
  const EngineWeights& weights_;
  TpGroup tp_;
  model::LayerSpec spec_;  // this rank's layer dims (the heads and MLP columns it computes)
  std::vector<model::Projection> projections_;  // the layer's projections with spec_'s dims
  KvCache cache_;
  std::vector<float> rope_cos_, rope_sin_;
  std::vector<LayerSlice> sliced_;  // TP > 1: this rank's slices
  std::vector<LayerCopy> packed_;   // the decode copies (linear_decode_pack)
  std::vector<float> packed_head_;
  bool bf16_ = false;
  std::vector<LayerBf16Copy> bf16_layers_;               // bf16: each layer's linears
  std::vector<model::bfloat16> packed_head_bf16_;        // bf16: the packed LM head
  std::vector<model::LoraLayerView<float>> lora_views_;  // per layer; empty: no adapters
  std::vector<float> merged_;                            // pack_weights' W + (α/r)·B·A scratch
  Rows decode_rows_, prefill_rows_;
  std::vector<float> logits_;          // (B, V) decode logits
  std::vector<float> patt_, plogits_;  // prefill: attention probabilities, last logits
  std::vector<int32_t> ppos_, plens_, ptable_;
};

void EngineCpu::slice_weights() {
  const model::ModelConfig& c = layout_.config();
  sliced_.resize(size_t(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int u = layout_.layer_unit(l);
    const LayerW full(layout_.unit(u), weights_.unit_buffer(u));
    const model::LoraLayerView<float>* lora =
        lora_views_.empty() ? nullptr : &lora_views_[size_t(l)];
    LayerSlice& t = sliced_[size_t(l)];
    t.view = full;  // the norms stay the full buffers'
    t.lora = model::LoraLayerView<float>{};
    if (lora != nullptr) t.lora.scale = lora->scale;
    for (const model::Projection& p : projections_) {
      const size_t i = size_t(p.id());
      TpProjSlice& sl = t.proj[i];
      tp_slice_projection(p, tp_.size, tp_.rank, full.weight(p.id()), full.bias(p.id()),
                          lora != nullptr ? (*lora)[p.id()] : model::LoraProjView<float>{}, sl);
      t.view.weight(p.id()) = sl.weight;
      t.view.bias(p.id()) = sl.bias;
      t.lora.proj[i] = sl.lora;
    }
    t.view.lora = lora != nullptr ? &t.lora : nullptr;
  }
}

void EngineCpu::pack_weights() {
  const model::ModelConfig& c = layout_.config();
  packed_.resize(size_t(c.num_hidden_layers));
  auto pack = [](std::vector<float>& dst, const float* w, int64_t IC, int64_t OC) {
    checked_resize(dst, model::linear_decode_packed_size(IC, OC), "the engine's packed weights");
    model::linear_decode_pack(dst.data(), w, IC, OC);
    return static_cast<const float*>(dst.data());
  };
  if (!lora_views_.empty()) {  // the merge scratch, sized once: the largest adapted weight
    int64_t most = 0;
    for (const model::Projection& pr : projections_)
      for (const model::LoraLayerView<float>& v : lora_views_)
        if (v[pr.id()].A != nullptr) most = std::max(most, pr.in * pr.out);
    checked_resize(merged_, most, "the engine's merged LoRA weight");
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerCopy& p = packed_[size_t(l)];
    const LayerW w = layer_weights(l);
    p.view = w;             // the packed linears, with the unpacked norms and biases
    p.view.lora = nullptr;  // decode reads the adapters merged into its packed copies
    for (const model::Projection& pr : projections_) {
      const float* src = w.weight(pr.id());
      const model::LoraProjView<float>* a = w.lora != nullptr ? &(*w.lora)[pr.id()] : nullptr;
      if (a != nullptr && a->A != nullptr) {  // W' = W + (α/r)·B·A, then packed
        std::copy(src, src + pr.in * pr.out, merged_.begin());
        model::lora_merge_cpu(merged_.data(), a->A, a->B, w.lora->scale, a->r, pr.in, pr.out);
        src = merged_.data();
      }
      p.view.weight(pr.id()) = pack(p.w[size_t(pr.id())], src, pr.in, pr.out);
    }
  }
  const model::ParamLayout::TensorRef lw = layout_.lm_head_weight();
  pack(packed_head_, weights_.unit_buffer(lw.unit) + lw.offset, c.hidden_size, c.vocab_size);
}

void EngineCpu::convert_weights_bf16() {
  const model::ModelConfig& c = layout_.config();
  bf16_layers_.resize(size_t(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerBf16Copy& t = bf16_layers_[size_t(l)];
    const LayerW w = layer_weights(l);
    t.packed_view.packed = true;
    for (const model::ProjInfo& pi : model::kProjections) {
      const model::Projection r = model::projection(spec_, pi.id);
      auto& plain = t.plain[size_t(pi.id)];
      auto& packed = t.packed[size_t(pi.id)];
      checked_resize(plain, r.in * r.out, "the engine's bf16 weights");
      model::float_to_bf16_n(plain.data(), w.weight(pi.id), r.in * r.out);
      checked_resize(packed, model::linear_decode_packed_size(r.in, r.out),
                     "the engine's packed bf16 weights");
      model::linear_decode_pack_bf16(packed.data(), w.weight(pi.id), r.in, r.out);
      t.plain_view.w.weight(pi.id) = plain.data();
      t.packed_view.w.weight(pi.id) = packed.data();
    }
  }
  const model::ParamLayout::TensorRef lw = layout_.lm_head_weight();
  checked_resize(packed_head_bf16_, model::linear_decode_packed_size(c.hidden_size, c.vocab_size),
                 "the engine's packed bf16 LM head");
  model::linear_decode_pack_bf16(packed_head_bf16_.data(),
                                 weights_.unit_buffer(lw.unit) + lw.offset, c.hidden_size,
                                 c.vocab_size);
}

EngineMemoryPlan EngineCpu::memory_plan() const {
  const model::ModelConfig& c = layout_.config();
  int64_t weights = 0, merge_scratch = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int u = layout_.layer_unit(l);
    const LayerW full(layout_.unit(u), weights_.unit_buffer(u));
    for (const model::Projection& sl : projections_) {
      const model::LoraProjView<float>* a =
          lora_views_.empty() ? nullptr : &lora_views_[size_t(l)][sl.id()];
      const int64_t lora_r = a != nullptr && a->A != nullptr ? a->r : 0;
      if (tp_.size > 1)  // slice_weights: the weight, a column-parallel bias, the adapter's slice
        weights += tp_slice_copied_floats(sl, full.bias(sl.id()) != nullptr, lora_r) *
                   int64_t(sizeof(float));
      if (lora_r > 0 && !bf16_)  // pack_weights' merge scratch: the largest adapted weight
        merge_scratch = std::max(merge_scratch, sl.in * sl.out * int64_t(sizeof(float)));
      const int64_t packed = model::linear_decode_packed_size(sl.in, sl.out);
      weights += bf16_ ? (sl.in * sl.out + packed) * int64_t(sizeof(model::bfloat16))
                       : packed * int64_t(sizeof(float));
    }
  }
  weights += model::linear_decode_packed_size(c.hidden_size, c.vocab_size) *
             int64_t(bf16_ ? sizeof(model::bfloat16) : sizeof(float));
  EngineMemoryPlan p;
  p.weights = weights + merge_scratch;
  p.kv_cache = cache_.capacity_bytes();
  p.sleep_frees = p.weights + p.kv_cache;
  return p;
}

int64_t EngineCpu::sleep() {
  int64_t freed = cache_.release_storage();
  for (LayerSlice& t : sliced_)
    for (TpProjSlice& p : t.proj)
      freed += free_vector(p.w) + free_vector(p.b) + free_vector(p.lora_a) + free_vector(p.lora_b);
  std::vector<LayerSlice>().swap(sliced_);
  for (LayerCopy& t : packed_)
    for (std::vector<float>& w : t.w) freed += free_vector(w);
  std::vector<LayerCopy>().swap(packed_);
  for (LayerBf16Copy& t : bf16_layers_)
    for (size_t i = 0; i < t.plain.size(); ++i)
      freed += free_vector(t.plain[i]) + free_vector(t.packed[i]);
  std::vector<LayerBf16Copy>().swap(bf16_layers_);
  freed += free_vector(packed_head_) + free_vector(packed_head_bf16_) + free_vector(merged_);
#if defined(__GLIBC__)
  malloc_trim(0);  // hand the freed pages back to the system (glibc keeps some heap otherwise)
#endif
  return freed;
}

model::LayerRun<float> EngineCpu::layer_run(int64_t N, const int32_t* pos,
                                            model::LinearFn<float> linear) const {
  model::LayerRun<float> run;
  run.N = N;
  run.pos = pos;
  run.rope_cos = rope_cos_.data();
  run.rope_sin = rope_sin_.data();
  run.linear = linear;
  if (tp_.size > 1) {  // the o_proj and down_proj partial outputs, summed over the group
    parallel::Comm* comm = tp_.comm;
    run.partial_sum = [comm](float* y, int64_t n) { comm->all_reduce(y, y, n); };
  }
  return run;
}

void EngineCpu::attend_cached(float* out, const float* q, int l, const int32_t* table,
                              const int32_t* lens, int64_t B, int64_t max_blocks) const {
  const KvCache& kv = cache_;
  if (kv.dtype() == KvDtype::kFloat16)
    model::attention_decode_cpu(out, q, kv.k<model::f16>(l), kv.v<model::f16>(l), table, lens, B,
                                spec_.H, spec_.Hkv, spec_.D, kv.num_blocks(), kv.block_size(),
                                max_blocks);
  else
    model::attention_decode_cpu(out, q, kv.k<float>(l), kv.v<float>(l), table, lens, B, spec_.H,
                                spec_.Hkv, spec_.D, kv.num_blocks(), kv.block_size(), max_blocks);
}

// Final norm + LM head of N hidden rows x (N, C) into logits (N, V).
const float* EngineCpu::head_logits(const float* x, int64_t N, Rows& r, float* logits) {
  const model::ModelConfig& c = layout_.config();
  model::rmsnorm_forward_cpu(r.a.ln1, r.a.rstd1, x,
                             unit_tensor(layout_.head_unit(), "model.norm.weight"), N,
                             c.hidden_size, c.rms_norm_eps);
  if (bf16_) {  // the trainer's bf16 head: round(x) · round(W)ᵀ, fp32 logits
    model::round_to_bf16_n(r.a.ln1, N * c.hidden_size);
    model::linear_decode_packed_bf16_cpu(logits, r.a.ln1, packed_head_bf16_.data(), nullptr, N,
                                         c.hidden_size, c.vocab_size);
    return logits;
  }
  model::linear_decode_packed_cpu(logits, r.a.ln1, packed_head_.data(), nullptr, N, c.hidden_size,
                                  c.vocab_size);
  return logits;
}

const float* EngineCpu::prefill(const int32_t* prompt, int64_t P, const int32_t* blocks) {
  const int64_t offsets[2] = {0, P};
  PrefillBatch b;
  b.G = 1;
  b.tokens = prompt;
  b.offsets = offsets;
  b.blocks = &blocks;
  b.vocab_size = layout_.config().vocab_size;
  return forward_prompts(b);
}

const float* EngineCpu::prefill_batch(const PrefillBatch& b) {
  // oneDNN's bf16 matmul is not row-invariant (its blocking follows M): one prompt at a time.
  return bf16_ ? EngineBackend::prefill_batch(b) : forward_prompts(b);
}

void EngineCpu::attend_prompt(float* atty, const float* q, const float* k, const float* v, int l,
                              const int32_t* blocks, int64_t P) {
  const int64_t H = spec_.H, Hkv = spec_.Hkv, D = spec_.D;
  cache_.write(l, blocks, 0, P, k, v);
  if (H * P * P <= kMaxPrefillAttFloats) {
    grow(patt_, H * P * P, "the engine's prefill attention probabilities");
    model::attention_forward_cpu(atty, patt_.data(), q, k, v, int64_t(1), P, H, Hkv, D);
    return;
  }
  // Every query row t reads positions [0, t] through the prompt's block list.
  const int64_t nb = cache_.blocks_for(P);
  plens_.resize(static_cast<size_t>(P));
  ptable_.resize(static_cast<size_t>(P * nb));
  for (int64_t t = 0; t < P; ++t) {
    plens_[size_t(t)] = int32_t(t + 1);
    std::copy(blocks, blocks + nb, ptable_.begin() + t * nb);
  }
  attend_cached(atty, q, l, ptable_.data(), plens_.data(), P, nb);
}

const float* EngineCpu::forward_prompts(const PrefillBatch& b) {
  const model::ModelConfig& c = layout_.config();
  const int64_t C = c.hidden_size, V = c.vocab_size, G = b.G, R = b.offsets[G];
  const int64_t Q = spec_.q_dim(), KV = spec_.kv_dim();
  RLHF_CHECK(!bf16_ || G == 1, "a bf16 CPU engine prefills one prompt at a time, got {}", G);
  Rows& r = prefill_rows_;
  Acts& a = r.acts(R, spec_);
  grow(plogits_, G * V, "the engine's prefill logits");
  ppos_.resize(static_cast<size_t>(R));
  for (int64_t g = 0; g < G; ++g)  // positions restart at each prompt
    for (int64_t t = b.offsets[g]; t < b.offsets[g + 1]; ++t)
      ppos_[size_t(t)] = int32_t(t - b.offsets[g]);
  model::embedding_forward_cpu(
      r.x.data(), b.tokens, unit_tensor(layout_.embedding_unit(), "embed_tokens.weight"), R, C, V);
  // Every prompt's rows through the packed decode kernel together, as the decode steps
  // (row-invariant: a row's result does not depend on the other rows, so a prompt's K/V and logits
  // are the same alone or with others). At a prompt's 30–64 rows it already outran BLAS sgemm here
  // (16 prompts of 64 tokens 0.153 → 0.129 s, 2-core Xeon, Cascade Lake); prompts together also
  // read each weight once for all of them. bf16: oneDNN on the plain bf16 copies, one prompt.
  model::LayerRun<float> run = bf16_ ? layer_run(R, ppos_.data(), &model::linear_forward_cpu<float>)
                                     : layer_run(R, ppos_.data(), &model::linear_decode_packed_cpu);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (bf16_) run.bf16 = &bf16_layers_[size_t(l)].plain_view;
    // Each prompt attends to itself causally; its K/V go to the cache for the decode steps.
    run.attention = [&, l](float* atty, const float* q, const float* k, const float* v) {
      for (int64_t g = 0; g < G; ++g) {
        const int64_t o = b.offsets[g];
        attend_prompt(atty + o * Q, q + o * Q, k + o * KV, v + o * KV, l, b.blocks[g],
                      b.offsets[g + 1] - o);
      }
    };
    model::decoder_layer_forward_cpu(
        r.x.data(), a, r.x.data(), bf16_ ? layer_weights(l) : packed_[size_t(l)].view, spec_, run);
  }
  // Only each prompt's last position's logits are needed (its first generated token): those rows
  // to the front (the last row of prompt g is at or after row g).
  for (int64_t g = 0; g < G; ++g)
    std::copy_n(r.x.data() + (b.offsets[g + 1] - 1) * C, C, r.x.data() + g * C);
  return head_logits(r.x.data(), G, r, plogits_.data());
}

const float* EngineCpu::decode(const DecodeBatch& d) {
  const model::ModelConfig& c = layout_.config();
  const int64_t B = d.B, R = d.rows;  // B, plus a sequence's observation tokens (multi-turn)
  const int64_t C = c.hidden_size, V = c.vocab_size, KV = spec_.kv_dim();
  Rows& r = decode_rows_;
  Acts& a = r.acts(R, spec_);
  grow(logits_, B * V, "the engine's decode logits");
  model::embedding_forward_cpu(
      r.x.data(), d.tokens, unit_tensor(layout_.embedding_unit(), "embed_tokens.weight"), R, C, V);
  // Each row at its own position; the batch-invariant decode kernel (packed weights) for every
  // linear. Every row's K/V is written before any row attends, so the rows of one sequence
  // attend causally to each other (lens = position + 1).
  model::LayerRun<float> run = layer_run(R, d.pos, &model::linear_decode_packed_cpu);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    run.attention = [&, l](float* atty, const float* q, const float* k, const float* v) {
      for (int64_t i = 0; i < R; ++i)
        cache_.write(l, d.table + i * d.max_blocks, d.pos[i], 1, k + i * KV, v + i * KV);
      attend_cached(atty, q, l, d.table, d.lens, R, d.max_blocks);
    };
    if (bf16_) {  // the bf16 packed panels; norms and biases from the fp32 buffers
      run.bf16 = &bf16_layers_[size_t(l)].packed_view;
      model::decoder_layer_forward_cpu(r.x.data(), a, r.x.data(), layer_weights(l), spec_, run);
      continue;
    }
    model::decoder_layer_forward_cpu(r.x.data(), a, r.x.data(), packed_[size_t(l)].view, spec_,
                                     run);
  }
  // Only each sequence's last row is sampled: move those rows to the front (last_row[b] >= b).
  if (R > B)
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(r.x.data() + d.last_row[b] * C, C, r.x.data() + b * C);
  return head_logits(r.x.data(), B, r, logits_.data());
}

}  // namespace

std::unique_ptr<EngineBackend> make_cpu_backend(const model::ParamLayout& layout,
                                                const EngineOptions& options,
                                                const EngineWeights& weights, const TpGroup& tp) {
  return std::make_unique<EngineCpu>(layout, options, weights, tp);
}

}  // namespace rlhf::rollout

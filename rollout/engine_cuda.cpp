#ifdef RLHF_CUDA
#include "rollout/engine_cuda.h"

#include <algorithm>

#include "core/checked_alloc.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "model/layer_params.h"
#include "model/ops/attention.h"
#include "model/ops/attention_decode.h"
#include "model/ops/embedding.h"
#include "model/ops/kv_cache.h"
#include "model/ops/linear.h"
#include "model/ops/residual.h"
#include "model/ops/rmsnorm.h"
#include "model/ops/rope.h"
#include "model/ops/swiglu.h"
#include "parallel/watchdog.h"
#include "rollout/engine.h"
#include "rollout/engine_cuda_tp.h"

namespace rlhf::rollout {

using model::bf16;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

void h2d(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
}

// Seconds between two recorded, completed events of one stream.
double event_seconds(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, from, to));
  return double(ms) * 1e-3;
}

}  // namespace

/// A captured decode step for one batch bucket.
struct EngineCuda::Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
};

/// The dims that size the engine's buffers.
struct EngineCuda::Dims {
  int64_t rows = 0;  // activation rows: decode max_batch, prefill max_position_embeddings
  int64_t max_batch = 0, max_pos = 0, max_blocks = 0, block_size = 0;
  int64_t C = 0, Q = 0, KV = 0, F = 0, H = 0, Hkv = 0, D = 0, V = 0;
  bool qk_norm = false, fused_qkv = false;
  // tp_size > 1: the heads and MLP columns of one rank of the group (tp_layer_spec).
  Dims(const model::ParamLayout& layout, int64_t max_batch_, int64_t block_size_, int tp_size = 1) {
    const model::ModelConfig& c = layout.config();
    max_batch = max_batch_;
    max_pos = c.max_position_embeddings;
    rows = std::max(max_batch, max_pos);
    block_size = block_size_;
    max_blocks = (max_pos + block_size - 1) / block_size;
    C = c.hidden_size;
    const model::LayerSpec s = tp_layer_spec(c, TpGroup{nullptr, tp_size, 0});
    F = s.F;
    H = s.H;
    Hkv = s.Hkv;
    D = c.D();
    Q = H * D;
    KV = Hkv * D;
    V = c.vocab_size;
    qk_norm = model::layer_spec(c).qk_norm;
    // Every layer's q/k/v packed (model::qkv_packed): one GEMM. QK-norm sits between the
    // projection and RoPE, so it never fuses.
    fused_qkv = c.num_hidden_layers > 0 && !qk_norm;
    for (int l = 0; l < c.num_hidden_layers; ++l)
      fused_qkv = fused_qkv && model::qkv_packed(layout.unit(layout.layer_unit(l)));
  }
};

template <typename Fn>
void EngineCuda::for_each_buffer(EngineCuda* self, const Dims& d, Fn&& fn) {
  auto at = [self](auto member) { return self != nullptr ? &(self->*member) : nullptr; };
  const int64_t R = d.rows;
  for (auto m : {&EngineCuda::rope_cos_, &EngineCuda::rope_sin_})
    fn(at(m), d.max_pos * d.D / 2, "RoPE table");
  // Activations for up to R rows (one layer at a time; x and x2 alternate as its input/output).
  for (auto m : {&EngineCuda::x_, &EngineCuda::x2_, &EngineCuda::ln_, &EngineCuda::xmid_,
                 &EngineCuda::proj_})
    fn(at(m), R * d.C, "engine");
  for (auto m : {&EngineCuda::q_, &EngineCuda::atty_}) fn(at(m), R * d.Q, "engine");
  for (auto m : {&EngineCuda::k_, &EngineCuda::v_}) fn(at(m), R * d.KV, "engine");
  for (auto m : {&EngineCuda::gate_, &EngineCuda::up_, &EngineCuda::h_})
    fn(at(m), R * d.F, "engine");
  if (d.fused_qkv) fn(at(&EngineCuda::qkv_), R * (d.Q + 2 * d.KV), "engine");
  fn(at(&EngineCuda::logits_), d.max_batch * d.V, "engine logits");
  fn(at(&EngineCuda::rstd_), R, "device array");
  if (d.qk_norm) fn(at(&EngineCuda::qk_rstd_), R * (d.H + d.Hkv), "engine");
  fn(at(&EngineCuda::lse_), d.H * d.max_pos, "device array");
  fn(at(&EngineCuda::attn_ws_),
     static_cast<int64_t>(model::attention_decode_paged_cuda_workspace_bytes(
         d.max_batch, d.H, d.D, d.max_blocks, d.block_size)) /
         int64_t(sizeof(float)),
     "device array");
  // Inputs: tokens and positions per row, lengths and block table per decode sequence, a
  // prompt's (and a prefix copy's) block lists.
  for (auto m : {&EngineCuda::tokens_, &EngineCuda::pos_}) fn(at(m), R, "device array");
  fn(at(&EngineCuda::lens_), d.max_batch, "device array");
  fn(at(&EngineCuda::table_), d.max_batch * d.max_blocks, "device array");
  for (auto m : {&EngineCuda::blocks_, &EngineCuda::blocks2_})
    fn(at(m), d.max_blocks, "device array");
  // Sampling on the device (decode_sampled): per sequence in and out.
  for (auto m : {&EngineCuda::sample_inv_t_, &EngineCuda::sample_logprob_})
    fn(at(m), d.max_batch, "device array");
  fn(at(&EngineCuda::sample_u_), d.max_batch, "device array");
  fn(at(&EngineCuda::sample_token_), d.max_batch, "device array");
}

int64_t EngineCuda::buffer_bytes(const model::ParamLayout& layout, int64_t max_batch,
                                 int64_t block_size) {  // full heads: a bound for every TP size
  int64_t bytes = 0;
  for_each_buffer(nullptr, Dims(layout, max_batch, block_size),
                  [&bytes](auto* buffer, int64_t elems, const char*) {
                    bytes += elems * int64_t(sizeof(*buffer->get()));
                  });
  return bytes;
}

int64_t EngineCuda::fixed_bytes(const model::ParamLayout& layout, int64_t max_batch,
                                int64_t block_size, int tp_size) {
  int64_t weights = 0;
  std::vector<bool> layer(size_t(layout.num_units()), false);
  if (tp_size > 1) {  // the layers as one rank's slices
    for (int l = 0; l < layout.config().num_hidden_layers; ++l)
      layer[size_t(layout.layer_unit(l))] = true;
    weights += EngineCudaTp::slice_elems(layout, tp_size);
  }
  for (int u = 0; u < layout.num_units(); ++u)
    if (!layer[size_t(u)]) weights += layout.unit(u).numel;
  return weights * int64_t(sizeof(bf16)) + buffer_bytes(layout, max_batch, block_size) +
         64 * kMiB;  // + cuBLASLt workspace and slack
}

int64_t EngineCuda::kv_budget_bytes(const model::ParamLayout& layout, double util,
                                    int64_t max_batch, int64_t block_size, int tp_size) {
  RLHF_CHECK(util > 0 && util <= 1, "--vllm_gpu_memory_utilization must be in (0, 1], got {}",
             util);
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t fixed = fixed_bytes(layout, max_batch, block_size, tp_size);
  const int64_t want = static_cast<int64_t>(util * static_cast<double>(total_b)) - fixed;
  const int64_t room = static_cast<int64_t>(free_b) - fixed - 512 * kMiB;
  const int64_t budget = std::min(want, room);
  RLHF_CHECK(budget > 0,
             "generation engine: no device memory left for the KV cache: "
             "--vllm_gpu_memory_utilization {} of {:.1f} GiB is {:.1f} GiB, the engine's weights "
             "and buffers take {:.1f} GiB, {:.1f} GiB are free now\nhint: raise "
             "--vllm_gpu_memory_utilization, lower --gen_max_num_seqs, or place generation on "
             "its own GPUs (--gen_ranks_per_node)",
             util, double(total_b) / (1 << 30), util * double(total_b) / (1 << 30),
             double(fixed) / (1 << 30), double(free_b) / (1 << 30));
  return budget;
}

EngineCuda::EngineCuda(const model::ParamLayout& layout, KvCache kv, int64_t max_batch,
                       bool use_graphs, const std::vector<int64_t>& unit_room,
                       const EngineWeights* host, const TpGroup& tp)
    : layout_(layout),
      cache_(std::move(kv)),
      host_(host),
      num_blocks_(cache_.num_blocks()),
      block_size_(cache_.block_size()),
      max_batch_(max_batch),
      use_graphs_(use_graphs) {
  const model::ModelConfig& c = layout.config();
  spec_ = tp_layer_spec(c, tp);  // this rank's heads and MLP columns (all of them for TP 1)
  C_ = c.hidden_size;
  F_ = spec_.F;
  H_ = spec_.H;
  Hkv_ = spec_.Hkv;
  D_ = c.D();
  V_ = c.vocab_size;
  L_ = c.num_hidden_layers;
  max_pos_ = c.max_position_embeddings;
  max_blocks_cap_ = (max_pos_ + block_size_ - 1) / block_size_;
  RLHF_CHECK(unit_room.empty() || int(unit_room.size()) == layout.num_units(),
             "GPU engine: room for {} units, the model has {}", unit_room.size(),
             layout.num_units());
  RLHF_CHECK(tp.size == 1 || cache_.bytes_per_token() == 2 * L_ * Hkv_ * D_ * 2,
             "GPU engine: the KV cache of a tensor-parallel rank must hold its {} KV heads", Hkv_);
  if (tp.size > 1) {
    tp_ = std::make_unique<EngineCudaTp>(layout, tp, stream_.get());  // collective over the group
    weight_bytes_ += tp_->bytes();
  }
  for (int u = 0; u < layout.num_units(); ++u) {
    unit_elems_.push_back(
        std::max(layout.unit(u).numel, unit_room.empty() ? 0 : unit_room[size_t(u)]));
    units_.emplace_back();
    const int64_t n = resident_elems(u);
    if (n == 0) continue;
    units_.back().resize(n, "engine weights");
    CUDA_CHECK(cudaMemsetAsync(units_.back().get(), 0, size_t(n) * sizeof(bf16), stream_.get()));
    weight_bytes_ += n * int64_t(sizeof(bf16));
  }
  // One extra block: the scratch block that the padded rows of a captured batch write into.
  kv_.resize(kv_elems(), "engine KV cache");
  const Dims dims(layout, max_batch_, block_size_, tp.size);
  fused_qkv_ = dims.fused_qkv;
  for_each_buffer(this, dims, [](auto* buffer, int64_t elems, const char* what) {
    buffer->resize(elems, what);
  });
  model::rope_tables_upload_cuda(rope_cos_.get(), rope_sin_.get(), max_pos_, D_,
                                 model::rope_inv_freq(c).data());
  graphs_.resize(static_cast<size_t>(bucket(max_batch_) / 8 + 8));
  CUDA_CHECK(cudaEventCreate(&step_begin_));
  CUDA_CHECK(cudaEventCreate(&step_end_));
  CUDA_CHECK(cudaEventCreate(&sample_end_));
  stream_.sync();
}

EngineCuda::~EngineCuda() {
  graphs_.clear();
  (void)cudaStreamSynchronize(stream_.get());
  if (step_begin_ != nullptr) (void)cudaEventDestroy(step_begin_);
  if (step_end_ != nullptr) (void)cudaEventDestroy(step_end_);
  if (sample_end_ != nullptr) (void)cudaEventDestroy(sample_end_);
}

void EngineCuda::upload_weights(const std::vector<const float*>& units) {
  RLHF_CHECK(units.size() == units_.size(), "engine: {} unit buffers for {} units", units.size(),
             units_.size());
  std::vector<bf16> tmp;
  for (int l = 0; tp_ != nullptr && l < L_; ++l)
    tp_->load_from_host(l, units[size_t(layout_.layer_unit(l))], stream_.get());
  for (size_t u = 0; u < units.size(); ++u)
    if (!sliced_unit(int(u))) upload_unit(u, units[u], layout_.unit(int(u)).numel, tmp);
}

void EngineCuda::upload_unit(size_t u, const float* src, int64_t n, std::vector<bf16>& tmp) {
  checked_resize(tmp, n, "the host staging buffer of the engine weights (bf16)");
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) tmp[size_t(i)] = __float2bfloat16_rn(src[i]);
  h2d(units_[u].get(), tmp.data(), tmp.size() * sizeof(bf16), stream_.get());
  stream_.sync();  // `tmp` is reused
}

void EngineCuda::upload_merged() {
  std::vector<bf16> tmp;
  std::vector<float> merged;
  const float scale = float(lora_layout_->config().scale());
  const int64_t r = lora_layout_->config().rank;
  for (int u = 0; u < layout_.num_units(); ++u) {
    const model::UnitLayout& unit = layout_.unit(u);
    const float* src = host_->unit_buffer(u);
    if (unit.kind == model::UnitKind::kLayer) {
      merged.assign(src, src + unit.numel);
      for (const model::ProjInfo& p : model::kProjections) {
        const model::LoraLayout::Entry& e = lora_layout_->entry(unit.layer, p.id);
        if (e.a < 0) continue;
        model::lora_merge_cpu(merged.data() + unit.at(p.weight_name).offset, lora_adapters_ + e.a,
                              lora_adapters_ + e.b, scale, r, e.in, e.out);
      }
      src = merged.data();
    }
    if (sliced_unit(u))
      tp_->load_from_host(unit.layer, src, stream_.get());
    else
      upload_unit(size_t(u), src, unit.numel, tmp);
  }
}

bool EngineCuda::sliced_unit(int u) const {
  if (tp_ == nullptr) return false;
  for (int l = 0; l < L_; ++l)
    if (layout_.layer_unit(l) == u) return true;
  return false;
}

void EngineCuda::prepare_weights(bool device_current) {
  if (device_current) {
    if (tp_ == nullptr || !staged_) return;
    // A device sync wrote the full layer units: this rank's slices of them, then free them.
    for (int l = 0; l < L_; ++l)
      tp_->load_from_device(l, units_[size_t(layout_.layer_unit(l))].get(), stream_.get());
    stream_.sync();
    for (int u = 0; u < layout_.num_units(); ++u)
      if (sliced_unit(u)) units_[size_t(u)].reset();
    staged_ = false;
    return;
  }
  RLHF_CHECK(host_ != nullptr, "GPU engine: no host weights to upload");
  if (lora_layout_ != nullptr) return upload_merged();  // LoRA: base + (α/r)·B·A
  std::vector<const float*> units;
  for (int u = 0; u < layout_.num_units(); ++u) units.push_back(host_->unit_buffer(u));
  upload_weights(units);  // the host buffers may have changed (loading, host sync)
}

EngineMemoryPlan EngineCuda::memory_plan() const {
  EngineMemoryPlan p;
  p.device = true;
  p.weights = weight_bytes_;
  p.kv_cache = kv_elems() * int64_t(sizeof(bf16));
  p.buffers = buffer_bytes(layout_, max_batch_, block_size_);
  p.sleep_frees = p.weights + p.kv_cache;
  return p;
}

int64_t EngineCuda::sleep() {
  if (asleep_) return 0;
  stream_.sync();  // nothing of ours in flight on the buffers
  for (auto& g : graphs_) g.reset();
  int64_t freed = kv_.bytes();
  kv_.reset();
  for (auto& u : units_) {
    freed += u.bytes();
    u.reset();
  }
  staged_ = false;
  if (tp_ != nullptr) freed += tp_->release();
  asleep_ = true;
  return freed;
}

int64_t EngineCuda::wake() {
  if (!asleep_) return 0;
  kv_.resize(kv_elems(), "engine KV cache (wake)");
  int64_t bytes = kv_.bytes();
  for (size_t u = 0; u < units_.size(); ++u) {
    const int64_t n = resident_elems(int(u));
    if (n == 0) continue;
    units_[u].resize(n, "engine weights (wake)");
    CUDA_CHECK(cudaMemsetAsync(units_[u].get(), 0, size_t(n) * sizeof(bf16), stream_.get()));
    bytes += units_[u].bytes();
  }
  if (tp_ != nullptr) bytes += tp_->allocate(stream_.get());
  stream_.sync();
  asleep_ = false;
  return bytes;
}

std::vector<bf16*> EngineCuda::device_units() {
  for (int u = 0; tp_ != nullptr && u < layout_.num_units(); ++u)
    if (sliced_unit(u) && units_[size_t(u)].get() == nullptr)  // the sync's full layer units
      units_[size_t(u)].resize(unit_elems_[size_t(u)], "engine weights (sync target)");
  staged_ = tp_ != nullptr;
  std::vector<bf16*> out;
  for (auto& u : units_) out.push_back(u.get());
  stream_.sync();  // nothing of ours is in flight on them
  return out;
}

// ---------------------------------------------------------------------------------------------
// Forward

model::LayerActsCuda EngineCuda::layer_acts(int64_t N) {
  model::LayerActsCuda a;  // inference: one set of buffers, ln/rstd shared by both norms
  a.ln1 = a.ln2 = ln_.get();
  a.rstd1 = a.rstd2 = rstd_.get();
  a.q = q_.get();
  a.k = k_.get();
  a.v = v_.get();
  if (spec_.qk_norm) {
    a.q_rstd = qk_rstd_.get();
    a.k_rstd = qk_rstd_.get() + N * H_;
  }
  a.atty = atty_.get();
  a.x_mid = xmid_.get();
  a.gate = gate_.get();
  a.up = up_.get();
  a.h = h_.get();
  return a;
}

void EngineCuda::layer_forward(int l, int64_t N, const bf16* x_in, bf16* x_out, bool decode,
                               int64_t table_stride, int64_t max_blocks) {
  const cudaStream_t s = stream_.get();
  const model::LayerParams<const bf16> w = layer_weights(l);
  const int64_t plane = (num_blocks_ + 1) * Hkv_ * block_size_ * D_;
  bf16* kc = kv_.get() + (2 * l) * plane;
  bf16* vc = kv_.get() + (2 * l + 1) * plane;
  // A batch of prompts (prefill_batch) has a block-table row per row, like decode.
  const bool prompts = !decode && table_stride > 0;
  const int32_t* table = decode || prompts ? table_.get() : blocks_.get();
  model::LayerActsCuda a = layer_acts(N);
  model::LayerScratchCuda scratch{proj_.get(), fused_qkv_ ? qkv_.get() : nullptr};
  model::LayerRunCuda run;
  run.N = N;
  run.pos = pos_.get();
  run.rope_cos = rope_cos_.get();
  run.rope_sin = rope_sin_.get();
  run.fused_qkv = fused_qkv_;
  run.forward_only = true;
  // With the packed q/k/v, the split writes k and v into the cache itself.
  const model::KvCacheWrite cache{kc, vc, table, table_stride, block_size_};
  if (fused_qkv_) run.kv_cache = &cache;
  // One set of acts for every layer: each layer's output residual add is fused with the next
  // layer's input norm.
  run.input_normed = l > 0;
  if (l + 1 < L_) run.next_input_norm = layer_weights(l + 1).w_in;
  run.stream = s;
  if (tp_ != nullptr)  // the o_proj and down_proj partial outputs, summed over the group
    run.partial_sum = [this](bf16* y, int64_t n, cudaStream_t st) { tp_->all_reduce(y, n, st); };
  run.attention = [&](bf16* atty, const bf16* q, const bf16* k, const bf16* v, cudaStream_t st) {
    if (!fused_qkv_)
      model::kv_cache_write_cuda(kc, vc, k, v, table, table_stride, pos_.get(), N, Hkv_, D_,
                                 block_size_, st);
    if (decode)
      model::attention_decode_paged_cuda(atty, attn_ws_.get(), q, kc, vc, table, lens_.get(), N, H_,
                                         Hkv_, D_, num_blocks_ + 1, block_size_, max_blocks, st);
    else if (prompts)  // each prompt attends to itself causally (positions restart at each)
      model::attention_forward_varlen_cuda(atty, lse_.get(), q, k, v, pos_.get(), N, H_, Hkv_, D_,
                                           st);
    else  // the prompt attends to itself causally (the rows just written to the cache); always
          // the flash kernels: a cuDNN plan per prompt length would compile at every new length
      model::attention_forward_cuda(atty, lse_.get(), q, k, v, 1, N, H_, Hkv_, D_, st,
                                    model::AttentionImpl::kFlash);
  };
  model::decoder_layer_forward_cuda(x_out, a, scratch, x_in, w, spec_, run);
}

model::LayerParams<const bf16> EngineCuda::layer_weights(int l) const {
  if (tp_ != nullptr) return tp_->layer(l);
  const int u = layout_.layer_unit(l);
  return model::LayerParams<const bf16>(layout_.unit(u), units_[size_t(u)].get());
}

namespace {
// The LM head weight (V, C): lm_head, or the embedding when tied.
const bf16* lm_weight(const model::ParamLayout& layout,
                      const std::vector<DeviceArray<bf16>>& units) {
  const model::ParamLayout::TensorRef lw = layout.lm_head_weight();
  return units[size_t(lw.unit)].get() + lw.offset;
}
}  // namespace

void EngineCuda::wait_step() {
  if (tp_ == nullptr) return stream_.sync();
  parallel::WatchScope watch("a tensor-parallel engine step (NCCL all-reduce)",
                             "the engine's tensor-parallel group");
  stream_.sync();
}

const float* EngineCuda::logits_to_host(int64_t rows) {
  if (logits_bf16_host_.size() < rows * V_)
    logits_bf16_host_ = PinnedArray<bf16>(rows * V_, "the engine's host logits (bf16, pinned)");
  checked_resize(logits_host_, rows * V_, "the engine's host logits");
  CUDA_CHECK(cudaMemcpyAsync(logits_bf16_host_.get(), logits_.get(),
                             size_t(rows * V_) * sizeof(bf16), cudaMemcpyDeviceToHost,
                             stream_.get()));
  stream_.sync();
  const int64_t n = rows * V_;
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i)
    logits_host_[size_t(i)] = __bfloat162float(logits_bf16_host_[size_t(i)]);
  return logits_host_.data();
}

const float* EngineCuda::prefill(const int32_t* prompt, int64_t P, const int32_t* blocks) {
  RLHF_CHECK(P >= 1 && P <= max_pos_, "engine prefill: {} positions (max {})", P, max_pos_);
  const cudaStream_t s = stream_.get();
  const int64_t nb = (P + block_size_ - 1) / block_size_;
  std::vector<int32_t> pos(static_cast<size_t>(P));
  for (int64_t t = 0; t < P; ++t) pos[size_t(t)] = static_cast<int32_t>(t);
  h2d(tokens_.get(), prompt, size_t(P) * sizeof(int32_t), s);
  h2d(pos_.get(), pos.data(), pos.size() * sizeof(int32_t), s);
  h2d(blocks_.get(), blocks, size_t(nb) * sizeof(int32_t), s);
  // Only the last position's logits are needed (the first generated token).
  forward(P, false, 0, nb, P - 1);
  wait_step();  // `pos` is read by the copy above
  return logits_to_host(1);
}

const float* EngineCuda::prefill_batch(const PrefillBatch& b) {
  const cudaStream_t s = stream_.get();
  float* out = batch_logits(b.G, V_);
  // Consecutive prompts in forwards that fit the buffers: rows (and lse) up to max_position_
  // embeddings, a block-table row per row within the decode table, a logits row per prompt.
  for (int64_t g0 = 0; g0 < b.G;) {
    int64_t g1 = g0, nb = 0;
    while (g1 < b.G) {
      const int64_t R = b.offsets[g1 + 1] - b.offsets[g0];
      const int64_t nbg =
          std::max(nb, (b.offsets[g1 + 1] - b.offsets[g1] + block_size_ - 1) / block_size_);
      if (g1 > g0 &&
          (R > max_pos_ || R * nbg > max_batch_ * max_blocks_cap_ || g1 - g0 >= max_batch_))
        break;
      nb = nbg;
      ++g1;
    }
    if (g1 - g0 == 1) {  // one prompt (alone it may need more table than a row per row fits)
      const float* lg =
          prefill(b.tokens + b.offsets[g0], b.offsets[g1] - b.offsets[g0], b.blocks[g0]);
      std::copy_n(lg, V_, out + g0 * V_);
      g0 = g1;
      continue;
    }
    const int64_t R = b.offsets[g1] - b.offsets[g0];
    std::vector<int32_t> pos(static_cast<size_t>(R)), table(static_cast<size_t>(R * nb), 0);
    std::vector<int64_t> last(static_cast<size_t>(g1 - g0));
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t o = b.offsets[g] - b.offsets[g0], P = b.offsets[g + 1] - b.offsets[g];
      const int64_t nbg = (P + block_size_ - 1) / block_size_;
      for (int64_t t = 0; t < P; ++t) {
        pos[size_t(o + t)] = static_cast<int32_t>(t);
        std::copy(b.blocks[g], b.blocks[g] + nbg, table.begin() + (o + t) * nb);
      }
      last[size_t(g - g0)] = o + P - 1;
    }
    h2d(tokens_.get(), b.tokens + b.offsets[g0], size_t(R) * sizeof(int32_t), s);
    h2d(pos_.get(), pos.data(), pos.size() * sizeof(int32_t), s);
    h2d(table_.get(), table.data(), table.size() * sizeof(int32_t), s);
    forward(R, false, nb, nb, 0, &last);
    wait_step();  // `pos` and `table` are read by the copies above
    const float* lg = logits_to_host(g1 - g0);
    std::copy_n(lg, (g1 - g0) * V_, out + g0 * V_);
    g0 = g1;
  }
  return out;
}

void EngineCuda::copy_prefix(const int32_t* src, const int32_t* dst, int64_t n) {
  const int64_t nb = (n + block_size_ - 1) / block_size_;
  h2d(blocks_.get(), src, size_t(nb) * sizeof(int32_t), stream_.get());
  h2d(blocks2_.get(), dst, size_t(nb) * sizeof(int32_t), stream_.get());
  model::kv_cache_copy_prefix_cuda(kv_.get(), 2 * L_, (num_blocks_ + 1) * Hkv_ * block_size_ * D_,
                                   blocks_.get(), blocks2_.get(), n, Hkv_, D_, block_size_,
                                   stream_.get());
}

void EngineCuda::forward(int64_t N, bool decode, int64_t table_stride, int64_t max_blocks,
                         int64_t first_out, const std::vector<int64_t>* out_rows) {
  const cudaStream_t s = stream_.get();
  const int eu = layout_.embedding_unit(), hu = layout_.head_unit();
  model::embedding_forward_cuda(
      x_.get(), tokens_.get(),
      units_[size_t(eu)].get() + layout_.unit(eu).at("embed_tokens.weight").offset, N, C_, V_, s);
  bf16 *a = x_.get(), *b = x2_.get();
  for (int l = 0; l < L_; ++l) {
    layer_forward(l, N, a, b, decode, table_stride, max_blocks);
    std::swap(a, b);
  }
  int64_t out = N - first_out;
  const bf16* head_in = a + first_out * C_;
  if (out_rows != nullptr) {  // the rows wanted, gathered into the free buffer
    out = int64_t(out_rows->size());
    for (int64_t i = 0; i < out; ++i)
      CUDA_CHECK(cudaMemcpyAsync(b + i * C_, a + (*out_rows)[size_t(i)] * C_,
                                 size_t(C_) * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
    head_in = b;
  }
  model::rmsnorm_forward_cuda(
      ln_.get(), rstd_.get(), head_in,
      units_[size_t(hu)].get() + layout_.unit(hu).at("model.norm.weight").offset, out, C_,
      layout_.config().rms_norm_eps, s);
  model::linear_forward_cuda(logits_.get(), ln_.get(), lm_weight(layout_, units_), nullptr, out, C_,
                             V_, s);
}

int64_t EngineCuda::bucket(int64_t B) const {
  int64_t b = B <= 1 ? 1 : B <= 2 ? 2 : B <= 4 ? 4 : (B + 7) / 8 * 8;
  return std::min(b, std::max<int64_t>(max_batch_, 1));
}

const float* EngineCuda::decode(const DecodeBatch& d) {
  RLHF_ASSERT(d.rows == d.B);  // the engine feeds no observation rows to a GPU backend
  return decode(d.tokens, d.pos, d.lens, d.table, d.B, d.max_blocks);
}

void EngineCuda::decode_forward(const int32_t* tokens, const int32_t* pos, const int32_t* lens,
                                const int32_t* table, int64_t B, int64_t max_blocks) {
  RLHF_CHECK(B >= 1 && B <= max_batch_ && max_blocks >= 1 && max_blocks <= max_blocks_cap_,
             "engine decode: batch {} (max {}) with {} blocks per sequence (max {})", B, max_batch_,
             max_blocks, max_blocks_cap_);
  const cudaStream_t s = stream_.get();
  // Inputs padded to the bucket: extra rows feed token 0 at position 0 into the scratch block.
  const int64_t Bb = use_graphs_ ? bucket(B) : B;
  const int64_t stride = use_graphs_ ? max_blocks_cap_ : max_blocks;
  std::vector<int32_t> tok(static_cast<size_t>(Bb), 0), ps(tok.size(), 0), ln(tok.size(), 1);
  std::vector<int32_t> tab(static_cast<size_t>(Bb * stride), static_cast<int32_t>(num_blocks_));
  for (int64_t b = 0; b < B; ++b) {
    tok[size_t(b)] = tokens[b];
    ps[size_t(b)] = pos[b];
    ln[size_t(b)] = lens[b];
    std::copy(table + b * max_blocks, table + (b + 1) * max_blocks, tab.begin() + b * stride);
  }
  h2d(tokens_.get(), tok.data(), tok.size() * sizeof(int32_t), s);
  h2d(pos_.get(), ps.data(), ps.size() * sizeof(int32_t), s);
  h2d(lens_.get(), ln.data(), ln.size() * sizeof(int32_t), s);
  h2d(table_.get(), tab.data(), tab.size() * sizeof(int32_t), s);
  CUDA_CHECK(cudaEventRecord(step_begin_, s));
  if (!use_graphs_) {
    forward(B, true, max_blocks, max_blocks, 0);
  } else {
    auto& g = graphs_.at(size_t(Bb <= 4 ? Bb : 4 + Bb / 8));
    if (g == nullptr) {
      // First use of this bucket: run it eagerly (creating the GEMM handles and workspaces that a
      // capture may not allocate), then capture the same launches for the next steps.
      forward(Bb, true, max_blocks_cap_, max_blocks_cap_, 0);
      auto graph = std::make_unique<Graph>();
      CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      try {
        forward(Bb, true, max_blocks_cap_, max_blocks_cap_, 0);
      } catch (...) {
        cudaGraph_t broken = nullptr;
        (void)cudaStreamEndCapture(s, &broken);
        if (broken != nullptr) (void)cudaGraphDestroy(broken);
        throw;
      }
      CUDA_CHECK(cudaStreamEndCapture(s, &graph->graph));
      CUDA_CHECK(cudaGraphInstantiate(&graph->exec, graph->graph, 0));
      g = std::move(graph);
      ++graphs_captured_;
    } else {
      CUDA_CHECK(cudaGraphLaunch(g->exec, s));
      ++graph_replays_;
    }
  }
  CUDA_CHECK(cudaEventRecord(step_end_, s));
  // The host vectors above may go now: a copy from pageable memory is staged before it returns.
}

void EngineCuda::add_step_time() {
  decode_device_s_ += event_seconds(step_begin_, step_end_);
}

const float* EngineCuda::decode(const int32_t* tokens, const int32_t* pos, const int32_t* lens,
                                const int32_t* table, int64_t B, int64_t max_blocks) {
  decode_forward(tokens, pos, lens, table, B, max_blocks);
  wait_step();
  add_step_time();
  return logits_to_host(B);  // (B, V) bf16 copied and widened: the host samples
}

const SampledToken* EngineCuda::decode_sampled(const DecodeBatch& d, const DeviceSampling& in) {
  RLHF_ASSERT(d.rows == d.B);  // the engine feeds no observation rows to a GPU backend
  const int64_t B = d.B;
  const cudaStream_t s = stream_.get();
  if (sample_token_host_.size() < max_batch_) {
    sample_logprob_host_ = PinnedArray<float>(max_batch_, "the engine's sampled tokens (pinned)");
    sample_token_host_ = PinnedArray<int32_t>(max_batch_, "the engine's sampled tokens (pinned)");
  }
  // The inputs from the caller's (pageable) arrays, staged at the call like decode_forward's.
  h2d(sample_inv_t_.get(), in.inv_temperature, size_t(B) * sizeof(float), s);
  h2d(sample_u_.get(), in.u, size_t(B) * sizeof(double), s);
  decode_forward(d.tokens, d.pos, d.lens, d.table, B, d.max_blocks);
  sample_rows_cuda(sample_token_.get(), sample_logprob_.get(), logits_.get(), B, V_,
                   sample_inv_t_.get(), sample_u_.get(), s);
  CUDA_CHECK(cudaEventRecord(sample_end_, s));
  CUDA_CHECK(cudaMemcpyAsync(sample_token_host_.get(), sample_token_.get(),
                             size_t(B) * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaMemcpyAsync(sample_logprob_host_.get(), sample_logprob_.get(),
                             size_t(B) * sizeof(float), cudaMemcpyDeviceToHost, s));
  wait_step();
  add_step_time();
  sampling_device_s_ += event_seconds(step_end_, sample_end_);
  sampled_.resize(size_t(B));
  for (int64_t b = 0; b < B; ++b)
    sampled_[size_t(b)] = {sample_token_host_[size_t(b)], sample_logprob_host_[size_t(b)]};
  return sampled_.data();
}

std::unique_ptr<EngineBackend> make_cuda_backend(const model::ParamLayout& layout,
                                                 const EngineOptions& o,
                                                 const EngineWeights& weights, const TpGroup& tp) {
  const model::ModelConfig c = tp_kv_config(layout.config(), tp);  // this rank's KV heads
  // No more than max_batch sequences of max_position_embeddings positions can ever be cached.
  const int64_t per_block =
      2 * c.num_hidden_layers * c.num_key_value_heads * c.D() * 2 * o.block_size;
  // In long double: max_batch x positions x per-position bytes can pass 2^63 (it is a cap).
  const long double most =
      static_cast<long double>(o.max_batch) *
      static_cast<long double>((c.max_position_embeddings + o.block_size - 1) / o.block_size) *
      static_cast<long double>(per_block);
  const int64_t avail = EngineCuda::kv_budget_bytes(layout, o.gpu_memory_utilization, o.max_batch,
                                                    o.block_size, tp.size);
  const int64_t budget =
      most < static_cast<long double>(avail) ? static_cast<int64_t>(most) : avail;
  return std::make_unique<EngineCuda>(layout, KvCache(c, budget, o.block_size, 2, false),
                                      o.max_batch, o.cuda_graphs, o.unit_room, &weights, tp);
}

}  // namespace rlhf::rollout
#else  // a build without CUDA has no GPU backend
#include "core/error.h"
#include "rollout/engine_backend.h"

namespace rlhf::rollout {

std::unique_ptr<EngineBackend> make_cuda_backend(const model::ParamLayout&, const EngineOptions&,
                                                 const EngineWeights&, const TpGroup&) {
  RLHF_FAIL("a GPU generation engine needs a build with CUDA");
}

}  // namespace rlhf::rollout
#endif  // RLHF_CUDA

#include "rollout/engine.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>

#include "core/checked_alloc.h"
#include "core/error.h"
#include "model/layer_params.h"
#include "model/ops/attention.h"
#include "model/ops/attention_decode.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "model/ops/linear_decode.h"
#include "model/ops/residual.h"
#include "model/ops/rmsnorm.h"
#include "model/ops/rope.h"
#include "model/ops/swiglu.h"
#include "rollout/engine_run.h"

#ifdef RLHF_CUDA
#include "rollout/engine_cuda.h"
#else
namespace rlhf::rollout {
class EngineCuda {};  // a build without CUDA has no GPU engine (Engine::cuda_ stays null)
}  // namespace rlhf::rollout
#endif

namespace rlhf::rollout {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

template <typename T>
void grow(std::vector<T>& v, int64_t n, const char* what) {
  checked_grow(v, n, what);
}

// Prefill attention through attention_forward_cpu needs an (H, P, P) probability scratch; above
// this many floats it goes through attention_decode_cpu over the cache instead (one query row per
// "sequence", lengths 1..P), which needs no P×P memory.
constexpr int64_t kMaxPrefillAttFloats = int64_t(1) << 24;  // 64 MiB

// Pointers to the tensors of one decoder layer inside its unit buffer.
using LayerW = model::LayerParams<const float>;

// Rows [r0, r0 + n) of a row-major (rows, cols) matrix.
std::vector<float> copy_rows(const float* m, int64_t cols, int64_t r0, int64_t n) {
  std::vector<float> out;
  checked_resize(out, n * cols, "a tensor-parallel weight slice");
  std::copy(m + r0 * cols, m + (r0 + n) * cols, out.begin());
  return out;
}

// Columns [c0, c0 + n) of a row-major (rows, cols) matrix, as a (rows, n) matrix.
std::vector<float> copy_cols(const float* m, int64_t rows, int64_t cols, int64_t c0, int64_t n) {
  std::vector<float> out;
  checked_resize(out, rows * n, "a tensor-parallel weight slice");
  for (int64_t r = 0; r < rows; ++r)
    std::copy(m + r * cols + c0, m + r * cols + c0 + n, out.begin() + r * n);
  return out;
}

}  // namespace

/// Tensor parallel: this rank's share of the dims and its weight slices.
struct Engine::Tp {
  parallel::Comm* comm = nullptr;
  int size = 1, rank = 0;
  struct Layer {
    std::vector<float> wq, bq, wk, bk, wv, bv, wo, wg, wu, wd;
    LayerW w;  // the slices, with the full buffers' norms (and o_proj bias on rank 0)
  };
  std::vector<Layer> layers;
};

/// The decode copies: each linear weight of each layer and the LM head packed in panels of 16
/// output rows (model::linear_decode_pack), and the layer views that point at them.
struct Engine::Packed {
  struct Layer {
    std::vector<float> wq, wk, wv, wo, wg, wu, wd;
    LayerW w;  // the packed linears, with the unpacked norms and biases
  };
  std::vector<Layer> layers;
  std::vector<float> lm_head;
};

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kEnvDone:
      return "env_done";
    case FinishReason::kMaxTurns:
      return "max_turns";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Weights

EngineWeights::EngineWeights(const model::ParamLayout& layout, const std::vector<int64_t>& room) {
  RLHF_CHECK(room.empty() || int(room.size()) == layout.num_units(),
             "engine weights: room for {} units, the model has {}", room.size(),
             layout.num_units());
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t n = std::max(layout.unit(u).numel, room.empty() ? 0 : room[size_t(u)]);
    units_.emplace_back();
    checked_assign(units_.back(), n, 0.0f,
                   fmt::format("the engine weights of unit '{}'", layout.unit(u).name));
  }
}

float* EngineWeights::acquire_grads(int u) {
  RLHF_FAIL("the rollout engine holds weights only: no gradient buffer for unit {}", u);
}

// ---------------------------------------------------------------------------------------------
// State

/// The activations of one forward over up to `rows` rows (one layer at a time), grown on demand
/// and reused across steps (first touch of fresh memory is expensive here).
struct Engine::Rows {
  std::vector<float> x, ln, rstd, q, k, v, q_rstd, k_rstd, atty, xmid, ln2, rstd2, gate, up, h;
  int64_t rows = 0;
  /// Room for n rows of spec's (this rank's) shapes; the layer routine's view of them.
  model::LayerActs<float> acts(int64_t n, const model::LayerSpec& s) {
    if (n > rows) {
      for (auto* b : {&x, &ln, &xmid, &ln2}) checked_resize(*b, n * s.C, "engine activations");
      for (auto* b : {&rstd, &rstd2}) checked_resize(*b, n, "engine activations");
      for (auto* b : {&q, &atty}) checked_resize(*b, n * s.q_dim(), "engine activations");
      for (auto* b : {&k, &v}) checked_resize(*b, n * s.kv_dim(), "engine activations");
      for (auto* b : {&gate, &up, &h}) checked_resize(*b, n * s.F, "engine activations");
      if (s.qk_norm) {
        checked_resize(q_rstd, n * s.H, "engine activations");
        checked_resize(k_rstd, n * s.Hkv, "engine activations");
      }
      rows = n;  // after the allocations: a failed one leaves the old size in force
    }
    model::LayerActs<float> a;
    a.ln1 = ln.data();
    a.rstd1 = rstd.data();
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.q_rstd = s.qk_norm ? q_rstd.data() : nullptr;
    a.k_rstd = s.qk_norm ? k_rstd.data() : nullptr;
    a.atty = atty.data();
    a.x_mid = xmid.data();
    a.ln2 = ln2.data();
    a.rstd2 = rstd2.data();
    a.gate = gate.data();
    a.up = up.data();
    a.h = h.data();
    return a;
  }
};

/// Buffers of the engine's forward passes.
struct Engine::Work {
  Rows decode, prefill;
  std::vector<float> logits;  // (B, V) decode logits
  std::vector<int32_t> tokens, pos, lens, table;
  int64_t max_blocks = 0;
  int64_t rows = 0;                  // decode rows: one per sequence, more with observations
  std::vector<int64_t> last_row;     // per sequence: its last row (whose logits are sampled)
  std::vector<float> patt, plogits;  // prefill: attention probabilities, last row's logits
  std::vector<int32_t> ppos, plens, ptable;
  // One sampler per OpenMP thread.
  std::vector<Sampler> samplers;
  std::vector<Seq*> batch;            // the sequences of a decode step
  std::vector<SampledToken> sampled;  // their sampled tokens
};

Engine::Engine(const model::ParamLayout& layout, const EngineOptions& options)
    : layout_(layout),
      opt_(options),
      weights_(layout, options.unit_room),
      work_(std::make_unique<Work>()) {
  RLHF_CHECK(layout.head() == model::HeadKind::kLM,
             "the generation engine needs a model with an LM head, not '{}'",
             model::to_string(layout.head()));
  RLHF_CHECK(opt_.max_batch >= 1, "engine: max_batch must be >= 1, got {}", opt_.max_batch);
  RLHF_CHECK(opt_.block_size >= 0, "engine: --kv_block_size must be >= 0, got {}", opt_.block_size);
  opt_.block_size = opt_.resolved_block_size();
  const model::ModelConfig& c = layout.config();
  spec_ = model::layer_spec(c);   // this rank's dims (narrowed below under tensor parallelism)
  model::ModelConfig kv_cfg = c;  // the KV heads this rank caches
  if (opt_.tp_comm != nullptr && opt_.tp_comm->size() > 1) {
    tp_ = std::make_unique<Tp>();
    tp_->comm = opt_.tp_comm;
    tp_->size = opt_.tp_comm->size();
    tp_->rank = opt_.tp_comm->rank();
    const int T = tp_->size;
    RLHF_CHECK(c.num_attention_heads % T == 0 && c.num_key_value_heads % T == 0 &&
                   c.intermediate_size % T == 0,
               "tensor parallel size {} must divide the attention heads ({}), the KV heads ({}) "
               "and intermediate_size ({})\nhint: use a --vllm_tensor_parallel_size that divides "
               "all three",
               T, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size);
    spec_.H /= T;
    spec_.Hkv /= T;
    spec_.F /= T;
    kv_cfg.head_dim = c.D();
    kv_cfg.num_key_value_heads = spec_.Hkv;
  }
  if (opt_.cuda) {
#ifdef RLHF_CUDA
    RLHF_CHECK(tp_ == nullptr,
               "a GPU generation engine runs with --vllm_tensor_parallel_size 1 (tensor-parallel "
               "engines run on the CPU)");
    // No more than max_batch sequences of max_position_embeddings positions can ever be cached.
    const int64_t per_block =
        2 * c.num_hidden_layers * c.num_key_value_heads * c.D() * 2 * opt_.block_size;
    // In long double: max_batch x positions x per-position bytes can pass 2^63 (it is a cap).
    const long double most =
        static_cast<long double>(opt_.max_batch) *
        static_cast<long double>((c.max_position_embeddings + opt_.block_size - 1) /
                                 opt_.block_size) *
        static_cast<long double>(per_block);
    const int64_t avail = EngineCuda::kv_budget_bytes(layout, opt_.gpu_memory_utilization,
                                                      opt_.max_batch, opt_.block_size);
    const int64_t budget =
        most < static_cast<long double>(avail) ? static_cast<int64_t>(most) : avail;
    cache_ = std::make_unique<KvCache>(kv_cfg, budget, opt_.block_size, 2, false);
    cuda_ = std::make_unique<EngineCuda>(layout, *cache_, opt_.max_batch, opt_.cuda_graphs,
                                         opt_.unit_room);
#else
    RLHF_FAIL("a GPU generation engine needs a build with CUDA");
#endif
  } else {
    cache_ = std::make_unique<KvCache>(kv_cfg, opt_.kv_cache_bytes, opt_.block_size,
                                       kv_element_bytes(opt_.kv_cache_dtype));
  }
  // P <= kMaxPositionEmbeddings and D <= kMaxHeadDim (ModelConfig::validate): P·D/2 <= 2^35.
  const int64_t P = c.max_position_embeddings, D = c.D();
  const std::string rope = fmt::format("({} positions x {} frequencies)", P, D / 2);
  checked_resize(rope_cos_, P * D / 2, "the engine's RoPE cos table " + rope);
  checked_resize(rope_sin_, P * D / 2, "the engine's RoPE sin table " + rope);
  model::rope_tables_cpu(rope_cos_.data(), rope_sin_.data(), P, D, model::rope_inv_freq(c).data());
}

Engine::~Engine() = default;

int Engine::tp_size() const {
  return tp_ ? tp_->size : 1;
}
int Engine::tp_rank() const {
  return tp_ ? tp_->rank : 0;
}

void Engine::slice_weights() {
  const model::ModelConfig& c = layout_.config();
  const int64_t C = c.hidden_size, D = c.D(), F = c.intermediate_size;
  const int64_t Q = c.num_attention_heads * D;
  const int64_t Ql = spec_.q_dim(), KVl = spec_.kv_dim(), Fl = spec_.F, r = tp_->rank;
  tp_->layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int u = layout_.layer_unit(l);
    const LayerW full(layout_.unit(u), weights_.unit_buffer(u));
    Tp::Layer& t = tp_->layers[size_t(l)];
    t.wq = copy_rows(full.wq, C, r * Ql, Ql);
    t.wk = copy_rows(full.wk, C, r * KVl, KVl);
    t.wv = copy_rows(full.wv, C, r * KVl, KVl);
    if (full.bq) t.bq = copy_rows(full.bq, 1, r * Ql, Ql);
    if (full.bk) t.bk = copy_rows(full.bk, 1, r * KVl, KVl);
    if (full.bv) t.bv = copy_rows(full.bv, 1, r * KVl, KVl);
    t.wo = copy_cols(full.wo, C, Q, r * Ql, Ql);
    t.wg = copy_rows(full.wg, C, r * Fl, Fl);
    t.wu = copy_rows(full.wu, C, r * Fl, Fl);
    t.wd = copy_cols(full.wd, C, F, r * Fl, Fl);
    LayerW& w = t.w;
    w = full;
    w.wq = t.wq.data();
    w.wk = t.wk.data();
    w.wv = t.wv.data();
    w.bq = full.bq ? t.bq.data() : nullptr;
    w.bk = full.bk ? t.bk.data() : nullptr;
    w.bv = full.bv ? t.bv.data() : nullptr;
    w.wo = t.wo.data();
    w.bo = r == 0 ? full.bo : nullptr;  // added once to the sum
    w.wg = t.wg.data();
    w.wu = t.wu.data();
    w.wd = t.wd.data();
  }
}

#ifdef RLHF_CUDA
std::vector<model::bf16*> Engine::device_unit_buffers() {
  RLHF_CHECK(cuda_ != nullptr, "device_unit_buffers: this engine runs on the CPU");
  return cuda_->device_units();
}
#endif

std::vector<float*> Engine::unit_buffers() {
  std::vector<float*> out;
  for (int u = 0; u < num_units(); ++u) out.push_back(unit_buffer(u));
  return out;
}

const float* Engine::lm_head_weight() const {
  const model::ParamLayout::TensorRef lw = layout_.lm_head_weight();
  return weights_.unit_buffer(lw.unit) + lw.offset;
}

int64_t Engine::weight_bytes_per_decode_step() const {
  int64_t n = 0;
  for (int l = 0; l < layout_.config().num_hidden_layers; ++l)
    for (const model::TensorInfo& t : layout_.unit(layout_.layer_unit(l)).tensors) n += t.numel;
  for (const model::TensorInfo& t : layout_.unit(layout_.head_unit()).tensors) n += t.numel;
  if (layout_.config().tie_word_embeddings)
    n += layout_.unit(layout_.embedding_unit()).at("embed_tokens.weight").numel;
  return n * (cuda_ ? 2 : int64_t(sizeof(float)));
}

// ---------------------------------------------------------------------------------------------
// Forward passes

model::LayerRun<float> Engine::layer_run(int64_t N, const int32_t* pos,
                                         model::LinearFn<float> linear) const {
  model::LayerRun<float> run;
  run.N = N;
  run.pos = pos;
  run.rope_cos = rope_cos_.data();
  run.rope_sin = rope_sin_.data();
  run.linear = linear;
  if (tp_) {
    parallel::Comm* comm = tp_->comm;
    run.partial_sum = [comm](float* y, int64_t n) { comm->all_reduce(y, y, n); };
  }
  return run;
}

void Engine::pack_weights() {
  const model::ModelConfig& c = layout_.config();
  if (!packed_) packed_ = std::make_unique<Packed>();
  packed_->layers.resize(size_t(c.num_hidden_layers));
  const int64_t C = c.hidden_size, Q = spec_.q_dim(), KV = spec_.kv_dim(), F = spec_.F;
  auto pack = [](std::vector<float>& dst, const float* w, int64_t IC, int64_t OC) {
    checked_resize(dst, model::linear_decode_packed_size(IC, OC), "the engine's packed weights");
    model::linear_decode_pack(dst.data(), w, IC, OC);
    return static_cast<const float*>(dst.data());
  };
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Packed::Layer& p = packed_->layers[size_t(l)];
    const LayerW w = layer_weights(l);
    p.w = w;
    p.w.wq = pack(p.wq, w.wq, C, Q);
    p.w.wk = pack(p.wk, w.wk, C, KV);
    p.w.wv = pack(p.wv, w.wv, C, KV);
    p.w.wo = pack(p.wo, w.wo, Q, C);
    p.w.wg = pack(p.wg, w.wg, C, F);
    p.w.wu = pack(p.wu, w.wu, C, F);
    p.w.wd = pack(p.wd, w.wd, F, C);
  }
  pack(packed_->lm_head, lm_head_weight(), C, c.vocab_size);
}

model::LayerParams<const float> Engine::packed_layer_weights(int l) const {
  return packed_->layers[size_t(l)].w;
}

model::LayerParams<const float> Engine::layer_weights(int l) const {
  if (tp_) return tp_->layers[size_t(l)].w;
  const int u = layout_.layer_unit(l);
  return model::LayerParams<const float>(layout_.unit(u), weights_.unit_buffer(u));
}

void Engine::attend_cached(float* out, const float* q, int l, const int32_t* table,
                           const int32_t* lens, int64_t B, int64_t max_blocks) const {
  const KvCache& kv = *cache_;
  if (kv.dtype() == KvDtype::kFloat16)
    model::attention_decode_cpu(out, q, kv.k<model::f16>(l), kv.v<model::f16>(l), table, lens, B,
                                spec_.H, spec_.Hkv, spec_.D, kv.num_blocks(), kv.block_size(),
                                max_blocks);
  else
    model::attention_decode_cpu(out, q, kv.k<float>(l), kv.v<float>(l), table, lens, B, spec_.H,
                                spec_.Hkv, spec_.D, kv.num_blocks(), kv.block_size(), max_blocks);
}

// The last row's logits from the final hidden rows x (N, C): norm + LM head.
const float* Engine::head_logits(const float* x, int64_t N, Rows& r, float* logits) {
  const model::ModelConfig& c = layout_.config();
  const int hu = layout_.head_unit();
  model::rmsnorm_forward_cpu(
      r.ln.data(), r.rstd.data(), x,
      weights_.unit_buffer(hu) + layout_.unit(hu).at("model.norm.weight").offset, N, c.hidden_size,
      c.rms_norm_eps);
  model::linear_decode_packed_cpu(logits, r.ln.data(), packed_->lm_head.data(), nullptr, N,
                                  c.hidden_size, c.vocab_size);
  return logits;
}

const float* Engine::prefill(const std::vector<int32_t>& prompt, const int32_t* blocks) {
  const model::ModelConfig& c = layout_.config();
  const int64_t P = static_cast<int64_t>(prompt.size());
  const int64_t C = c.hidden_size, H = spec_.H, Hkv = spec_.Hkv, D = spec_.D, V = c.vocab_size;
  Work& w = *work_;
  Rows& r = w.prefill;
  model::LayerActs<float> a = r.acts(P, spec_);
  grow(w.plogits, V, "the engine's prefill logits");
  const bool att_direct = H * P * P <= kMaxPrefillAttFloats;
  if (att_direct) grow(w.patt, H * P * P, "the engine's prefill attention probabilities");
  w.ppos.resize(static_cast<size_t>(P));
  for (int64_t t = 0; t < P; ++t) w.ppos[size_t(t)] = int32_t(t);
  const int64_t nb = cache_->blocks_for(P);
  if (!att_direct) {  // every query row t reads positions [0, t] through the same block list
    w.plens.resize(static_cast<size_t>(P));
    w.ptable.resize(static_cast<size_t>(P * nb));
    for (int64_t t = 0; t < P; ++t) {
      w.plens[size_t(t)] = int32_t(t + 1);
      std::copy(blocks, blocks + nb, w.ptable.begin() + t * nb);
    }
  }
  const int eu = layout_.embedding_unit();
  model::embedding_forward_cpu(
      r.x.data(), prompt.data(),
      weights_.unit_buffer(eu) + layout_.unit(eu).at("embed_tokens.weight").offset, P, C, V);
  // The prompt's rows through BLAS GEMM (a prompt is always prefilled alone, so its result does
  // not depend on the batch).
  model::LayerRun<float> run = layer_run(P, w.ppos.data(), &model::linear_forward_cpu<float>);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    // The prompt attends to itself causally; its K/V go to the cache for the decode steps.
    run.attention = [&, l](float* atty, const float* q, const float* k, const float* v) {
      cache_->write(l, blocks, 0, P, k, v);
      if (att_direct)
        model::attention_forward_cpu(atty, w.patt.data(), q, k, v, int64_t(1), P, H, Hkv, D);
      else
        attend_cached(atty, q, l, w.ptable.data(), w.plens.data(), P, nb);
    };
    model::decoder_layer_forward_cpu(r.x.data(), a, r.x.data(), layer_weights(l), spec_, run);
  }
  // Only the last position's logits are needed (the first generated token).
  return head_logits(r.x.data() + (P - 1) * C, 1, r, w.plogits.data());
}

void Engine::prepare_decode(const std::vector<Seq*>& active) {
  const int64_t B = static_cast<int64_t>(active.size());
  Work& w = *work_;
  // One row per token to feed: each sequence's last sampled token, then any observation tokens
  // (multi-turn), at consecutive positions.
  w.rows = 0;
  w.max_blocks = 0;
  w.last_row.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const Seq* s = active[size_t(b)];
    w.rows += 1 + static_cast<int64_t>(s->extra.size());
    w.last_row[size_t(b)] = w.rows - 1;
    w.max_blocks = std::max(w.max_blocks, static_cast<int64_t>(s->blocks.size()));
  }
  w.tokens.resize(static_cast<size_t>(w.rows));
  w.pos.resize(static_cast<size_t>(w.rows));
  w.lens.resize(static_cast<size_t>(w.rows));
  w.table.assign(static_cast<size_t>(w.rows * w.max_blocks), 0);
  int64_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    const Seq& s = *active[size_t(b)];
    for (int64_t j = 0; j <= static_cast<int64_t>(s.extra.size()); ++j, ++row) {
      w.tokens[size_t(row)] = j == 0 ? s.next_token : s.extra[size_t(j - 1)];
      w.pos[size_t(row)] = int32_t(s.len + j);
      w.lens[size_t(row)] = int32_t(s.len + j + 1);
      std::copy(s.blocks.begin(), s.blocks.end(), w.table.begin() + row * w.max_blocks);
    }
  }
}

const float* Engine::decode_step(const std::vector<Seq*>& active) {
  const model::ModelConfig& c = layout_.config();
  const int64_t B = static_cast<int64_t>(active.size());
  Work& w = *work_;
  prepare_decode(active);
  const int64_t R = w.rows;  // B, plus a sequence's observation tokens (multi-turn)
#ifdef RLHF_CUDA
  if (cuda_) {
    RLHF_ASSERT(R == B);  // generate() refuses observations on a GPU engine
    return cuda_->decode(w.tokens.data(), w.pos.data(), w.lens.data(), w.table.data(), B,
                         w.max_blocks);
  }
#endif
  const int64_t C = c.hidden_size, V = c.vocab_size, KV = spec_.kv_dim();
  Rows& r = w.decode;
  model::LayerActs<float> a = r.acts(R, spec_);
  grow(w.logits, B * V, "the engine's decode logits");
  const int eu = layout_.embedding_unit();
  model::embedding_forward_cpu(
      r.x.data(), w.tokens.data(),
      weights_.unit_buffer(eu) + layout_.unit(eu).at("embed_tokens.weight").offset, R, C, V);
  // Each row at its own position; the batch-invariant decode kernel (packed weights) for every
  // linear. Every row's K/V is written before any row attends, so the rows of one sequence
  // attend causally to each other (lens = position + 1).
  model::LayerRun<float> run = layer_run(R, w.pos.data(), &model::linear_decode_packed_cpu);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    run.attention = [&, l](float* atty, const float* q, const float* k, const float* v) {
      for (int64_t i = 0; i < R; ++i)
        cache_->write(l, w.table.data() + i * w.max_blocks, w.pos[size_t(i)], 1, k + i * KV,
                      v + i * KV);
      attend_cached(atty, q, l, w.table.data(), w.lens.data(), R, w.max_blocks);
    };
    model::decoder_layer_forward_cpu(r.x.data(), a, r.x.data(), packed_layer_weights(l), spec_,
                                     run);
  }
  // Only each sequence's last row is sampled: move those rows to the front (last_row[b] >= b).
  if (R > B)
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(r.x.data() + w.last_row[size_t(b)] * C, C, r.x.data() + b * C);
  return head_logits(r.x.data(), B, r, w.logits.data());
}

// ---------------------------------------------------------------------------------------------
// Scheduling

void Engine::decode_and_sample(std::vector<std::unique_ptr<Seq>>& active,
                               std::vector<std::unique_ptr<Seq>>& turning, Run& run) {
  const auto t_step = Clock::now();
  Work& w = *work_;
  const int64_t V = layout_.config().vocab_size;
  std::vector<Seq*>& batch = w.batch;
  batch.clear();
  for (auto& s : active) batch.push_back(s.get());
  const int64_t B = static_cast<int64_t>(batch.size());
  const float* logits = decode_step(batch);
  w.sampled.resize(static_cast<size_t>(B));
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b) {
    try {
      const Seq& s = *batch[size_t(b)];
      const double u = counter_uniform(s.sampling->seed, s.request_id, uint64_t(s.sample_index),
                                       uint64_t(s.result.tokens.size()));
      w.sampled[size_t(b)] =
          w.samplers[size_t(omp_get_thread_num())].sample(logits + b * V, *s.sampling, u);
    } catch (...) {
#pragma omp critical(rlhf_engine_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  ++stats_.decode_steps;
  stats_.decode_tokens += B;
  stats_.max_active = std::max(stats_.max_active, B);
  for (const Seq* s : batch)
    stats_.kv_bytes_read += double(s->len + 1) * double(cache_->bytes_per_token());
  size_t kept = 0;
  for (int64_t b = 0; b < B; ++b) {
    Seq& s = *active[size_t(b)];
    s.len += 1 + static_cast<int64_t>(s.extra.size());  // the rows fed this step are now cached
    s.extra.clear();
    const Run::Outcome o = run.append(s, w.sampled[size_t(b)]);
    if (o == Run::Outcome::kFinished) continue;
    if (o == Run::Outcome::kTurnEnd) {
      turning.push_back(std::move(active[size_t(b)]));
      continue;
    }
    if (kept != size_t(b)) active[kept] = std::move(active[size_t(b)]);
    ++kept;
  }
  active.resize(kept);
  stats_.decode_s += since(t_step);
}

std::vector<GenerationResult> Engine::generate(const std::vector<GenerationRequest>& requests,
                                               const ProgressFn& progress, const TurnHooks* hooks) {
  const auto t_start = Clock::now();
  stats_ = EngineStats{};
  if (hooks != nullptr) {
    RLHF_CHECK(hooks->max_turns >= 1, "multi-turn generation: max_turns must be >= 1, got {}",
               hooks->max_turns);
    RLHF_CHECK(!hooks->on_turn_end || (cuda_ == nullptr && tp_ == nullptr),
               "--env_command needs a CPU generation engine with --vllm_tensor_parallel_size 1 "
               "(observation tokens are prefilled by the CPU engine's decode step only)\nhint: "
               "drop --device cuda / --vllm_tensor_parallel_size for runs with an environment");
  }
  if (tp_) slice_weights();  // the unit buffers may have changed (weight sync) since last time
  if (!cuda_) pack_weights();
#ifdef RLHF_CUDA
  if (cuda_ && !device_weights_current_) {
    std::vector<const float*> units;
    for (int u = 0; u < num_units(); ++u) units.push_back(unit_buffer(u));
    cuda_->upload_weights(units);  // the host buffers may have changed (loading, host sync)
  }
  device_weights_current_ = false;
#endif
  cache_->reset_peak();
  const model::ModelConfig& c = layout_.config();
  const int64_t V = c.vocab_size, max_pos = c.max_position_embeddings;
  const int32_t eos = opt_.eos_token_id >= 0 ? opt_.eos_token_id : int32_t(c.eos_token_id);
  const int64_t R = static_cast<int64_t>(requests.size());

  // --- validation, and each request's per-sample cost
  std::vector<int64_t> max_new(static_cast<size_t>(R)), blocks_per(static_cast<size_t>(R));
  int64_t samples_total = 0;
  for (int64_t i = 0; i < R; ++i) {
    const GenerationRequest& r = requests[size_t(i)];
    const int64_t P = static_cast<int64_t>(r.prompt.size());
    RLHF_CHECK(P >= 1, "request {} (id {}): empty prompt", i, r.id);
    for (int64_t t = 0; t < P; ++t)
      RLHF_CHECK(r.prompt[size_t(t)] >= 0 && r.prompt[size_t(t)] < V,
                 "request {} (id {}): prompt token {} at position {} is outside the vocabulary "
                 "[0, {})",
                 i, r.id, r.prompt[size_t(t)], t, V);
    RLHF_CHECK(r.n_samples >= 1, "request {} (id {}): n_samples must be >= 1, got {}", i, r.id,
               r.n_samples);
    RLHF_CHECK(r.max_new_tokens >= 1, "request {} (id {}): max_new_tokens must be >= 1, got {}", i,
               r.id, r.max_new_tokens);
    try {
      r.sampling.validate();
    } catch (const Error& e) {
      RLHF_FAIL("request {} (id {}): {}", i, r.id, e.what());
    }
    RLHF_CHECK(P < max_pos,
               "request {} (id {}): a prompt of {} tokens leaves no room to generate under "
               "max_position_embeddings = {}",
               i, r.id, P, max_pos);
    max_new[size_t(i)] = std::min(r.max_new_tokens, max_pos - P);
    // Positions a sample can ever hold: the prompt and every generated token but the last (which
    // is sampled and never fed back).
    const int64_t positions = P + max_new[size_t(i)] - 1;
    blocks_per[size_t(i)] = cache_->blocks_for(positions);
    RLHF_CHECK(blocks_per[size_t(i)] <= cache_->num_blocks(),
               "request {} (id {}): one sample needs up to {} positions ({} bytes of KV cache) but "
               "the cache holds {} bytes\nhint: raise --gen_kv_cache_mb or lower "
               "--generate_max_len",
               i, r.id, positions, blocks_per[size_t(i)] * cache_->bytes_per_block(),
               cache_->capacity_bytes());
    samples_total += r.n_samples;
  }
  stats_.requests = R;
  stats_.samples = samples_total;

  Work& w = *work_;
  const int threads = omp_get_max_threads();
  if (static_cast<int>(w.samplers.size()) != threads ||
      (threads > 0 && w.samplers[0].vocab_size() != V)) {
    w.samplers.clear();
    for (int t = 0; t < threads; ++t) w.samplers.emplace_back(V);
  }

  struct Pending {
    int64_t index, next_sample, remaining;
  };
  std::deque<Pending> pending;
  for (int64_t i = 0; i < R; ++i) pending.push_back({i, 0, requests[size_t(i)].n_samples});
  Run run(requests, *cache_, stats_, hooks, eos, opt_.ignore_eos, V);
  std::vector<std::unique_ptr<Seq>> active;
  std::vector<std::unique_ptr<Seq>> turning;  // their turn ended this step (multi-turn)
  // If anything throws mid-way, the running sequences' blocks go back to the pool, so the engine
  // stays usable for the next call.
  struct ReleaseOnExit {
    KvCache& cache;
    std::vector<std::unique_ptr<Seq>>& seqs;
    ~ReleaseOnExit() {
      for (auto& s : seqs)
        if (s && !s->blocks.empty()) cache.release(s->blocks);
    }
  } release_on_exit{*cache_, active}, release_turning{*cache_, turning};

  bool waiting = false;
  while (!pending.empty() || !active.empty() || !turning.empty()) {
    // --- admission: first come, first served, as long as slots and KV blocks allow
    while (!pending.empty()) {
      Pending& pr = pending.front();
      const GenerationRequest& r = requests[size_t(pr.index)];
      const int64_t per = blocks_per[size_t(pr.index)];
      const int64_t group_max = std::min(opt_.max_batch, cache_->num_blocks() / per);
      const int64_t want = std::min(pr.remaining, group_max);
      const int64_t slots = opt_.max_batch - static_cast<int64_t>(active.size());
      if (want > slots || want * per > cache_->free_blocks()) {
        if (!waiting) ++stats_.admission_waits;
        waiting = true;
        break;
      }
      waiting = false;
      const auto t_prefill = Clock::now();
      std::vector<std::unique_ptr<Seq>> group;
      const ReleaseOnExit group_guard{*cache_, group};  // until each is active or finished
      for (int64_t j = 0; j < want; ++j) {
        auto s = std::make_unique<Seq>();
        const bool allocated = cache_->allocate(per, s->blocks);
        RLHF_ASSERT(allocated);
        s->request_index = pr.index;
        s->request_id = r.id;
        s->sample_index = pr.next_sample + j;
        s->sampling = &r.sampling;
        s->len = static_cast<int64_t>(r.prompt.size());
        s->max_new = max_new[size_t(pr.index)];
        s->result.request_index = pr.index;
        s->result.request_id = r.id;
        s->result.sample_index = s->sample_index;
        group.push_back(std::move(s));
      }
      const int64_t P = static_cast<int64_t>(r.prompt.size());
      const float* logits = nullptr;
#ifdef RLHF_CUDA
      if (cuda_) {
        logits = cuda_->prefill(r.prompt.data(), P, group[0]->blocks.data());
        for (int64_t j = 1; j < want; ++j)
          cuda_->copy_prefix(group[0]->blocks.data(), group[size_t(j)]->blocks.data(), P);
      }
#endif
      if (logits == nullptr) {
        logits = prefill(r.prompt, group[0]->blocks.data());
        for (int64_t j = 1; j < want; ++j)
          cache_->copy_prefix(group[0]->blocks.data(), group[size_t(j)]->blocks.data(), P);
      }
      ++stats_.prefills;
      stats_.prefill_tokens += static_cast<int64_t>(r.prompt.size());
      for (auto& s : group) {
        const double u = counter_uniform(r.sampling.seed, r.id, uint64_t(s->sample_index), 0);
        const Run::Outcome o = run.append(*s, w.samplers[0].sample(logits, r.sampling, u));
        if (o == Run::Outcome::kGoing) active.push_back(std::move(s));
        if (o == Run::Outcome::kTurnEnd) turning.push_back(std::move(s));
      }
      stats_.prefill_s += since(t_prefill);
      pr.next_sample += want;
      pr.remaining -= want;
      if (pr.remaining == 0) pending.pop_front();
    }
    if (active.empty() && turning.empty()) continue;  // all admitted finished at a first token
    if (!active.empty()) decode_and_sample(active, turning, run);
    if (!turning.empty()) run.resolve_turns(turning, active);  // the environment's answers
    if (progress) progress(stats_, run.samples_done, samples_total);
  }
  stats_.peak_kv_blocks = cache_->peak_used_blocks();
  stats_.total_s = since(t_start);
  if (progress) progress(stats_, run.samples_done, samples_total);
  return run.take_results();
}

}  // namespace rlhf::rollout

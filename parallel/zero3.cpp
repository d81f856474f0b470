#include "parallel/zero3.h"

#include <algorithm>
#include <cstring>

#include "core/checked_alloc.h"
#include "core/error.h"
#include "optim/clip.h"

namespace rlhf::parallel {

namespace {
void copy_floats(float* dst, const float* src, int64_t n) {
  std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Zero3Store

Zero3Store::Zero3Store(const model::ParamLayout& layout, Comm& comm, Zero3Options options)
    : layout_(layout),
      shard_layout_(layout, comm.size()),
      comm_(comm),
      opt_(options),
      schedule_(layout.num_units(), options.prefetch, options.keep_params_for_backward) {
  shards_.resize(static_cast<size_t>(layout.num_units()));
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t S = shard_numel(u);
    Shard& s = shards_[size_t(u)];
    const std::string& name = layout.unit(u).name;
    auto shard = [&](std::vector<float>& v, const char* what) {
      checked_assign(v, S, 0.0f, fmt::format("the ZeRO-3 {} shard of unit '{}'", what, name));
    };
    shard(s.params, "parameter");
    if (opt_.bf16_gather)
      checked_assign(s.params16, S, model::bfloat16{0},
                     fmt::format("the ZeRO-3 bf16 parameter shard of unit '{}'", name));
    if (opt_.frozen) continue;
    shard(s.grads, "gradient");
    if (opt_.adam_offload) {
      shard(s.master_host, "host master weight");
      shard(s.grads_host, "host gradient");
      shard(s.m_host, "host AdamW first moment");
      shard(s.v_host, "host AdamW second moment");
    } else {
      shard(s.m, "AdamW first moment");
      shard(s.v, "AdamW second moment");
    }
  }
}

Zero3Store::~Zero3Store() = default;

std::vector<float>* Zero3Store::take_buffer(Pool& free, int64_t n) {
  std::unique_ptr<std::vector<float>> b;
  auto it = free.find(n);
  if (it != free.end() && !it->second.empty()) {
    b = std::move(it->second.back());
    it->second.pop_back();
  } else {
    b = std::make_unique<std::vector<float>>();
    checked_assign(*b, n, 0.0f, "a ZeRO-3 full-unit buffer (gathered parameters or gradients)");
    pooled_floats_ += n;
  }
  std::vector<float>* raw = b.get();
  in_use_[raw] = std::move(b);
  return raw;
}

void Zero3Store::give_back(Pool& free, std::vector<float>* b) {
  auto it = in_use_.find(b);
  RLHF_ASSERT(it != in_use_.end());
  free[int64_t(b->size())].push_back(std::move(it->second));
  in_use_.erase(it);
}

void Zero3Store::refresh_bf16(int u) {
  if (!opt_.bf16_gather) return;
  Shard& s = shards_[size_t(u)];
  model::float_to_bf16_n(s.params16.data(), s.params.data(), shard_numel(u));
}

Zero3Store::Gathered Zero3Store::post_gather(int u) {
  Gathered g;
  const int64_t padded = shard_layout_.padded_numel(u);
  g.buffer = take_buffer(free_params_, padded);
  if (opt_.bf16_gather) {
    auto& free = free16_[padded];
    if (!free.empty()) {
      g.buffer16 = std::move(free.back());
      free.pop_back();
    } else {
      g.buffer16 = std::make_unique<std::vector<model::bfloat16>>();
      checked_assign(*g.buffer16, padded, model::bfloat16{0},
                     "a ZeRO-3 full-unit bf16 buffer (gathered parameters)");
      pooled_bf16_ += padded;
    }
    g.request = comm_.iall_gather(shards_[size_t(u)].params16.data(), g.buffer16->data(),
                                  shard_numel(u), DType::kBfloat16);
    param_gather_bytes_ += padded * int64_t(sizeof(model::bfloat16));
    return g;  // ready once complete() has widened it
  }
  g.request = comm_.iall_gather(shards_[size_t(u)].params.data(), g.buffer->data(), shard_numel(u));
  param_gather_bytes_ += padded * int64_t(sizeof(float));
  g.ready = g.request.done();
  return g;
}

void Zero3Store::complete(Gathered& g, int64_t numel) {
  if (g.ready) return;
  g.request.wait();
  if (g.buffer16) {
    model::bf16_to_float_n(g.buffer->data(), g.buffer16->data(), numel);
    widened_.push_back(&g);
  }
  g.ready = true;
}

void Zero3Store::drop(Gathered& g) {
  if (!g.ready) g.request.wait();  // an in-flight (prefetched) gather completes first
  give_back(free_params_, g.buffer);
  if (g.buffer16) {
    widened_.erase(std::remove(widened_.begin(), widened_.end(), &g), widened_.end());
    const int64_t n = int64_t(g.buffer16->size());
    free16_[n].push_back(std::move(g.buffer16));
  }
}

const float* Zero3Store::acquire_params(int u) {
  const int64_t numel = layout_.unit(u).numel;
  Gathered& g = schedule_.acquire(
      u, [&](int v) { return post_gather(v); }, [&](Gathered& h) { complete(h, numel); });
  return g.buffer->data();
}

const model::bfloat16* Zero3Store::bf16_twin(const float* p, int64_t n) const {
  for (const Gathered* g : widened_) {
    const float* base = g->buffer->data();
    if (p >= base && p + n <= base + g->buffer->size()) return g->buffer16->data() + (p - base);
  }
  return nullptr;
}

void Zero3Store::release_params(int u) {
  schedule_.release(u, [&](Gathered& g) { drop(g); });
}

float* Zero3Store::acquire_grads(int u) {
  RLHF_CHECK(!opt_.frozen, "internal error: gradients requested from a frozen model");
  RLHF_ASSERT(grads_out_.count(u) == 0);
  std::vector<float>* b = take_buffer(free_grads_, shard_layout_.padded_numel(u));
  std::memset(b->data(), 0, sizeof(float) * b->size());
  grads_out_[u] = b;
  return b->data();
}

void Zero3Store::release_grads(int u) {
  auto it = grads_out_.find(u);
  RLHF_ASSERT(it != grads_out_.end());
  PendingGrad p;
  p.unit = u;
  p.full = it->second;
  grads_out_.erase(it);
  Shard& s = shards_[size_t(u)];
  const int64_t S = shard_numel(u);
  if (s.grads_fresh) {
    // First micro-batch since zero_grads: the reduce-scatter writes the shard directly.
    p.request = comm_.ireduce_scatter(p.full->data(), s.grads.data(), S);
    s.grads_fresh = false;
  } else {
    p.staging = take_buffer(free_staging_, S);
    p.request = comm_.ireduce_scatter(p.full->data(), p.staging->data(), S);
  }
  pending_.push_back(std::move(p));
  // At most two reduce-scatters in flight: the previous unit's overlaps this unit's backward.
  while (pending_.size() > 2) {
    finish_pending_grad(pending_.front());
    pending_.erase(pending_.begin());
  }
}

void Zero3Store::finish_pending_grad(PendingGrad& p) {
  p.request.wait();
  if (p.staging) {
    float* g = shards_[size_t(p.unit)].grads.data();
    const float* add = p.staging->data();
    const int64_t S = shard_numel(p.unit);
#pragma omp parallel for simd schedule(static) if (S > 65536)
    for (int64_t i = 0; i < S; ++i) g[i] += add[i];
    give_back(free_staging_, p.staging);
  }
  give_back(free_grads_, p.full);
}

void Zero3Store::finish_all_pending_grads() {
  for (PendingGrad& p : pending_) finish_pending_grad(p);
  pending_.clear();
}

void Zero3Store::begin_pass(bool backward) {
  schedule_.begin_pass(backward, [&](int u) { return post_gather(u); });
}

void Zero3Store::end_pass(bool backward) {
  if (backward) finish_all_pending_grads();
  // In-flight gathers of dropped copies complete first.
  schedule_.end_pass(backward, [&](Gathered& g) { drop(g); });
}

void Zero3Store::zero_grads() {
  finish_all_pending_grads();
  if (opt_.frozen) return;
  for (Shard& s : shards_) {
    std::fill(s.grads.begin(), s.grads.end(), 0.0f);
    s.grads_fresh = true;
  }
}

double Zero3Store::grad_sq_norm() {
  finish_all_pending_grads();
  if (opt_.frozen) return 0.0;
  double local = 0;
  for (int u = 0; u < layout_.num_units(); ++u)
    local += optim::sum_of_squares(shards_[size_t(u)].grads.data(), shard_numel(u));
  double global = 0;
  comm_.all_reduce(&local, &global, 1);
  return global;
}

void Zero3Store::adamw_step(const optim::AdamWConfig& cfg, double lr, int64_t step,
                            float grad_scale) {
  RLHF_CHECK(!opt_.frozen, "internal error: optimizer step on a frozen model");
  finish_all_pending_grads();
  for (int u = 0; u < layout_.num_units(); ++u) {
    Shard& s = shards_[size_t(u)];
    const int64_t S = shard_numel(u);
    const auto segs =
        adamw_segments(layout_.unit(u), shard_layout_.shard_offset(u, comm_.rank()), S);
    if (opt_.adam_offload) {
      // Gradient shard down to the host, step on the host master, updated shard back up.
      copy_floats(s.grads_host.data(), s.grads.data(), S);
      optim::adamw_step_segments_cpu(s.master_host.data(), s.m_host.data(), s.v_host.data(),
                                     s.grads_host.data(), S, segs, cfg, lr, step, grad_scale);
      copy_floats(s.params.data(), s.master_host.data(), S);
    } else {
      optim::adamw_step_segments_cpu(s.params.data(), s.m.data(), s.v.data(), s.grads.data(), S,
                                     segs, cfg, lr, step, grad_scale);
    }
    refresh_bf16(u);
  }
}

void Zero3Store::gather_padded(int u, const float* shard, float* out) {
  std::vector<float>* full = take_buffer(free_params_, shard_layout_.padded_numel(u));
  comm_.all_gather(shard, full->data(), shard_numel(u));
  copy_floats(out, full->data(), layout_.unit(u).numel);
  give_back(free_params_, full);
}

void Zero3Store::gather_unit(int u, float* out) {
  gather_padded(u, shards_[size_t(u)].params.data(), out);
}

void Zero3Store::load_unit(int u, const float* full) {
  Shard& s = shards_[size_t(u)];
  const int64_t S = shard_numel(u);
  scatter_shard(s.params.data(), full, layout_.unit(u).numel,
                shard_layout_.shard_offset(u, comm_.rank()), S);
  if (opt_.adam_offload) copy_floats(s.master_host.data(), s.params.data(), S);
  refresh_bf16(u);
}

void Zero3Store::gather_moments(int u, float* m, float* v) {
  Shard& s = shards_[size_t(u)];
  gather_padded(u, opt_.adam_offload ? s.m_host.data() : s.m.data(), m);
  gather_padded(u, opt_.adam_offload ? s.v_host.data() : s.v.data(), v);
}

void Zero3Store::load_moments(int u, const float* m, const float* v) {
  Shard& s = shards_[size_t(u)];
  const int64_t S = shard_numel(u), off = shard_layout_.shard_offset(u, comm_.rank());
  const int64_t n = layout_.unit(u).numel;
  scatter_shard(opt_.adam_offload ? s.m_host.data() : s.m.data(), m, n, off, S);
  scatter_shard(opt_.adam_offload ? s.v_host.data() : s.v.data(), v, n, off, S);
}

MemoryReport Zero3Store::memory() const {
  MemoryReport r;
  const int64_t b = shard_layout_.total_shard() * int64_t(sizeof(float));
  // bf16_gather: + the bf16 copy of the shard.
  r.params_bytes = b + (opt_.bf16_gather ? shard_layout_.total_shard() * 2 : 0);
  r.grads_bytes = opt_.frozen ? 0 : b;
  r.optimizer_bytes = opt_.frozen         ? 0
                      : opt_.adam_offload ? 4 * b
                                          : 2 * b;  // offload: + master, grad
  r.optimizer_on_host = opt_.adam_offload;
  r.gather_bytes =
      pooled_floats_ * int64_t(sizeof(float)) + pooled_bf16_ * int64_t(sizeof(model::bfloat16));
  return r;
}

// ---------------------------------------------------------------------------------------------
// ReplicatedStore

ReplicatedStore::ReplicatedStore(const model::ParamLayout& layout, Comm& comm, bool bf16_twins)
    : local_(layout, bf16_twins), comm_(comm) {}

void ReplicatedStore::reduce_grads() {
  if (reduced_) return;
  for (int u = 0; u < layout().num_units(); ++u) {
    float* g = local_.local().grads(u);
    comm_.all_reduce(g, g, layout().unit(u).numel);
  }
  reduced_ = true;
}

double ReplicatedStore::grad_sq_norm() {
  reduce_grads();
  return local_.grad_sq_norm();
}

void ReplicatedStore::adamw_step(const optim::AdamWConfig& cfg, double lr, int64_t step,
                                 float grad_scale) {
  reduce_grads();
  local_.adamw_step(cfg, lr, step, grad_scale);
}

}  // namespace rlhf::parallel

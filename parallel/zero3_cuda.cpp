#ifdef RLHF_CUDA
#include "parallel/zero3_cuda.h"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "core/error.h"
#include "optim/adamw.h"
#include "optim/flat_cuda.h"
#include "parallel/comm_nccl.h"
#include "parallel/mpi_check.h"
#include "parallel/watchdog.h"

namespace rlhf::parallel {

namespace {

void to_bf16_host(model::bf16* out, const float* in, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = __float2bfloat16_rn(in[i]);
}

void h2d(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
}
void d2h(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
}

}  // namespace

Zero3StoreCuda::Zero3StoreCuda(const model::ParamLayout& layout, Comm* comm,
                               Zero3OptionsCuda options)
    : layout_(layout),
      shard_layout_(layout, comm != nullptr ? comm->size() : 1),
      opt_(options),
      schedule_(layout.num_units(), options.prefetch, options.keep_params_for_backward) {
  if (comm != nullptr && comm->size() > 1) {
#ifdef RLHF_NCCL
    nccl_ = dynamic_cast<NcclComm*>(comm);
#endif
    RLHF_CHECK(nccl_ != nullptr,
               "ZeRO-3 on the GPU over {} ranks needs an NCCL communicator, but {} is '{}'",
               comm->size(), comm->name(), comm_kind_name(comm->kind()));
    nshards_ = comm->size();
    rank_ = comm->rank();
  }
  if (opt_.adam_offload && !opt_.frozen) copy_ = std::make_unique<CudaStream>();
  shards_.resize(static_cast<size_t>(layout.num_units()));
  for (int u = 0; u < layout.num_units(); ++u) {
    const int64_t S = shard_numel(u);
    Shard& s = shards_[size_t(u)];
    s.params16.resize(S, "ZeRO-3 bf16 parameter shard");
    CUDA_CHECK(cudaMemsetAsync(s.params16.get(), 0, size_t(S) * sizeof(model::bf16), stream()));
    if (opt_.frozen) continue;
    s.grads.resize(S, "ZeRO-3 gradient shard");
    CUDA_CHECK(cudaMemsetAsync(s.grads.get(), 0, size_t(S) * sizeof(float), stream()));
    if (opt_.adam_offload) {
      s.master_host = PinnedArray<float>(S, "adam_offload master weights");
      s.m_host = PinnedArray<float>(S, "adam_offload first moment");
      s.v_host = PinnedArray<float>(S, "adam_offload second moment");
      s.grads_host = PinnedArray<float>(S, "adam_offload gradient copy");
      s.params16_host = PinnedArray<model::bf16>(S, "adam_offload bf16 copy");
      s.d2h = std::make_unique<CudaEvent>();
      s.h2d = std::make_unique<CudaEvent>();
      s.h2d->record(copy_->get());
    } else {
      for (DeviceArray<float>* a : {&s.master, &s.m, &s.v}) {
        a->resize(S, "ZeRO-3 master weights / AdamW moments");
        CUDA_CHECK(cudaMemsetAsync(a->get(), 0, size_t(S) * sizeof(float), stream()));
      }
    }
  }
  norm_ws_.resize(optim::kSumSquaresWorkspace * layout.num_units(), "gradient norm workspace");
  compute_.sync();
}

Zero3StoreCuda::~Zero3StoreCuda() {
  // Outstanding collectives and copies use the buffers: let them finish (not while unwinding,
  // where a peer may never arrive; then the communicator is aborted on the way to MPI_Abort).
  if (std::uncaught_exceptions() == 0) {
    try {
      sync_comm();
      compute_.sync();
      if (copy_) copy_->sync();
    } catch (...) {
    }
  }
}

model::UnitProvider<float>& Zero3StoreCuda::provider() {
  RLHF_FAIL("internal error: a device store has no host-side unit provider (use TransformerCuda)");
}

cudaStream_t Zero3StoreCuda::comm_stream() const {
#ifdef RLHF_NCCL
  if (nccl_ != nullptr) return nccl_->stream();
#endif
  return compute_.get();
}

// --- buffer pools ----------------------------------------------------------------------------

template <typename T>
std::unique_ptr<Zero3StoreCuda::Buffer<T>> Zero3StoreCuda::take(Pool<T>& pool, int64_t n,
                                                                cudaStream_t user) {
  std::unique_ptr<Buffer<T>> b;
  auto it = pool.find(n);
  if (it != pool.end() && !it->second.empty()) {
    b = std::move(it->second.back());
    it->second.pop_back();
  } else {
    b = std::make_unique<Buffer<T>>();
    b->data.resize(n, "ZeRO-3 gather / gradient buffer");
    pooled_bytes_ += n * int64_t(sizeof(T));
  }
  // The new user may overwrite the buffer only after its last user is done with it.
  if (b->used) CUDA_CHECK(cudaStreamWaitEvent(user, b->reusable.get(), 0));
  return b;
}

template <typename T>
void Zero3StoreCuda::give_back(Pool<T>& pool, std::unique_ptr<Buffer<T>> b,
                               cudaStream_t last_user) {
  b->reusable.record(last_user);
  b->used = true;
  pool[b->data.size()].push_back(std::move(b));
}

// --- the provider ----------------------------------------------------------------------------

std::unique_ptr<Zero3StoreCuda::Gathered> Zero3StoreCuda::post_gather(int u) {
#ifdef RLHF_NCCL
  auto g = std::make_unique<Gathered>();
  const int64_t S = shard_numel(u);
  g->buffer = take(free_params_, shard_layout_.padded_numel(u), comm_stream());
  requests_.push_back(nccl_->iall_gather(shards_[size_t(u)].params16.get(), g->buffer->data.get(),
                                         S, DType::kBfloat16));
  g->ready.record(comm_stream());
  return g;
#else
  (void)u;
  RLHF_FAIL("internal error: ZeRO-3 gather without NCCL");
#endif
}

const model::bf16* Zero3StoreCuda::acquire_params(int u) {
  RLHF_ASSERT(u >= 0 && u < layout_.num_units());
  if (nshards_ == 1) return shards_[size_t(u)].params16.get();
  // Compute waits for this unit's gather only (not for prefetches posted after it).
  const std::unique_ptr<Gathered>& g = schedule_.acquire(
      u, [&](int v) { return post_gather(v); },
      [&](std::unique_ptr<Gathered>& h) {
        CUDA_CHECK(cudaStreamWaitEvent(stream(), h->ready.get(), 0));
      });
  return g->buffer->data.get();
}

void Zero3StoreCuda::release_params(int u) {
  if (nshards_ == 1) return;
  schedule_.release(u, [&](std::unique_ptr<Gathered>& g) {
    give_back(free_params_, std::move(g->buffer), stream());
  });
}

float* Zero3StoreCuda::acquire_grads(int u) {
  RLHF_CHECK(!opt_.frozen, "internal error: gradients requested from a frozen model");
  if (nshards_ == 1) return shards_[size_t(u)].grads.get();  // the shard is the unit
  RLHF_ASSERT(grads_out_.count(u) == 0);
  auto b = take(free_grads_, shard_layout_.padded_numel(u), stream());
  CUDA_CHECK(cudaMemsetAsync(b->data.get(), 0, size_t(b->data.size()) * sizeof(float), stream()));
  float* p = b->data.get();
  grads_out_[u] = std::move(b);
  return p;
}

void Zero3StoreCuda::release_grads(int u) {
  if (nshards_ == 1) return;
#ifdef RLHF_NCCL
  auto it = grads_out_.find(u);
  RLHF_ASSERT(it != grads_out_.end());
  std::unique_ptr<Buffer<float>> full = std::move(it->second);
  grads_out_.erase(it);
  const int64_t S = shard_numel(u);
  // The reduce-scatter reads what the compute stream wrote into the full buffer.
  compute_to_comm_.order(stream(), comm_stream());
  auto staging = take(free_staging_, S, comm_stream());
  requests_.push_back(nccl_->ireduce_scatter(full->data.get(), staging->data.get(), S,
                                             DType::kFloat32, ReduceOp::kSum));
  optim::accumulate_f32_cuda(shards_[size_t(u)].grads.get(), staging->data.get(), S, comm_stream());
  give_back(free_grads_, std::move(full), comm_stream());
  give_back(free_staging_, std::move(staging), comm_stream());
#endif
}

void Zero3StoreCuda::begin_pass(bool backward) {
  if (nshards_ == 1) return;
  // Gathers read the bf16 shards, which the optimizer (on stream()) may just have updated.
  compute_to_comm_.order(stream(), comm_stream());
  schedule_.begin_pass(backward, [&](int u) { return post_gather(u); });
}

void Zero3StoreCuda::end_pass(bool backward) {
  if (nshards_ == 1) return;
  // A dropped copy nobody computed on (a prefetch past the end): its last user is the gather.
  schedule_.end_pass(backward, [&](std::unique_ptr<Gathered>& g) {
    give_back(free_params_, std::move(g->buffer), comm_stream());
  });
  // Retire finished collectives without blocking.
  while (!requests_.empty() && requests_.front().test()) requests_.pop_front();
}

void Zero3StoreCuda::sync_comm() {
#ifdef RLHF_NCCL
  if (nccl_ != nullptr) {
    nccl_->signal_to(stream());
    for (CommRequest& r : requests_) r.wait();
    requests_.clear();
  }
#endif
}

// --- the optimizer ---------------------------------------------------------------------------

void Zero3StoreCuda::zero_grads() {
  sync_comm();
  if (opt_.frozen) return;
  for (Shard& s : shards_)
    CUDA_CHECK(cudaMemsetAsync(s.grads.get(), 0, size_t(s.grads.size()) * sizeof(float), stream()));
}

double Zero3StoreCuda::grad_sq_norm() {
  sync_comm();
  if (opt_.frozen) return 0.0;
  const int nu = layout_.num_units();
  for (int u = 0; u < nu; ++u)
    optim::sum_squares_cuda(norm_ws_.get() + u * optim::kSumSquaresWorkspace,
                            shards_[size_t(u)].grads.get(), shard_numel(u), stream());
  std::vector<double> ws(size_t(norm_ws_.size()));
  d2h(ws.data(), norm_ws_.get(), ws.size() * sizeof(double), stream());
  compute_.sync();
  double local = 0;
  for (int u = 0; u < nu; ++u) local += ws[size_t(u * optim::kSumSquaresWorkspace)];
  if (nshards_ == 1) return local;
  double global = 0;
#ifdef RLHF_NCCL
  WatchScope watch("all_reduce (gradient norm)", "train_comm");
  MPI_CHECK(MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_SUM, nccl_->mpi_comm()));
#endif
  return global;
}

void Zero3StoreCuda::adamw_step(const optim::AdamWConfig& cfg, double lr, int64_t step,
                                float grad_scale) {
  RLHF_CHECK(!opt_.frozen, "internal error: optimizer step on a frozen model");
  sync_comm();
  const int nu = layout_.num_units();
  if (!opt_.adam_offload) {
    for (int u = 0; u < nu; ++u) {
      Shard& s = shards_[size_t(u)];
      const int64_t S = shard_numel(u);
      const auto segs = adamw_segments(layout_.unit(u), shard_layout_.shard_offset(u, rank_), S);
      optim::adamw_step_segments_cuda(s.master.get(), s.m.get(), s.v.get(), s.grads.get(), S, segs,
                                      cfg, lr, step, grad_scale, stream());
      optim::cast_f32_to_bf16_cuda(s.params16.get(), s.master.get(), S, stream());
    }
    return;
  }
  // Offload: every gradient shard goes down on the copy stream (after the compute that produced
  // it); the host steps unit u as soon as its copy has landed, and its updated bf16 shard goes up
  // on the copy stream while the host steps unit u + 1.
  const cudaStream_t cp = copy_->get();
  compute_to_comm_.order(stream(), cp);
  for (int u = 0; u < nu; ++u) {
    Shard& s = shards_[size_t(u)];
    d2h(s.grads_host.get(), s.grads.get(), size_t(shard_numel(u)) * sizeof(float), cp);
    s.d2h->record(cp);
  }
  for (int u = 0; u < nu; ++u) {
    Shard& s = shards_[size_t(u)];
    const int64_t S = shard_numel(u);
    s.d2h->sync();
    const auto segs = adamw_segments(layout_.unit(u), shard_layout_.shard_offset(u, rank_), S);
    optim::adamw_step_segments_cpu(s.master_host.get(), s.m_host.get(), s.v_host.get(),
                                   s.grads_host.get(), S, segs, cfg, lr, step, grad_scale);
    s.h2d->sync();  // the previous step's upload of this staging buffer is done
    to_bf16_host(s.params16_host.get(), s.master_host.get(), S);
    h2d(s.params16.get(), s.params16_host.get(), size_t(S) * sizeof(model::bf16), cp);
    s.h2d->record(cp);
  }
  // The next forward reads the uploaded shards.
  compute_to_comm_.order(cp, stream());
}

// --- consolidated views (checkpoints, weight sync) -------------------------------------------

const float* Zero3StoreCuda::master_host_view(int u) const {
  const Shard& s = shards_[size_t(u)];
  const int64_t S = shard_numel(u);
  if (opt_.adam_offload && !opt_.frozen) {
    if (copy_) copy_->sync();
    return s.master_host.get();
  }
  s.mirror.resize(size_t(S));
  if (opt_.frozen) {
    std::vector<model::bf16> tmp(static_cast<size_t>(S));
    d2h(tmp.data(), s.params16.get(), tmp.size() * sizeof(model::bf16), compute_.get());
    compute_.sync();
    for (int64_t i = 0; i < S; ++i) s.mirror[size_t(i)] = __bfloat162float(tmp[size_t(i)]);
  } else {
    d2h(s.mirror.data(), s.master.get(), size_t(S) * sizeof(float), compute_.get());
    compute_.sync();
  }
  return s.mirror.data();
}

UnitShard Zero3StoreCuda::unit_shard(int u) const {
  return {master_host_view(u), shard_layout_.shard_offset(u, rank_), shard_numel(u)};
}

void Zero3StoreCuda::gather_host(int u, const float* mine, float* out) {
  const int64_t S = shard_numel(u), n = layout_.unit(u).numel;
  if (nshards_ == 1) {
    std::memcpy(out, mine, size_t(n) * sizeof(float));
    return;
  }
#ifdef RLHF_NCCL
  std::vector<float> full(static_cast<size_t>(shard_layout_.padded_numel(u)));
  WatchScope watch("all_gather (master weights)", "train_comm");
  MPI_CHECK(MPI_Allgather(mine, static_cast<int>(S), MPI_FLOAT, full.data(), static_cast<int>(S),
                          MPI_FLOAT, nccl_->mpi_comm()));
  std::memcpy(out, full.data(), size_t(n) * sizeof(float));
#else
  (void)S;
#endif
}

void Zero3StoreCuda::gather_unit(int u, float* out) {
  sync_comm();
  gather_host(u, master_host_view(u), out);
}

void Zero3StoreCuda::load_unit(int u, const float* full) {
  sync_comm();
  Shard& s = shards_[size_t(u)];
  const int64_t S = shard_numel(u);
  std::vector<float> shard(static_cast<size_t>(S));
  scatter_shard(shard.data(), full, layout_.unit(u).numel, shard_layout_.shard_offset(u, rank_), S);
  const float* mine = shard.data();
  std::vector<model::bf16> b16(static_cast<size_t>(S));
  to_bf16_host(b16.data(), mine, S);
  h2d(s.params16.get(), b16.data(), b16.size() * sizeof(model::bf16), stream());
  if (!opt_.frozen) {
    if (opt_.adam_offload)
      std::memcpy(s.master_host.get(), mine, size_t(S) * sizeof(float));
    else
      h2d(s.master.get(), mine, size_t(S) * sizeof(float), stream());
  }
  compute_.sync();
}

void Zero3StoreCuda::gather_moments(int u, float* m, float* v) {
  RLHF_CHECK(!opt_.frozen, "internal error: moments of a frozen model");
  sync_comm();
  Shard& s = shards_[size_t(u)];
  const int64_t S = shard_numel(u);
  std::vector<float> mh(static_cast<size_t>(S)), vh(static_cast<size_t>(S));
  if (opt_.adam_offload) {
    std::memcpy(mh.data(), s.m_host.get(), size_t(S) * sizeof(float));
    std::memcpy(vh.data(), s.v_host.get(), size_t(S) * sizeof(float));
  } else {
    d2h(mh.data(), s.m.get(), size_t(S) * sizeof(float), stream());
    d2h(vh.data(), s.v.get(), size_t(S) * sizeof(float), stream());
    compute_.sync();
  }
  gather_host(u, mh.data(), m);
  gather_host(u, vh.data(), v);
}

void Zero3StoreCuda::load_moments(int u, const float* m, const float* v) {
  RLHF_CHECK(!opt_.frozen, "internal error: moments of a frozen model");
  sync_comm();
  Shard& s = shards_[size_t(u)];
  const int64_t S = shard_numel(u), off = shard_layout_.shard_offset(u, rank_);
  const int64_t n = layout_.unit(u).numel;
  std::vector<float> ms(static_cast<size_t>(S)), vs(static_cast<size_t>(S));
  scatter_shard(ms.data(), m, n, off, S);
  scatter_shard(vs.data(), v, n, off, S);
  if (opt_.adam_offload) {
    std::memcpy(s.m_host.get(), ms.data(), size_t(S) * sizeof(float));
    std::memcpy(s.v_host.get(), vs.data(), size_t(S) * sizeof(float));
  } else {
    h2d(s.m.get(), ms.data(), size_t(S) * sizeof(float), stream());
    h2d(s.v.get(), vs.data(), size_t(S) * sizeof(float), stream());
    compute_.sync();
  }
}

MemoryReport Zero3StoreCuda::memory() const {
  MemoryReport r;
  const int64_t shard = shard_layout_.total_shard();
  const int64_t f = shard * int64_t(sizeof(float));
  r.params_bytes = shard * int64_t(sizeof(model::bf16)) + (opt_.frozen ? 0 : f);  // + master
  r.grads_bytes = opt_.frozen ? 0 : f;
  r.optimizer_bytes = opt_.frozen ? 0 : 2 * f;
  r.optimizer_on_host = opt_.adam_offload;
  r.gather_bytes = pooled_bytes_;
  return r;
}

}  // namespace rlhf::parallel
#endif  // RLHF_CUDA

#ifdef RLHF_CUDA
#include "rollout/engine_cuda_tp.h"

#include <mpi.h>

#include <algorithm>

#include "core/checked_alloc.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "parallel/mpi_check.h"
#include "parallel/watchdog.h"
#include "rollout/engine.h"

#ifdef RLHF_NCCL
#include <nccl.h>
#endif

namespace rlhf::rollout {

using model::bf16;

TpSlicePlan::TpSlicePlan(const model::UnitLayout& u, const model::LayerSpec& s, int T, int r) {
  auto align = [this] { elems = (elems + 63) / 64 * 64; };
  auto place = [this](int64_t src, int64_t pitch, int64_t width, int64_t rows) {
    pieces.push_back({src, pitch, elems, width, rows});
    const int64_t at = elems;
    elems += width * rows;
    return at;
  };
  const auto slots = layer_linears<float>(s);
  // Weights, then biases; q/k/v back to back in each (no alignment gap between them).
  for (size_t i = 0; i < slots.size(); ++i) {
    const model::ProjInfo& pi = model::kProjections[i];
    const LinearSlot<float>& sl = slots[i];
    const int64_t off = u.at(pi.weight_name).offset;
    w[i] = sl.column_parallel ? place(off + r * sl.out * sl.in, 0, sl.out * sl.in, 1)  // rows
                              : place(off + r * sl.in, sl.in * T, sl.in, sl.out);      // columns
    if (!pi.fused_qkv || pi.id == model::Proj::kV) align();
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    const model::ProjInfo& pi = model::kProjections[i];
    const LinearSlot<float>& sl = slots[i];
    const model::TensorInfo* t = u.find(pi.bias_name);
    b[i] = -1;
    if (t == nullptr) continue;
    if (sl.column_parallel) {
      b[i] = place(t->offset + r * sl.out, 0, sl.out, 1);
    } else {  // added once to the sum: rank 0's; every rank keeps the room (one size for all)
      const int64_t at = place(t->offset, 0, sl.out, 1);
      if (r == 0) b[i] = at;
    }
    if (!pi.fused_qkv || pi.id == model::Proj::kV) align();
  }
  auto whole = [&](const char* name) -> int64_t {
    const model::TensorInfo* t = u.find(name);
    if (t == nullptr) return -1;
    const int64_t at = place(t->offset, 0, t->numel, 1);
    align();
    return at;
  };
  q_norm = whole("self_attn.q_norm.weight");
  k_norm = whole("self_attn.k_norm.weight");
  w_in = whole("input_layernorm.weight");
  w_post = whole("post_attention_layernorm.weight");
  RLHF_CHECK(w_in >= 0 && w_post >= 0, "tensor-parallel GPU engine: unit '{}' has no layer norms",
             u.name);
}

int64_t EngineCudaTp::slice_elems(const model::ParamLayout& layout, int T) {
  const model::LayerSpec s = tp_layer_spec(layout.config(), TpGroup{nullptr, T, 0});
  int64_t n = 0;
  for (int l = 0; l < layout.config().num_hidden_layers; ++l)
    n += TpSlicePlan(layout.unit(layout.layer_unit(l)), s, T, 0).elems;
  return n;
}

EngineCudaTp::EngineCudaTp(const model::ParamLayout& layout, const TpGroup& tp, cudaStream_t s)
    : tp_(tp) {
  RLHF_CHECK(tp.size > 1 && tp.comm != nullptr, "tensor-parallel GPU engine: a group of {} ranks",
             tp.size);
  const model::LayerSpec spec = tp_layer_spec(layout.config(), tp);
  for (int l = 0; l < layout.config().num_hidden_layers; ++l)
    plans_.emplace_back(layout.unit(layout.layer_unit(l)), spec, tp.size, tp.rank);
#ifdef RLHF_NCCL
  ncclUniqueId id{};
  if (tp.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  ncclComm_t comm = nullptr;
  {
    // Both wait for every rank of the group: watched (--comm_timeout), as the steps are.
    parallel::WatchScope watch("the tensor-parallel engine's NCCL set-up",
                               "the engine's tensor-parallel group");
    MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, tp.comm->mpi_comm()));
    NCCL_CHECK(ncclCommInitRank(&comm, tp.size, id, tp.rank));
  }
  nccl_ = comm;
#else
  RLHF_FAIL(
      "--vllm_tensor_parallel_size {} with --device cuda needs NCCL, and this build has none "
      "(libnccl-dev; CMake RLHF_NCCL)",
      tp.size);
#endif
  try {
    allocate(s);
  } catch (...) {
#ifdef RLHF_NCCL
    (void)ncclCommAbort(static_cast<ncclComm_t>(nccl_));
#endif
    throw;
  }
}

EngineCudaTp::~EngineCudaTp() {
#ifdef RLHF_NCCL
  if (nccl_ != nullptr) {
    auto* comm = static_cast<ncclComm_t>(nccl_);
    if (std::uncaught_exceptions() > 0) {
      (void)ncclCommAbort(comm);  // a peer may never get here: do not wait for it
    } else {
      (void)ncclCommFinalize(comm);
      (void)ncclCommDestroy(comm);
    }
  }
#endif
}

int64_t EngineCudaTp::allocate(cudaStream_t s) {
  int64_t bytes = 0;
  slices_.resize(plans_.size());
  for (size_t l = 0; l < plans_.size(); ++l) {
    slices_[l].resize(plans_[l].elems, "tensor-parallel engine weight slices");
    CUDA_CHECK(cudaMemsetAsync(slices_[l].get(), 0, size_t(plans_[l].elems) * sizeof(bf16), s));
    bytes += slices_[l].bytes();
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
  return bytes;
}

int64_t EngineCudaTp::release() {
  const int64_t freed = bytes();
  for (auto& a : slices_) a.reset();
  return freed;
}

int64_t EngineCudaTp::bytes() const {
  int64_t n = 0;
  for (const auto& a : slices_) n += a.bytes();
  return n;
}

void EngineCudaTp::load_from_host(int l, const float* unit, cudaStream_t s) {
  const TpSlicePlan& p = plans_.at(size_t(l));
  checked_resize(staging_, p.elems, "the host staging buffer of the engine's weight slices");
  std::fill(staging_.begin(), staging_.end(), __float2bfloat16_rn(0.0f));
  for (const TpSlicePlan::Piece& c : p.pieces)
    for (int64_t row = 0; row < c.rows; ++row) {
      const float* src = unit + c.src + row * c.pitch;
      bf16* dst = staging_.data() + c.dst + row * c.width;
      for (int64_t j = 0; j < c.width; ++j) dst[j] = __float2bfloat16_rn(src[j]);
    }
  CUDA_CHECK(cudaMemcpyAsync(slices_[size_t(l)].get(), staging_.data(),
                             size_t(p.elems) * sizeof(bf16), cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaStreamSynchronize(s));  // staging_ is reused
}

void EngineCudaTp::load_from_device(int l, const bf16* unit, cudaStream_t s) {
  const TpSlicePlan& p = plans_.at(size_t(l));
  bf16* base = slices_[size_t(l)].get();
  for (const TpSlicePlan::Piece& c : p.pieces) {
    const size_t w = size_t(c.width) * sizeof(bf16);
    CUDA_CHECK(cudaMemcpy2DAsync(base + c.dst, w, unit + c.src,
                                 c.rows > 1 ? size_t(c.pitch) * sizeof(bf16) : w, w, size_t(c.rows),
                                 cudaMemcpyDeviceToDevice, s));
  }
}

model::LayerParams<const bf16> EngineCudaTp::layer(int l) const {
  const TpSlicePlan& p = plans_.at(size_t(l));
  const bf16* base = slices_[size_t(l)].get();
  auto at = [base](int64_t off) { return off >= 0 ? base + off : nullptr; };
  model::LayerParams<const bf16> v;
  for (const model::ProjInfo& pi : model::kProjections) {
    v.weight(pi.id) = at(p.w[size_t(pi.id)]);
    v.bias(pi.id) = at(p.b[size_t(pi.id)]);
  }
  v.q_norm = at(p.q_norm);
  v.k_norm = at(p.k_norm);
  v.w_in = at(p.w_in);
  v.w_post = at(p.w_post);
  return v;
}

void EngineCudaTp::all_reduce(bf16* y, int64_t n, cudaStream_t s) {
#ifdef RLHF_NCCL
  NCCL_CHECK(
      ncclAllReduce(y, y, size_t(n), ncclBfloat16, ncclSum, static_cast<ncclComm_t>(nccl_), s));
#else
  (void)y, (void)n, (void)s;
  RLHF_FAIL("tensor-parallel GPU engine: no NCCL in this build");
#endif
}

}  // namespace rlhf::rollout
#endif  // RLHF_CUDA

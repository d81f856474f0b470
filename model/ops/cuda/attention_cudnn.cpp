// Causal grouped-query attention on cuDNN's fused flash-attention engines ("SDPA"), built with
// NVIDIA's header-only cudnn-frontend (its graph API: graph->sdpa / graph->sdpa_backward; the
// headers are fetched from PyPI at configure time, cmake/cudnn_frontend.cmake). Same contract as
// attention_forward_cuda / attention_backward_cuda (model/ops/attention.h); the flash kernels of
// attention.cu stay the fallback wherever these functions return false.
//
// Layouts: cuDNN's logical dims are (B, heads, S, D); our buffers are row-major (B, T, heads, D),
// so q/out/dq/dout are described with strides {T·H·D, D, H·D, 1} and k/v/dk/dv with
// {T·Hkv·D, D, Hkv·D, 1}. GQA: K/V keep their Hkv heads; cuDNN pairs KV head g with query heads
// g·G .. g·G+G−1 (G = H/Hkv), which is our contract. lse (B, H, T) fp32 is the "Stats" tensor
// (B, H, T, 1) with strides {H·T, T, 1, 1}: cuDNN's softmax statistics are max + log(sum exp) of
// the scaled scores, natural log, i.e. exactly our lse, so either backward follows either forward.
// Causal: top-left diagonal alignment with right bound 0 (key s is seen by query t iff s <= t).
//
// One graph per case: a forward and a backward graph per (device, B, T, H, Hkv, D), validated,
// lowered and planned (heuristics mode A, then FALLBACK) on first use and kept for the life of the
// process; a shape cuDNN cannot serve is remembered as such. The frontend handles what differs
// between cuDNN versions: notably, backward before cuDNN 9.15.1 needs T % 128 == 0, and for other
// T the frontend adds a padding mask with the true length (written into the workspace at every
// run). One cudnnHandle_t per device, bound to the caller's stream before each use; the
// workspace is taken with cudaMallocAsync on that stream and released with cudaFreeAsync after
// the launch. Building and executing hold one mutex (a handle must not be used by two threads at
// once; execution only enqueues work). RLHF_CUDNN_DEBUG=1 prints why a shape is refused (the
// frontend's message); CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr prints the
// frontend's own log, CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr cuDNN's.
#include "model/ops/attention.h"

#include <cudnn_frontend.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "core/cuda_check.h"
#include "model/ops/cuda/attention_cudnn_rules.h"

namespace rlhf::model {
namespace {

namespace fe = cudnn_frontend;
using cudnn_attention::check_problem;

// Tensor uids in the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

enum class Direction { kForward, kBackward };

struct Problem {
  int64_t B, T, H, Hkv, D;
};

bool debug_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("RLHF_CUDNN_DEBUG");
    return e != nullptr && e[0] != '\0' && e[0] != '0';
  }();
  return on;
}

// Our (B, S, heads, D) row-major buffer as cuDNN's (B, heads, S, D).
fe::graph::Tensor_attributes& bshd(fe::graph::Tensor_attributes& t, int64_t uid, int64_t B,
                                   int64_t S, int64_t heads, int64_t D) {
  return t.set_uid(uid).set_dim({B, heads, S, D}).set_stride({S * heads * D, D, heads * D, 1});
}
fe::graph::Tensor_attributes bshd(const char* name, int64_t uid, int64_t B, int64_t S,
                                  int64_t heads, int64_t D) {
  fe::graph::Tensor_attributes t;
  t.set_name(name);
  return bshd(t, uid, B, S, heads, D);
}

// lse (B, H, T) fp32 as the (B, H, T, 1) statistics tensor.
fe::graph::Tensor_attributes& stats(fe::graph::Tensor_attributes& t, const Problem& p) {
  return t.set_uid(kStats)
      .set_dim({p.B, p.H, p.T, 1})
      .set_stride({p.H * p.T, p.T, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// out, Stats = sdpa(Q, K, V), causal, scale 1/sqrt(D).
std::shared_ptr<fe::graph::Graph> forward_graph(const Problem& p) {
  auto g = new_graph();
  auto q = g->tensor(bshd("Q", kQ, p.B, p.T, p.H, p.D));
  auto k = g->tensor(bshd("K", kK, p.B, p.T, p.Hkv, p.D));
  auto v = g->tensor(bshd("V", kV, p.B, p.T, p.Hkv, p.D));
  auto options = fe::graph::SDPA_attributes()
                     .set_name("attention_forward")
                     .set_generate_stats(true)
                     .set_attn_scale(1.0f / std::sqrt(static_cast<float>(p.D)))
                     .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                     .set_diagonal_band_right_bound(0);
  auto [o, lse] = g->sdpa(q, k, v, options);
  bshd(o->set_output(true), kO, p.B, p.T, p.H, p.D);
  stats(lse->set_output(true), p);
  return g;
}

// dQ, dK, dV = sdpa_backward(Q, K, V, O, dO, Stats), same mask and scale.
std::shared_ptr<fe::graph::Graph> backward_graph(const Problem& p) {
  auto g = new_graph();
  auto q = g->tensor(bshd("Q", kQ, p.B, p.T, p.H, p.D));
  auto k = g->tensor(bshd("K", kK, p.B, p.T, p.Hkv, p.D));
  auto v = g->tensor(bshd("V", kV, p.B, p.T, p.Hkv, p.D));
  auto o = g->tensor(bshd("O", kO, p.B, p.T, p.H, p.D));
  auto dout = g->tensor(bshd("dO", kDO, p.B, p.T, p.H, p.D));
  fe::graph::Tensor_attributes lse_attr;
  lse_attr.set_name("Stats");
  auto lse = g->tensor(stats(lse_attr, p));
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_attn_scale(1.0f / std::sqrt(static_cast<float>(p.D)))
                     .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                     .set_diagonal_band_right_bound(0);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, lse, options);
  bshd(dq->set_output(true), kDQ, p.B, p.T, p.H, p.D);
  bshd(dk->set_output(true), kDK, p.B, p.T, p.Hkv, p.D);
  bshd(dv->set_output(true), kDV, p.B, p.T, p.Hkv, p.D);
  return g;
}

// A built graph: its execution plan is chosen, workspace_bytes is what execute needs.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

// Validates, lowers and plans the graph of (p, dir) on `handle`; nullptr (with the frontend's
// reason under RLHF_CUDNN_DEBUG) when cuDNN cannot serve it.
std::shared_ptr<const Plan> build(cudnnHandle_t handle, const Problem& p, Direction dir) {
  auto plan = std::make_shared<Plan>();
  plan->graph = dir == Direction::kForward ? forward_graph(p) : backward_graph(p);
  fe::graph::Graph& g = *plan->graph;
  fe::error_t e = g.validate();
  if (e.is_good()) e = g.build_operation_graph(handle);
  if (e.is_good()) e = g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (e.is_good()) e = g.check_support();
  if (e.is_good()) e = g.build_plans();
  if (e.is_good()) e = g.get_workspace_size(plan->workspace_bytes);
  if (debug_enabled()) {
    std::fprintf(
        stderr, "[rlhf cudnn attention] %s B=%lld T=%lld H=%lld Hkv=%lld D=%lld: %s%s\n",
        dir == Direction::kForward ? "forward" : "backward", static_cast<long long>(p.B),
        static_cast<long long>(p.T), static_cast<long long>(p.H), static_cast<long long>(p.Hkv),
        static_cast<long long>(p.D), e.is_good() ? "planned, workspace " : "refused: ",
        e.is_good() ? std::to_string(plan->workspace_bytes).c_str() : e.get_message().c_str());
  }
  if (!e.is_good()) return nullptr;
  return plan;
}

using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int>;

struct Cache {
  std::mutex mu;
  std::map<int, cudnnHandle_t> handles;                  // by device, bound to a stream per call
  std::map<PlanKey, std::shared_ptr<const Plan>> plans;  // nullptr: cannot be served
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: may be used until the very end of main
  return *c;
}

// The device's one handle (created on first use), bound to `stream` for the call that follows.
// nullptr, with *status set, when cuDNN cannot create or bind it. Call with c.mu held.
cudnnHandle_t handle_for(Cache& c, int dev, cudaStream_t stream, cudnnStatus_t* status) {
  *status = CUDNN_STATUS_SUCCESS;
  cudnnHandle_t h = nullptr;
  const auto it = c.handles.find(dev);
  if (it != c.handles.end()) {
    h = it->second;
  } else {
    *status = cudnnCreate(&h);
    if (*status != CUDNN_STATUS_SUCCESS) return nullptr;
    c.handles[dev] = h;
  }
  *status = cudnnSetStream(h, stream);
  return *status == CUDNN_STATUS_SUCCESS ? h : nullptr;
}

// The cuDNN found at run time and the device can run the fused engines: cuDNN 9 (the major the
// frontend was compiled against), not 9.10.0/9.10.1, compute capability >= 8.0. Never throws.
bool runtime_supported(int dev) {
  if (!cudnn_attention::runtime_version_supported(static_cast<int64_t>(cudnnGetVersion()),
                                                  CUDNN_MAJOR))
    return false;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 8;
}

// The plan of (dev, p, dir), built on first use; nullptr if cuDNN cannot serve it (cached either
// way). Call with c.mu held. Never throws a cuDNN error.
const Plan* plan_for(Cache& c, int dev, cudaStream_t stream, const Problem& p, Direction dir) {
  const PlanKey key{dev, p.B, p.T, p.H, p.Hkv, p.D, static_cast<int>(dir)};
  const auto it = c.plans.find(key);
  if (it != c.plans.end()) return it->second.get();
  std::shared_ptr<const Plan> plan;
  if (runtime_supported(dev) && cudnn_attention::problem_offered(p.B, p.T, p.H, p.Hkv, p.D)) {
    cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
    if (cudnnHandle_t handle = handle_for(c, dev, stream, &status)) {
      plan = build(handle, p, dir);
    } else if (debug_enabled()) {
      std::fprintf(stderr, "[rlhf cudnn attention] cudnnCreate/cudnnSetStream failed: %s\n",
                   cudnnGetErrorString(status));
    }
  }
  c.plans[key] = plan;
  return plan.get();
}

// Frees a stream-ordered allocation if the launch path throws before the planned free.
struct AsyncFree {
  void* p = nullptr;
  cudaStream_t stream = nullptr;
  ~AsyncFree() {
    if (p != nullptr) (void)cudaFreeAsync(p, stream);
  }
};

// Runs `plan` on `stream` (the handle is already bound to it) with the caller's tensors.
void execute(const Plan& plan, cudnnHandle_t handle, cudaStream_t stream, const char* op,
             std::unordered_map<int64_t, void*> pack) {
  AsyncFree ws{nullptr, stream};
  if (plan.workspace_bytes > 0)
    CUDA_CHECK(cudaMallocAsync(&ws.p, static_cast<size_t>(plan.workspace_bytes), stream));
  fe::error_t e = plan.graph->execute(handle, pack, ws.p);
  RLHF_CHECK(e.is_good(), "{}: cuDNN failed to run its plan: {}", op, e.get_message());
  if (ws.p != nullptr) CUDA_CHECK(cudaFreeAsync(std::exchange(ws.p, nullptr), stream));
}

bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Finds (building on first use) the plan of (p, dir) for the current device and binds the
// device's handle to `stream`; nullptr when cuDNN cannot serve the problem. Call with c.mu held.
const Plan* prepare(Cache& c, const Problem& p, Direction dir, cudaStream_t stream,
                    cudnnHandle_t* handle) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const Plan* plan = plan_for(c, dev, stream, p, dir);
  if (plan == nullptr) return nullptr;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  *handle = handle_for(c, dev, stream, &status);
  if (*handle == nullptr) CUDNN_CHECK(status);  // worked when the plan was built: a real failure
  return plan;
}

}  // namespace

bool attention_cudnn_available(int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D) noexcept {
  try {
    if (!cudnn_attention::problem_offered(B, T_, H, Hkv, D) || cuda_device_count() == 0)
      return false;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    const Problem p{B, T_, H, Hkv, D};
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    return plan_for(c, dev, nullptr, p, Direction::kForward) != nullptr &&
           plan_for(c, dev, nullptr, p, Direction::kBackward) != nullptr;
  } catch (...) {
    return false;
  }
}

int64_t attention_cudnn_runtime_version() noexcept {
  try {
    if (cuda_device_count() == 0) return 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return runtime_supported(dev) ? static_cast<int64_t>(cudnnGetVersion()) : 0;
  } catch (...) {
    return 0;
  }
}

bool attention_forward_cudnn(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                             int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                             cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_problem("attention_forward_cudnn", B, T_, H, Hkv, D);
  if (!cudnn_attention::problem_offered(B, T_, H, Hkv, D) || !aligned16({out, lse, q, k, v}))
    return false;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  cudnnHandle_t handle = nullptr;
  const Plan* plan = prepare(c, {B, T_, H, Hkv, D}, Direction::kForward, stream, &handle);
  if (plan == nullptr) return false;
  execute(*plan, handle, stream, "attention_forward_cudnn",
          {{kQ, const_cast<bf16*>(q)},
           {kK, const_cast<bf16*>(k)},
           {kV, const_cast<bf16*>(v)},
           {kO, out},
           {kStats, lse}});
  return true;
}

bool attention_backward_cudnn(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                              const float* lse, const bf16* q, const bf16* k, const bf16* v,
                              int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                              cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_problem("attention_backward_cudnn", B, T_, H, Hkv, D);
  if (!cudnn_attention::problem_offered(B, T_, H, Hkv, D) ||
      !aligned16({dq, dk, dv, dout, out, lse, q, k, v}))
    return false;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  cudnnHandle_t handle = nullptr;
  const Plan* plan = prepare(c, {B, T_, H, Hkv, D}, Direction::kBackward, stream, &handle);
  if (plan == nullptr) return false;
  execute(*plan, handle, stream, "attention_backward_cudnn",
          {{kQ, const_cast<bf16*>(q)},
           {kK, const_cast<bf16*>(k)},
           {kV, const_cast<bf16*>(v)},
           {kO, const_cast<bf16*>(out)},
           {kDO, const_cast<bf16*>(dout)},
           {kStats, const_cast<float*>(lse)},
           {kDQ, dq},
           {kDK, dk},
           {kDV, dv}});
  return true;
}

}  // namespace rlhf::model

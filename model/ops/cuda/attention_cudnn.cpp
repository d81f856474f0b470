// Causal grouped-query attention through cuDNN's fused flash-attention engines ("SDPA"), written
// directly against the cuDNN backend graph API (cudnn_graph.h: cudnnBackendCreateDescriptor /
// SetAttribute / Finalize, engine heuristics, execution plans, variant packs, cudnnBackendExecute).
// Same contract as attention_forward_cuda / attention_backward_cuda (model/ops/attention.h); the
// hand-written kernels in attention.cu stay the fallback whenever these functions return false.
//
// cuDNN's logical dims are (B, heads, S, D); our buffers are row-major (B, T, heads, D), so every
// I/O tensor is described with strides: q/out/dq/dout {T·H·D, D, H·D, 1}, k/v/dk/dv
// {T·Hkv·D, D, Hkv·D, 1}; Kᵀ (and Vᵀ in backward) swap the last two dims and strides:
// (B, Hkv, D, T) with strides {T·Hkv·D, D, 1, Hkv·D}. lse (B, H, T) fp32 is the "Stats" tensor
// (B, H, T, 1) with strides {H·T, T, 1, 1}. GQA: K/V keep their own head count Hkv; the engine
// is expected to pair KV head g with query heads g·G .. g·G+G−1 (G = H/Hkv, the frontend's
// "b (hk g)" grouping), which is our contract; the test checks it.
//
// --- Forward graph (cuDNN 8.9/9.0 developer guide, "Graph API" > "Specialized Runtime Fusion
// Engines" > "Fused Flash Attention fprop"; the graph cudnn-frontend's SDPA node lowers to):
//   S  = matmul(Q, Kᵀ)                       fp32 (B, H, T, T), virtual
//   S1 = pointwise MUL(S, scale)              scale = 1/sqrt(D), fp32 scalar passed by value
//   causal mask: r = GEN_INDEX(S1, axis 2), c = GEN_INDEX(S1, axis 3) (int32),
//                keep = CMP_GE(r, c) (boolean), S2 = BINARY_SELECT(S1, lowest, keep)
//                (keep ? S1 : lowest float, a by-value scalar)
//   softmax with stats: m = reduce MAX(S2) (B, H, T, 1); E = exp(S2 − m); l = reduce ADD(E);
//                Stats = m + log(l)  -> lse, non-virtual fp32 (B, H, T, 1)
//                P = E / l, virtual bf16 (the second matmul's A operand is the I/O type)
//   O  = matmul(P, V)                         bf16 (B, H, T, D) -> out
// EXP and LOG are the natural exp/log (cudnnPointwiseMode_t), so Stats = log Σ_{s≤t} exp(S1[t,s])
// is exactly our lse (natural log, of the scaled scores): no base or scale conversion is needed.
//
// --- Backward graph ("Fused Flash Attention bprop"; cudnn-frontend's SDPA backward node):
//   Δ      = reduce ADD(dO ⊙ O) · one        (B, H, T, 1) fp32 ("softmax_sum"; one = 1.0f by value)
//   S1     = matmul(Q, Kᵀ) · scale, causal mask as in forward (variant 1: after the next step)
//   P      = exp(S1 − Stats)                 recomputed from lse, fp32 virtual
//   dV     = matmul(reshape(P) -> Pᵀ bf16, dO)            (B, H, T, D)
//   dP     = matmul(dO, Vᵀ)                              (B, H, T, T) fp32
//   dS     = (dP − Δ) ⊙ P · scale                        (variant 0 also multiplies dP by one)
//   dK     = matmul(reshape(dS) -> dSᵀ bf16, Q)           (B, H, T, D)
//   dQacc  = matmul(dS, reshape(Kᵀ) -> K)                 fp32, non-virtual, in our workspace
//   dQ     = IDENTITY(dQacc)                              bf16
// With Hkv < H the two (B, H, T, D) products are virtual bf16 tensors followed by a reduce ADD
// over the heads of each group into dK, dV (B, Hkv, T, D); with Hkv == H the matmuls write dK, dV.
// dQacc is zeroed (cudaMemsetAsync) before every run: cuDNN < 9.6 requires it, later versions
// do not, and the memset is cheap.
//
// Two spellings of the backward graph are tried in order, because cuDNN matches the graph
// against fixed patterns and which spelling a given version accepts could not be checked here:
//   variant 0: as an earlier cudnn-frontend 1.x emits it for cuDNN 9 (GEN_INDEX math int32,
//              mask before the Stats subtraction, dP·one, Δ virtual, dQacc reordered F16x16);
//   variant 1: as emitted by current cudnn-frontend (GEN_INDEX math fp32, mask after the Stats
//              subtraction, no dP·one, Δ a non-virtual fp32 (B, H, T, 1) workspace tensor,
//              dQacc plain row-major).
// The forward graph is the same in both, except for the GEN_INDEX math precision.
//
// Sources: the cuDNN 9 backend API reference ("cuDNN Graph Library": backend descriptor types and
// attributes), the developer guide sections named above, and the public cudnn-frontend sources
// (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h, softmax.h,
// attn_score_modifiers.h), read to learn the graph shapes; no frontend code is used or copied.
//
// Plans: one graph + execution plan per (device, B, T, H, Hkv, D, direction), built on first use
// (engine heuristics mode A, then FALLBACK; the first engine config whose plan finalizes wins)
// and kept for the life of the process; a shape cuDNN cannot serve is remembered as such. One
// cudnnHandle_t per (device, stream), bound with cudnnSetStream. The workspace (plan workspace,
// plus dQacc and Δ in backward) is taken with cudaMallocAsync on the stream and released with
// cudaFreeAsync after the launch (stream-ordered). Plan building and execution hold one mutex (a
// cuDNN handle must not be used by two threads at once; execution only enqueues work).
// RLHF_CUDNN_DEBUG=1 prints why a plan could not be built (with cudnnGetLastErrorString) to
// stderr; cuDNN's own log (CUDNN_LOGLEVEL_DBG=2, CUDNN_LOGDEST_DBG=stderr) says more.
//
// NOT VERIFIED: the machine this was written on has no GPU. The code compiles and links against
// the real cuDNN 9 headers and library (and against the CUDA emulator's stubs, where every cuDNN
// call reports CUDNN_STATUS_NOT_SUPPORTED), but it has never been executed on a GPU: neither that
// cuDNN accepts these graphs, nor the numerics, nor the GQA head mapping, nor the stats base.
// tests/ops/test_attention_cudnn_cuda.cpp checks all of that against the CPU reference and the
// hand-written kernels the first time it runs on a GPU.
#include "model/ops/attention.h"

#if defined(RLHF_CUDA) && defined(RLHF_CUDNN)

#include <cudnn.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/cuda_check.h"

namespace rlhf::model {
namespace {

// --- descriptors ------------------------------------------------------------------------------

// Owns one cudnnBackendDescriptor_t (destroyed with the object, also on every failure path).
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptor_t d) : d_(d) {}
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    if (this != &o) {
      reset();
      d_ = std::exchange(o.d_, nullptr);
    }
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() { reset(); }

  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  void reset() {
    if (d_ != nullptr) (void)cudnnBackendDestroyDescriptor(d_);
    d_ = nullptr;
  }
  cudnnBackendDescriptor_t d_ = nullptr;
};

// Tensor unique ids in the variant pack; virtual tensors get ids from kFirstVirtual up.
enum Uid : int64_t {
  kQ = 1,
  kK = 2,  // Kᵀ view of k
  kV = 3,  // V view of v (forward), Vᵀ view (backward)
  kO = 4,
  kStats = 5,
  kScale = 6,
  kNegInf = 7,
  kDO = 8,
  kDQ = 9,
  kDK = 10,
  kDV = 11,
  kOne = 12,
  kDQAccum = 13,
  kSoftmaxSum = 14,
  kFirstVirtual = 100,
};

using Dims = std::array<int64_t, 4>;

struct Layout {
  Dims dims;
  Dims strides;
};

// Row-major packed (a, b, c, d).
Layout packed(int64_t a, int64_t b, int64_t c, int64_t d) {
  return {{a, b, c, d}, {b * c * d, c * d, d, 1}};
}
// Our (B, S, heads, D) buffer seen as cuDNN's (B, heads, S, D).
Layout bshd(int64_t B, int64_t S, int64_t heads, int64_t D) {
  return {{B, heads, S, D}, {S * heads * D, D, heads * D, 1}};
}
// The same buffer seen transposed, (B, heads, D, S) (Kᵀ, Vᵀ).
Layout bshd_transposed(int64_t B, int64_t S, int64_t heads, int64_t D) {
  return {{B, heads, D, S}, {S * heads * D, D, 1, heads * D}};
}

bool debug_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("RLHF_CUDNN_DEBUG");
    return e != nullptr && e[0] != '\0' && e[0] != '0';
  }();
  return on;
}

// Builds descriptors while no call has failed: the first non-success status is recorded (with
// the step that failed) and every later call is skipped, so a graph that cuDNN cannot represent
// ends as ok() == false with every descriptor made so far owned by `keep` (none leak).
class GraphBuilder {
 public:
  explicit GraphBuilder(std::vector<Desc>* keep) : keep_(keep) {}

  bool ok() const { return status_ == CUDNN_STATUS_SUCCESS; }
  cudnnStatus_t status() const { return status_; }
  const std::string& failed_step() const { return failed_step_; }
  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }

  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type, const char* step) {
    if (!ok()) return nullptr;
    cudnnBackendDescriptor_t d = nullptr;
    if (!check(cudnnBackendCreateDescriptor(type, &d), step)) return nullptr;
    keep_->emplace_back(d);
    return d;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t count, const void* values, const char* step) {
    if (ok()) check(cudnnBackendSetAttribute(d, name, type, count, values), step);
  }
  void finalize(cudnnBackendDescriptor_t d, const char* step) {
    if (ok()) check(cudnnBackendFinalize(d), step);
  }

  // A tensor descriptor (16-byte alignment, as the fused engines require).
  cudnnBackendDescriptor_t tensor(
      int64_t uid, cudnnDataType_t type, const Layout& l, bool is_virtual, bool by_value = false,
      cudnnBackendTensorReordering_t reorder = CUDNN_TENSOR_REORDERING_NONE) {
    cudnnBackendDescriptor_t t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor: create");
    const int64_t alignment = 16;
    const bool virt = is_virtual, byval = by_value;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor: data type");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, l.dims.data(), "tensor: dims");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, l.strides.data(), "tensor: strides");
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor: uid");
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor: alignment");
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor: is_virtual");
    if (by_value) {
      set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval, "tensor: by_value");
    }
    if (reorder != CUDNN_TENSOR_REORDERING_NONE) {
      set(t, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &reorder,
          "tensor: reordering");
    }
    finalize(t, "tensor: finalize");
    return t;
  }
  // A virtual (never materialised) tensor with the next free uid.
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, const Layout& l) {
    return tensor(next_virtual_++, type, l, /*is_virtual=*/true);
  }
  // An fp32 scalar passed by value (its variant-pack pointer is a host float).
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, packed(1, 1, 1, 1), /*is_virtual=*/false,
                  /*by_value=*/true);
  }

  // y = mode(x [, b] [, t]); axis >= 0 only for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise: create");
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise: mode");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math, "pointwise: math");
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pw: axis");
    finalize(pw, "pointwise: finalize");
    cudnnBackendDescriptor_t op =
        create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op: create");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw,
        "pointwise op: descriptor");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
        "pointwise op: x");
    if (b != nullptr) {
      set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b,
          "pointwise op: b");
    }
    if (t != nullptr) {
      set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t,
          "pointwise op: t");
    }
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
        "pointwise op: y");
    finalize(op, "pointwise op: finalize");
    add_op(op);
  }
  void unary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    pointwise(mode, CUDNN_DATA_FLOAT, x, nullptr, nullptr, y);
  }
  void binary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
              cudnnBackendDescriptor_t y) {
    pointwise(mode, CUDNN_DATA_FLOAT, x, b, nullptr, y);
  }

  // y = reduce(x) over the dimensions where y has extent 1 (or a smaller head count: the
  // grouped-head reduction of the SDPA backward pattern).
  void reduction(cudnnReduceTensorOp_t op_type, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t r = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction: create");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op_type,
        "reduction: operator");
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction: comp");
    finalize(r, "reduction: finalize");
    cudnnBackendDescriptor_t op =
        create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op: create");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
        "reduction op: x");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
        "reduction op: y");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r,
        "reduction op: descriptor");
    finalize(op, "reduction op: finalize");
    add_op(op);
  }

  // c = a · b, batched over the first two dims (b may have fewer heads: GQA broadcast).
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul: create");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul: comp");
    finalize(mm, "matmul: finalize");
    cudnnBackendDescriptor_t op =
        create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op: create");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a,
        "matmul op: a");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b,
        "matmul op: b");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c,
        "matmul op: c");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm,
        "matmul op: descriptor");
    finalize(op, "matmul op: finalize");
    add_op(op);
  }

  // y = x with another layout (a transpose when the strides say so).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op =
        create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape op: create");
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
        "reshape op: x");
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
        "reshape op: y");
    finalize(op, "reshape op: finalize");
    add_op(op);
  }

  // The finalized operation graph of every op added so far.
  cudnnBackendDescriptor_t operation_graph(cudnnHandle_t handle) {
    cudnnBackendDescriptor_t g = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph: create");
    set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph: handle");
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(ops_.size()), ops_.data(), "graph: ops");
    finalize(g, "graph: finalize");
    return g;
  }

  // Records a failure from outside the builder (heuristics, plans).
  bool check(cudnnStatus_t s, const char* step) {
    if (s != CUDNN_STATUS_SUCCESS && ok()) {
      status_ = s;
      failed_step_ = step;
    }
    return s == CUDNN_STATUS_SUCCESS;
  }

 private:
  void add_op(cudnnBackendDescriptor_t op) {
    if (ok()) ops_.push_back(op);
  }

  std::vector<Desc>* keep_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
  cudnnStatus_t status_ = CUDNN_STATUS_SUCCESS;
  std::string failed_step_;
};

// --- the graphs -------------------------------------------------------------------------------

enum class Direction { kForward, kBackward };

struct Problem {
  int64_t B, T, H, Hkv, D;
};

// The causal mask of the SDPA pattern: keep[t, s] = (row index t >= column index s), masked
// scores become the lowest float (by-value scalar kNegInf). `index_math`: GEN_INDEX math
// precision (int32 in variant 0, fp32 in variant 1, as the two frontend generations emit it).
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, cudnnBackendDescriptor_t s,
                                     cudnnBackendDescriptor_t neg_inf, const Layout& score,
                                     cudnnDataType_t index_math) {
  cudnnBackendDescriptor_t row = g.virt(CUDNN_DATA_INT32, score);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, index_math, s, nullptr, nullptr, row, /*axis=*/2);
  cudnnBackendDescriptor_t col = g.virt(CUDNN_DATA_INT32, score);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, index_math, s, nullptr, nullptr, col, /*axis=*/3);
  cudnnBackendDescriptor_t keep = g.virt(CUDNN_DATA_BOOLEAN, score);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
  cudnnBackendDescriptor_t masked = g.virt(CUDNN_DATA_FLOAT, score);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep, masked);
  return masked;
}

// Forward: see the file comment. Non-virtual tensors: kQ, kK (Kᵀ), kV, kO, kStats, kScale,
// kNegInf.
void build_forward_graph(GraphBuilder& g, const Problem& p, int variant) {
  const int64_t B = p.B, T = p.T, H = p.H, Hkv = p.Hkv, D = p.D;
  const Layout score = packed(B, H, T, T), row_stat = packed(B, H, T, 1);
  cudnnBackendDescriptor_t q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, bshd(B, T, H, D), false);
  cudnnBackendDescriptor_t kt =
      g.tensor(kK, CUDNN_DATA_BFLOAT16, bshd_transposed(B, T, Hkv, D), false);
  cudnnBackendDescriptor_t v = g.tensor(kV, CUDNN_DATA_BFLOAT16, bshd(B, T, Hkv, D), false);
  cudnnBackendDescriptor_t o = g.tensor(kO, CUDNN_DATA_BFLOAT16, bshd(B, T, H, D), false);
  cudnnBackendDescriptor_t stats = g.tensor(kStats, CUDNN_DATA_FLOAT, row_stat, false);
  cudnnBackendDescriptor_t scale = g.scalar(kScale);
  cudnnBackendDescriptor_t neg_inf = g.scalar(kNegInf);

  cudnnBackendDescriptor_t s = g.virt(CUDNN_DATA_FLOAT, score);
  g.matmul(q, kt, s);
  cudnnBackendDescriptor_t s1 = g.virt(CUDNN_DATA_FLOAT, score);
  g.binary(CUDNN_POINTWISE_MUL, s, scale, s1);
  cudnnBackendDescriptor_t s2 =
      causal_mask(g, s1, neg_inf, score, variant == 0 ? CUDNN_DATA_INT32 : CUDNN_DATA_FLOAT);

  // Softmax with statistics: Stats = max + log Σ exp(x − max), P = exp(x − max) / Σ.
  cudnnBackendDescriptor_t m = g.virt(CUDNN_DATA_FLOAT, row_stat);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s2, m);
  cudnnBackendDescriptor_t centered = g.virt(CUDNN_DATA_FLOAT, score);
  g.binary(CUDNN_POINTWISE_SUB, s2, m, centered);
  cudnnBackendDescriptor_t e = g.virt(CUDNN_DATA_FLOAT, score);
  g.unary(CUDNN_POINTWISE_EXP, centered, e);
  cudnnBackendDescriptor_t l = g.virt(CUDNN_DATA_FLOAT, row_stat);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, l);
  cudnnBackendDescriptor_t log_l = g.virt(CUDNN_DATA_FLOAT, row_stat);
  g.unary(CUDNN_POINTWISE_LOG, l, log_l);
  g.binary(CUDNN_POINTWISE_ADD, m, log_l, stats);
  cudnnBackendDescriptor_t prob = g.virt(CUDNN_DATA_BFLOAT16, score);  // A of bmm2: I/O type
  g.binary(CUDNN_POINTWISE_DIV, e, l, prob);

  g.matmul(prob, v, o);
}

// Backward: see the file comment. Non-virtual tensors: kQ, kK (Kᵀ), kV (Vᵀ), kO, kStats, kDO,
// kDQ, kDK, kDV, kScale, kNegInf, kOne, kDQAccum and (variant 1) kSoftmaxSum.
void build_backward_graph(GraphBuilder& g, const Problem& p, int variant) {
  const int64_t B = p.B, T = p.T, H = p.H, Hkv = p.Hkv, D = p.D;
  const Layout score = packed(B, H, T, T), row_stat = packed(B, H, T, 1);
  // Pᵀ and dSᵀ: the (B, H, T, T) score buffer read transposed.
  const Layout score_t = {{B, H, T, T}, {H * T * T, T * T, 1, T}};
  cudnnBackendDescriptor_t q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, bshd(B, T, H, D), false);
  cudnnBackendDescriptor_t kt =
      g.tensor(kK, CUDNN_DATA_BFLOAT16, bshd_transposed(B, T, Hkv, D), false);
  cudnnBackendDescriptor_t vt =
      g.tensor(kV, CUDNN_DATA_BFLOAT16, bshd_transposed(B, T, Hkv, D), false);
  cudnnBackendDescriptor_t o = g.tensor(kO, CUDNN_DATA_BFLOAT16, bshd(B, T, H, D), false);
  cudnnBackendDescriptor_t stats = g.tensor(kStats, CUDNN_DATA_FLOAT, row_stat, false);
  cudnnBackendDescriptor_t dout = g.tensor(kDO, CUDNN_DATA_BFLOAT16, bshd(B, T, H, D), false);
  cudnnBackendDescriptor_t dq = g.tensor(kDQ, CUDNN_DATA_BFLOAT16, bshd(B, T, H, D), false);
  cudnnBackendDescriptor_t dk = g.tensor(kDK, CUDNN_DATA_BFLOAT16, bshd(B, T, Hkv, D), false);
  cudnnBackendDescriptor_t dv = g.tensor(kDV, CUDNN_DATA_BFLOAT16, bshd(B, T, Hkv, D), false);
  cudnnBackendDescriptor_t scale = g.scalar(kScale);
  cudnnBackendDescriptor_t neg_inf = g.scalar(kNegInf);
  cudnnBackendDescriptor_t one = g.scalar(kOne);
  cudnnBackendDescriptor_t dq_accum =
      g.tensor(kDQAccum, CUDNN_DATA_FLOAT, packed(B, H, T, D), false, false,
               variant == 0 ? CUDNN_TENSOR_REORDERING_F16x16 : CUDNN_TENSOR_REORDERING_NONE);
  const cudnnDataType_t index_math = variant == 0 ? CUDNN_DATA_INT32 : CUDNN_DATA_FLOAT;

  // Δ = rowsum(dO ⊙ O) · 1 ("softmax_sum"). The product's layout is the one the frontend gives
  // it (it is virtual: never stored).
  const Layout prod = {{B, H, T, D}, {H * T * D, T * D, H * D, 1}};
  cudnnBackendDescriptor_t do_o = g.virt(CUDNN_DATA_FLOAT, prod);
  g.binary(CUDNN_POINTWISE_MUL, dout, o, do_o);
  cudnnBackendDescriptor_t rowsum = g.virt(CUDNN_DATA_FLOAT, row_stat);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, rowsum);
  cudnnBackendDescriptor_t delta = variant == 0
                                       ? g.virt(CUDNN_DATA_FLOAT, row_stat)
                                       : g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, row_stat, false);
  g.binary(CUDNN_POINTWISE_MUL, rowsum, one, delta);

  // P = exp(mask(S · scale) − Stats), recomputed from lse.
  cudnnBackendDescriptor_t s = g.virt(CUDNN_DATA_FLOAT, score);
  g.matmul(q, kt, s);
  cudnnBackendDescriptor_t s1 = g.virt(CUDNN_DATA_FLOAT, score);
  g.binary(CUDNN_POINTWISE_MUL, s, scale, s1);
  cudnnBackendDescriptor_t logits = nullptr;
  if (variant == 0) {
    cudnnBackendDescriptor_t masked = causal_mask(g, s1, neg_inf, score, index_math);
    logits = g.virt(CUDNN_DATA_FLOAT, score);
    g.binary(CUDNN_POINTWISE_SUB, masked, stats, logits);
  } else {
    cudnnBackendDescriptor_t centered = g.virt(CUDNN_DATA_FLOAT, score);
    g.binary(CUDNN_POINTWISE_SUB, s1, stats, centered);
    logits = causal_mask(g, centered, neg_inf, score, index_math);
  }
  cudnnBackendDescriptor_t prob = g.virt(CUDNN_DATA_FLOAT, score);
  g.unary(CUDNN_POINTWISE_EXP, logits, prob);

  // dV = Pᵀ · dO (per query head, then summed over each group of G heads when Hkv < H).
  const Layout full_head = packed(B, H, T, D);
  cudnnBackendDescriptor_t prob_t = g.virt(CUDNN_DATA_BFLOAT16, score_t);
  g.reshape(prob, prob_t);
  if (H == Hkv) {
    g.matmul(prob_t, dout, dv);
  } else {
    cudnnBackendDescriptor_t dv_full = g.virt(CUDNN_DATA_BFLOAT16, full_head);
    g.matmul(prob_t, dout, dv_full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);
  }

  // dS = (dO · Vᵀ − Δ) ⊙ P · scale.
  cudnnBackendDescriptor_t dp = g.virt(CUDNN_DATA_FLOAT, score);
  g.matmul(dout, vt, dp);
  if (variant == 0) {
    cudnnBackendDescriptor_t dp1 = g.virt(CUDNN_DATA_FLOAT, score);
    g.binary(CUDNN_POINTWISE_MUL, dp, one, dp1);
    dp = dp1;
  }
  cudnnBackendDescriptor_t dp_centered = g.virt(CUDNN_DATA_FLOAT, score);
  g.binary(CUDNN_POINTWISE_SUB, dp, delta, dp_centered);
  cudnnBackendDescriptor_t ds_unscaled = g.virt(CUDNN_DATA_FLOAT, score);
  g.binary(CUDNN_POINTWISE_MUL, dp_centered, prob, ds_unscaled);
  cudnnBackendDescriptor_t ds = g.virt(CUDNN_DATA_FLOAT, score);
  g.binary(CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);

  // dK = dSᵀ · Q (grouped like dV).
  cudnnBackendDescriptor_t ds_t = g.virt(CUDNN_DATA_BFLOAT16, score_t);
  g.reshape(ds, ds_t);
  if (H == Hkv) {
    g.matmul(ds_t, q, dk);
  } else {
    cudnnBackendDescriptor_t dk_full = g.virt(CUDNN_DATA_BFLOAT16, full_head);
    g.matmul(ds_t, q, dk_full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);
  }

  // dQ = dS · K, accumulated in fp32, then converted.
  cudnnBackendDescriptor_t k_view = g.virt(CUDNN_DATA_BFLOAT16, bshd(B, T, Hkv, D));
  g.reshape(kt, k_view);
  g.matmul(ds, k_view, dq_accum);
  g.unary(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
}

// --- plans ------------------------------------------------------------------------------------

int64_t round_up(int64_t n, int64_t m) {
  return (n + m - 1) / m * m;
}

// A finalized execution plan and everything it was built from (kept alive with it).
struct Plan {
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    while (!descs.empty()) descs.pop_back();  // newest first: users before what they reference
  }

  std::vector<Desc> descs;  // in creation order
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace_bytes = 0;    // cuDNN's own workspace
  int64_t dq_accum_bytes = 0;     // backward: fp32 (B, H, T, D), zeroed before each run
  int64_t softmax_sum_bytes = 0;  // backward variant 1: fp32 (B, H, T)
  int variant = 0;
};

constexpr int kVariants = 2;

void debug_print(const Problem& p, Direction dir, int variant, const GraphBuilder& g) {
  if (!debug_enabled()) return;
  char msg[1024] = {0};
  cudnnGetLastErrorString(msg, sizeof(msg));
  std::fprintf(stderr,
               "[rlhf cudnn attention] %s B=%lld T=%lld H=%lld Hkv=%lld D=%lld variant %d: %s "
               "failed with %s (%d): %s\n",
               dir == Direction::kForward ? "forward" : "backward", static_cast<long long>(p.B),
               static_cast<long long>(p.T), static_cast<long long>(p.H),
               static_cast<long long>(p.Hkv), static_cast<long long>(p.D), variant,
               g.failed_step().c_str(), cudnnGetErrorString(g.status()),
               static_cast<int>(g.status()), msg);
}

// Builds graph variant `variant` and the first execution plan that finalizes for it; nullptr
// when cuDNN rejects the graph or no engine config can be finalized. Never throws a cuDNN error.
std::unique_ptr<Plan> try_build(cudnnHandle_t handle, const Problem& p, Direction dir,
                                int variant) {
  auto plan = std::make_unique<Plan>();
  plan->variant = variant;
  GraphBuilder g(&plan->descs);
  if (dir == Direction::kForward) {
    build_forward_graph(g, p, variant);
  } else {
    build_backward_graph(g, p, variant);
    // (B, H, T, D) fp32; allocated as if T were rounded up to a multiple of 128, a margin in
    // case an engine's reordered (F16x16) accumulator writes whole tiles (the frontend
    // allocates the exact size).
    plan->dq_accum_bytes =
        p.B * p.H * round_up(p.T, 128) * p.D * static_cast<int64_t>(sizeof(float));
    if (variant == 1) {
      plan->softmax_sum_bytes = p.B * p.H * p.T * static_cast<int64_t>(sizeof(float));
    }
  }
  cudnnBackendDescriptor_t graph = g.operation_graph(handle);
  if (!g.ok()) {
    debug_print(p, dir, variant, g);
    return nullptr;
  }

  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    // Each mode gets a fresh failure record: a failure here only means "try the next one".
    GraphBuilder h(&plan->descs);
    cudnnBackendDescriptor_t heur = h.create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heur: create");
    h.set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph,
          "heur: graph");
    h.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heur: mode");
    h.finalize(heur, "heur: finalize");
    int64_t count = 0;
    if (h.ok()) {
      h.check(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
              "heur: result count");
    }
    if (!h.ok() || count <= 0) {
      if (!h.ok()) debug_print(p, dir, variant, h);
      continue;
    }
    // Engine configs to be filled in by the heuristics (owned here; the chosen one moves to the
    // plan).
    std::vector<Desc> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count && h.ok(); ++i) {
      cudnnBackendDescriptor_t d = nullptr;
      if (h.check(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &d),
                  "engine config: create")) {
        cfgs.emplace_back(d);
        raw.push_back(d);
      }
    }
    int64_t got = 0;
    if (h.ok()) {
      h.check(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
              "heur: results");
    }
    if (!h.ok()) {
      debug_print(p, dir, variant, h);
      continue;
    }
    for (int64_t i = 0; i < got && i < count; ++i) {
      std::vector<Desc> attempt;
      GraphBuilder e(&attempt);
      cudnnBackendDescriptor_t ep =
          e.create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "plan: create");
      e.set(ep, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan: handle");
      e.set(ep, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw[i],
            "plan: engine config");
      e.finalize(ep, "plan: finalize");
      int64_t n = 0, ws = 0;
      if (e.ok()) {
        e.check(cudnnBackendGetAttribute(ep, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, &n, &ws),
                "plan: workspace size");
      }
      if (!e.ok() || ws < 0) {
        debug_print(p, dir, variant, e);
        continue;
      }
      plan->plan = ep;
      plan->workspace_bytes = ws;
      for (Desc& d : cfgs) plan->descs.push_back(std::move(d));  // raw[i] among them
      for (Desc& d : attempt) plan->descs.push_back(std::move(d));
      if (debug_enabled()) {
        std::fprintf(stderr,
                     "[rlhf cudnn attention] %s B=%lld T=%lld H=%lld Hkv=%lld D=%lld: graph "
                     "variant %d, engine config %lld of %lld, workspace %lld bytes\n",
                     dir == Direction::kForward ? "forward" : "backward",
                     static_cast<long long>(p.B), static_cast<long long>(p.T),
                     static_cast<long long>(p.H), static_cast<long long>(p.Hkv),
                     static_cast<long long>(p.D), variant, static_cast<long long>(i),
                     static_cast<long long>(got), static_cast<long long>(ws));
      }
      return plan;
    }
  }
  return nullptr;
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

// The device's one handle (created on first use), bound to `stream` for the call that follows:
// plans are built and executed on the handle of the device they were built on, and no handle is
// kept per stream. nullptr (and *status set) when cuDNN cannot create or bind it. Call with c.mu
// held.
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

// cuDNN's version and the device are new enough for the fused flash-attention engines: cuDNN 9
// (the attribute enums of this file are cuDNN 9's), compute capability >= 8.0. Never throws.
bool runtime_supported(int dev) {
  const size_t version = cudnnGetVersion();
  if (version < 90000 || version / 10000 != CUDNN_MAJOR) return false;
  // cudnn-frontend refuses bf16/fp16 fused attention on 9.10.0 and 9.10.1 (known bugs).
  if (version == 91000 || version == 91001) return false;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 8;
}

// The head dims the fused engines take (cudnn-frontend's SDPA checks: D % 8 == 0, D <= 128).
bool head_dim_supported(int64_t D) {
  return D > 0 && D % 8 == 0 && D <= 128;
}

// Shapes the graphs of this file must not be used for, as cudnn-frontend's support checks say:
// a single position (s_q = s_kv = 1: never in backward, and not with a causal mask in forward
// before 9.10); and, in backward before 9.15.1, a sequence length that is not a multiple of 128
// (the frontend adds a padding mask there to avoid NaN gradients; these graphs have none).
bool shape_supported(const Problem& p, Direction dir) {
  if (p.T == 1) return false;
  if (dir == Direction::kBackward && cudnnGetVersion() <= 91500 && p.T % 128 != 0) return false;
  return true;
}

// The plan of (dev, problem, dir), built on first use; nullptr if cuDNN cannot serve it (the
// answer is cached either way). Call with c.mu held. Never throws a cuDNN error.
const Plan* plan_for(Cache& c, int dev, cudaStream_t stream, const Problem& p, Direction dir) {
  const PlanKey key{dev, p.B, p.T, p.H, p.Hkv, p.D, static_cast<int>(dir)};
  const auto it = c.plans.find(key);
  if (it != c.plans.end()) return it->second.get();
  std::shared_ptr<const Plan> plan;
  if (runtime_supported(dev) && head_dim_supported(p.D) && shape_supported(p, dir)) {
    cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
    cudnnHandle_t handle = handle_for(c, dev, stream, &status);
    for (int variant = 0; handle != nullptr && plan == nullptr && variant < kVariants; ++variant)
      plan = try_build(handle, p, dir, variant);
    if (handle == nullptr && debug_enabled()) {
      std::fprintf(stderr, "[rlhf cudnn attention] cudnnCreate/cudnnSetStream failed: %s\n",
                   cudnnGetErrorString(status));
    }
  }
  c.plans[key] = plan;
  return plan.get();
}

// --- execution --------------------------------------------------------------------------------

// Frees a stream-ordered allocation if the launch path throws before the planned free.
struct AsyncFree {
  void* p = nullptr;
  cudaStream_t stream = nullptr;
  ~AsyncFree() {
    if (p != nullptr) (void)cudaFreeAsync(p, stream);
  }
};

// Runs `plan` on `stream` with the caller's tensors (uid, pointer); by-value scalars point to
// host floats. Takes the workspace stream-ordered and frees it after the launch.
void execute(const Plan& plan, cudnnHandle_t handle, cudaStream_t stream,
             std::vector<std::pair<int64_t, void*>> tensors) {
  const int64_t ws_bytes = round_up(plan.workspace_bytes, 256);
  const int64_t dq_bytes = round_up(plan.dq_accum_bytes, 256);
  const int64_t total = ws_bytes + dq_bytes + plan.softmax_sum_bytes;
  AsyncFree ws{nullptr, stream};
  if (total > 0) CUDA_CHECK(cudaMallocAsync(&ws.p, static_cast<size_t>(total), stream));
  char* base = static_cast<char*>(ws.p);
  if (plan.dq_accum_bytes > 0) {
    CUDA_CHECK(
        cudaMemsetAsync(base + ws_bytes, 0, static_cast<size_t>(plan.dq_accum_bytes), stream));
    tensors.emplace_back(kDQAccum, base + ws_bytes);
  }
  if (plan.softmax_sum_bytes > 0) tensors.emplace_back(kSoftmaxSum, base + ws_bytes + dq_bytes);

  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (const auto& [uid, ptr] : tensors) {
    uids.push_back(uid);
    ptrs.push_back(ptr);
  }
  void* workspace = ws.p;
  cudnnBackendDescriptor_t raw = nullptr;
  CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &raw));
  const Desc pack(raw);
  CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                       CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
                                       uids.data()));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                       CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()),
                                       ptrs.data()));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                       CUDNN_TYPE_VOID_PTR, 1, &workspace));
  CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
  CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan, pack.get()));
  if (ws.p != nullptr) {
    void* p = std::exchange(ws.p, nullptr);
    CUDA_CHECK(cudaFreeAsync(p, stream));
  }
}

void check_problem(const char* op, int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D) {
  RLHF_CHECK(B > 0 && T_ > 0 && H > 0 && Hkv > 0 && D > 0,
             "{}: all dimensions must be > 0, got B={} T={} H={} Hkv={} D={}", op, B, T_, H, Hkv,
             D);
  RLHF_CHECK(H % Hkv == 0,
             "{}: num_attention_heads H={} is not a multiple of num_key_value_heads Hkv={}", op, H,
             Hkv);
  RLHF_CHECK(B * T_ * H * D < (int64_t{1} << 62), "{}: sizes too large (B={} T={} H={} D={})", op,
             B, T_, H, D);
}

bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// The device's handle bound to `stream` for executing; a failure here is a runtime failure
// (throws).
cudnnHandle_t exec_handle(Cache& c, int dev, cudaStream_t stream) {
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  cudnnHandle_t h = handle_for(c, dev, stream, &status);
  if (h == nullptr) CUDNN_CHECK(status);
  return h;
}

}  // namespace

// --- public -----------------------------------------------------------------------------------

bool attention_cudnn_available(int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D) noexcept {
  try {
    if (B <= 0 || T_ <= 0 || H <= 0 || Hkv <= 0 || H % Hkv != 0) return false;
    if (!head_dim_supported(D) || cuda_device_count() == 0) return false;
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

bool attention_forward_cudnn(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                             int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                             cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_problem("attention_forward_cudnn", B, T_, H, Hkv, D);
  if (!head_dim_supported(D) || !aligned16({out, lse, q, k, v})) return false;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const Problem p{B, T_, H, Hkv, D};
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  const Plan* plan = plan_for(c, dev, stream, p, Direction::kForward);
  if (plan == nullptr) return false;
  cudnnHandle_t handle = exec_handle(c, dev, stream);
  float scale = 1.0f / std::sqrt(static_cast<float>(D));
  float neg_inf = std::numeric_limits<float>::lowest();
  execute(*plan, handle, stream,
          {{kQ, const_cast<bf16*>(q)},
           {kK, const_cast<bf16*>(k)},
           {kV, const_cast<bf16*>(v)},
           {kO, out},
           {kStats, lse},
           {kScale, &scale},
           {kNegInf, &neg_inf}});
  return true;
}

bool attention_backward_cudnn(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                              const float* lse, const bf16* q, const bf16* k, const bf16* v,
                              int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                              cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_problem("attention_backward_cudnn", B, T_, H, Hkv, D);
  if (!head_dim_supported(D) || !aligned16({dq, dk, dv, dout, out, lse, q, k, v})) return false;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const Problem p{B, T_, H, Hkv, D};
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  const Plan* plan = plan_for(c, dev, stream, p, Direction::kBackward);
  if (plan == nullptr) return false;
  cudnnHandle_t handle = exec_handle(c, dev, stream);
  float scale = 1.0f / std::sqrt(static_cast<float>(D));
  float neg_inf = std::numeric_limits<float>::lowest();
  float one = 1.0f;
  execute(*plan, handle, stream,
          {{kQ, const_cast<bf16*>(q)},
           {kK, const_cast<bf16*>(k)},
           {kV, const_cast<bf16*>(v)},
           {kO, const_cast<bf16*>(out)},
           {kStats, const_cast<float*>(lse)},
           {kDO, const_cast<bf16*>(dout)},
           {kDQ, dq},
           {kDK, dk},
           {kDV, dv},
           {kScale, &scale},
           {kNegInf, &neg_inf},
           {kOne, &one}});
  return true;
}

}  // namespace rlhf::model

#elif defined(RLHF_CUDA)

// Built without cuDNN: nothing can be served, callers use the hand-written kernels.
namespace rlhf::model {

bool attention_cudnn_available(int64_t, int64_t, int64_t, int64_t, int64_t) noexcept {
  return false;
}

bool attention_forward_cudnn(bf16*, float*, const bf16*, const bf16*, const bf16*, int64_t, int64_t,
                             int64_t, int64_t, int64_t, cudaStream_t) {
  return false;
}

bool attention_backward_cudnn(bf16*, bf16*, bf16*, const bf16*, const bf16*, const float*,
                              const bf16*, const bf16*, const bf16*, int64_t, int64_t, int64_t,
                              int64_t, int64_t, cudaStream_t) {
  return false;
}

}  // namespace rlhf::model

#endif

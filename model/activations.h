// The activations of a decoder layer as one table: every buffer the layer's forward writes (and
// backward reads), with its elements per row (token) derived from the LayerSpec, whether it is a
// value (T on the CPU, bf16 on the GPU) or a statistic (T on the CPU, fp32 on the GPU), and when
// it exists (QK-norm, backward, a saved attention state). The same table carves the buffers
// (carve) and sizes them (act_elems, act_bytes) for training and inference on both backends, and
// a second one does the same for backward's activation-gradient scratch. A new activation (an
// MLP kind's router logits, a LoRA adapter's low-rank intermediate) is one row here.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "model/arch.h"

namespace rlhf::model {

/// Activations of one layer's forward over N rows, caller-owned (row-major, shapes with the
/// spec's C, H, Hkv, D, F). V: the value type (T on the CPU, bf16 on the GPU); S: statistics (T on
/// the CPU, fp32 on the GPU). Training keeps them for backward; inference reuses one set per
/// layer. The shapes are those of layer_act_table.
template <typename V, typename S = V>
struct LayerActs {
  V* ln1 = nullptr;    ///< (N, C) input RMSNorm output
  S* rstd1 = nullptr;  ///< (N)
  /// (N, H·D), (N, Hkv·D), (N, Hkv·D): what attention reads (after QK-norm and RoPE).
  V *q = nullptr, *k = nullptr, *v = nullptr;
  /// QK-norm with backward: the projections before the norm, (N, H·D) and (N, Hkv·D). nullptr
  /// (inference): the norm runs in place on q and k.
  V *q_raw = nullptr, *k_raw = nullptr;
  S *q_rstd = nullptr, *k_rstd = nullptr;  ///< QK-norm: (N·H), (N·Hkv) statistics
  /// What the attention saves for its backward (training only; ActOptions::att_per_row per row):
  /// the CPU's (B, H, T, T) probabilities, the GPU's (B, H, T) log-sum-exp.
  S* att = nullptr;
  V* atty = nullptr;                               ///< (N, H·D) attention output
  V* x_mid = nullptr;                              ///< (N, C) residual stream after attention
  V* ln2 = nullptr;                                ///< (N, C) post-attention RMSNorm output
  S* rstd2 = nullptr;                              ///< (N)
  V *gate = nullptr, *up = nullptr, *h = nullptr;  ///< (N, F) the dense MLP's
};

/// Activation-gradient scratch of one layer's backward over N rows (shapes as LayerActs; the
/// value type of the backend: T, or bf16 on the GPU).
template <typename V>
struct LayerGradScratch {
  V* dln = nullptr;                                   ///< (N, C)
  V* datty = nullptr;                                 ///< (N, H·D)
  V *dq = nullptr, *dk = nullptr, *dv = nullptr;      ///< (N, H·D), (N, Hkv·D), (N, Hkv·D)
  V *dq_raw = nullptr, *dk_raw = nullptr;             ///< QK-norm: gradients before the norm
  V *dh = nullptr, *dgate = nullptr, *dup = nullptr;  ///< (N, F) the dense MLP's
};

/// A buffer of LayerActs (or LayerGradScratch).
enum class Act : int {
  kLn1,
  kRstd1,
  kQ,
  kK,
  kV,
  kAtty,
  kXMid,
  kLn2,
  kRstd2,
  kAtt,
  kGate,
  kUp,
  kH,
  kQRaw,
  kKRaw,
  kQRstd,
  kKRstd,
  // LayerGradScratch
  kDln,
  kDatty,
  kDq,
  kDk,
  kDv,
  kDqRaw,
  kDkRaw,
  kDh,
  kDgate,
  kDup,
};

/// One row of an activation table.
struct ActInfo {
  Act id;
  const char* name;
  int64_t per_row = 0;  ///< elements per row (token)
  bool stat = false;    ///< a statistic (S), else a value (V)
  /// Inference with shared norms: this buffer is `same_as`'s (takes no room). Else itself.
  Act same_as;
};

/// What the forward keeps, which decides the table.
struct ActOptions {
  /// Training (backward follows, or may): QK-norm keeps its inputs (q_raw, k_raw). Inference
  /// runs the norm in place.
  bool backward = true;
  /// Elements per row the attention saves for backward (the CPU's probabilities: H·T; the
  /// GPU's log-sum-exp: H); 0 for none.
  int64_t att_per_row = 0;
  /// ln2/rstd2 share ln1/rstd1's buffers (inference: both norms' outputs are dead before the next
  /// is written).
  bool share_norms = false;
};

/// The layer's activations for spec s under o, in carving order: values in the order the GPU
/// lays them out (ln1, q, k, v, atty, x_mid, ln2, the MLP's, q_raw, k_raw), statistics likewise
/// (rstd1, rstd2, att, q_rstd, k_rstd).
std::vector<ActInfo> layer_act_table(const LayerSpec& s, const ActOptions& o);

/// The layer's backward activation-gradient scratch for spec s (all values).
std::vector<ActInfo> layer_grad_table(const LayerSpec& s);

/// Elements of N rows of a table's buffers, each rounded up to a multiple of align elements.
struct ActElems {
  int64_t values = 0, stats = 0;
};
ActElems act_elems(const std::vector<ActInfo>& table, int64_t N, int64_t align = 1);

/// Bytes of N rows of a table: values of value_bytes each, statistics of stat_bytes.
inline int64_t act_bytes(const std::vector<ActInfo>& table, int64_t N, int64_t value_bytes,
                         int64_t stat_bytes, int64_t align = 1) {
  const ActElems e = act_elems(table, N, align);
  return e.values * value_bytes + e.stats * stat_bytes;
}

/// The field of `a` that holds buffer id: value_slot for values, stat_slot for statistics;
/// nullptr when the struct has no such field of that kind.
template <typename V, typename S>
V** value_slot(LayerActs<V, S>& a, Act id) {
  switch (id) {
    case Act::kLn1:
      return &a.ln1;
    case Act::kQ:
      return &a.q;
    case Act::kK:
      return &a.k;
    case Act::kV:
      return &a.v;
    case Act::kAtty:
      return &a.atty;
    case Act::kXMid:
      return &a.x_mid;
    case Act::kLn2:
      return &a.ln2;
    case Act::kGate:
      return &a.gate;
    case Act::kUp:
      return &a.up;
    case Act::kH:
      return &a.h;
    case Act::kQRaw:
      return &a.q_raw;
    case Act::kKRaw:
      return &a.k_raw;
    default:
      return nullptr;
  }
}
template <typename V, typename S>
S** stat_slot(LayerActs<V, S>& a, Act id) {
  switch (id) {
    case Act::kRstd1:
      return &a.rstd1;
    case Act::kRstd2:
      return &a.rstd2;
    case Act::kAtt:
      return &a.att;
    case Act::kQRstd:
      return &a.q_rstd;
    case Act::kKRstd:
      return &a.k_rstd;
    default:
      return nullptr;
  }
}
template <typename V>
V** value_slot(LayerGradScratch<V>& d, Act id) {
  switch (id) {
    case Act::kDln:
      return &d.dln;
    case Act::kDatty:
      return &d.datty;
    case Act::kDq:
      return &d.dq;
    case Act::kDk:
      return &d.dk;
    case Act::kDv:
      return &d.dv;
    case Act::kDqRaw:
      return &d.dq_raw;
    case Act::kDkRaw:
      return &d.dk_raw;
    case Act::kDh:
      return &d.dh;
    case Act::kDgate:
      return &d.dgate;
    case Act::kDup:
      return &d.dup;
    default:
      return nullptr;
  }
}
template <typename V>
V** stat_slot(LayerGradScratch<V>&, Act) {
  return nullptr;
}

/// Points every buffer of `table` (for N rows) into `values` and `stats`, in table order, each
/// rounded up to a multiple of align elements; what the table lacks is nullptr. The regions must
/// hold act_elems(table, N, align).values and .stats elements. stats = nullptr (V == S only): one
/// region of act_elems(...).values + .stats elements, values and statistics in table order.
/// Acts: LayerActs or LayerGradScratch. Throws rlhf::Error when a row names a buffer Acts lacks.
template <typename Acts, typename V, typename S>
void carve(Acts& a, const std::vector<ActInfo>& table, int64_t N, V* values, S* stats,
           int64_t align = 1) {
  a = Acts{};
  const bool one_region = stats == nullptr;
  for (const ActInfo& r : table) {
    const int64_t n = (N * r.per_row + align - 1) / align * align;
    if (r.stat) {
      auto slot = stat_slot(a, r.id);
      RLHF_CHECK(slot != nullptr, "activation table: '{}' is not a statistic here", r.name);
      if (r.same_as != r.id) {
        *slot = *stat_slot(a, r.same_as);
      } else if (one_region) {
        if constexpr (std::is_same_v<V, S>) {
          *slot = values;
          values += n;
        } else {
          RLHF_FAIL("activation table: one region needs one element type");
        }
      } else {
        *slot = stats;
        stats += n;
      }
    } else {
      auto slot = value_slot(a, r.id);
      RLHF_CHECK(slot != nullptr, "activation table: '{}' is not a value here", r.name);
      if (r.same_as != r.id) {
        *slot = *value_slot(a, r.same_as);
      } else {
        *slot = values;
        values += n;
      }
    }
  }
}

}  // namespace rlhf::model

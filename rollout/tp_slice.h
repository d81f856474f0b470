// One rank's slice of a decoder layer's projection under tensor parallelism (Megatron style:
// model/projections.h's TpSplit), as the CPU engine (rollout/engine_cpu.cpp) computes it: the one
// statement of which rows or columns a rank keeps, applied alike to the base weight, its bias and
// its LoRA adapter. A column-parallel projection (q/k/v, gate/up) keeps its output rows: those of
// W, of the bias and of LoRA's B, with all of A; a row-parallel one (o_proj, down_proj) keeps its
// input columns: those of W and of LoRA's A, with all of B, and its bias on rank 0 only (added
// once to the group's sum). So W_slice + (α/r)·B_slice·A_slice is the slice of the merged weight
// W + (α/r)·B·A (bit for bit through model::lora_merge_cpu), and the unmerged adapter branch on a
// slice gives this rank's output rows, or its partial sum, of the full branch.
#pragma once

#include <cstdint>
#include <vector>

#include "model/lora.h"
#include "model/projections.h"

namespace rlhf::rollout {

/// One rank's slice of a projection: copies of what the rank slices, and the views its layer
/// routine reads (the copies, or the full tensors where the rank reads them whole).
struct TpProjSlice {
  std::vector<float> w, b, lora_a, lora_b;  ///< the copies (capacity reused by the next slice)
  const float* weight = nullptr;            ///< (out, in), this rank's dims
  const float* bias = nullptr;  ///< (out), or nullptr: none, or a row-parallel bias off rank 0
  /// The adapter on this rank's dims: A (r, in), B (out, r); A nullptr: no adapter.
  model::LoraProjView<float> lora;
};

/// Rank `rank` of a group of T's slice of projection p (its dims this rank's: tp_layer_spec) from
/// the full tensors: w (out·T, in) for a kColumn projection, (out, in·T) for a kRow one; b its
/// full bias or nullptr; lora the full adapter (A (r, in_full), B (out_full, r); A nullptr: none).
/// Fills `out`, reusing its buffers. Throws rlhf::Error when p has no split (TpSplit::kNone).
void tp_slice_projection(const model::Projection& p, int T, int rank, const float* w,
                         const float* b, const model::LoraProjView<float>& lora, TpProjSlice& out);

/// Floats tp_slice_projection copies for projection p (this rank's dims): the weight, a
/// column-parallel bias (has_bias), and with an adapter of rank lora_rank (0: none) B's rows
/// (kColumn) or A's columns (kRow).
int64_t tp_slice_copied_floats(const model::Projection& p, bool has_bias, int64_t lora_rank);

}  // namespace rlhf::rollout

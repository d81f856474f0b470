#include "rollout/tp_slice.h"

#include <algorithm>

#include "core/checked_alloc.h"
#include "core/error.h"

namespace rlhf::rollout {

namespace {

// Rows [r0, r0 + n) of a row-major (rows, cols) matrix into dst (n, cols).
const float* copy_rows(std::vector<float>& dst, const float* m, int64_t cols, int64_t r0,
                       int64_t n) {
  checked_resize(dst, n * cols, "a tensor-parallel weight slice");
  std::copy(m + r0 * cols, m + (r0 + n) * cols, dst.begin());
  return dst.data();
}

// Columns [c0, c0 + n) of a row-major (rows, cols) matrix into dst (rows, n).
const float* copy_cols(std::vector<float>& dst, const float* m, int64_t rows, int64_t cols,
                       int64_t c0, int64_t n) {
  checked_resize(dst, rows * n, "a tensor-parallel weight slice");
  for (int64_t r = 0; r < rows; ++r)
    std::copy(m + r * cols + c0, m + r * cols + c0 + n, dst.begin() + r * n);
  return dst.data();
}

}  // namespace

void tp_slice_projection(const model::Projection& p, int T, int rank, const float* w,
                         const float* b, const model::LoraProjView<float>& lora, TpProjSlice& out) {
  RLHF_CHECK(p.split() != model::TpSplit::kNone, "tensor-parallel engine: {} has no split",
             p.info->name);
  const bool adapter = lora.A != nullptr;
  out.lora = model::LoraProjView<float>{};
  if (adapter) out.lora.r = lora.r;
  if (p.split() == model::TpSplit::kColumn) {  // this rank's output rows: of W, b and B
    out.weight = copy_rows(out.w, w, p.in, rank * p.out, p.out);
    out.bias = b != nullptr ? copy_rows(out.b, b, 1, rank * p.out, p.out) : nullptr;
    if (adapter) {
      out.lora.A = lora.A;
      out.lora.B = copy_rows(out.lora_b, lora.B, lora.r, rank * p.out, p.out);
    }
  } else {  // kRow: this rank's input columns: of W and A; the bias added once to the sum
    out.weight = copy_cols(out.w, w, p.out, p.in * T, rank * p.in, p.in);
    out.bias = rank == 0 ? b : nullptr;
    if (adapter) {
      out.lora.A = copy_cols(out.lora_a, lora.A, lora.r, p.in * T, rank * p.in, p.in);
      out.lora.B = lora.B;
    }
  }
}

int64_t tp_slice_copied_floats(const model::Projection& p, bool has_bias, int64_t lora_rank) {
  const bool column = p.split() == model::TpSplit::kColumn;
  return p.in * p.out + (column && has_bias ? p.out : 0) + lora_rank * (column ? p.out : p.in);
}

}  // namespace rlhf::rollout

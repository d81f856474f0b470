// Gradient-norm clipping on flat buffers, as torch.nn.utils.clip_grad_norm_ defines it, with a
// deterministic sum of squares (the same bits for any thread count).
#pragma once

#include <cstdint>

namespace rlhf::optim {

/// Elements per block of sum_of_squares: the blocking is fixed, so the result depends only on
/// the data, never on the thread count.
inline constexpr int64_t kSumSquaresBlockElems = 4096;

/// Σ x[i]² over x: (n) fp32, accumulated in double. Deterministic: x is cut into fixed blocks of
/// kSumSquaresBlockElems; inside a block, 8 double lanes take the elements i ≡ lane (mod 8) in
/// order and are added lane 0..7; the block sums are added in block order. Threads (OpenMP,
/// static) split the blocks only. Non-finite inputs propagate (NaN/Inf result).
/// Throws rlhf::Error if n < 0.
double sum_of_squares(const float* x, int64_t n);

/// torch.nn.utils.clip_grad_norm_'s coefficient for gradients of L2 norm `total_norm` (e.g.
/// sqrt of the all-reduced sum_of_squares): min(1, max_norm / (total_norm + 1e-6)); 1 when
/// max_norm <= 0 (clipping disabled, OpenRLHF's `--max_norm 0`). Multiply the gradients (or pass it
/// as AdamW's grad_scale). A NaN total_norm gives NaN (as torch), so a non-finite norm surfaces.
double clip_coefficient(double total_norm, double max_norm);

}  // namespace rlhf::optim

// Token-budget micro-batches (--use_dynamic_batch; OpenRLHF's name): how one rank's samples of an
// optimizer step or of a forward-only pass are cut into micro-batches by tokens instead of by a
// sample count (docs/algorithms.md, "Batch arithmetic").
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace rlhf::rl {

/// Cuts n items of lengths len (tokens, in their fixed order) into consecutive runs: a run takes
/// the next item while (items in the run) × (the longest of them) — the padded tokens B·T the
/// model computes for that micro-batch — stays ≤ budget (packed: while the sum of their lengths,
/// the tokens of the packed row, stays ≤ budget); an item longer than the budget is a run of its
/// own. Then, while there are fewer than min_runs runs (capped at n), the first of the runs
/// with the most items is split in two (the first half takes the extra item), so that ranks with
/// fewer runs can match the rank with the most (every rank must run as many forward/backward
/// passes, which are collective). Returns the [begin, end) of each run; none for n = 0. Throws
/// rlhf::Error for budget < 1.
std::vector<std::pair<int64_t, int64_t>> token_budget_runs(const std::vector<int64_t>& len,
                                                           int64_t budget, int64_t min_runs = 1,
                                                           bool packed = false);

/// Runs of fixed size: [0, per), [per, 2·per), … (the last may be shorter); per ≥ 1.
std::vector<std::pair<int64_t, int64_t>> count_runs(int64_t n, int64_t per);

}  // namespace rlhf::rl

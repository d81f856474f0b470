// Usage checks that need the world (its size and nodes) but no model: the placement of the ranks
// (--ranks_per_node, --gen_ranks_per_node, --vllm_tensor_parallel_size), the flag combinations
// that depend on it (--async_train with colocation) and the tensor-parallel size against the
// model's heads (its config only, no weights). Run by app/main once after parse_args, on every
// rank, before any model or dataset loads, so a refusal exits 2 (a usage error) within a second
// instead of 1 after the models load.
#pragma once

#include <mpi.h>

#include "app/cli.h"

namespace rlhf::app {

/// Collective over `world` (every rank calls it with the same args). Plans the placement with
/// parallel::plan_world_placement — the function the run's Topology plans with, on the same input,
/// so this check and the runtime cannot disagree — and checks the flags that depend on it; with
/// --vllm_tensor_parallel_size > 1 it reads the generating model's config (no weights) and applies
/// rollout::tp_split_problem, the engine's own rule.
/// Throws UsageError (the same message on every rank) naming the flag and what would work.
void check_usage(const CommandArgs& args, MPI_Comm world);

}  // namespace rlhf::app

#include "app/usage_checks.h"

#include <type_traits>

#include "core/error.h"
#include "parallel/topology.h"

namespace rlhf::app {

namespace {

// The placement options a command's run will use (as app/runtime.cpp's runtime_options builds
// them), and whether the command generates.
struct PlacementUse {
  parallel::TopologyOptions topo;
  bool plans = false;      // the command builds a Topology
  bool generates = false;  // it has generation ranks (else --gen_ranks_per_node must be 0)
  bool async_train = false;
};

parallel::TopologyOptions topology_options(const ParallelArgs& p, int tensor_parallel) {
  parallel::TopologyOptions t;
  t.ranks_per_node = p.ranks_per_node;
  t.gen_ranks_per_node = p.gen_ranks_per_node;
  t.tensor_parallel = tensor_parallel;
  return t;
}

PlacementUse placement_use(const CommandArgs& args) {
  return std::visit(
      [](const auto& a) -> PlacementUse {
        using A = std::decay_t<decltype(a)>;
        PlacementUse u;
        if constexpr (std::is_same_v<A, SftArgs> || std::is_same_v<A, RmArgs>) {
          u = {topology_options(a.parallel, 1), true, false, false};
        } else if constexpr (std::is_base_of_v<PpoArgs, A>) {
          u = {topology_options(a.parallel, a.gen.vllm_tensor_parallel_size), true, true,
               a.async_train};
        } else if constexpr (std::is_same_v<A, GenerateArgs> || std::is_same_v<A, EvalArgs>) {
          u = {topology_options(a.parallel, a.gen.vllm_tensor_parallel_size), true, true, false};
        } else if constexpr (std::is_same_v<A, ScoreArgs>) {
          u = {topology_options(a.parallel, 1), true, true, false};
        }
        return u;
      },
      args);
}

}  // namespace

void check_usage(const CommandArgs& args, MPI_Comm world) {
  const PlacementUse u = placement_use(args);
  if (!u.plans) return;
  if (!u.generates && u.topo.gen_ranks_per_node != 0)
    throw UsageError(fmt::format(
        "--gen_ranks_per_node {}: this command only trains, so generation ranks would idle\nhint: "
        "use --gen_ranks_per_node 0",
        u.topo.gen_ranks_per_node));
  parallel::Placement plan;
  try {
    plan = parallel::plan_world_placement(world, u.topo);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());  // a placement that cannot work is a usage error (exit 2)
  }
  if (u.async_train && plan.colocated())
    throw UsageError(
        "--async_train needs generation ranks apart from the training ranks: colocated, every "
        "rank both generates and trains, so there is nothing to overlap\nhint: add "
        "--gen_ranks_per_node 1 (or more)");
}

}  // namespace rlhf::app

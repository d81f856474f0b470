#include "app/usage_checks.h"

#include <optional>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "io/model_config_file.h"
#include "io/model_source.h"
#include "parallel/runtime.h"
#include "parallel/topology.h"
#include "rollout/engine_backend.h"

namespace rlhf::app {

namespace {

// The placement options a command's run will use (as app/runtime.cpp's runtime_options builds
// them) and the model its engines generate with.
struct PlacementUse {
  parallel::TopologyOptions topo;
  bool plans = false;  // the command builds a Topology
  bool async_train = false;
  std::string model_config, pretrain,
      tokenizer;  // the generating model (--model_config/--pretrain)
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
        if constexpr (std::is_same_v<A, SftArgs> || std::is_same_v<A, RmArgs> ||
                      std::is_same_v<A, ScoreArgs>) {
          u = {topology_options(a.parallel, 1), true, false, "", "", ""};
        } else if constexpr (std::is_base_of_v<PpoArgs, A>) {
          u = {topology_options(a.parallel, a.gen.vllm_tensor_parallel_size),
               true,
               a.async_train,
               a.model.model_config,
               a.model.pretrain,
               a.model.tokenizer};
        } else if constexpr (std::is_same_v<A, GenerateArgs> || std::is_same_v<A, EvalArgs>) {
          u = {topology_options(a.parallel, a.gen.vllm_tensor_parallel_size),
               true,
               false,
               "",
               a.pretrain,
               a.tokenizer};
        }
        return u;
      },
      args);
}

// The generating model's config, read without its weights (a config file, or a pretrained
// model's header); nullopt when it cannot be read — the run itself then reports why, naming the
// flag, when it loads the model.
std::optional<model::ModelConfig> peek_model_config(const PlacementUse& u) {
  try {
    if (!u.model_config.empty()) return io::load_model_config_file(u.model_config);
    if (!u.pretrain.empty())
      return io::resolve_model_source("", u.pretrain, u.tokenizer, model::HeadKind::kLM).config;
  } catch (const Error&) {
  }
  return std::nullopt;
}

}  // namespace

void check_usage(const CommandArgs& args, MPI_Comm world) {
  const PlacementUse u = placement_use(args);
  if (!u.plans) return;
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
  if (u.topo.tensor_parallel > 1) {
    // Every rank reads the same files, so every rank reaches the same verdict.
    if (const auto c = peek_model_config(u)) {
      const std::string problem = rollout::tp_split_problem(*c, u.topo.tensor_parallel);
      if (!problem.empty()) throw UsageError(problem);
    }
  }
}

}  // namespace rlhf::app

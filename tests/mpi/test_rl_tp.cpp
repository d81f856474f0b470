// `rlhf ppo` / `rlhf grpo` with tensor-parallel engines (--vllm_tensor_parallel_size 2): every rank
// of an engine generates, only its rank 0 contributes the samples, and weight sync fills every
// engine rank — so a run with TP 2 engines ends with the same trainer weights, bit for bit, as the
// same run with TP 1 engines (colocated on the test's simulated nodes of 2 ranks, and with 4 ranks
// also disaggregated: 2 training ranks and one engine of 2 on a node of 4). The runs call the
// command's entry point (app::run_command) in-process on every rank; the policy changes during
// the run (checked against its initial weights), so equality is not vacuous. The same with LoRA
// (--lora_rank): the engines apply their slices of the synced adapters.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "app/cli.h"
#include "app/commands.h"
#include "core/log.h"
#include "io/hdf5_ckpt.h"
#include "io/model_source.h"
#include "model/layout.h"
#include "rl/weights.h"

using namespace rlhf;

namespace {

// The consolidated fp32 weights of a model.h5, one vector per unit (layout for 1 shard).
std::vector<std::vector<float>> load_weights(const std::string& path,
                                             const model::ParamLayout& layout) {
  std::vector<std::vector<float>> w;
  std::vector<float*> ptrs;
  for (int u = 0; u < layout.num_units(); ++u) {
    w.emplace_back(size_t(layout.unit(u).numel), 0.0f);
    ptrs.push_back(w.back().data());
  }
  io::load_model_hdf5(path, layout, ptrs);
  return w;
}

// Runs `rlhf <cmd>` with the common arguments plus `extra`, saving under dir/<name>; returns the
// model path.
std::string run_rl(const std::string& cmd, const std::string& dir, const std::string& name,
                   std::vector<std::string> extra) {
  const std::string out = dir + "/" + name;
  // --device cpu: CPU engines in every build (a CUDA build on a GPU, or on the emulator, would
  // otherwise pick bf16 GPU engines, whose TP 2 sums round differently from TP 1's).
  std::vector<std::string> argv = {"rlhf",
                                   cmd,
                                   "--model_config",
                                   std::string(RLHF_SOURCE_DIR) + "/examples/models/tiny.toml",
                                   "--prompt_data",
                                   "builtin:addition?n=64&digits=1&seed=1",
                                   "--input_key",
                                   "input",
                                   "--label_key",
                                   "label",
                                   "--reward",
                                   "math",
                                   "--rollout_batch_size",
                                   "8",
                                   "--n_samples_per_prompt",
                                   "2",
                                   "--train_batch_size",
                                   "16",
                                   "--micro_train_batch_size",
                                   "4",
                                   "--micro_rollout_batch_size",
                                   "4",
                                   "--generate_max_len",
                                   "6",
                                   "--actor_learning_rate",
                                   "1e-3",
                                   "--max_steps",
                                   "2",
                                   "--seed",
                                   "5",
                                   "--threads",
                                   "1",
                                   "--device",
                                   "cpu",
                                   "--save_path",
                                   out,
                                   "--ckpt_path",
                                   out + "/ckpt"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const app::ParsedCommand parsed = app::parse_args(argv);
  app::run_command(parsed.args);
  return out + "/model.h5";
}

void check_tp_equals_tp1(const std::string& cmd, const std::vector<std::string>& placement,
                         const std::vector<std::string>& sampling) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // One directory for all ranks: rank 0 makes it, everyone gets the name.
  char buf[256] = {0};
  if (rank == 0) {
    const std::string d =
        (std::filesystem::temp_directory_path() / "rlhf_test_rl_tp_XXXXXX").string();
    std::snprintf(buf, sizeof(buf), "%s", d.c_str());
    REQUIRE(mkdtemp(buf) != nullptr);
  }
  MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  const std::string dir = buf;
  auto args = [&](const char* tp) {
    std::vector<std::string> a = placement;
    a.insert(a.end(), sampling.begin(), sampling.end());
    a.push_back("--vllm_tensor_parallel_size");
    a.push_back(tp);
    return a;
  };
  const std::string m1 = run_rl(cmd, dir, "tp1", args("1"));
  const std::string m2 = run_rl(cmd, dir, "tp2", args("2"));
  if (rank == 0) {
    const io::ModelSource src = io::resolve_model_source(
        std::string(RLHF_SOURCE_DIR) + "/examples/models/tiny.toml", "", "", model::HeadKind::kLM);
    const model::ParamLayout layout(src.config, model::HeadKind::kLM);
    const auto w1 = load_weights(m1, layout);
    const auto w2 = load_weights(m2, layout);
    // The initial policy (random init from --seed): the runs must have moved away from it.
    parallel::LocalParamStore init(layout);
    rl::initialize_weights(init, src, 5);
    bool moved = false;
    for (int u = 0; u < layout.num_units(); ++u) {
      CHECK_MESSAGE(w1[size_t(u)] == w2[size_t(u)], cmd << ": TP 2 != TP 1 in unit " << u);
      const parallel::UnitShard s = init.unit_shard(u);
      moved = moved || !std::equal(w1[size_t(u)].begin(), w1[size_t(u)].end(), s.data);
    }
    CHECK_MESSAGE(moved, cmd << ": the policy did not change; the comparison proves nothing");
    std::filesystem::remove_all(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

TEST_CASE("ppo/grpo with TP 2 engines give the same trainer weights as TP 1 engines") {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size % 2 != 0) return;
  rlhf::init_logging({rank, size, "warn", ""});
  // Greedy PPO (GAE gives non-zero advantages with identical samples); GRPO samples (a group of
  // greedy copies has zero advantages), at temperature 1 with the same counter-based streams.
  const std::vector<std::string> colocated = {"--ranks_per_node", "2"};
  check_tp_equals_tp1("ppo", colocated, {"--greedy"});
  check_tp_equals_tp1("grpo", colocated, {});
  // LoRA: every engine rank receives the full adapters (adapter-only sync) and applies its slice
  // of them; the saved model is the merged one, so equal weights are equal trained adapters.
  const std::vector<std::string> lora = {"--lora_rank", "8", "--lora_alpha", "16"};
  check_tp_equals_tp1("grpo", colocated, lora);
  if (size == 4) {
    const std::vector<std::string> disagg = {"--ranks_per_node", "4", "--gen_ranks_per_node", "2"};
    check_tp_equals_tp1("grpo", disagg, {});
    check_tp_equals_tp1("grpo", disagg, lora);  // the adapters broadcast to both engine ranks
  }
  rlhf::init_logging({});
}

#include "app/commands.h"

#include <type_traits>

#include "app/param_dtype.h"
#include "parallel/runtime.h"

namespace rlhf::app {

int run_command(const CommandArgs& args) {
  return std::visit(
      [](const auto& a) -> int {
        using T = std::decay_t<decltype(a)>;
        // --param_dtype, resolved and logged once for every command that computes (`score` runs
        // on the CPU only; export and import compute nothing).
        if constexpr (requires { a.parallel; }) {
          const bool gpu = !std::is_same_v<T, ScoreArgs> &&
                           parallel::resolve_device(a.parallel.device) == parallel::Device::kCuda;
          setup_param_dtype(a.parallel, gpu);
        }
        if constexpr (std::is_same_v<T, SftArgs>)
          return run_sft(a);
        else if constexpr (std::is_same_v<T, RmArgs>)
          return run_rm(a);
        else if constexpr (std::is_same_v<T, GrpoArgs>)
          return run_grpo(a);
        else if constexpr (std::is_same_v<T, PpoArgs>)
          return run_ppo(a);
        else if constexpr (std::is_same_v<T, GenerateArgs>)
          return run_generate(a);
        else if constexpr (std::is_same_v<T, EvalArgs>)
          return run_eval(a);
        else if constexpr (std::is_same_v<T, ScoreArgs>)
          return run_score(a);
        else if constexpr (std::is_same_v<T, ExportArgs>)
          return run_export(a);
        else if constexpr (std::is_same_v<T, ImportArgs>)
          return run_import(a);
        else if constexpr (std::is_same_v<T, BenchArgs>)
          return run_bench(a);
        else
          static_assert(sizeof(T) == 0, "run_command: a command without a run_* function");
      },
      args);
}

}  // namespace rlhf::app

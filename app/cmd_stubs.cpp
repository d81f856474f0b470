// Placeholders for subcommands that do not exist yet. Each one fails loudly; when a subcommand is
// implemented in app/cmd_<name>.cpp, delete its stub here.
#include "app/commands.h"

namespace rlhf::app {

int run_grpo(const GrpoArgs&) {
  RLHF_FAIL("`rlhf grpo` is not implemented yet");
}

int run_ppo(const PpoArgs&) {
  RLHF_FAIL("`rlhf ppo` is not implemented yet");
}

}  // namespace rlhf::app

// Placeholders for subcommands that do not exist yet. Each one fails loudly; when a subcommand is
// implemented in app/cmd_<name>.cpp, delete its stub here.
#include "app/commands.h"

namespace rlhf::app {

int run_export(const ExportArgs&) {
  RLHF_FAIL("`rlhf export` is not implemented yet");
}

int run_import(const ImportArgs&) {
  RLHF_FAIL("`rlhf import` is not implemented yet");
}

}  // namespace rlhf::app

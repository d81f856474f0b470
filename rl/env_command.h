// `--env_command`: the environment as an external program, one per generation engine, started once
// and kept for the run, spoken to in JSON lines (rl/environment.h, docs/environments.md).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "rl/environment.h"

namespace rlhf::rl {

/// A long-lived `/bin/sh -c command` in a process group of its own. step() writes one request
/// line per query and reads one answer line per query (blank lines skipped) under one deadline of
/// timeout_s for the whole batch. Each of these is an rlhf::Error naming the command, after which
/// the group is killed (SIGTERM, then SIGKILL) and reaped and every later step() fails at once:
/// the deadline passing; the program exiting (its status and the end of its stderr quoted); an
/// answer line longer than kEnvMaxLineBytes, or more than kEnvMaxOutputBytes for one batch; an
/// answer that parse_env_answer rejects; output nobody asked for (more lines than queries, or
/// anything written between two batches). The destructor closes the program's stdin, gives it up
/// to a second to exit, then kills its group.
class CommandEnvironment : public Environment {
 public:
  /// Starts the program. Throws rlhf::Error when /bin/sh cannot start or timeout_s <= 0.
  CommandEnvironment(std::string command, double timeout_s);
  ~CommandEnvironment() override;
  std::string name() const override { return command_; }
  std::vector<EnvAnswer> step(const std::vector<EnvQuery>& queries) override;

 private:
  struct Process;
  // Throws the error `message` after killing the program; later calls fail with it too.
  [[noreturn]] void fail(const std::string& message);
  std::string command_;
  double timeout_s_;
  std::unique_ptr<Process> proc_;
  std::string broken_;  // the error that ended the program ("" while it runs)
};

}  // namespace rlhf::rl

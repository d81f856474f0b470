// `rlhf`: MPI start-up, command line, logging, dispatch to a subcommand, and the one place that
// turns any exception into a logged error and an exit status (docs/design.md, "Conventions:
// errors").
//
// Exit status: 0 on success and for --help/--version; 2 for a usage error (bad flag, config file
// or value); 3 when a training run stopped on SIGTERM/SIGUSR1 after writing its checkpoint
// (parallel/preemption.h); 1 for any other error. With more than one rank, an error on any rank
// ends the whole job through MPI_Abort(MPI_COMM_WORLD, status), so that no rank is left waiting in
// a collective; mpirun (Open MPI) exits with that errorcode, so a usage error is status 2 under
// mpirun too. The C API only: Open MPI's mpi.h otherwise pulls in the deprecated C++ bindings,
// which the MPI::MPI_C target does not link.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/Error.hpp>

#include "app/cli.h"
#include "app/commands.h"
#include "app/usage_checks.h"
#include "core/error.h"
#include "core/log.h"
#include "core/openblas_core.h"
#include "parallel/comm_nccl.h"
#include "parallel/preemption.h"
#include "parallel/watchdog.h"

namespace {

/// Logs `error: <what> (rank R on host H)` at critical, flushes the logs and ends the process:
/// MPI_Abort(status) when there are other ranks, else MPI_Finalize and `status`.
int fail(const std::string& what, int status, int world_size) {
  const std::string& ctx = rlhf::error_context();
  std::string message = what;
  if (!ctx.empty() && message.find(ctx) == std::string::npos) {
    const size_t eol = message.find('\n');
    message.insert(eol == std::string::npos ? message.size() : eol, " (" + ctx + ")");
  }
  LOG_CRITICAL("error: {}", message);
  rlhf::flush_logs();
  std::cout.flush();
  rlhf::parallel::abort_nccl_comms();  // a rank stuck in an NCCL kernel would outlive MPI_Abort
  if (world_size > 1) {
    // Said by us: Open MPI's own MPI_ABORT report gets lost when the machine is loaded
    // ("ORTE_ERROR_LOG: Data unpack ... show_help.c").
    LOG_CRITICAL("ending the job on every rank (MPI_Abort)");
    rlhf::flush_logs();
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  MPI_Finalize();
  return status;
}

/// A last barrier and MPI_Finalize under the --comm_timeout watchdog: a peer stopped after the
/// last collective would otherwise leave this rank in finalize, or leave mpirun waiting for it
/// after every other rank has exited 0; the barrier makes its silence end the job with a message.
void finalize_watched() {
  rlhf::parallel::WatchScope watch("final barrier and MPI_Finalize", "world");
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
}

}  // namespace

int main(int argc, char** argv) {
  // Before MPI and any thread: OpenBLAS's kernels are chosen as it loads (core/openblas_core.h).
  rlhf::reexec_for_openblas_core(argv);
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    std::cerr << "error: MPI_Init_thread failed\n";
    return 1;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_len = 0;
  MPI_Get_processor_name(host, &host_len);
  rlhf::set_error_context(rank, std::string(host, host_len));

  int status = 0;
  try {
    // A console-only logger until the command line says where and how much to log.
    rlhf::init_logging({rank, world_size, "info", ""});
    if (provided < MPI_THREAD_SERIALIZED)
      LOG0_WARN("MPI provides thread level {} < MPI_THREAD_SERIALIZED", provided);

    const rlhf::app::ParsedCommand cmd =
        rlhf::app::parse_args(std::vector<std::string>(argv, argv + argc));
    if (cmd.action != rlhf::app::ParsedCommand::Action::kRun) {
      if (rank == 0) std::cout << cmd.text << std::flush;
      MPI_Finalize();
      return 0;
    }
    // Refusals that need the world's size and nodes, before any model loads (exit 2), and before
    // the log folder is made: a refused run leaves nothing behind.
    rlhf::app::check_usage(cmd.args, MPI_COMM_WORLD);
    rlhf::init_logging({rank, world_size, cmd.common().log_level, cmd.common().log_dir});
    LOG0_INFO("{} | rlhf {} | {} rank{}", rlhf::app::version_string(), cmd.command, world_size,
              world_size == 1 ? "" : "s");
    LOG_DEBUG("rank {} of {} on host {}", rank, world_size, host);
    rlhf::app::print_resolved_config(cmd);
    for (const std::string& notice : cmd.notices) LOG0_WARN("{}", notice);
    if (const rlhf::OpenblasCoreNote blas = rlhf::openblas_core_note(); !blas.text.empty()) {
      if (blas.warn)
        LOG0_WARN("{}", blas.text);
      else
        LOG0_INFO("{}", blas.text);
    }
    // A SIGTERM/SIGUSR1 names the rank and phase before ending the process; training commands
    // replace these with their preemption handlers (stop after the step, checkpoint, exit 3).
    rlhf::parallel::install_fault_note_handlers();
    status = rlhf::app::run_command(cmd.args);
    // Stopped on SIGTERM/SIGUSR1 with a checkpoint written: every rank returns it together.
    if (status == rlhf::parallel::kExitPreempted) {
      rlhf::flush_logs();
      finalize_watched();
      return status;
    }
    if (status != 0)
      return fail(fmt::format("`rlhf {}` finished with status {}", cmd.command, status), status,
                  world_size);
  } catch (const rlhf::app::UsageError& e) {
    return fail(e.what(), 2, world_size);
  } catch (const rlhf::Error& e) {
    LOG_DEBUG("error raised at {}", e.where());
    return fail(e.what(), 1, world_size);
  } catch (const CLI::Error& e) {  // parse_args converts these; kept as a safety net
    return fail(e.what(), 2, world_size);
  } catch (const std::exception& e) {
    return fail(e.what(), 1, world_size);
  } catch (...) {
    return fail("unknown exception", 1, world_size);
  }
  rlhf::flush_logs();
  finalize_watched();
  return status;
}

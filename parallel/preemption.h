// Preemption: SIGTERM (what Slurm sends at the time limit, on preemption or scancel) and SIGUSR1
// (`sbatch --signal=USR1@120`; mpirun forwards it to every rank) ask a training run to finish
// the step it is in, write a checkpoint and exit with kExitPreempted, so that a requeued job
// resumes with --load_checkpoint where this one stopped.
#pragma once

namespace rlhf::parallel {

class Comm;

/// Exit status of a run that stopped on a signal after writing its checkpoint (0 = finished,
/// 1 = error, 2 = usage error). A batch script requeues the job on this status.
inline constexpr int kExitPreempted = 3;

/// Installs the SIGTERM and SIGUSR1 handlers of this process (idempotent). The first signal only
/// records itself and writes one line to stderr naming the rank, the signal and the phase
/// (core/phase.h) — a job ended from outside, e.g. by mpirun after another rank died, says what
/// it was doing; a second SIGTERM or SIGUSR1 takes its default action (a user who presses ^C
/// twice, or Slurm's SIGKILL after KillWait, still ends the process at once). Syscalls restart
/// (SA_RESTART): a signal never turns into an I/O error.
void install_preemption_handlers();

/// For commands that do not stop gracefully (generate, eval, score): SIGTERM and SIGUSR1 write
/// the same one line (rank, signal, phase) and then take their default action (the process
/// ends as before).
void install_fault_note_handlers();

/// The signal this process has received (SIGTERM or SIGUSR1), or 0. Async-signal-safe read.
int preemption_signal();

/// Whether any rank of `comm` has received a preemption signal: the largest signal number over
/// the ranks (0 = none). Collective over `comm` (one all-reduce of one value): every rank gets
/// the same answer, so every rank stops after the same step. Raises what Comm::all_reduce raises.
int agree_preemption(Comm& comm);

/// The name of a signal number ("SIGTERM", "SIGUSR1", "SIGINT"; else "a signal").
const char* signal_name(int signal);

}  // namespace rlhf::parallel

// Failure injection for tests: make one rank throw at a named point of a run, to check that a
// failing rank ends the whole job (main turns any exception into MPI_Abort) instead of leaving the
// other ranks waiting in a collective.
#pragma once

namespace rlhf::parallel {

/// Throws rlhf::Error("injected failure at <point> on rank <rank>") when the environment variable
/// RLHF_INJECT_FAILURE names this point and rank: "<point>:<rank>" (the rank is the last
/// ':'-separated field, so a point may itself contain ':'; "<point>:*" matches every rank). Several
/// specs may be given separated by ','. Does nothing when the variable is unset or empty. The
/// variable is read at every call (a getenv: cheap, but keep it out of inner loops). Throws
/// rlhf::Error for a malformed spec (no ':' or a rank that is neither an integer nor '*').
void maybe_inject_failure(const char* point, int rank);

/// Stops this process with SIGSTOP when RLHF_INJECT_STOP names this point and rank (same syntax):
/// the stopped-rank fault (a hung node that keeps its sockets open) the --comm_timeout watchdog
/// exists for. Throws rlhf::Error for a malformed spec.
void maybe_inject_stop(const char* point, int rank);

}  // namespace rlhf::parallel

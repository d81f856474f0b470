// MPI_CHECK: the checked-call macro for MPI (STYLE B5), built on RLHF_CHECK_GEN.
//
// app/main sets MPI_ERRORS_RETURN on MPI_COMM_WORLD right after MPI_Init (communicators split or
// duplicated from it inherit the handler), so a failing MPI call returns its error code instead of
// aborting silently, and MPI_CHECK turns that code into an rlhf::Error that names the call, the
// MPI error string, the source location, rank and host. main turns the error into MPI_Abort.
#pragma once

#include <mpi.h>

#include <exception>
#include <string>

#include "core/error.h"

namespace rlhf::parallel {

/// True for MPI_SUCCESS.
inline bool mpi_ok(int code) {
  return code == MPI_SUCCESS;
}

/// MPI_Error_string of an MPI return code, with its error class:
/// "MPI_ERR_... text (code 5, class 5)". Never throws for an unknown code.
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  int cls = -1;
  if (MPI_Error_class(code, &cls) != MPI_SUCCESS) cls = -1;
  std::string s = len > 0 ? std::string(text, static_cast<size_t>(len)) : "unknown MPI error";
  return s + " (code " + std::to_string(code) + ", class " + std::to_string(cls) + ")";
}

/// Rank of this process in `comm` (MPI_Comm_rank, checked; rlhf::Error for MPI_COMM_NULL).
inline int comm_rank(MPI_Comm comm) {
  RLHF_CHECK(comm != MPI_COMM_NULL, "MPI_Comm_rank on MPI_COMM_NULL");
  int r = 0;
  RLHF_CHECK_GEN("MPI", MPI_Comm_rank(comm, &r), mpi_ok, mpi_error_string);
  return r;
}

/// Size of `comm` (MPI_Comm_size, checked; rlhf::Error for MPI_COMM_NULL).
inline int comm_size(MPI_Comm comm) {
  RLHF_CHECK(comm != MPI_COMM_NULL, "MPI_Comm_size on MPI_COMM_NULL");
  int n = 0;
  RLHF_CHECK_GEN("MPI", MPI_Comm_size(comm, &n), mpi_ok, mpi_error_string);
  return n;
}

/// Frees `*comm` (MPI_Comm_free) and sets it to MPI_COMM_NULL, unless it is MPI_COMM_NULL, MPI is
/// finalized, or an exception is unwinding the stack: then the handle is leaked on purpose, since
/// freeing may synchronise and a failing rank must reach MPI_Abort instead of waiting for ranks
/// that will never come. Never throws.
inline void free_comm_quietly(MPI_Comm* comm) noexcept {
  if (comm == nullptr || *comm == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && std::uncaught_exceptions() == 0) MPI_Comm_free(comm);
  *comm = MPI_COMM_NULL;
}

}  // namespace rlhf::parallel

/// Checked MPI call: `MPI_CHECK(MPI_Allreduce(...));` evaluates the call once and throws
/// rlhf::Error("MPI error: <MPI_Error_string> in `<call>` at file:line (rank R on host H)") when
/// it does not return MPI_SUCCESS. Needs MPI_ERRORS_RETURN on the communicator (see above).
#define MPI_CHECK(expr) \
  RLHF_CHECK_GEN("MPI", expr, ::rlhf::parallel::mpi_ok, ::rlhf::parallel::mpi_error_string)

// OpenBLAS's kernel choice, checked against the CPU. OpenBLAS's DYNAMIC_ARCH builds (Debian's)
// pick their kernels at load time from the CPU's family and model; a release older than the CPU
// does not know it and falls back to its oldest x86-64 kernels (Debian 12's OpenBLAS 0.3.21 on an
// Emerald Rapids Xeon, family 6 model 207: "Prescott", SSE3 only). There its sgemm ran at 59
// GFLOP/s instead of 290 (2 threads), and fp32 training at a quarter of its speed. The documented
// remedy is the environment variable OPENBLAS_CORETYPE, which OpenBLAS reads only as it loads, so
// `rlhf` sets it and executes itself again before anything else runs.
#pragma once

#include <string>

#include "core/cpu_features.h"

namespace rlhf {

/// OpenBLAS's name for the kernel set it runs in this process (openblas_get_corename(), e.g.
/// "Cooperlake"): benchmark rows carry it next to every sgemm reference rate.
std::string openblas_core_name();

/// True when `core` (OpenBLAS's name for its kernel set, openblas_get_corename(), any case) is
/// one of its pre-AVX2 x86 kernel sets (Prescott, Core2, Penryn, Dunnington, Nehalem, Atom,
/// Sandybridge, the 32-bit and pre-Zen AMD ones): what it falls back to on a CPU it does not know.
bool openblas_core_pre_avx2(const std::string& core);

/// The OPENBLAS_CORETYPE value that suits `f` when OpenBLAS picked `core` and that choice wastes
/// the CPU (a pre-AVX2 kernel set on a CPU with AVX2): "Cooperlake" (Intel with AVX512-BF16),
/// "SkylakeX" (Intel with AVX-512), "Zen" (other vendors with AVX2), "Haswell" (Intel with AVX2).
/// "" when the choice is fine or the CPU has no AVX2.
std::string openblas_better_core(const std::string& core, const CpuFeatures& f);

/// First thing in main(), before MPI_Init and before any thread starts: when OpenBLAS picked a
/// kernel set that wastes this CPU (openblas_better_core) and neither OPENBLAS_CORETYPE nor
/// RLHF_OPENBLAS_PICKED is set, sets OPENBLAS_CORETYPE to the better one, RLHF_OPENBLAS_PICKED to
/// what OpenBLAS had picked, and executes /proc/self/exe with the same `argv` (same process id, so
/// mpirun and srun see the same rank). Returns when there is nothing to do, and when the exec
/// fails (OPENBLAS_CORETYPE is unset again and RLHF_OPENBLAS_PICKED says the exec failed, so that
/// openblas_core_note warns and names it).
void reexec_for_openblas_core(char** argv);

/// What reexec_for_openblas_core did, for the start-up log: `warn` false with a line saying which
/// kernels OpenBLAS had picked and runs now; `warn` true when OpenBLAS still runs a pre-AVX2 kernel
/// set on an AVX2 CPU (OPENBLAS_CORETYPE set by hand, or a build without DYNAMIC_ARCH); `text` ""
/// when there is nothing to say.
struct OpenblasCoreNote {
  bool warn = false;
  std::string text;
};

/// The note of this process (see OpenblasCoreNote).
OpenblasCoreNote openblas_core_note();

}  // namespace rlhf

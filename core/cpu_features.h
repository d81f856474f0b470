// What the CPU this process runs on can compute, detected at run time (cpuid and xgetbv, so both
// the processor and the operating system must support a feature): the instruction sets that decide
// whether bf16 compute pays off (AMX-BF16, AVX512-BF16) and a short name of the best one for logs
// and benchmark rows.
#pragma once

#include <string>

namespace rlhf {

/// x86 features relevant to the GEMMs. Each is true only when the processor reports it (cpuid) and
/// the OS saves its registers (XCR0 via xgetbv): AVX-512 needs the opmask and ZMM state, AMX the
/// tile state. All false on other architectures.
struct CpuFeatures {
  bool avx2 = false;         ///< AVX2 and FMA
  bool avx512f = false;      ///< AVX-512 Foundation (+ the OS's ZMM/opmask state)
  bool avx512_vnni = false;  ///< AVX512-VNNI (int8 dot products; Cascade Lake and later)
  bool avx512_bf16 = false;  ///< AVX512-BF16 (vdpbf16ps; Cooper Lake, Sapphire Rapids, Zen 4)
  bool amx_bf16 = false;     ///< AMX-TILE + AMX-BF16 reported by cpuid and enabled in XCR0
  /// Linux: the kernel granted this process the AMX tile-data state (arch_prctl
  /// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), without which the first tile instruction faults.
  /// Requested once, on first detection, when amx_bf16 is set.
  bool amx_permitted = false;
};

/// The features of this CPU, detected on first call (thread-safe) and cached. Never throws.
const CpuFeatures& cpu_features();

/// A short name of the best instruction set of `f` for the GEMMs, in oneDNN's spelling:
/// "avx512_core_amx" (AMX-BF16 usable), "avx512_core_bf16", "avx512_core_vnni", "avx512_core",
/// "avx2", "sse4.1 or older" (x86), "non-x86".
std::string cpu_isa_string(const CpuFeatures& f);

/// cpu_isa_string(cpu_features()).
std::string cpu_isa_string();

/// True when the CPU computes bf16 products natively: usable AMX-BF16 or AVX512-BF16 (what
/// `--param_dtype auto` asks of a CPU before choosing bf16).
bool cpu_has_native_bf16(const CpuFeatures& f);

}  // namespace rlhf

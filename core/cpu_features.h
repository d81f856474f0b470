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
  bool intel = false;  ///< vendor GenuineIntel (cpuid leaf 0)
  int family = 0;      ///< display family (cpuid leaf 1, with the extended family)
  int model = 0;       ///< display model (with the extended model), e.g. 207 = Emerald Rapids
};

/// The features of this CPU, detected on first call (thread-safe) and cached. Never throws.
const CpuFeatures& cpu_features();

/// A short name of the best instruction set of `f` for the GEMMs, in oneDNN's spelling:
/// "avx512_core_amx" (AMX-BF16 usable), "avx512_core_bf16", "avx512_core_vnni", "avx512_core",
/// "avx2", "sse4.1 or older" (x86), "non-x86".
std::string cpu_isa_string(const CpuFeatures& f);

/// cpu_isa_string(cpu_features()).
std::string cpu_isa_string();

/// How oneDNN's bf16 matmul on a CPU compares with fp32 at the model's shapes: what
/// `--param_dtype auto` asks of a CPU before choosing bf16.
enum class CpuBf16 {
  /// Neither AMX-BF16 nor AVX512-BF16: oneDNN emulates bf16 (0.13x sgemm on Cascade Lake).
  kEmulated,
  /// AVX512-BF16 on an Intel core without usable AMX (Cooper Lake; Sapphire/Emerald Rapids whose
  /// hypervisor hides AMX): vdpbf16ps does no more multiply-adds a cycle than the two FMA ports
  /// do in fp32, and the operands' rounding and packing cost extra: oneDNN's bf16 matmul ran at
  /// 0.56x its fp32 one on an Emerald Rapids VM (docs/benchmarks.md).
  kNoFaster,
  /// Usable AMX-BF16 (oneDNN's bf16 matmul 6-7x its fp32 one), or AVX512-BF16 on a non-Intel core
  /// (AMD Zen 4/5, where vdpbf16ps has the FMA's rate at twice the products; unmeasured here).
  kFaster,
};

/// The class of `f`'s bf16 GEMMs (see CpuBf16).
CpuBf16 cpu_bf16_class(const CpuFeatures& f);

}  // namespace rlhf

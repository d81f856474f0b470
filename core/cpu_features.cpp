#include "core/cpu_features.h"

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define RLHF_X86 1
#endif
#if defined(__linux__) && defined(RLHF_X86)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace rlhf {

namespace {

#ifdef RLHF_X86
// XCR0 (the OS-enabled state components); only valid when cpuid reports OSXSAVE. Inline assembly
// rather than _xgetbv, which needs -mxsave at compile time.
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Linux >= 5.16 hands out the AMX tile-data state only on request
// (Documentation/arch/x86/xstate.rst).
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023;
  constexpr unsigned long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long bitmask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &bitmask) != 0) return false;
  return (bitmask & (1ul << kXfeatureXtiledata)) != 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  f.intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "Genu" "ineI" "ntel"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const int base_family = int((a >> 8) & 0xF), base_model = int((a >> 4) & 0xF);
  f.family = base_family == 0xF ? base_family + int((a >> 20) & 0xFF) : base_family;
  f.model = (base_family == 0x6 || base_family == 0xF) ? (int((a >> 16) & 0xF) << 4) + base_model
                                                       : base_model;
  const bool osxsave = (c >> 27) & 1u, fma = (c >> 12) & 1u;
  if (!osxsave) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;                    // XMM, YMM
  const bool os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0;     // opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);  // XTILECFG, XTILEDATA
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = os_avx && fma && ((b >> 5) & 1u);
  f.avx512f = os_avx512 && ((b >> 16) & 1u);
  f.avx512_vnni = f.avx512f && ((c >> 11) & 1u);
  const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
  f.amx_bf16 = os_amx && amx_bf16 && amx_tile && f.avx512f;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  f.avx512_bf16 = f.avx512f && ((a1 >> 5) & 1u);
  if (f.amx_bf16) f.amx_permitted = request_amx_permission();
  return f;
}
#endif

}  // namespace

const CpuFeatures& cpu_features() {
#ifdef RLHF_X86
  static const CpuFeatures f = detect();
#else
  static const CpuFeatures f;
#endif
  return f;
}

std::string cpu_isa_string(const CpuFeatures& f) {
#ifdef RLHF_X86
  if (f.amx_bf16 && f.amx_permitted) return "avx512_core_amx";
  if (f.avx512_bf16) return "avx512_core_bf16";
  if (f.avx512_vnni) return "avx512_core_vnni";
  if (f.avx512f) return "avx512_core";
  if (f.avx2) return "avx2";
  return "sse4.1 or older";
#else
  (void)f;
  return "non-x86";
#endif
}

std::string cpu_isa_string() {
  return cpu_isa_string(cpu_features());
}

CpuBf16 cpu_bf16_class(const CpuFeatures& f) {
  if (f.amx_bf16 && f.amx_permitted) return CpuBf16::kFaster;
  if (!f.avx512_bf16) return CpuBf16::kEmulated;
  return f.intel ? CpuBf16::kNoFaster : CpuBf16::kFaster;
}

}  // namespace rlhf

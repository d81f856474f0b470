// CPU feature detection (core/cpu_features.h) against the kernel's view of the same CPU: the flags
// line of /proc/cpuinfo (Linux; skipped elsewhere), and the ISA string's order of preference.
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "core/cpu_features.h"
#include "tests/test_util.h"

TEST_CASE("cpu features agree with /proc/cpuinfo") {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream ss(line.substr(line.find(':') + 1));
      for (std::string f; ss >> f;) flags.insert(f);
      break;
    }
  if (flags.empty()) {
    MESSAGE("skipped: no flags line in /proc/cpuinfo (not Linux x86)");
    return;
  }
  const rlhf::CpuFeatures& f = rlhf::cpu_features();
  MESSAGE("ISA: " << rlhf::cpu_isa_string() << " (avx512f " << f.avx512f << ", avx512_vnni "
                  << f.avx512_vnni << ", avx512_bf16 " << f.avx512_bf16 << ", amx_bf16 "
                  << f.amx_bf16 << ", amx permitted " << f.amx_permitted << ")");
  // The kernel lists a feature only when it also enabled its register state, as we require.
  CHECK(f.avx512f == (flags.count("avx512f") == 1));
  CHECK(f.avx512_vnni == (flags.count("avx512_vnni") == 1));
  CHECK(f.avx512_bf16 == (flags.count("avx512_bf16") == 1));
  CHECK(f.amx_bf16 == (flags.count("amx_bf16") == 1 && flags.count("amx_tile") == 1));
  CHECK(f.avx2 == (flags.count("avx2") == 1 && flags.count("fma") == 1));
  CHECK(&rlhf::cpu_features() == &f);  // detected once
  // The vendor, family and model the kernel read from the same cpuid leaves.
  in.clear();
  in.seekg(0);
  std::string vendor;
  int family = -1, model = -1;
  while (std::getline(in, line) && (vendor.empty() || family < 0 || model < 0)) {
    const std::string value = line.substr(line.find(':') + 1);
    if (line.rfind("vendor_id", 0) == 0) std::istringstream(value) >> vendor;
    if (line.rfind("cpu family", 0) == 0) std::istringstream(value) >> family;
    if (line.rfind("model\t", 0) == 0) std::istringstream(value) >> model;
  }
  CHECK(f.intel == (vendor == "GenuineIntel"));
  CHECK(f.family == family);
  CHECK(f.model == model);
}

TEST_CASE("cpu bf16 class: AMX anywhere, AVX512-BF16 off Intel") {
  using rlhf::CpuBf16;
  rlhf::CpuFeatures f;
  f.avx2 = f.avx512f = f.avx512_vnni = true;
  CHECK(rlhf::cpu_bf16_class(f) == CpuBf16::kEmulated);
  f.avx512_bf16 = true;  // AMD Zen 4/5
  CHECK(rlhf::cpu_bf16_class(f) == CpuBf16::kFaster);
  f.intel = true;  // Cooper Lake, or Sapphire/Emerald Rapids with AMX hidden
  CHECK(rlhf::cpu_bf16_class(f) == CpuBf16::kNoFaster);
  f.amx_bf16 = true;  // reported, but the kernel did not grant the tile state
  CHECK(rlhf::cpu_bf16_class(f) == CpuBf16::kNoFaster);
  f.amx_permitted = true;
  CHECK(rlhf::cpu_bf16_class(f) == CpuBf16::kFaster);
}

TEST_CASE("cpu ISA string: the best feature wins") {
  rlhf::CpuFeatures f;
#if defined(__x86_64__)
  CHECK(rlhf::cpu_isa_string(f) == "sse4.1 or older");
  f.avx2 = true;
  CHECK(rlhf::cpu_isa_string(f) == "avx2");
  f.avx512f = true;
  CHECK(rlhf::cpu_isa_string(f) == "avx512_core");
  f.avx512_vnni = true;
  CHECK(rlhf::cpu_isa_string(f) == "avx512_core_vnni");
  f.avx512_bf16 = true;
  CHECK(rlhf::cpu_isa_string(f) == "avx512_core_bf16");
  f.amx_bf16 = true;  // without the kernel's permission AMX is not usable
  CHECK(rlhf::cpu_isa_string(f) == "avx512_core_bf16");
  f.amx_permitted = true;
  CHECK(rlhf::cpu_isa_string(f) == "avx512_core_amx");
  f.avx512_bf16 = false;
#else
  CHECK(rlhf::cpu_isa_string(f) == "non-x86");
#endif
}

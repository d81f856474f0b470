#include "core/openblas_core.h"
#include "core/strings.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

namespace rlhf {

namespace {

constexpr const char* kPickedEnv = "RLHF_OPENBLAS_PICKED";

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

}  // namespace

std::string openblas_core_name() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

bool openblas_core_pre_avx2(const std::string& core) {
  // OpenBLAS's x86 core names (driver/others/dynamic.c) whose kernels stop before AVX2.
  static const char* const kPre[] = {"katmai",  "coppermine", "northwood",    "prescott",
                                     "banias",  "core2",      "penryn",       "dunnington",
                                     "nehalem", "atom",       "nano",         "sandybridge",
                                     "athlon",  "opteron",    "opteron_sse3", "barcelona",
                                     "bobcat",  "bulldozer",  "piledriver",   "steamroller"};
  const std::string c = to_lower_ascii(core);
  return std::any_of(std::begin(kPre), std::end(kPre), [&](const char* p) { return c == p; });
}

std::string openblas_better_core(const std::string& core, const CpuFeatures& f) {
  if (!f.avx2 || !openblas_core_pre_avx2(core)) return "";
  if (!f.intel) return "Zen";
  if (f.avx512_bf16) return "Cooperlake";
  if (f.avx512f) return "SkylakeX";
  return "Haswell";
}

void reexec_for_openblas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::getenv(kPickedEnv) != nullptr) return;
  const std::string picked = openblas_core_name();
  const std::string better = openblas_better_core(picked, cpu_features());
  if (better.empty()) return;
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  setenv(kPickedEnv, picked.c_str(), 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // only reached when the exec failed
  setenv(kPickedEnv, ("(exec failed) " + picked).c_str(), 1);
}

OpenblasCoreNote openblas_core_note() {
  const CpuFeatures& f = cpu_features();
  const std::string now = openblas_core_name();
  const std::string picked = env_or_empty(kPickedEnv);
  const bool warn = openblas_core_pre_avx2(now) && f.avx2;
  if (!warn && picked.empty()) return {};
  const std::string cpu = fmt::format("{} family {} model {}, {}", f.intel ? "Intel" : "x86",
                                      f.family, f.model, cpu_isa_string(f));
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": its first two words.
  const char* config = openblas_get_config();
  std::string version = config != nullptr ? config : "OpenBLAS";
  const size_t second = version.find(' ', version.find(' ') + 1);
  if (second != std::string::npos) version.resize(second);
  if (warn)
    return {true, fmt::format("{} runs its pre-AVX2 {} kernels on this CPU ({}){}: fp32 GEMMs run "
                              "several times slower than the CPU allows; set OPENBLAS_CORETYPE={} "
                              "(or unset it), or install an OpenBLAS that knows this CPU",
                              version, now, cpu,
                              picked.empty() ? "" : fmt::format(" (it had picked {})", picked),
                              openblas_better_core(now, f))};
  return {false,
          fmt::format("{} did not know this CPU ({}) and picked its {} kernels; rlhf restarted "
                      "itself with OPENBLAS_CORETYPE={}: it runs {} now",
                      version, cpu, picked, env_or_empty("OPENBLAS_CORETYPE"), now)};
}

}  // namespace rlhf

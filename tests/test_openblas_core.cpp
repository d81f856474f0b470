// OpenBLAS's kernel choice against the CPU (core/openblas_core.h): the rule on made-up CPUs, and
// this process after main()'s re-exec: OpenBLAS never runs pre-AVX2 kernels on an AVX2 CPU unless
// OPENBLAS_CORETYPE was set by hand.
#include <cstdlib>
#include <string>

#include "core/openblas_core.h"
#include "tests/test_util.h"

TEST_CASE("openblas core: a pre-AVX2 fallback on a newer CPU is replaced") {
  rlhf::CpuFeatures f;
  CHECK(rlhf::openblas_better_core("Prescott", f).empty());  // no AVX2: the fallback is right
  f.avx2 = true;
  f.intel = true;
  CHECK(rlhf::openblas_better_core("Prescott", f) == "Haswell");
  CHECK(rlhf::openblas_better_core("Haswell", f).empty());
  f.avx512f = true;
  CHECK(rlhf::openblas_better_core("PRESCOTT", f) == "SkylakeX");
  CHECK(rlhf::openblas_better_core("Nehalem", f) == "SkylakeX");
  CHECK(rlhf::openblas_better_core("SkylakeX", f).empty());
  f.avx512_bf16 = true;  // Cooper Lake, Sapphire/Emerald Rapids
  CHECK(rlhf::openblas_better_core("Prescott", f) == "Cooperlake");
  CHECK(rlhf::openblas_better_core("Cooperlake", f).empty());
  f.intel = false;  // AMD: OpenBLAS's Zen kernels
  CHECK(rlhf::openblas_better_core("Barcelona", f) == "Zen");
  CHECK(rlhf::openblas_better_core("Zen", f).empty());
  CHECK(rlhf::openblas_better_core("Excavator", f).empty());  // an AVX2 set: its own choice
  CHECK(rlhf::openblas_core_pre_avx2("sandybridge"));
  CHECK_FALSE(rlhf::openblas_core_pre_avx2("SapphireRapids"));
}

TEST_CASE("openblas core: this process runs kernels that suit its CPU") {
  const std::string core = rlhf::openblas_core_name();
  const rlhf::CpuFeatures& f = rlhf::cpu_features();
  const char* picked = std::getenv("RLHF_OPENBLAS_PICKED");
  MESSAGE("OpenBLAS core " << core << " (had picked: " << std::string(picked ? picked : "-")
                           << "), CPU " << rlhf::cpu_isa_string(f) << " family " << f.family
                           << " model " << f.model);
  const rlhf::OpenblasCoreNote note = rlhf::openblas_core_note();
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr && picked == nullptr) {
    MESSAGE("skipped: OPENBLAS_CORETYPE set by hand");
    return;
  }
  if (picked != nullptr && !rlhf::openblas_better_core(core, f).empty()) {
    // Re-executed with OPENBLAS_CORETYPE, which this OpenBLAS ignored (no DYNAMIC_ARCH): the
    // start-up log must say so.
    MESSAGE("this OpenBLAS ignores OPENBLAS_CORETYPE");
    CHECK(note.warn);
    return;
  }
  CHECK(rlhf::openblas_better_core(core, f).empty());  // a fallback would have been replaced
  CHECK_FALSE(note.warn);
  CHECK(note.text.empty() == (picked == nullptr));
  if (picked != nullptr)
    CHECK(note.text.find(std::string("picked its ") + picked) != std::string::npos);
}

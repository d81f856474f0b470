// --param_dtype / --bf16: parsed on every computing command, and the resolution rule
// (app/param_dtype.h) on a GPU and on CPUs with and without native bf16, with oneDNN in the
// build or not; refusals are usage errors (exit status 2) that say why.
#include "app/param_dtype.h"

#include "tests/cli_test_util.h"

using namespace rlhf;
using app::ParamDtype;
using cli_test::contains;
using rlhf::CpuBf16;

namespace {

// The message of the UsageError that resolving throws ("" when it does not throw).
constexpr CpuBf16 kEmu = CpuBf16::kEmulated, kNoFaster = CpuBf16::kNoFaster,
                  kFaster = CpuBf16::kFaster;

std::string refusal(const std::string& flag, bool alias, bool gpu, CpuBf16 cpu, bool ready) {
  try {
    app::resolve_param_dtype(flag, alias, gpu, cpu, ready, "avx512_core_vnni");
  } catch (const app::UsageError& e) {
    return e.what();
  }
  return "";
}

ParamDtype resolved(const std::string& flag, bool alias, bool gpu, CpuBf16 cpu, bool ready) {
  return app::resolve_param_dtype(flag, alias, gpu, cpu, ready, "isa").dtype;
}

}  // namespace

TEST_CASE("param_dtype: flags on every computing command") {
  for (const char* cmd : {"sft", "rm", "grpo", "ppo", "generate", "eval", "score", "bench"}) {
    CAPTURE(cmd);
    const std::string help = cli_test::parse({cmd, "--help"}).text;
    CHECK(contains(help, "--param_dtype"));
    CHECK(contains(help, "--bf16"));
  }
  CHECK(contains(
      cli_test::usage_error({"sft", "--dataset", "d", "--pretrain", "m", "--param_dtype", "fp16"}),
      "--param_dtype"));
  const auto p = cli_test::parse({"sft", "--dataset", "d", "--pretrain", "m", "--bf16"});
  const auto& g = std::get<app::SftArgs>(p.args);
  CHECK(g.parallel.bf16);
  CHECK(g.parallel.param_dtype == "auto");
  const auto q = cli_test::parse({"bench", "gemm", "--param_dtype", "fp32"});
  CHECK(std::get<app::BenchArgs>(q.args).parallel.param_dtype == "fp32");
}

TEST_CASE("param_dtype: the auto rule and the refusals") {
  // GPU: always bf16; fp32 is refused.
  CHECK(resolved("auto", false, true, kEmu, false) == ParamDtype::kBf16);
  CHECK(resolved("bf16", false, true, kEmu, false) == ParamDtype::kBf16);
  CHECK(resolved("auto", true, true, kEmu, false) == ParamDtype::kBf16);
  CHECK(contains(refusal("fp32", false, true, kFaster, true), "GPU backend computes in bf16 only"));
  // CPU without bf16 instructions: auto = fp32 even when the bf16 path is ready.
  CHECK(resolved("auto", false, false, kEmu, true) == ParamDtype::kFp32);
  CHECK(resolved("fp32", false, false, kFaster, true) == ParamDtype::kFp32);
  // Intel AVX512-BF16 without AMX: bf16 GEMMs are slower there, so auto = fp32; bf16 when asked.
  CHECK(resolved("auto", false, false, kNoFaster, true) == ParamDtype::kFp32);
  CHECK(contains(app::resolve_param_dtype("auto", false, false, kNoFaster, true, "x").reason,
                 "no faster than fp32"));
  CHECK(resolved("bf16", false, false, kNoFaster, true) == ParamDtype::kBf16);
  CHECK(contains(app::resolve_param_dtype("bf16", false, false, kNoFaster, true, "x").reason,
                 "slower than fp32"));
  // CPU with AMX (or AVX512-BF16 off Intel): auto = bf16 once the path is ready, fp32 until then.
  CHECK(resolved("auto", false, false, kFaster, true) == ParamDtype::kBf16);
  CHECK(resolved("auto", false, false, kFaster, false) == ParamDtype::kFp32);
  CHECK(contains(
      app::resolve_param_dtype("auto", false, false, kFaster, false, "avx512_core_amx").reason,
      "this build has no oneDNN"));
  // Explicit bf16 on the CPU: refused until the path is ready (whatever the CPU), then accepted.
  const std::string no = refusal("bf16", false, false, kFaster, false);
  CHECK(contains(no, "--param_dtype bf16: bf16 compute on the CPU needs oneDNN"));
  CHECK(contains(refusal("auto", true, false, kEmu, false), "--bf16: bf16 compute on the CPU"));
  CHECK(resolved("bf16", false, false, kEmu, true) == ParamDtype::kBf16);
  CHECK(contains(app::resolve_param_dtype("bf16", false, false, kEmu, true, "avx512_core").reason,
                 "emulates"));
  // --bf16 with an explicit fp32 contradicts it.
  CHECK(contains(refusal("fp32", true, false, kFaster, true), "contradict"));
  // The CPU model computes in bf16 (model/layer_bf16.h); whether a build can is onednn_available.
  CHECK(app::kCpuBf16Wired);
}

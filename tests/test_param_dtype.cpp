// --param_dtype / --bf16: parsed on every computing command, and the resolution rule
// (app/param_dtype.h) on a GPU and on CPUs with and without native bf16, with oneDNN in the
// build or not; refusals are usage errors (exit status 2) that say why.
#include "app/param_dtype.h"

#include "tests/cli_test_util.h"

using namespace rlhf;
using app::ParamDtype;
using cli_test::contains;

namespace {

// The message of the UsageError that resolving throws ("" when it does not throw).
std::string refusal(const std::string& flag, bool alias, bool gpu, bool native, bool ready) {
  try {
    app::resolve_param_dtype(flag, alias, gpu, native, ready, "avx512_core_vnni");
  } catch (const app::UsageError& e) {
    return e.what();
  }
  return "";
}

ParamDtype resolved(const std::string& flag, bool alias, bool gpu, bool native, bool ready) {
  return app::resolve_param_dtype(flag, alias, gpu, native, ready, "isa").dtype;
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
  CHECK(resolved("auto", false, true, false, false) == ParamDtype::kBf16);
  CHECK(resolved("bf16", false, true, false, false) == ParamDtype::kBf16);
  CHECK(resolved("auto", true, true, false, false) == ParamDtype::kBf16);
  CHECK(contains(refusal("fp32", false, true, true, true), "GPU backend computes in bf16 only"));
  // CPU without native bf16: auto = fp32 even when the bf16 path is ready.
  CHECK(resolved("auto", false, false, false, true) == ParamDtype::kFp32);
  CHECK(resolved("fp32", false, false, true, true) == ParamDtype::kFp32);
  // CPU with AMX / AVX512-BF16: auto = bf16 once the path is ready, fp32 until then.
  CHECK(resolved("auto", false, false, true, true) == ParamDtype::kBf16);
  CHECK(resolved("auto", false, false, true, false) == ParamDtype::kFp32);
  CHECK(contains(
      app::resolve_param_dtype("auto", false, false, true, false, "avx512_core_amx").reason,
      "this build has no oneDNN"));
  // Explicit bf16 on the CPU: refused until the path is ready (native or not), then accepted.
  const std::string no = refusal("bf16", false, false, true, false);
  CHECK(contains(no, "--param_dtype bf16: bf16 compute on the CPU needs oneDNN"));
  CHECK(contains(refusal("auto", true, false, false, false), "--bf16: bf16 compute on the CPU"));
  CHECK(resolved("bf16", false, false, false, true) == ParamDtype::kBf16);
  CHECK(contains(app::resolve_param_dtype("bf16", false, false, false, true, "avx512_core").reason,
                 "emulates"));
  // --bf16 with an explicit fp32 contradicts it.
  CHECK(contains(refusal("fp32", true, false, true, true), "contradict"));
  // The CPU model computes in bf16 (model/layer_bf16.h); whether a build can is onednn_available.
  CHECK(app::kCpuBf16Wired);
}

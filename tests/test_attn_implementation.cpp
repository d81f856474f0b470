// --attn_implementation: rlhf's values and Hugging Face's names as OpenRLHF scripts pass them
// (also as --ds.attn_implementation), what each means here, the CPU's choice of the bf16 attention
// tiles, and the refusals (onednn with fp32 compute, a value nobody knows).
#include "app/runtime.h"
#include "core/cpu_features.h"
#include "model/ops/attention_bf16.h"
#include "model/ops/matmul_bf16.h"
#include "parallel/runtime.h"
#include "tests/cli_test_util.h"

using namespace rlhf;
using cli_test::contains;

namespace {

app::SftArgs sft(std::vector<std::string> extra) {
  std::vector<std::string> argv = {"sft", "--dataset", "d", "--pretrain", "m", "--device", "cpu"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return std::get<app::SftArgs>(cli_test::parse(argv).args);
}

}  // namespace

TEST_CASE("attn_implementation: Hugging Face's names are accepted and mean what serves them here") {
  CHECK(sft({"--attn_implementation", "flash_attention_2"}).parallel.attn_implementation ==
        "flash_attention_2");
  CHECK(sft({"--ds.attn_implementation", "eager"}).parallel.attn_implementation == "eager");
  CHECK(parallel::attention_implementation_name("flash_attention_2") == "auto");
  CHECK(parallel::attention_implementation_name("flash_attention_3") == "auto");
  CHECK(parallel::attention_implementation_name("sdpa") == "auto");
  CHECK(parallel::attention_implementation_name("eager") == "flash");
  for (const char* own : {"auto", "flash", "cudnn", "onednn"})
    CHECK(parallel::attention_implementation_name(own) == own);
  CHECK(contains(cli_test::usage_error({"sft", "--dataset", "d", "--pretrain", "m",
                                        "--attn_implementation", "paged"}),
                 "--attn_implementation"));
}

TEST_CASE("attn_implementation: the CPU's bf16 attention tiles, chosen and refused") {
  const bool saved = model::cpu_attention_bf16();
  const bool faster = cpu_bf16_class(cpu_features()) == CpuBf16::kFaster;
  const bool onednn = model::onednn_available();
  parallel::use_cpu_attention_implementation("auto", true);
  CHECK(model::cpu_attention_bf16() == (faster && onednn));
  parallel::use_cpu_attention_implementation("sdpa", true);  // = auto
  CHECK(model::cpu_attention_bf16() == (faster && onednn));
  parallel::use_cpu_attention_implementation("eager", true);
  CHECK_FALSE(model::cpu_attention_bf16());
  if (onednn) {
    parallel::use_cpu_attention_implementation("onednn", true);
    CHECK(model::cpu_attention_bf16());
  } else {
    CHECK_THROWS_WITH_AS(parallel::use_cpu_attention_implementation("onednn", true),
                         doctest::Contains("no oneDNN"), Error);
  }
  model::set_cpu_attention_bf16(saved);
  // onednn needs the CPU to compute in bf16.
  auto fp32 = sft({"--attn_implementation", "onednn", "--param_dtype", "fp32"});
  CHECK_THROWS_WITH_AS(app::runtime_options(fp32.parallel),
                       doctest::Contains("computes attention's products in bf16"), app::UsageError);
  if (onednn) {
    auto bf16 = sft({"--attn_implementation", "onednn", "--param_dtype", "bf16"});
    CHECK(app::runtime_options(bf16.parallel).bf16);
  }
}

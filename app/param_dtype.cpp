#include "app/param_dtype.h"

#include <fmt/format.h>

#include "core/cpu_features.h"
#include "core/log.h"
#include "model/ops/matmul_bf16.h"

namespace rlhf::app {

const char* param_dtype_name(ParamDtype d) {
  return d == ParamDtype::kBf16 ? "bf16" : "fp32";
}

ParamDtypeChoice resolve_param_dtype(const std::string& flag, bool bf16_alias, bool gpu,
                                     CpuBf16 cpu, bool cpu_bf16_ready, const std::string& isa) {
  if (bf16_alias && flag == "fp32")
    throw UsageError("--bf16 and --param_dtype fp32 contradict each other: give one of them");
  if (flag != "auto" && flag != "bf16" && flag != "fp32")
    throw UsageError(fmt::format("--param_dtype {}: expected bf16, fp32 or auto", flag));
  const std::string asked = bf16_alias ? "bf16" : flag;
  const std::string given = bf16_alias ? "--bf16" : "--param_dtype " + flag;
  if (gpu) {
    if (asked == "fp32")
      throw UsageError(
          fmt::format("{}: the GPU backend computes in bf16 only (bf16 weights and activations, "
                      "fp32 accumulation, fp32 master weights, gradients and AdamW moments)\nhint: "
                      "--param_dtype bf16 or auto, or --device cpu for fp32",
                      given));
    return {ParamDtype::kBf16, asked == "auto" ? "auto: a GPU computes in bf16" : "asked"};
  }
  if (asked == "fp32") return {ParamDtype::kFp32, "asked"};
  if (asked == "bf16") {
    if (!cpu_bf16_ready)
      throw UsageError(fmt::format(
          "{}: bf16 compute on the CPU needs oneDNN, and this build has none (CPU {}); the CPU "
          "computes in fp32\nhint: --param_dtype fp32 (or auto), or install libdnnl-dev "
          "(scripts/install-deps.sh) and rebuild, or --device cuda",
          given, isa));
    if (cpu == CpuBf16::kEmulated)
      return {ParamDtype::kBf16, fmt::format("asked; CPU {} has neither AMX nor AVX512-BF16, so "
                                             "oneDNN emulates bf16 (slower than fp32)",
                                             isa)};
    if (cpu == CpuBf16::kNoFaster)
      return {ParamDtype::kBf16,
              fmt::format("asked; CPU {} is an Intel core without usable AMX, where bf16 GEMMs "
                          "run slower than fp32 ones (bf16 weights still halve decode's bytes)",
                          isa)};
    return {ParamDtype::kBf16, "asked"};
  }
  if (cpu == CpuBf16::kEmulated)
    return {ParamDtype::kFp32, fmt::format("auto: CPU {} has neither AMX nor AVX512-BF16", isa)};
  if (cpu == CpuBf16::kNoFaster)
    return {ParamDtype::kFp32,
            fmt::format("auto: CPU {} has AVX512-BF16 but no usable AMX, and on an Intel core "
                        "its bf16 GEMMs are no faster than fp32 ones",
                        isa)};
  if (!cpu_bf16_ready)
    return {ParamDtype::kFp32,
            fmt::format("auto: CPU {} computes bf16 faster than fp32, but this build has no "
                        "oneDNN",
                        isa)};
  return {ParamDtype::kBf16, fmt::format("auto: CPU {} computes bf16 faster than fp32", isa)};
}

namespace {

ParamDtypeChoice resolve_here(const ParallelArgs& args, bool gpu) {
  const CpuFeatures& f = cpu_features();
  const bool ready = kCpuBf16Wired && model::onednn_available();
  return resolve_param_dtype(args.param_dtype, args.bf16, gpu, cpu_bf16_class(f), ready,
                             cpu_isa_string(f));
}

}  // namespace

bool cpu_bf16(const ParallelArgs& args, bool gpu) {
  return !gpu && resolve_here(args, gpu).dtype == ParamDtype::kBf16;
}

ParamDtype setup_param_dtype(const ParallelArgs& args, bool gpu) {
  const std::string isa = cpu_isa_string(cpu_features());
  const ParamDtypeChoice c = resolve_here(args, gpu);
  if (log_rank() == 0) {
    std::string onednn = model::onednn_version_string();
    // The kernel oneDNN picks for a bf16 GEMM of this CPU (a 2048 x 576 x 576 projection).
    if (!gpu && model::onednn_available()) {
      try {
        onednn += ", bf16 matmul " + model::onednn_matmul_impl(true, 2048, 576, 576);
      } catch (const Error& e) {
        onednn += fmt::format(", bf16 matmul refused ({})", e.what());
      }
    }
    LOG0_INFO("param_dtype: {} ({}) | ISA {} | {}", param_dtype_name(c.dtype), c.reason, isa,
              gpu ? "GPU GEMMs: cuBLASLt bf16" : onednn);
  }
  return c.dtype;
}

}  // namespace rlhf::app

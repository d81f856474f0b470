// --param_dtype (OpenRLHF's name; --bf16 an alias of bf16): the precision of the model's GEMMs,
// resolved once per command from the flag, the device and the CPU, and logged at start-up.
#pragma once

#include <string>

#include "app/cli.h"
#include "core/cpu_features.h"

namespace rlhf::app {

/// The compute precision of a command's models.
///  - kFp32: fp32 weights and activations everywhere (the CPU reference path).
///  - kBf16: bf16 weights and activations into every GEMM, fp32 accumulation; fp32 master weights,
///    gradients and AdamW moments (the GPU backend's numerics).
enum class ParamDtype { kFp32, kBf16 };

/// "fp32", "bf16".
const char* param_dtype_name(ParamDtype d);

/// Whether the CPU backend's model computes in bf16 when asked: true — the trainer's decoder layers
/// and heads (model/layer_bf16.h), the experience passes and the CPU engine run their GEMMs in bf16
/// through oneDNN. A build without oneDNN still refuses bf16 on the CPU (cpu_bf16_ready false).
inline constexpr bool kCpuBf16Wired = true;

/// What resolve_param_dtype decided, and why (for the start-up log).
struct ParamDtypeChoice {
  ParamDtype dtype = ParamDtype::kFp32;
  std::string reason;
};

/// The rule of --param_dtype: `flag` "bf16" | "fp32" | "auto" (bf16_alias: --bf16 was given, which
/// means bf16 and contradicts an explicit fp32). On a GPU: bf16 (the CUDA backend computes in bf16
/// only; fp32 is refused). On the CPU: fp32 as asked; auto = bf16 when `cpu` is CpuBf16::kFaster
/// (usable AMX, or AVX512-BF16 off Intel: core/cpu_features.h) and cpu_bf16_ready (oneDNN in the
/// build and kCpuBf16Wired), else fp32 (on kNoFaster too: Intel AVX512-BF16 without AMX, where
/// oneDNN's bf16 matmul is slower than fp32); bf16 needs cpu_bf16_ready only (oneDNN emulates it
/// where the CPU has no bf16 instructions, slowly). `isa` names the CPU in the reasons. Throws
/// UsageError (exit status 2) for a refused choice.
ParamDtypeChoice resolve_param_dtype(const std::string& flag, bool bf16_alias, bool gpu,
                                     CpuBf16 cpu, bool cpu_bf16_ready, const std::string& isa);

/// Whether a command's CPU models (trainer, experience passes, scorer, CPU engine) compute in bf16:
/// resolve_param_dtype with this process's CPU features and build, without the log; false when
/// `gpu` (the GPU backend is bf16 on its own). Throws UsageError like resolve_param_dtype.
bool cpu_bf16(const ParallelArgs& args, bool gpu);

/// resolve_param_dtype for a command running on `gpu` or the CPU, with this process's CPU features
/// and build; logs (rank 0) "param_dtype: <choice> (<reason>) | ISA <isa> | <oneDNN version and the
/// bf16 matmul kernel it picks>". Throws UsageError like resolve_param_dtype.
ParamDtype setup_param_dtype(const ParallelArgs& args, bool gpu);

}  // namespace rlhf::app

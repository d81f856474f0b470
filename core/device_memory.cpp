#include "core/device_memory.h"

#ifdef RLHF_CUDA

#include "core/phase.h"

namespace rlhf {

std::string device_oom_message(const char* what, size_t bytes, cudaError_t e) {
  size_t free_b = 0, total_b = 0;
  const bool have = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
  (void)cudaGetLastError();
  const std::string phase = current_phase();
  constexpr double kMiB = 1 << 20;
  return fmt::format(
      "out of GPU memory{}: {} asked for {:.1f} MiB{} ({}; {})\nhint: to need less GPU memory, "
      "lower --micro_train_batch_size (training) or --micro_rollout_batch_size (log-probs), "
      "lower --vllm_gpu_memory_utilization (the generation KV cache's share of the GPU), add "
      "--gradient_checkpointing (recompute activations in backward) or --adam_offload (Adam "
      "state on the host)",
      phase.empty() ? "" : " during " + phase, what, double(bytes) / kMiB,
      have ? fmt::format(", {:.1f} MiB free of {:.1f} MiB", double(free_b) / kMiB,
                         double(total_b) / kMiB)
           : std::string(),
      cuda_error_string(e), error_context());
}

}  // namespace rlhf

#endif

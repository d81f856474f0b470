// cuDNN attention where there is none: builds without cuDNN or without the cudnn-frontend headers
// (CMakeLists.txt says which with a ✗ line) and the CUDA emulator (tests/cuda_emu has no cuDNN).
// Every problem is refused, so callers use the flash-attention kernels of attention.cu; the real
// implementation is attention_cudnn.cpp.
// Bad dimensions still throw, as the header promises.
#include "model/ops/attention.h"

#ifdef RLHF_CUDA

#include "model/ops/cuda/attention_cudnn_rules.h"

namespace rlhf::model {

bool attention_cudnn_available(int64_t, int64_t, int64_t, int64_t, int64_t) noexcept {
  return false;
}

int64_t attention_cudnn_runtime_version() noexcept {
  return 0;
}

bool attention_forward_cudnn(bf16*, float*, const bf16*, const bf16*, const bf16*, int64_t B,
                             int64_t T_, int64_t H, int64_t Hkv, int64_t D, cudaStream_t) {
  cudnn_attention::check_problem("attention_forward_cudnn", B, T_, H, Hkv, D);
  return false;
}

bool attention_backward_cudnn(bf16*, bf16*, bf16*, const bf16*, const bf16*, const float*,
                              const bf16*, const bf16*, const bf16*, int64_t B, int64_t T_,
                              int64_t H, int64_t Hkv, int64_t D, cudaStream_t) {
  cudnn_attention::check_problem("attention_backward_cudnn", B, T_, H, Hkv, D);
  return false;
}

}  // namespace rlhf::model

#endif  // RLHF_CUDA

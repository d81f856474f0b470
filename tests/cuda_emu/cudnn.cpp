// The emulator's cuDNN: none. The emulated build compiles
// model/ops/cuda/attention_cudnn_unavailable.cpp instead of the cudnn-frontend implementation, so
// cuDNN attention refuses every shape there and the flash kernels serve it, as on a GPU where
// cuDNN cannot. What remains here is what the rest of the project references when built with
// RLHF_CUDNN: cudnnGetErrorString (core/cuda_check.cpp) and cudnnGetVersion (the cuDNN attention
// test's skip reasons), with cuDNN 9's signatures.
#include <cudnn.h>

const char* cudnnGetErrorString(cudnnStatus_t status) {
  return status == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS"
                                        : "CUDNN_STATUS_NOT_SUPPORTED (CUDA emulator: no cuDNN)";
}

size_t cudnnGetVersion(void) {
  return CUDNN_VERSION;
}

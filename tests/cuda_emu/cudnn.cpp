// The emulator's cuDNN: none. The emulated build compiles
// model/ops/cuda/attention_cudnn_unavailable.cpp instead of the cudnn-frontend implementation, so
// cuDNN attention refuses every shape there and the flash kernels serve it, as on a GPU where
// cuDNN cannot. What remains here is what the rest of the project references when built with
// RLHF_CUDNN: cudnnGetErrorString (core/cuda_check.cpp) and cudnnGetVersion (the cuDNN attention
// test's skip reasons), with cuDNN 9's signatures.
#include <cudnn.h>

// The names of the statuses the project can meet here (the real library names every one).
const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED:
      return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER:
      return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_INTERNAL_ERROR:
      return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED:
      return "CUDNN_STATUS_EXECUTION_FAILED";
    default:
      return "CUDNN_STATUS (a status the CUDA emulator does not name)";
  }
}

size_t cudnnGetVersion(void) {
  return CUDNN_VERSION;
}

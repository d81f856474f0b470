// The emulator's cuDNN: none. The entry points the project references report
// CUDNN_STATUS_NOT_SUPPORTED, so code that asks cuDNN for an operation falls back to its own
// kernels, as it must on a GPU where cuDNN cannot serve the shape.
#include <cudnn.h>

const char* cudnnGetErrorString(cudnnStatus_t status) {
  return status == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS"
                                        : "CUDNN_STATUS_NOT_SUPPORTED (CUDA emulator: no cuDNN)";
}

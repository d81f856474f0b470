// The emulator's cuDNN: none. The entry points the project references report
// CUDNN_STATUS_NOT_SUPPORTED, so code that asks cuDNN for an operation falls back to its own
// kernels, as it must on a GPU where cuDNN cannot serve the shape.
//
// Referenced by model/ops/cuda/attention_cudnn.cpp (cuDNN fused attention through the backend
// graph API) and its test: every backend-descriptor call fails, so no graph or plan can be built
// and attention_cudnn_available / attention_forward_cudnn / attention_backward_cudnn answer false.
// cudnnGetVersion reports the version of the headers and the handle functions succeed (with a
// dummy handle), so the emulated run goes as far as building the first descriptor: the version
// and handle checks and the failure path of the plan builder are exercised, not skipped.
// Signatures are those of cuDNN 9's cudnn_graph.h; a function missing here is a link error of
// rlhf_core_emu.
#include <cudnn.h>

#include <cstdio>

// The real library's handle type is opaque; the emulator's is an empty placeholder.
struct cudnnContext {
  int unused = 0;
};

namespace {
cudnnContext emulated_handle;
constexpr const char* kNoCudnn = "CUDA emulator: no cuDNN";
}  // namespace

const char* cudnnGetErrorString(cudnnStatus_t status) {
  return status == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS"
                                        : "CUDNN_STATUS_NOT_SUPPORTED (CUDA emulator: no cuDNN)";
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (message != nullptr && max_size > 0) std::snprintf(message, max_size, "%s", kNoCudnn);
}

size_t cudnnGetVersion(void) {
  return CUDNN_VERSION;
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (handle == nullptr) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  *handle = &emulated_handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t) {
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t, cudaStream_t) {
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t,
                                           cudnnBackendDescriptor_t* descriptor) {
  if (descriptor != nullptr) *descriptor = nullptr;
  return CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t) {
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, const void*) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, int64_t* elementCount,
                                       void*) {
  if (elementCount != nullptr) *elementCount = 0;
  return CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t, cudnnBackendDescriptor_t,
                                  cudnnBackendDescriptor_t) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

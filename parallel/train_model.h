// TrainModel: one model as a trainer drives it — its training state (ParamStore) and its forward
// and backward — on the CPU (Transformer<float> over the store's UnitProvider) or on the GPU
// (TransformerCuda over a DeviceZero3Store). The trainers (rlhf sft, rm, ppo, grpo, bench) see
// only this interface, so one code path serves both backends.
#pragma once

#include <cstdint>
#include <memory>

#include "model/layout.h"
#include "parallel/param_store.h"

namespace rlhf::parallel {

class DeviceZero3Store;

/// The forward/backward contracts are those of model::Transformer (model/transformer.h): tokens
/// and targets (B, T) int32, lp / entropy / values and their gradients (B, T) fp32, all host
/// arrays; parameter gradients accumulate in the store until store().zero_grads(). Collective
/// over the store's communicator like the store's provider calls.
class TrainModel {
 public:
  virtual ~TrainModel() = default;
  virtual ParamStore& store() = 0;
  const model::ParamLayout& layout() { return store().layout(); }
  /// "cpu" or "cuda".
  virtual const char* device() const = 0;

  virtual void forward_lm(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                          float* lp, float* entropy, bool for_backward,
                          float inv_temperature = 1.0f) = 0;
  virtual void backward_lm(const float* dlp, const float* dentropy) = 0;
  virtual void forward_scalar(const int32_t* tokens, int64_t B, int64_t T, float* values,
                              bool for_backward) = 0;
  virtual void backward_scalar(const float* dvalues) = 0;
  /// Bytes of activation memory (host or device) the model currently holds.
  virtual int64_t activation_bytes() const = 0;
};

/// The CPU model over `store` (any ParamStore with a host provider).
std::unique_ptr<TrainModel> make_cpu_train_model(std::unique_ptr<ParamStore> store,
                                                 bool gradient_checkpointing);

#ifdef RLHF_CUDA
/// The GPU model over `store` (on the current CUDA device).
std::unique_ptr<TrainModel> make_cuda_train_model(std::unique_ptr<DeviceZero3Store> store,
                                                  bool gradient_checkpointing);
#endif

}  // namespace rlhf::parallel

#include "parallel/train_model.h"

#include "model/transformer.h"

#ifdef RLHF_CUDA
#include "model/transformer_cuda.h"
#include "parallel/device_store.h"
#endif

namespace rlhf::parallel {

namespace {

// Binds a network to a store and forwards every call with the store as its unit provider.
template <typename Store, typename Net, typename Provider>
class BoundModel final : public TrainModel {
 public:
  BoundModel(std::unique_ptr<Store> store, bool checkpointing, const char* device)
      : store_(std::move(store)), net_(store_->layout(), checkpointing), device_(device) {}
  ParamStore& store() override { return *store_; }
  const char* device() const override { return device_; }
  void forward_lm(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, float* lp,
                  float* entropy, bool for_backward, float inv_temperature) override {
    net_.forward_lm(provider(), tokens, targets, B, T, lp, entropy, for_backward, inv_temperature);
  }
  void backward_lm(const float* dlp, const float* dentropy) override {
    net_.backward_lm(provider(), dlp, dentropy);
  }
  void forward_scalar(const int32_t* tokens, int64_t B, int64_t T, float* values,
                      bool for_backward) override {
    net_.forward_scalar(provider(), tokens, B, T, values, for_backward);
  }
  void backward_scalar(const float* dvalues) override { net_.backward_scalar(provider(), dvalues); }
  int64_t activation_bytes() const override { return net_.activation_bytes(); }

 private:
  Provider& provider() {
    if constexpr (std::is_same_v<Provider, model::UnitProvider<float>>)
      return store_->provider();
    else
      return *store_;
  }
  std::unique_ptr<Store> store_;
  Net net_;
  const char* device_;
};

}  // namespace

std::unique_ptr<TrainModel> make_cpu_train_model(std::unique_ptr<ParamStore> store,
                                                 bool gradient_checkpointing) {
  return std::make_unique<
      BoundModel<ParamStore, model::Transformer<float>, model::UnitProvider<float>>>(
      std::move(store), gradient_checkpointing, "cpu");
}

#ifdef RLHF_CUDA
std::unique_ptr<TrainModel> make_cuda_train_model(std::unique_ptr<DeviceZero3Store> store,
                                                  bool gradient_checkpointing) {
  return std::make_unique<
      BoundModel<DeviceZero3Store, model::TransformerCuda, model::DeviceUnitProvider>>(
      std::move(store), gradient_checkpointing, "cuda");
}
#endif

}  // namespace rlhf::parallel

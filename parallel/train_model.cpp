#include "parallel/train_model.h"

#include <type_traits>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "parallel/lora_store.h"
#include "parallel/sweep_group.h"
#include "parallel/zero3.h"

#include "model/transformer.h"

#ifdef RLHF_CUDA
#include "model/transformer_cuda.h"
#include "parallel/lora_model_cuda.h"
#include "parallel/zero3_cuda.h"
#endif

namespace rlhf::parallel {

std::vector<size_t> sweep_groups(const std::vector<ForwardBatch>& batches, int64_t bytes_per_token,
                                 int64_t budget_bytes, int64_t min_groups) {
  std::vector<size_t> first{0};
  int64_t held = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    const int64_t bytes = batches[i].B * batches[i].seq_len * bytes_per_token;
    if (held > 0 && held + bytes > budget_bytes) {
      first.push_back(i);
      held = 0;
    }
    held += bytes;
  }
  if (!batches.empty()) first.push_back(batches.size());
  while (int64_t(first.size()) - 1 < min_groups) {
    size_t big = 0;  // the first group with the most batches
    for (size_t g = 1; g + 1 < first.size(); ++g)
      if (first[g + 1] - first[g] > first[big + 1] - first[big]) big = g;
    if (first.size() < 2 || first[big + 1] - first[big] < 2) {
      first.push_back(batches.size());  // an empty group
      continue;
    }
    const size_t mid = first[big] + (first[big + 1] - first[big] + 1) / 2;
    first.insert(first.begin() + std::ptrdiff_t(big) + 1, mid);
  }
  return first;
}

void TrainModel::forward_lm_sweep(const std::vector<ForwardBatch>& batches, float inv_temperature) {
  for (const ForwardBatch& b : batches)
    forward_lm(b.tokens, b.targets, b.B, b.seq_len, b.out, nullptr, false, inv_temperature, b.seqs);
}

void TrainModel::forward_scalar_sweep(const std::vector<ForwardBatch>& batches) {
  for (const ForwardBatch& b : batches)
    forward_scalar(b.tokens, b.B, b.seq_len, b.out, false, b.seqs);
}

void TrainModel::set_adapters_enabled(bool) {
  RLHF_FAIL("internal error: switching LoRA adapters on a model without adapters");
}

namespace {

// Binds a network to a store and forwards every call with the store as its unit provider.
template <typename Store, typename Net, typename Provider>
class BoundModel final : public TrainModel {
 public:
  BoundModel(std::unique_ptr<Store> store, bool checkpointing, const char* device, Comm* sweep_comm,
             int64_t sweep_budget_bytes, bool bf16)
      : store_(std::move(store)),
        net_(store_->layout(), checkpointing),
        device_(device),
        sweep_comm_(sweep_comm),
        sweep_budget_(sweep_budget_bytes) {
    if constexpr (std::is_same_v<Net, model::Transformer<float>>) {
      net_.set_bf16(bf16);
      if (auto* ls = dynamic_cast<LoraStore*>(store_.get())) {
        net_.set_lora(&ls->lora_layout(), ls->adapters(), ls->adapter_grads());
        lora_ = true;
      }
    }
  }
  bool has_adapters() const override { return lora_; }
  void set_adapters_enabled(bool on) override {
    if constexpr (std::is_same_v<Net, model::Transformer<float>>) {
      if (lora_) return net_.set_lora_enabled(on);
    }
    TrainModel::set_adapters_enabled(on);
  }
  ParamStore& store() override { return *store_; }
  const char* device() const override { return device_; }
  void forward_lm(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, float* lp,
                  float* entropy, bool for_backward, float inv_temperature,
                  model::SeqLens seqs) override {
    net_.forward_lm(provider(), tokens, targets, B, T, lp, entropy, for_backward, inv_temperature,
                    seqs);
  }
  void backward_lm(const float* dlp, const float* dentropy) override {
    net_.backward_lm(provider(), dlp, dentropy);
  }
  void forward_scalar(const int32_t* tokens, int64_t B, int64_t T, float* values, bool for_backward,
                      model::SeqLens seqs) override {
    net_.forward_scalar(provider(), tokens, B, T, values, for_backward, seqs);
  }
  void backward_scalar(const float* dvalues) override { net_.backward_scalar(provider(), dvalues); }
  void forward_lm_sweep(const std::vector<ForwardBatch>& batches, float inv_temperature) override {
    for_each_group(batches, net_.sweep_residual_bytes_per_token(), sweep_budget_, sweep_comm_,
                   [&](const std::vector<ForwardBatch>& g) {
                     net_.forward_lm_sweep(provider(), g, inv_temperature);
                   });
  }
  void forward_scalar_sweep(const std::vector<ForwardBatch>& batches) override {
    for_each_group(
        batches, net_.sweep_residual_bytes_per_token(), sweep_budget_, sweep_comm_,
        [&](const std::vector<ForwardBatch>& g) { net_.forward_scalar_sweep(provider(), g); });
  }
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
  bool lora_ = false;
  Comm* sweep_comm_;
  int64_t sweep_budget_;
};

}  // namespace

std::unique_ptr<TrainModel> make_cpu_train_model(std::unique_ptr<ParamStore> store,
                                                 bool gradient_checkpointing, Comm* sweep_comm,
                                                 int64_t sweep_budget_bytes, bool bf16) {
  return std::make_unique<
      BoundModel<ParamStore, model::Transformer<float>, model::UnitProvider<float>>>(
      std::move(store), gradient_checkpointing, "cpu", sweep_comm, sweep_budget_bytes, bf16);
}

#ifdef RLHF_CUDA
std::unique_ptr<TrainModel> make_cuda_train_model(std::unique_ptr<Zero3StoreCuda> store,
                                                  bool gradient_checkpointing, Comm* sweep_comm,
                                                  int64_t sweep_budget_bytes) {
  return std::make_unique<
      BoundModel<Zero3StoreCuda, model::TransformerCuda, model::UnitProviderCuda>>(
      std::move(store), gradient_checkpointing, "cuda", sweep_comm, sweep_budget_bytes, true);
}
#endif

#ifdef RLHF_CUDA
namespace {

// The device ZeRO-3 store of a model (frozen: bf16 weights only; else with fp32 masters, gradients
// and AdamW moments, on the host with --adam_offload). Throws rlhf::Error for a ZeRO stage other
// than 3, which the GPU path does not have.
std::unique_ptr<Zero3StoreCuda> make_cuda_store(const model::ParamLayout& layout, TrainRuntime& rt,
                                                const ZeroOptions& z, bool frozen) {
  RLHF_CHECK(z.zero_stage == 3,
             "--zero_stage {} with --device cuda: the GPU path shards with ZeRO-3 (--zero_stage "
             "3); the replicated ZeRO-0 baseline runs on the CPU only",
             z.zero_stage);
  Zero3OptionsCuda o;
  o.adam_offload = z.adam_offload && !frozen;
  o.frozen = frozen;
  o.keep_params_for_backward = z.zero_keep_params;
  return std::make_unique<Zero3StoreCuda>(layout, rt.device_comm.get(), o);
}

}  // namespace
#endif

std::unique_ptr<TrainModel> make_train_model(const model::ParamLayout& layout, TrainRuntime& rt,
                                             const ZeroOptions& z, bool frozen) {
  RLHF_ASSERT(rt.train_comm != nullptr);
  if (z.lora.enabled() && !frozen) return make_lora_train_model(layout, rt, z, z.lora, 0);
  const bool checkpointing = z.gradient_checkpointing && !frozen;
  if (rt.device == Device::kCuda) {
#ifdef RLHF_CUDA
    return make_cuda_train_model(make_cuda_store(layout, rt, z, frozen), checkpointing,
                                 rt.train_comm.get());
#endif
  }
  std::unique_ptr<ParamStore> store;
  if (frozen) {
    Zero3Options f;
    f.frozen = true;
    f.bf16_gather = rt.bf16;
    store = std::make_unique<Zero3Store>(layout, *rt.train_comm, f);
  } else {
    store = make_param_store(layout, *rt.train_comm, z, rt.bf16);
  }
  return make_cpu_train_model(std::move(store), checkpointing, rt.train_comm.get(),
                              kSweepResidualBytes, rt.bf16);
}

std::unique_ptr<TrainModel> make_lora_train_model(const model::ParamLayout& layout,
                                                  TrainRuntime& rt, const ZeroOptions& z,
                                                  const model::LoraConfig& lora, uint64_t seed) {
  RLHF_ASSERT(rt.train_comm != nullptr);
  model::LoraConfig cfg = lora;
  cfg.save_score = layout.head() != model::HeadKind::kLM;  // PEFT's modules_to_save (SEQ_CLS)
  if (rt.device == Device::kCuda) {
#ifdef RLHF_CUDA
    auto base = make_cuda_store(layout, rt, z, true);  // the frozen base
    return make_lora_cuda_model(
        std::make_unique<LoraStore>(std::move(base), cfg, *rt.train_comm, seed, false),
        z.gradient_checkpointing, rt.train_comm.get());
#endif
  }
  Zero3Options f;
  f.frozen = true;
  f.keep_params_for_backward = z.zero_keep_params;
  f.bf16_gather = rt.bf16;
  auto base = std::make_unique<Zero3Store>(layout, *rt.train_comm, f);
  return make_cpu_train_model(
      std::make_unique<LoraStore>(std::move(base), cfg, *rt.train_comm, seed),
      z.gradient_checkpointing, rt.train_comm.get(), kSweepResidualBytes, rt.bf16);
}

std::unique_ptr<ParamStore> make_param_store(const model::ParamLayout& layout, Comm& comm,
                                             const ZeroOptions& z, bool bf16_gather) {
  if (z.zero_stage == 0) {
    RLHF_CHECK(!z.adam_offload, "--adam_offload needs --zero_stage 3");
    if (comm.size() == 1) return std::make_unique<LocalParamStore>(layout, bf16_gather);
    return std::make_unique<ReplicatedStore>(layout, comm, bf16_gather);
  }
  if (comm.size() == 1 && !z.adam_offload)
    return std::make_unique<LocalParamStore>(layout, bf16_gather);  // nothing to shard
  Zero3Options o;
  o.adam_offload = z.adam_offload;
  o.keep_params_for_backward = z.zero_keep_params;
  o.bf16_gather = bf16_gather;
  return std::make_unique<Zero3Store>(layout, comm, o);
}

void log_memory(const ParamStore& store, int64_t activation_bytes, Comm& comm) {
  const auto m = store.memory();
  int64_t v[6] = {m.params_bytes, m.grads_bytes,    m.optimizer_bytes,
                  m.gather_bytes, activation_bytes, peak_rss_bytes()};
  int64_t mx[6];
  comm.all_reduce(v, mx, 6, ReduceOp::kMax);
  LOG0_INFO(
      "memory per rank (max over {} ranks): params {} | grads {} | optimizer {}{} | gather "
      "buffers {} | activations {} | peak RSS {}",
      comm.size(), format_bytes(double(mx[0])), format_bytes(double(mx[1])),
      format_bytes(double(mx[2])), m.optimizer_on_host ? " (host)" : "",
      format_bytes(double(mx[3])), format_bytes(double(mx[4])), format_bytes(double(mx[5])));
}

}  // namespace rlhf::parallel

// The GPU model of a LoRA run: TransformerCuda over a frozen bf16 base (Zero3StoreCuda) with the
// adapters of a LoraStore, whose master weights, reduced gradients and AdamW moments stay on the
// host (they are ∝ r); the model keeps the device copies the GEMMs read and the device gradients
// they write.
#pragma once

#ifdef RLHF_CUDA
#include <memory>

#include "model/ops/cuda_types.h"
#include "parallel/comm.h"
#include "parallel/lora_store.h"
#include "parallel/train_model.h"

namespace rlhf::parallel {

/// The model a LoRA training command trains with --device cuda. `store` must be a LoraStore over
/// a frozen Zero3StoreCuda (host_provider false). Before each forward, when the store's adapters
/// changed (optimizer step, load), they are uploaded as bf16 with every B pre-scaled by α/r
/// (TransformerCuda::set_lora); each backward accumulates fp32 adapter gradients on the device,
/// which are then added into the store's host accumulator (adapter_grads) and zeroed, so the
/// store's grad_sq_norm / adamw_step (host, sharded over the ranks) run as on the CPU. The base
/// gets no gradient (acquire_grads returns nullptr). has_adapters() is true (adapters_off_view
/// makes the reference policy). sweep_comm: as make_cuda_train_model. Throws rlhf::Error when the
/// store's base is not a Zero3StoreCuda.
std::unique_ptr<TrainModel> make_lora_cuda_model(std::unique_ptr<LoraStore> store,
                                                 bool gradient_checkpointing, Comm* sweep_comm,
                                                 int64_t sweep_budget_bytes = kSweepResidualBytes);

/// The device copy of the adapters that make_lora_cuda_model uploads: `adapters` (layout.numel()
/// fp32) as bf16 (out, numel), each B multiplied by α/r before its rounding, A and the score head's
/// copy as they are.
void lora_device_copy(const model::LoraLayout& layout, const float* adapters, model::bf16* out);

}  // namespace rlhf::parallel
#endif  // RLHF_CUDA

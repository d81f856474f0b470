// Forward-only sweeps of the Transformer over several micro-batches, unit-major: the experience
// passes (old and reference log-probs, values, reward-model scores) acquire each unit once for
// all their micro-batches, so a ZeRO-3 store gathers it once instead of once per micro-batch.
#include <algorithm>

#include "core/checked_alloc.h"
#include "core/error.h"
#include "model/layer_params.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "model/transformer.h"

namespace rlhf::model {

// Sizes the per-batch scratch for the largest batch and lays out every batch's residual stream
// and positions end to end, then embeds every batch into its rows of sweep_res_ and runs each layer
// over every batch (the layer's output goes through res_ and back into the batch's rows). Returns
// each batch's first row (token) in sweep_res_ and sweep_pos_. Per batch, the kernels and shapes
// are those of trunk_forward without backward, so the results are the same bit for bit.
template <typename T>
std::vector<int64_t> Transformer<T>::sweep_trunk(UnitProvider<T>& p,
                                                 const std::vector<ForwardBatch<T>>& batches) {
  lora_drop_pass_ = 0;  // evaluation passes: no LoRA dropout
  std::vector<int64_t> row;
  int64_t total = 0;
  for (const ForwardBatch<T>& b : batches) {
    RLHF_CHECK(b.B >= 1 && b.seq_len >= 1, "batch must be non-empty, got B={} T={}", b.B,
               b.seq_len);
    row.push_back(total);
    total += b.B * b.seq_len;
  }
  checked_grow(sweep_res_, total * C_, "activations (residual streams of a forward sweep)");
  checked_resize(sweep_pos_, total, "token positions (forward sweep)");
  for (size_t i = 0; i < batches.size(); ++i) {
    // Validates the shape (and packing), grows the per-batch scratch, lays out the positions.
    reserve(batches[i].B, batches[i].seq_len, false, batches[i].seqs);
    std::copy(pos_.begin(), pos_.begin() + N_, sweep_pos_.begin() + row[i]);
  }
  const int eu = layout_.embedding_unit();
  const T* emb = p.acquire_params(eu);
  for (size_t i = 0; i < batches.size(); ++i) {
    sweep_geometry(batches[i]);
    embedding_forward_cpu(sweep_res_.data() + row[i] * C_, batches[i].tokens,
                          emb + layout_.unit(eu).at("embed_tokens.weight").offset, N_, C_, V_);
    bf16_round(sweep_res_.data() + row[i] * C_, N_ * C_);
  }
  p.release_params(eu);
  sweep_layers(p, batches, row, sweep_res_.data(), sweep_pos_.data());
  return row;
}

template <typename T>
void Transformer<T>::forward_lm_sweep(UnitProvider<T>& p,
                                      const std::vector<ForwardBatch<T>>& batches,
                                      T inv_temperature) {
  check_head(true, "forward_lm_sweep");
  bf16_next_pass(&p);
  if (batches.empty()) return idle_sweep(p, true);
  p.begin_pass(false);
  const std::vector<int64_t> row = sweep_trunk(p, batches);
  inv_temperature_ = inv_temperature;
  head_forward(p, false, [&](const T* hp, const T* w) {
    for (size_t i = 0; i < batches.size(); ++i) {
      const ForwardBatch<T>& b = batches[i];
      sweep_geometry(b);
      targets_.assign(b.targets, b.targets + N_);
      final_norm(hp, sweep_res_.data() + row[i] * C_);
      lm_logprobs(w, b.out, nullptr, false);
    }
  });
  entropy_valid_ = false;
}

template <typename T>
void Transformer<T>::forward_scalar_sweep(UnitProvider<T>& p,
                                          const std::vector<ForwardBatch<T>>& batches) {
  check_head(false, "forward_scalar_sweep");
  bf16_next_pass(&p);
  if (batches.empty()) return idle_sweep(p, false);
  p.begin_pass(false);
  const std::vector<int64_t> row = sweep_trunk(p, batches);
  head_forward(p, false, [&](const T* hp, const T* score) {
    for (size_t i = 0; i < batches.size(); ++i) {
      const ForwardBatch<T>& b = batches[i];
      sweep_geometry(b);
      final_norm(hp, sweep_res_.data() + row[i] * C_);
      head_linear(b.out, lnf_.data(), score, N_, C_, int64_t(1), -2);
    }
  });
}

#define RLHF_INSTANTIATE_SWEEP(T)                                                                 \
  template std::vector<int64_t> Transformer<T>::sweep_trunk(UnitProvider<T>&,                     \
                                                            const std::vector<ForwardBatch<T>>&); \
  template void Transformer<T>::forward_lm_sweep(UnitProvider<T>&,                                \
                                                 const std::vector<ForwardBatch<T>>&, T);         \
  template void Transformer<T>::forward_scalar_sweep(UnitProvider<T>&,                            \
                                                     const std::vector<ForwardBatch<T>>&);
RLHF_INSTANTIATE_SWEEP(float)
RLHF_INSTANTIATE_SWEEP(double)
#undef RLHF_INSTANTIATE_SWEEP

}  // namespace rlhf::model

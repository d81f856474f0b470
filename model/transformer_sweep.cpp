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

// Embeds every batch into its slice of sweep_res_, then runs each layer over every batch (the
// layer's output goes through res_ and back into the slice). Returns each batch's offset in
// sweep_res_ (elements). Per batch, the kernels and shapes are those of trunk_forward without
// backward, so the results are the same bit for bit.
template <typename T>
std::vector<int64_t> Transformer<T>::sweep_trunk(UnitProvider<T>& p,
                                                 const std::vector<ForwardBatch<T>>& batches) {
  std::vector<int64_t> offset;
  int64_t total = 0;
  for (const ForwardBatch<T>& b : batches) {
    reserve(b.B, b.seq_len, false);  // validates the shape and sizes the per-batch scratch
    offset.push_back(total);
    total += N_ * C_;
  }
  checked_grow(sweep_res_, total, "activations (residual streams of a forward sweep)");
  have_backward_state_ = false;
  kept_ = false;
  const int eu = layout_.embedding_unit();
  const T* emb = p.acquire_params(eu);
  for (size_t i = 0; i < batches.size(); ++i) {
    const ForwardBatch<T>& b = batches[i];
    reserve(b.B, b.seq_len, false);
    embedding_forward_cpu(sweep_res_.data() + offset[i], b.tokens,
                          emb + layout_.unit(eu).at("embed_tokens.weight").offset, N_, C_, V_);
  }
  p.release_params(eu);
  for (int l = 0; l < L_; ++l) {
    const int u = layout_.layer_unit(l);
    const T* params = p.acquire_params(u);
    for (size_t i = 0; i < batches.size(); ++i) {
      reserve(batches[i].B, batches[i].seq_len, false);
      T* x = sweep_res_.data() + offset[i];
      Saved a;
      point_layer(a, layers_.data());
      layer_forward(params, l, x, res_.data(), a);
      std::copy(res_.data(), res_.data() + N_ * C_, x);
    }
    p.release_params(u);
  }
  return offset;
}

template <typename T>
void Transformer<T>::forward_lm_sweep(UnitProvider<T>& p,
                                      const std::vector<ForwardBatch<T>>& batches,
                                      T inv_temperature) {
  RLHF_CHECK(layout_.head() == HeadKind::kLM,
             "forward_lm_sweep needs a model with an LM head, not '{}'", to_string(layout_.head()));
  if (batches.empty()) return;
  p.begin_pass(false);
  const std::vector<int64_t> offset = sweep_trunk(p, batches);
  inv_temperature_ = inv_temperature;
  const int hu = layout_.head_unit(), eu = layout_.embedding_unit();
  const T* hp = p.acquire_params(hu);
  const T* w = acquire_lm_head(p, layout_, hp, static_cast<T*>(nullptr)).w;
  for (size_t i = 0; i < batches.size(); ++i) {
    const ForwardBatch<T>& b = batches[i];
    reserve(b.B, b.seq_len, false);
    targets_.assign(b.targets, b.targets + N_);
    final_norm(hp, sweep_res_.data() + offset[i]);
    lm_logprobs(w, b.out, nullptr, false);
  }
  if (layout_.config().tie_word_embeddings) p.release_params(eu);
  p.release_params(hu);
  p.end_pass(false);
  last_head_ = HeadKind::kLM;
  entropy_valid_ = false;
}

template <typename T>
void Transformer<T>::forward_scalar_sweep(UnitProvider<T>& p,
                                          const std::vector<ForwardBatch<T>>& batches) {
  RLHF_CHECK(layout_.head() != HeadKind::kLM,
             "forward_scalar_sweep needs a model with a value or reward head");
  if (batches.empty()) return;
  p.begin_pass(false);
  const std::vector<int64_t> offset = sweep_trunk(p, batches);
  const int hu = layout_.head_unit();
  const T* hp = p.acquire_params(hu);
  const T* score = hp + layout_.unit(hu).at("score.weight").offset;
  for (size_t i = 0; i < batches.size(); ++i) {
    const ForwardBatch<T>& b = batches[i];
    reserve(b.B, b.seq_len, false);
    final_norm(hp, sweep_res_.data() + offset[i]);
    linear_forward_cpu(b.out, lnf_.data(), score, static_cast<const T*>(nullptr), N_, C_,
                       int64_t(1));
  }
  p.release_params(hu);
  p.end_pass(false);
  last_head_ = layout_.head();
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

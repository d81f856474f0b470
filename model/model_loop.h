// ModelLoop: what the CPU model (Transformer<T>, model/transformer.h) and the GPU model
// (TransformerCuda, model/transformer_cuda.h) share above the decoder layer, written once: the
// model's dimensions and pass state, the batch geometry checks, and the loops over the decoder
// layers in the static unit order of model/provider.h — a forward pass (keeping every layer's
// activations for backward, or ping-ponging two residual slots), a backward pass (recomputing a
// layer's activations under gradient checkpointing) and a forward sweep over several batches (one
// acquire of each unit for all of them). The backend, Net (CRTP), supplies the steps:
//   Value* residual(int slot)                 the slot-th (N, C) residual-stream buffer
//   void point_layer(Acts& a, int set)        layer activation set `set` (model/activations.h)
//   void layer_forward(const P* params, int l, const Value* x_in, Value* x_out, Acts& a,
//                      const int32_t* pos)    one decoder layer (pos: nullptr = the batch's)
//   void layer_backward(const P* params, G* grads, int l, const Value* x_in, Acts& a,
//                       Value* dres)
//   void copy_rows(Value* dst, const Value* src, int64_t n)
// and its embedding, heads, buffers and transfers. Adding a loop feature (pipeline stages, a
// different unit order) is one edit here for both backends.
#pragma once

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "model/arch.h"
#include "model/layout.h"

namespace rlhf::model {

/// The shared part of a model over backend Net with activation values of type Value and
/// per-layer activations Acts (LayerActs<T>, LayerActsCuda). Not thread-safe.
template <typename Net, typename Value, typename Acts>
class ModelLoop {
 public:
  const ParamLayout& layout() const { return layout_; }

 protected:
  ModelLoop(const ParamLayout& layout, bool checkpointing)
      : layout_(layout), spec_(layer_spec(layout.config())), checkpointing_(checkpointing) {
    const ModelConfig& c = layout.config();
    C_ = c.hidden_size;
    F_ = c.intermediate_size;
    H_ = c.num_attention_heads;
    Hkv_ = c.num_key_value_heads;
    D_ = c.D();
    V_ = c.vocab_size;
    L_ = c.num_hidden_layers;
  }

  /// Checks a batch of B sequences of T tokens (non-empty, T <= max_position_embeddings) and
  /// makes it the current geometry. Throws rlhf::Error naming the bad value.
  void set_geometry(int64_t B, int64_t T) {
    RLHF_CHECK(B >= 1 && T >= 1, "batch must be non-empty, got B={} T={}", B, T);
    RLHF_CHECK(T <= layout_.config().max_position_embeddings,
               "sequence length {} exceeds max_position_embeddings {}", T,
               layout_.config().max_position_embeddings);
    B_ = B;
    T_ = T;
    N_ = B * T;
  }

  /// Activation sets a pass keeps: every layer's for backward without checkpointing, else one.
  int64_t layer_sets(bool for_backward) const { return (for_backward && !checkpointing_) ? L_ : 1; }
  /// Residual-stream slots a pass uses: every layer's input and the output for backward (L + 1),
  /// else two (ping-pong).
  int64_t residual_slots(bool for_backward) const { return for_backward ? L_ + 1 : 2; }

  /// The decoder layers of a forward pass over the current batch, whose embedding is in residual
  /// slot 0. With for_backward, slot l keeps layer l's input and set l its activations (set 0 for
  /// all under checkpointing); without, two slots ping-pong and one set is reused.
  template <typename Provider>
  void forward_layers(Provider& p, bool for_backward) {
    have_backward_state_ = false;
    kept_ = for_backward;
    for (int l = 0; l < L_; ++l) {
      const Value* x_in = net().residual(for_backward ? l : l % 2);
      Value* x_out = net().residual(for_backward ? l + 1 : (l + 1) % 2);
      Acts a;
      net().point_layer(a, (for_backward && !checkpointing_) ? l : 0);
      const int u = layout_.layer_unit(l);
      net().layer_forward(p.acquire_params(u), l, x_in, x_out, a, nullptr);
      p.release_params(u);
    }
  }

  /// The decoder layers of a backward pass, last to first: dres is d x_L in and d x_0 (the
  /// embedding's output gradient) out; parameter gradients accumulate into the provider's.
  /// Under checkpointing each layer's activations are recomputed first (its output equals the
  /// kept residual slot l + 1 bit for bit).
  template <typename Provider>
  void backward_layers(Provider& p, Value* dres) {
    for (int l = static_cast<int>(L_) - 1; l >= 0; --l) {
      const int u = layout_.layer_unit(l);
      const auto* params = p.acquire_params(u);
      auto* grads = p.acquire_grads(u);
      Acts a;
      const Value* x_in = net().residual(l);
      if (checkpointing_) {
        net().point_layer(a, 0);
        net().layer_forward(params, l, x_in, net().residual(l + 1), a, nullptr);
      } else {
        net().point_layer(a, l);
      }
      net().layer_backward(params, grads, l, x_in, a, dres);
      p.release_grads(u);
      p.release_params(u);
    }
  }

  /// The decoder layers of a forward sweep, unit-major: batch i (B = batches[i].B, T =
  /// batches[i].seq_len) has its residual stream at rows row[i].. of sweep_res (C wide) and its
  /// positions at sweep_pos + row[i]. Each unit is acquired once; each batch runs through residual
  /// slot 0 and activation set 0 (the kernels and shapes of a forward without backward, so the
  /// same bits) and is copied back into its rows. Leaves the last batch's geometry current.
  template <typename Provider, typename Batch>
  void sweep_layers(Provider& p, const std::vector<Batch>& batches, const std::vector<int64_t>& row,
                    Value* sweep_res, const int32_t* sweep_pos) {
    have_backward_state_ = false;
    kept_ = false;
    for (int l = 0; l < L_; ++l) {
      const int u = layout_.layer_unit(l);
      const auto* params = p.acquire_params(u);
      for (size_t i = 0; i < batches.size(); ++i) {
        sweep_geometry(batches[i]);
        Value* x = sweep_res + row[i] * C_;
        Acts a;
        net().point_layer(a, 0);
        net().layer_forward(params, l, x, net().residual(0), a, sweep_pos + row[i]);
        net().copy_rows(x, net().residual(0), N_ * C_);
      }
      p.release_params(u);
    }
  }

  /// B_, T_, N_ of one batch of a sweep (its scratch is sized for the largest).
  template <typename Batch>
  void sweep_geometry(const Batch& b) {
    B_ = b.B;
    T_ = b.seq_len;
    N_ = b.B * b.seq_len;
  }

  /// The residual stream after the last layer of the last forward pass.
  Value* x_last() { return net().residual(kept_ ? L_ : L_ % 2); }

  ParamLayout layout_;
  LayerSpec spec_;
  bool checkpointing_;
  int64_t C_, F_, H_, Hkv_, D_, V_, L_;
  // Current batch geometry and pass state.
  int64_t B_ = 0, T_ = 0, N_ = 0;
  bool have_backward_state_ = false;
  bool entropy_valid_ = false;
  bool kept_ = false;  // the last trunk forward kept every layer's activations
  HeadKind last_head_ = HeadKind::kLM;

 private:
  Net& net() { return static_cast<Net&>(*this); }
};

}  // namespace rlhf::model

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
//   void final_norm_backward(const P* hp, G* hg)  d RMSNorm(x_L) -> the residual gradient (hg:
//                                                 nullptr = frozen)
//   void trunk_backward(Provider& p)              the layers' and the embedding's backward
//   const P* score_weight(const P* hp)            a scalar head's weight (1, C) and where its
//   G* score_grad(G* hg)                          gradient goes, given the head unit's (LoRA:
//                                                 the adapters' trained copy)
// and its embedding, the heads' arithmetic, buffers and transfers. The heads' unit order (which
// units a head pass acquires and releases, and when) and their pass state are written here once
// (head_forward, head_backward). Adding a loop feature (pipeline stages, a different unit order)
// is one edit here for both backends.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "model/arch.h"
#include "model/forward_batch.h"
#include "model/layer_params.h"
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
  /// makes it the current geometry; with packed seqs (SeqLens) the B·T tokens hold seqs.n samples
  /// instead, each at most max_position_embeddings long (the row itself may be longer). Throws
  /// rlhf::Error naming the bad value.
  void set_geometry(int64_t B, int64_t T, SeqLens seqs = {}) {
    RLHF_CHECK(B >= 1 && T >= 1, "batch must be non-empty, got B={} T={}", B, T);
    set_segments(B, T, seqs);
    RLHF_CHECK(max_seg_ <= layout_.config().max_position_embeddings,
               "sequence length {} exceeds max_position_embeddings {}", max_seg_,
               layout_.config().max_position_embeddings);
    B_ = B;
    T_ = T;
    N_ = B * T;
  }
  /// cu_ and max_seg_ of a batch: seqs' boundaries (checked), or the B rows of T tokens.
  void set_segments(int64_t B, int64_t T, SeqLens seqs) {
    cu_.clear();
    if (!seqs.packed()) {
      for (int64_t b = 0; b <= B; ++b) cu_.push_back(int32_t(b * T));
      max_seg_ = T;
      return;
    }
    RLHF_CHECK(seqs.n >= 1 && seqs.cu[0] == 0 && seqs.cu[seqs.n] == B * T,
               "packed batch: cu_seqlens must run from 0 to B*T = {} over n >= 1 samples (got n "
               "= {}, from {} to {})",
               B * T, seqs.n, seqs.n >= 0 ? seqs.cu[0] : -1, seqs.n >= 0 ? seqs.cu[seqs.n] : -1);
    max_seg_ = 0;
    for (int64_t s = 0; s < seqs.n; ++s) {
      RLHF_CHECK(seqs.cu[s + 1] > seqs.cu[s], "packed batch: sample {} is empty", s);
      max_seg_ = std::max<int64_t>(max_seg_, seqs.cu[s + 1] - seqs.cu[s]);
    }
    cu_.assign(seqs.cu, seqs.cu + seqs.n + 1);
  }
  /// Whether the current batch's samples differ from its rows (packed with more than one sample a
  /// row somewhere): B rows of T tokens give cu_ = 0, T, ..., B·T.
  bool packed() const { return cu_.size() != size_t(B_) + 1 || max_seg_ != T_; }
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

  /// A forward sweep over no batches: acquires and releases every unit in the order a sweep does
  /// (embedding, layers, head and, for a tied LM head, the embedding again), computing nothing, so
  /// that a rank with nothing to sweep still takes part in a ZeRO-3 store's gathers (collective).
  /// lm_head: the sweep is an LM one (forward_lm_sweep). Ends any backward state.
  template <typename Provider>
  void idle_sweep(Provider& p, bool lm_head) {
    have_backward_state_ = false;
    p.begin_pass(false);
    const int eu = layout_.embedding_unit(), hu = layout_.head_unit();
    p.acquire_params(eu);
    p.release_params(eu);
    for (int l = 0; l < L_; ++l) {
      p.acquire_params(layout_.layer_unit(l));
      p.release_params(layout_.layer_unit(l));
    }
    p.acquire_params(hu);
    if (lm_head && layout_.config().tie_word_embeddings) {
      p.acquire_params(eu);
      p.release_params(eu);
    }
    p.release_params(hu);
    p.end_pass(false);
  }
  /// B_, T_, N_ of one batch of a sweep (its scratch is sized for the largest).
  template <typename Batch>
  void sweep_geometry(const Batch& b) {
    set_segments(b.B, b.seq_len, b.seqs);
    B_ = b.B;
    T_ = b.seq_len;
    N_ = b.B * b.seq_len;
  }

  /// Refuses a head pass (`what`, e.g. "forward_lm") on a model without the head it needs: an LM
  /// head (lm) or a value / reward head. Throws rlhf::Error naming `what` and the model's head.
  void check_head(bool lm, const char* what) const {
    if (lm)
      RLHF_CHECK(layout_.head() == HeadKind::kLM, "{} needs a model with an LM head, not '{}'",
                 what, to_string(layout_.head()));
    else
      RLHF_CHECK(layout_.head() != HeadKind::kLM, "{} needs a model with a value or reward head",
                 what);
  }
  /// Refuses a head backward (lm: backward_lm, else backward_scalar) that does not follow a
  /// forward of the same head with for_backward, or asks for an entropy gradient when that
  /// forward computed no entropy. Throws rlhf::Error.
  void check_backward(bool lm, bool entropy_grad) const {
    if (!lm) {
      RLHF_CHECK(have_backward_state_ && last_head_ != HeadKind::kLM,
                 "backward_scalar needs a preceding forward_scalar(for_backward = true)");
      return;
    }
    RLHF_CHECK(have_backward_state_ && last_head_ == HeadKind::kLM,
               "backward_lm needs a preceding forward_lm(for_backward = true)");
    RLHF_CHECK(!entropy_grad || entropy_valid_,
               "backward_lm with an entropy gradient needs forward_lm to compute the entropy");
  }

  /// The head of a forward pass (or sweep), after its trunk: acquires the head unit and, for an LM
  /// head tied to the embeddings, the embedding unit (acquire_lm_head), calls fn(hp, w) with the
  /// head unit's parameters hp and the head weight w (lm_head (V, C), or score (1, C)) to compute
  /// the outputs, releases the units and ends the pass. Every head pass of both backends takes
  /// its units in this order, as a ZeRO-3 store's collectives need. for_backward: a backward of
  /// this head may follow.
  template <typename Provider, typename Fn>
  void head_forward(Provider& p, bool for_backward, Fn&& fn) {
    const int hu = layout_.head_unit();
    const auto* hp = p.acquire_params(hu);
    if (layout_.head() == HeadKind::kLM) {
      using G = std::remove_pointer_t<decltype(p.acquire_grads(hu))>;
      const auto head = acquire_lm_head(p, layout_, hp, static_cast<G*>(nullptr));
      fn(hp, head.w);
      if (head.tied) p.release_params(layout_.embedding_unit());
    } else {
      fn(hp, net().score_weight(hp));
    }
    p.release_params(hu);
    p.end_pass(false);
    have_backward_state_ = for_backward;
    last_head_ = layout_.head();
  }

  /// The backward of the head and then of the trunk: begins the pass, acquires the head unit's
  /// parameters hp and gradients hg (and, for a tied LM head, the embedding's), calls fn(hp, w, dw)
  /// — which writes d loss / d RMSNorm(x_L) into the backend's buffer and accumulates the head
  /// weight's gradient into dw (nullptr: frozen) —, hands a tied head's embedding back at once (a
  /// ZeRO-3 store reduce-scatters its gradient part then instead of holding an embedding-sized
  /// buffer through the backward; the embedding's backward acquires it again and accumulates),
  /// runs net().final_norm_backward(hp, hg), releases the head unit, runs net().trunk_backward(p)
  /// and ends the pass.
  template <typename Provider, typename Fn>
  void head_backward(Provider& p, Fn&& fn) {
    p.begin_pass(true);
    const int hu = layout_.head_unit(), eu = layout_.embedding_unit();
    const auto* hp = p.acquire_params(hu);
    auto* hg = p.acquire_grads(hu);
    if (layout_.head() == HeadKind::kLM) {
      const auto head = acquire_lm_head(p, layout_, hp, hg);
      fn(hp, head.w, head.dw);
      if (head.tied) {
        p.release_grads(eu);
        p.release_params(eu);
      }
    } else {
      fn(hp, net().score_weight(hp), net().score_grad(hg));
    }
    net().final_norm_backward(hp, hg);
    p.release_grads(hu);
    p.release_params(hu);
    net().trunk_backward(p);
    have_backward_state_ = false;
    p.end_pass(true);
  }

  /// The residual stream after the last layer of the last forward pass.
  Value* x_last() { return net().residual(kept_ ? L_ : L_ % 2); }

  ParamLayout layout_;
  LayerSpec spec_;
  bool checkpointing_;
  int64_t C_, F_, H_, Hkv_, D_, V_, L_;
  // Current batch geometry and pass state.
  int64_t B_ = 0, T_ = 0, N_ = 0;
  // The batch's samples over its N_ tokens (SeqLens::cu; B_ rows of T_ when not packed) and the
  // longest of them.
  std::vector<int32_t> cu_;
  int64_t max_seg_ = 0;
  bool have_backward_state_ = false;
  bool entropy_valid_ = false;
  bool kept_ = false;  // the last trunk forward kept every layer's activations
  HeadKind last_head_ = HeadKind::kLM;

 private:
  Net& net() { return static_cast<Net&>(*this); }
};

}  // namespace rlhf::model

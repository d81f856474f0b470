// UnitProvider: how the model obtains full unit parameters and hands back unit gradients, without
// knowing whether they are local buffers (one process) or ZeRO-3 shards gathered on demand.
#pragma once

namespace rlhf::model {

/// The model calls acquire/release in its static unit order (forward: 0, 1..L, L+1; backward:
/// L+1, L..1, 0 — plus unit 0 again at the head when the LM head is tied to the embedding), so an
/// implementation can prefetch the next unit while the current one computes.
template <typename T>
class UnitProvider {
 public:
  virtual ~UnitProvider() = default;
  /// Full parameters of unit u (ParamLayout::unit(u) order, at least numel elements), valid until
  /// release_params(u). May block until a gather completes. Calls may nest (unit 0 at the head).
  virtual const T* acquire_params(int u) = 0;
  /// The caller no longer reads unit u's parameters.
  virtual void release_params(int u) = 0;
  /// Full gradient buffer of unit u; the model accumulates into it (+=). Valid until
  /// release_grads(u).
  virtual T* acquire_grads(int u) = 0;
  /// Unit u's gradient for this backward pass is complete (a ZeRO-3 provider reduce-scatters it).
  virtual void release_grads(int u) = 0;
  /// A forward (backward = false) or backward pass is about to start (prefetch hint).
  virtual void begin_pass(bool backward) { (void)backward; }
  /// The pass has ended; every acquired unit has been released.
  virtual void end_pass(bool backward) { (void)backward; }
};

}  // namespace rlhf::model

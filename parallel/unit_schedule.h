// UnitSchedule: the ZeRO-3 unit schedule both sharded stores share — the host Zero3Store
// (parallel/zero3.h) and the GPU Zero3StoreCuda (parallel/zero3_cuda.h). It keeps which units
// are gathered and by how many holders, walks the model's static unit order with a cursor to
// prefetch the next unit, and decides when a full copy is dropped; the store supplies how a
// gather is posted, waited for and freed (host buffers and MPI requests, or device buffers, NCCL
// and events).
#pragma once

#include <map>
#include <utility>

#include "core/error.h"

namespace rlhf::parallel {

/// The schedule of num_units units over gathered copies of type G (the store's record of one
/// gather: its buffer and completion handle; movable).
///
/// Static order (model/provider.h): forward acquires units 0, 1, …, U−1, backward U−1, …, 0.
/// The cursor is the next unit of that order; only an acquire at the cursor moves it, so a nested
/// acquire out of order (the tied LM head's unit 0) prefetches nothing. With prefetch, acquiring
/// the cursor's unit posts the gather of the one after it, and begin_pass posts the first.
/// A copy is dropped when its last holder releases it — except during a forward pass with
/// keep_params_for_backward, when it stays for backward; end_pass drops every copy nobody holds
/// (a prefetch past the end, or the kept copies once backward is done).
template <typename G>
class UnitSchedule {
 public:
  UnitSchedule(int num_units, bool prefetch, bool keep_params_for_backward)
      : num_units_(num_units), prefetch_(prefetch), keep_(keep_params_for_backward) {}

  bool backward() const { return backward_; }
  bool gathered(int u) const { return units_.count(u) != 0; }

  /// Starts a pass; posts (post(u) -> G) the gather of its first unit when prefetching.
  template <typename Post>
  void begin_pass(bool backward, Post&& post) {
    backward_ = backward;
    cursor_ = backward ? num_units_ - 1 : 0;
    if (prefetch_ && !gathered(cursor_)) units_.emplace(cursor_, Entry{post(cursor_), 0});
  }

  /// Unit u's gathered copy, posting its gather (post) when absent and waiting for it (wait(G&));
  /// one more holder. Then prefetches the next unit of the static order when u is the cursor's.
  template <typename Post, typename Wait>
  G& acquire(int u, Post&& post, Wait&& wait) {
    RLHF_ASSERT(u >= 0 && u < num_units_);
    auto it = units_.find(u);
    if (it == units_.end()) it = units_.emplace(u, Entry{post(u), 0}).first;
    wait(it->second.copy);
    ++it->second.refs;
    if (u == cursor_) {
      cursor_ = backward_ ? u - 1 : u + 1;
      if (prefetch_ && cursor_ >= 0 && cursor_ < num_units_ && !gathered(cursor_))
        units_.emplace(cursor_, Entry{post(cursor_), 0});
    }
    return it->second.copy;
  }

  /// One holder fewer of unit u; the copy is dropped (drop(G&), then forgotten) when none is
  /// left, unless a forward pass keeps it for backward.
  template <typename Drop>
  void release(int u, Drop&& drop) {
    auto it = units_.find(u);
    RLHF_ASSERT(it != units_.end() && it->second.refs > 0);
    if (--it->second.refs > 0) return;
    if (keep_ && !backward_) return;  // reused by backward
    drop(it->second.copy);
    units_.erase(it);
  }

  /// Ends a pass: drops (drop(G&)) every copy nobody holds, but the kept ones after a forward.
  template <typename Drop>
  void end_pass(bool backward, Drop&& drop) {
    const bool keep = keep_ && !backward;
    for (auto it = units_.begin(); it != units_.end();) {
      if (it->second.refs == 0 && !keep) {
        drop(it->second.copy);
        it = units_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  struct Entry {
    G copy;
    int refs = 0;
  };
  int num_units_;
  bool prefetch_, keep_;
  bool backward_ = false;
  int cursor_ = 0;
  std::map<int, Entry> units_;
};

}  // namespace rlhf::parallel

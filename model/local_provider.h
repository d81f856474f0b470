// LocalParams: every unit's full parameter and gradient buffer in local memory — the UnitProvider
// of a single process (and of tests).
#pragma once

#include <algorithm>
#include <vector>

#include "core/checked_alloc.h"
#include "model/init.h"
#include "model/layout.h"
#include "model/provider.h"

namespace rlhf::model {

/// Owns params and grads for all units of a layout (numel elements each, zero gaps).
/// acquire_* return the buffers directly; releases are no-ops. Gradients accumulate across
/// backward passes until zero_grads().
template <typename T>
class LocalParams : public UnitProvider<T> {
 public:
  explicit LocalParams(const ParamLayout& layout) : layout_(layout) {
    for (const UnitLayout& u : layout.units()) {
      checked_assign(params_.emplace_back(), u.numel, T(0),
                     fmt::format("the parameters of unit '{}'", u.name));
      checked_assign(grads_.emplace_back(), u.numel, T(0),
                     fmt::format("the gradients of unit '{}'", u.name));
    }
  }
  /// Deterministic init (see init_unit_params).
  void init(uint64_t seed, double std = 0.02) {
    for (int u = 0; u < layout_.num_units(); ++u)
      init_unit_params(params_[static_cast<size_t>(u)].data(), layout_.unit(u), seed, std);
  }
  void zero_grads() {
    for (auto& g : grads_) std::fill(g.begin(), g.end(), T(0));
  }
  const ParamLayout& layout() const { return layout_; }
  T* params(int u) { return params_.at(static_cast<size_t>(u)).data(); }
  T* grads(int u) { return grads_.at(static_cast<size_t>(u)).data(); }
  /// Pointer to tensor `hf_name` in the params (or grads) buffers.
  T* param(const std::string& hf_name) {
    auto [u, t] = layout_.locate(hf_name);
    return params(u) + t->offset;
  }
  T* grad(const std::string& hf_name) {
    auto [u, t] = layout_.locate(hf_name);
    return grads(u) + t->offset;
  }

  const T* acquire_params(int u) override { return params(u); }
  void release_params(int) override {}
  T* acquire_grads(int u) override { return grads(u); }
  void release_grads(int) override {}

 private:
  ParamLayout layout_;
  std::vector<std::vector<T>> params_, grads_;
};

}  // namespace rlhf::model

// Deterministic parameter initialisation, independent of how units are sharded or ordered.
#pragma once

#include <cstdint>

#include "model/layout.h"

namespace rlhf::model {

/// Fills the full flat buffer of unit `u` (u.numel elements): linear and embedding weights
/// ~ N(0, std²) (HF's initializer_range, 0.02 by default), norm weights = 1, biases = 0, gaps
/// between tensors = 0. Each value depends only on (seed, tensor name, element index) — a
/// counter-based generator (splitmix64 + Box–Muller) — so every rank and every shard count produces
/// the same weights.
template <typename T>
void init_unit_params(T* unit_buffer, const UnitLayout& u, uint64_t seed, double std = 0.02);

/// 64-bit FNV-1a hash of a string (stable across platforms; used to seed per-tensor streams).
uint64_t fnv1a64(const char* s, uint64_t h = 1469598103934665603ull);

/// Counter-based standard normal: deterministic in (key, index).
double counter_normal(uint64_t key, uint64_t index);

}  // namespace rlhf::model

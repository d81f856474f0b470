// Where a CPU training step's seconds go: wall time inside the heavy ops, per kind, for the
// benchmarks (rlhf bench train: GEMM, attention and bf16 rounding against the step).
#pragma once

#include <chrono>
#include <cstdint>

namespace rlhf::model {

/// What an OpClock counts. kGemm: the linear layers' GEMMs (OpenBLAS sgemm in fp32, oneDNN
/// matmuls in bf16; the LM head included). kAttention: the training attention kernels (their
/// per-head sgemms included). kBf16Round: rounding fp32 to bf16 and widening back
/// (float_to_bf16_n, round_to_bf16_n, bf16_to_float_n).
enum class OpKind : int { kGemm = 0, kAttention, kBf16Round, kCount };

/// Seconds of wall time the process spent in ops of kind k since it started (monotone; every
/// thread's top-level calls summed: a call made inside an OpenMP parallel region is not counted,
/// as its region's time is its caller's).
double op_seconds(OpKind k);

/// Counts the wall time of its scope as kind k (RAII), unless constructed inside an OpenMP
/// parallel region. Cost: two clock reads (~40 ns) per op call.
class OpClock {
 public:
  explicit OpClock(OpKind k);
  ~OpClock();
  OpClock(const OpClock&) = delete;
  OpClock& operator=(const OpClock&) = delete;

 private:
  OpKind kind_;
  bool counting_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace rlhf::model

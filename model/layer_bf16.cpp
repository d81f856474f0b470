#include "model/layer_bf16.h"

#include "core/error.h"
#include "model/ops/linear_decode.h"
#include "model/ops/matmul_bf16.h"

namespace rlhf::model {

namespace {

// src rounded to bfloat16 in a thread-local scratch buffer (one per operand role).
const bfloat16* to_bf16(std::vector<bfloat16>& s, const float* src, int64_t n) {
  if (int64_t(s.size()) < n) s.resize(size_t(n));
  float_to_bf16_n(s.data(), src, n);
  return s.data();
}

}  // namespace

const bfloat16* round_bf16_input(const LayerBf16* b, const float* x, int64_t n,
                                 std::vector<bfloat16>& buf) {
  if (b == nullptr || b->packed) return nullptr;
  return to_bf16(buf, x, n);
}

void project_forward_bf16(const LayerBf16& b, Proj p, float* y, const float* x, const float* bias,
                          int64_t N, int64_t IC, int64_t OC, const bfloat16* x16) {
  if (b.packed) {
    // The decode kernel widens the bf16 weights in registers; its x is rounded here so that the
    // products are the GEMM's (round(x) · round(w), fp32 accumulation), in a batch-invariant order.
    thread_local std::vector<float> xr;
    if (int64_t(xr.size()) < N * IC) xr.resize(size_t(N * IC));
    std::copy(x, x + N * IC, xr.data());
    round_to_bf16_n(xr.data(), N * IC);
    linear_decode_packed_bf16_cpu(y, xr.data(), b.w.weight(p), bias, N, IC, OC);
  } else {
    thread_local std::vector<bfloat16> sx;
    linear_forward_bf16(y, x16 != nullptr ? x16 : to_bf16(sx, x, N * IC), b.w.weight(p), bias, N,
                        IC, OC);
  }
  round_to_bf16_n(y, N * OC);
}

void project_backward_bf16(const LayerBf16& b, Proj p, float* dx, float* dw, float* db,
                           const float* dy, const float* x, int64_t N, int64_t IC, int64_t OC,
                           bool accumulate_dx, const bfloat16* x16) {
  RLHF_CHECK(!b.packed, "project_backward_bf16: packed (decode) weights have no backward");
  thread_local std::vector<bfloat16> sdy, sx;
  const bfloat16* dy16 = to_bf16(sdy, dy, N * OC);
  if (dw == nullptr)
    x16 = nullptr;
  else if (x16 == nullptr)
    x16 = to_bf16(sx, x, N * IC);
  // db sums the fp32 dy (which the backward chain already rounded where a GEMM produced it).
  linear_backward_bf16(dx, dw, nullptr, dy16, x16, b.w.weight(p), N, IC, OC, accumulate_dx);
  if (db != nullptr)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OC; ++o) db[o] += dy[n * OC + o];
  if (dx != nullptr) round_to_bf16_n(dx, N * IC);
}

const bfloat16* Bf16UnitCache::get(const float* src, int unit, int64_t n) {
  if (twins_ != nullptr)
    if (const bfloat16* t = twins_->bf16_twin(src, n)) return t;
  if (src != src_ || unit != unit_ || n != n_) {
    converted_ += n;
    if (int64_t(buf_.size()) < n) buf_.resize(size_t(n));
    float_to_bf16_n(buf_.data(), src, n);
    src_ = src;
    unit_ = unit;
    n_ = n;
  }
  return buf_.data();
}

}  // namespace rlhf::model

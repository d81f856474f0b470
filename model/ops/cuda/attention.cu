// Causal grouped-query attention on the GPU, flash-attention style (Dao et al. 2022; FA-2 loop
// order, Dao 2023): the (T, T) score matrix never exists in memory. Forward keeps the online
// softmax state (running max m, running sum l, un-normalised output) per query row in registers
// and saves lse = m + log l; backward recomputes P = exp(S − lse) tile by tile.
//
// Thread mapping (all kernels): a warp handles one query row at a time. For the scores, lane j
// takes key j of a 32-key tile and computes its whole dot product (q row broadcast from shared
// memory, key row from a padded shared tile: stride D + 1 keeps the 32 lanes on distinct banks
// for even D). For the D-long accumulators, lane j owns the dimensions d = j + 32·c, c < kDC
// (so D <= 32·kDC), and gets the per-key weights by __shfl_sync. Math is fp32 throughout (bf16
// only in memory); no tensor cores: this is the simple, checkable version.
//
// Masking: a (row t, key tile from s0) pair is only visited when s0 <= t, so the tile's first key
// is always visible and every running max is finite; keys s > t get score −inf (p = 0). Keys past
// T are loaded as zeros and are masked the same way (s > t for every t < T).
//
// Packed rows (varlen: pos != nullptr, sample packing): row t sees keys lo_t <= s <= t only, with
// lo_t = t − pos[t] the first token of its sample (positions restart at 0 per sample). A (row,
// tile) pair is then visited only when the tile also reaches lo_t (s0 + kBc > lo_t), so its first
// visible key max(s0, lo_t) <= t keeps the running max finite; the key loops start at the tile of
// the block's first row's lo, and dk/dv stop at the first query tile whose rows all start after
// the block's last key. pos = nullptr: lo_t = 0, the plain causal kernels.
#include <atomic>

#include "model/ops/attention.h"
#include "model/ops/cuda/attention_common.cuh"
#include "model/ops/cuda/cuda_common.cuh"

namespace rlhf::model {

using cuda::kWarpSize;
using cuda::to_bf16;
using cuda::to_f32;
using cuda::warp_max;
using cuda::warp_sum;
using namespace attn;

namespace {

// Loads rows [s0, s0 + kBc) of a (T, row_stride) bf16 matrix (columns [0, D)) into a (kBc, D + 1)
// fp32 shared tile; rows at or beyond `limit` become zeros.
__device__ __forceinline__ void load_tile(float* tile, const bf16* src, int64_t row_stride, int s0,
                                          int limit, int D) {
  const int ks = D + 1;
  for (int i = threadIdx.x; i < kBc * D; i += blockDim.x) {
    const int j = i / D, d = i % D, s = s0 + j;
    tile[j * ks + d] = s < limit ? to_f32(src[static_cast<int64_t>(s) * row_stride + d]) : 0.0f;
  }
}

// --- forward ---------------------------------------------------------------------------------

// Block: (b, h, query tile of kFwdBr rows); tiles ordered last-first so the longest ones start
// early. Shared: q tile (kFwdBr, D), K and V tiles (kBc, D + 1).
template <int kDC>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    attn_fwd_kernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                    const int32_t* pos, int T, int H, int Hkv, int D, float scale) {
  extern __shared__ float smem[];
  const int ks = D + 1;
  float* sq = smem;
  float* sk = sq + kFwdBr * D;
  float* sv = sk + kBc * ks;
  const int tiles = (T + kFwdBr - 1) / kFwdBr;
  const int tile = tiles - 1 - static_cast<int>(blockIdx.x % tiles);
  const int bh = static_cast<int>(blockIdx.x / tiles);
  const int b = bh / H, h = bh % H, g = h / (H / Hkv);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t qs = static_cast<int64_t>(H) * D, kvs = static_cast<int64_t>(Hkv) * D;
  const bf16* qb = q + static_cast<int64_t>(b) * T * qs + static_cast<int64_t>(h) * D;
  const bf16* kb = k + static_cast<int64_t>(b) * T * kvs + static_cast<int64_t>(g) * D;
  const bf16* vb = v + static_cast<int64_t>(b) * T * kvs + static_cast<int64_t>(g) * D;
  const int t0 = tile * kFwdBr;
  for (int i = threadIdx.x; i < kFwdBr * D; i += blockDim.x) {
    const int r = i / D, d = i % D, t = t0 + r;
    sq[i] = t < T ? to_f32(qb[static_cast<int64_t>(t) * qs + d]) : 0.0f;
  }
  float m[kFwdRows], l[kFwdRows], acc[kFwdRows][kDC];
#pragma unroll
  for (int rr = 0; rr < kFwdRows; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDC; ++c) acc[rr][c] = 0.0f;
  }
  const int t_last = min(T, t0 + kFwdBr) - 1;
  const int32_t* pos_b = pos != nullptr ? pos + static_cast<int64_t>(b) * T : nullptr;
  int lo[kFwdRows];  // first visible key of each row (its sample's first token)
#pragma unroll
  for (int rr = 0; rr < kFwdRows; ++rr) {
    const int t = t0 + warp * kFwdRows + rr;
    lo[rr] = pos_b != nullptr && t < T ? t - pos_b[t] : 0;
  }
  const int s_first = pos_b != nullptr ? (t0 - pos_b[t0]) / kBc * kBc : 0;
  for (int s0 = s_first; s0 <= t_last; s0 += kBc) {
    __syncthreads();  // the previous tiles are consumed (and sq is complete)
    load_tile(sk, kb, kvs, s0, T, D);
    load_tile(sv, vb, kvs, s0, T, D);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kFwdRows; ++rr) {
      const int r = warp * kFwdRows + rr, t = t0 + r;
      if (t >= T || s0 > t || s0 + kBc <= lo[rr]) continue;  // warp-uniform
      const int s = s0 + lane;
      const float score =
          s <= t && s >= lo[rr] ? dot_shared(sq + r * D, sk + lane * ks, D) * scale : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(score));  // finite: key s0 <= t is visible
      const float corr = expf(m[rr] - m_new);             // 0 on the first tile (m = −inf)
      const float p = expf(score - m_new);                // 0 for masked keys
      l[rr] = l[rr] * corr + warp_sum(p);
#pragma unroll
      for (int c = 0; c < kDC; ++c) acc[rr][c] *= corr;
      for (int j = 0; j < kBc; ++j) {
        const float pj = __shfl_sync(kFull, p, j);
        const float* vr = sv + j * ks;
#pragma unroll
        for (int c = 0; c < kDC; ++c) {
          const int d = lane + kWarpSize * c;
          if (d < D) acc[rr][c] += pj * vr[d];
        }
      }
      m[rr] = m_new;
    }
  }
  bf16* ob = out + static_cast<int64_t>(b) * T * qs + static_cast<int64_t>(h) * D;
#pragma unroll
  for (int rr = 0; rr < kFwdRows; ++rr) {
    const int t = t0 + warp * kFwdRows + rr;
    if (t >= T) continue;
    const float inv = 1.0f / l[rr];
#pragma unroll
    for (int c = 0; c < kDC; ++c) {
      const int d = lane + kWarpSize * c;
      if (d < D) ob[static_cast<int64_t>(t) * qs + d] = to_bf16(acc[rr][c] * inv);
    }
    if (lane == 0) lse[static_cast<int64_t>(bh) * T + t] = m[rr] + logf(l[rr]);
  }
}

// --- backward: dq ----------------------------------------------------------------------------

// Block: (b, h, query tile of kDqBr rows). Per row t: Δ_t = Σ_d dout·out, then per key s <= t:
// p = exp(q·k·scale − lse_t), dp = dout_t·v_s, ds = p·(dp − Δ_t); dq_t = scale · Σ_s ds·k_s.
// Shared: q and dout tiles (kDqBr, D), K and V tiles (kBc, D + 1).
template <int kDC>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    attn_bwd_dq_kernel(bf16* dq, const bf16* dout, const bf16* out, const float* lse, const bf16* q,
                       const bf16* k, const bf16* v, const int32_t* pos, int T, int H, int Hkv,
                       int D, float scale) {
  extern __shared__ float smem[];
  const int ks = D + 1;
  float* sq = smem;
  float* sdo = sq + kDqBr * D;
  float* sk = sdo + kDqBr * D;
  float* sv = sk + kBc * ks;
  const int tiles = (T + kDqBr - 1) / kDqBr;
  const int tile = tiles - 1 - static_cast<int>(blockIdx.x % tiles);
  const int bh = static_cast<int>(blockIdx.x / tiles);
  const int b = bh / H, h = bh % H, g = h / (H / Hkv);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t qs = static_cast<int64_t>(H) * D, kvs = static_cast<int64_t>(Hkv) * D;
  const int64_t qoff = static_cast<int64_t>(b) * T * qs + static_cast<int64_t>(h) * D;
  const bf16* kb = k + static_cast<int64_t>(b) * T * kvs + static_cast<int64_t>(g) * D;
  const bf16* vb = v + static_cast<int64_t>(b) * T * kvs + static_cast<int64_t>(g) * D;
  const int t0 = tile * kDqBr;
  for (int i = threadIdx.x; i < kDqBr * D; i += blockDim.x) {
    const int r = i / D, d = i % D, t = t0 + r;
    const int64_t idx = qoff + static_cast<int64_t>(t) * qs + d;
    sq[i] = t < T ? to_f32(q[idx]) : 0.0f;
    sdo[i] = t < T ? to_f32(dout[idx]) : 0.0f;
  }
  const int32_t* pos_b = pos != nullptr ? pos + static_cast<int64_t>(b) * T : nullptr;
  float row_lse[kDqRows], delta[kDqRows], acc[kDqRows][kDC];
  int lo[kDqRows];
#pragma unroll
  for (int rr = 0; rr < kDqRows; ++rr) {
    const int t = t0 + warp * kDqRows + rr;
    lo[rr] = pos_b != nullptr && t < T ? t - pos_b[t] : 0;
    float part = 0.0f;
    if (t < T)
      for (int d = lane; d < D; d += kWarpSize) {
        const int64_t idx = qoff + static_cast<int64_t>(t) * qs + d;
        part += to_f32(dout[idx]) * to_f32(out[idx]);
      }
    delta[rr] = warp_sum(part);
    row_lse[rr] = t < T ? lse[static_cast<int64_t>(bh) * T + t] : 0.0f;
#pragma unroll
    for (int c = 0; c < kDC; ++c) acc[rr][c] = 0.0f;
  }
  const int t_last = min(T, t0 + kDqBr) - 1;
  const int s_first = pos_b != nullptr ? (t0 - pos_b[t0]) / kBc * kBc : 0;
  for (int s0 = s_first; s0 <= t_last; s0 += kBc) {
    __syncthreads();
    load_tile(sk, kb, kvs, s0, T, D);
    load_tile(sv, vb, kvs, s0, T, D);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kDqRows; ++rr) {
      const int r = warp * kDqRows + rr, t = t0 + r;
      if (t >= T || s0 > t || s0 + kBc <= lo[rr]) continue;  // warp-uniform
      const int s = s0 + lane;
      float ds = 0.0f;
      if (s <= t && s >= lo[rr]) {
        const float p = expf(dot_shared(sq + r * D, sk + lane * ks, D) * scale - row_lse[rr]);
        const float dp = dot_shared(sdo + r * D, sv + lane * ks, D);
        ds = p * (dp - delta[rr]);
      }
      for (int j = 0; j < kBc; ++j) {
        const float dsj = __shfl_sync(kFull, ds, j);
        const float* kr = sk + j * ks;
#pragma unroll
        for (int c = 0; c < kDC; ++c) {
          const int d = lane + kWarpSize * c;
          if (d < D) acc[rr][c] += dsj * kr[d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kDqRows; ++rr) {
    const int t = t0 + warp * kDqRows + rr;
    if (t >= T) continue;
#pragma unroll
    for (int c = 0; c < kDC; ++c) {
      const int d = lane + kWarpSize * c;
      if (d < D) dq[qoff + static_cast<int64_t>(t) * qs + d] = to_bf16(acc[rr][c] * scale);
    }
  }
}

// --- backward: dk, dv ------------------------------------------------------------------------

// Block: (b, KV head g, key block [s0, s0 + 32)); warp w owns keys s0 + 8w .. s0 + 8w + 7, whose
// k, v rows and dk, dv accumulators live in registers (lane: dimensions d = lane + 32c). The block
// walks the G query heads of the group and, for each, the query rows t >= s0 in tiles of 32
// (q, dout, lse, Δ staged in shared memory), in a fixed order: dk, dv are deterministic.
//   p = exp(q_t·k_s·scale − lse_t), dp = dout_t·v_s, ds = p·(dp − Δ_t)
//   dv_s += p·dout_t,  dk_s += ds·q_t (·scale at the end)
template <int kDC>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    attn_bwd_dkdv_kernel(bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                         const bf16* q, const bf16* k, const bf16* v, const int32_t* pos, int T,
                         int H, int Hkv, int D, float scale) {
  extern __shared__ float smem[];
  float* sq = smem;                // (kDkvBr, D)
  float* sdo = sq + kDkvBr * D;    // (kDkvBr, D)
  float* slse = sdo + kDkvBr * D;  // (kDkvBr)
  float* sdelta = slse + kDkvBr;   // (kDkvBr)
  const int tiles = (T + kDkvBc - 1) / kDkvBc;
  const int tile = static_cast<int>(blockIdx.x % tiles);  // early key blocks have the most rows
  const int bg = static_cast<int>(blockIdx.x / tiles);
  const int b = bg / Hkv, g = bg % Hkv, G = H / Hkv;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t qs = static_cast<int64_t>(H) * D, kvs = static_cast<int64_t>(Hkv) * D;
  const int64_t kvoff = static_cast<int64_t>(b) * T * kvs + static_cast<int64_t>(g) * D;
  const int s0 = tile * kDkvBc;
  const int sw = s0 + warp * kKeysPerWarp;  // first key of this warp
  const int32_t* pos_b = pos != nullptr ? pos + static_cast<int64_t>(b) * T : nullptr;
  // Packed: the rows after the sample of the block's last key see none of its keys.
  const int s_last = min(T, s0 + kDkvBc) - 1, sw_last = sw + kKeysPerWarp - 1;
  auto row_lo = [&](int t) { return pos_b != nullptr ? t - pos_b[t] : 0; };
  float kr[kKeysPerWarp][kDC], vr[kKeysPerWarp][kDC], dka[kKeysPerWarp][kDC],
      dva[kKeysPerWarp][kDC];
#pragma unroll
  for (int j = 0; j < kKeysPerWarp; ++j) {
    const int s = sw + j;
#pragma unroll
    for (int c = 0; c < kDC; ++c) {
      const int d = lane + kWarpSize * c;
      const bool ok = s < T && d < D;
      const int64_t idx = kvoff + static_cast<int64_t>(s) * kvs + d;
      kr[j][c] = ok ? to_f32(k[idx]) : 0.0f;
      vr[j][c] = ok ? to_f32(v[idx]) : 0.0f;
      dka[j][c] = 0.0f;
      dva[j][c] = 0.0f;
    }
  }
  for (int hh = 0; hh < G; ++hh) {
    const int h = g * G + hh;
    const int64_t qoff = static_cast<int64_t>(b) * T * qs + static_cast<int64_t>(h) * D;
    const float* lse_bh = lse + (static_cast<int64_t>(b) * H + h) * T;
    for (int tq0 = s0; tq0 < T && row_lo(tq0) <= s_last; tq0 += kDkvBr) {
      __syncthreads();  // the previous query tile is consumed
      for (int i = threadIdx.x; i < kDkvBr * D; i += blockDim.x) {
        const int r = i / D, d = i % D, t = tq0 + r;
        const int64_t idx = qoff + static_cast<int64_t>(t) * qs + d;
        sq[i] = t < T ? to_f32(q[idx]) : 0.0f;
        sdo[i] = t < T ? to_f32(dout[idx]) : 0.0f;
      }
      for (int r = warp; r < kDkvBr; r += kWarps) {  // Δ_t and lse_t, one warp per row
        const int t = tq0 + r;
        float part = 0.0f;
        if (t < T)
          for (int d = lane; d < D; d += kWarpSize) {
            const int64_t idx = qoff + static_cast<int64_t>(t) * qs + d;
            part += to_f32(dout[idx]) * to_f32(out[idx]);
          }
        part = warp_sum(part);
        if (lane == 0) {
          sdelta[r] = part;
          slse[r] = t < T ? lse_bh[t] : 0.0f;
        }
      }
      __syncthreads();
      const int rows = min(kDkvBr, T - tq0);
      for (int r = 0; r < rows; ++r) {
        const int t = tq0 + r;
        if (t < sw) continue;  // every key of this warp is after t (warp-uniform)
        const int lo = row_lo(t);
        if (lo > sw_last) continue;  // every key of this warp precedes t's sample (warp-uniform)
        const float* qrow = sq + r * D;
        const float* dorow = sdo + r * D;
        float sc[kKeysPerWarp], dp[kKeysPerWarp];
#pragma unroll
        for (int j = 0; j < kKeysPerWarp; ++j) {
          sc[j] = 0.0f;
          dp[j] = 0.0f;
#pragma unroll
          for (int c = 0; c < kDC; ++c) {
            const int d = lane + kWarpSize * c;
            if (d < D) {
              sc[j] += qrow[d] * kr[j][c];
              dp[j] += dorow[d] * vr[j][c];
            }
          }
        }
#pragma unroll
        for (int j = 0; j < kKeysPerWarp; ++j) {
          sc[j] = warp_sum(sc[j]);
          dp[j] = warp_sum(dp[j]);
        }
        const float row_lse = slse[r], row_delta = sdelta[r];
#pragma unroll
        for (int j = 0; j < kKeysPerWarp; ++j) {
          const int s = sw + j;
          const float p = s <= t && s >= lo ? expf(sc[j] * scale - row_lse) : 0.0f;  // s <= t < T
          const float ds = p * (dp[j] - row_delta);
#pragma unroll
          for (int c = 0; c < kDC; ++c) {
            const int d = lane + kWarpSize * c;
            if (d < D) {
              dva[j][c] += p * dorow[d];
              dka[j][c] += ds * qrow[d];
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kKeysPerWarp; ++j) {
    const int s = sw + j;
    if (s >= T) continue;
#pragma unroll
    for (int c = 0; c < kDC; ++c) {
      const int d = lane + kWarpSize * c;
      if (d < D) {
        const int64_t idx = kvoff + static_cast<int64_t>(s) * kvs + d;
        dk[idx] = to_bf16(dka[j][c] * scale);
        dv[idx] = to_bf16(dva[j][c]);
      }
    }
  }
}

// --- launch helpers --------------------------------------------------------------------------

template <int kDC>
void launch_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                    const int32_t* pos, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                    cudaStream_t stream) {
  const size_t smem = sizeof(float) * static_cast<size_t>(kFwdBr * D + 2 * kBc * (D + 1));
  const unsigned grid = grid_1d(B * H * cuda::ceil_div(T, kFwdBr), "attention_forward_cuda");
  attn_fwd_kernel<kDC><<<grid, kWarps * kWarpSize, smem, stream>>>(
      out, lse, q, k, v, pos, static_cast<int>(T), static_cast<int>(H), static_cast<int>(Hkv),
      static_cast<int>(D), 1.0f / sqrtf(static_cast<float>(D)));
  CUDA_CHECK(cudaGetLastError());
}

template <int kDC>
void launch_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                     const float* lse, const bf16* q, const bf16* k, const bf16* v,
                     const int32_t* pos, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                     cudaStream_t stream) {
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const int Ti = static_cast<int>(T), Hi = static_cast<int>(H), Hkvi = static_cast<int>(Hkv),
            Di = static_cast<int>(D);
  const size_t smem_dq = sizeof(float) * static_cast<size_t>(2 * kDqBr * D + 2 * kBc * (D + 1));
  const unsigned grid_dq = grid_1d(B * H * cuda::ceil_div(T, kDqBr), "attention_backward_cuda");
  attn_bwd_dq_kernel<kDC><<<grid_dq, kWarps * kWarpSize, smem_dq, stream>>>(
      dq, dout, out, lse, q, k, v, pos, Ti, Hi, Hkvi, Di, scale);
  CUDA_CHECK(cudaGetLastError());
  const size_t smem_kv = sizeof(float) * static_cast<size_t>(2 * kDkvBr * D + 2 * kDkvBr);
  const unsigned grid_kv = grid_1d(B * Hkv * cuda::ceil_div(T, kDkvBc), "attention_backward_cuda");
  attn_bwd_dkdv_kernel<kDC><<<grid_kv, kWarps * kWarpSize, smem_kv, stream>>>(
      dk, dv, dout, out, lse, q, k, v, pos, Ti, Hi, Hkvi, Di, scale);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// --- launchers -------------------------------------------------------------------------------

namespace {
std::atomic<int> g_attention_impl{static_cast<int>(AttentionImpl::kFlash)};
}  // namespace

void set_attention_impl(AttentionImpl impl) noexcept {
  g_attention_impl.store(static_cast<int>(impl));
}
AttentionImpl attention_impl() noexcept {
  return static_cast<AttentionImpl>(g_attention_impl.load());
}

void attention_forward_cuda(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                            int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                            cudaStream_t stream) {
  attention_forward_cuda(out, lse, q, k, v, B, T_, H, Hkv, D, stream, attention_impl());
}

void attention_forward_cuda(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                            int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                            cudaStream_t stream, AttentionImpl impl) {
  NVTX_RANGE_FN();
  check_dims("attention_forward_cuda", B, T_, H, Hkv, D);
  if (impl == AttentionImpl::kCudnn &&
      attention_forward_cudnn(out, lse, q, k, v, B, T_, H, Hkv, D, stream))
    return;
  switch (d_chunks(D)) {
    case 1:
      return launch_forward<1>(out, lse, q, k, v, nullptr, B, T_, H, Hkv, D, stream);
    case 2:
      return launch_forward<2>(out, lse, q, k, v, nullptr, B, T_, H, Hkv, D, stream);
    default:
      return launch_forward<4>(out, lse, q, k, v, nullptr, B, T_, H, Hkv, D, stream);
  }
}

void attention_backward_cuda(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                             const float* lse, const bf16* q, const bf16* k, const bf16* v,
                             int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                             cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("attention_backward_cuda", B, T_, H, Hkv, D);
  if (attention_impl() == AttentionImpl::kCudnn &&
      attention_backward_cudnn(dq, dk, dv, dout, out, lse, q, k, v, B, T_, H, Hkv, D, stream))
    return;
  switch (d_chunks(D)) {
    case 1:
      return launch_backward<1>(dq, dk, dv, dout, out, lse, q, k, v, nullptr, B, T_, H, Hkv, D,
                                stream);
    case 2:
      return launch_backward<2>(dq, dk, dv, dout, out, lse, q, k, v, nullptr, B, T_, H, Hkv, D,
                                stream);
    default:
      return launch_backward<4>(dq, dk, dv, dout, out, lse, q, k, v, nullptr, B, T_, H, Hkv, D,
                                stream);
  }
}

void attention_forward_varlen_cuda(bf16* out, float* lse, const bf16* q, const bf16* k,
                                   const bf16* v, const int32_t* pos, int64_t N, int64_t H,
                                   int64_t Hkv, int64_t D, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("attention_forward_varlen_cuda", 1, N, H, Hkv, D);
  RLHF_CHECK(pos != nullptr, "attention_forward_varlen_cuda: pos is null");
  switch (d_chunks(D)) {
    case 1:
      return launch_forward<1>(out, lse, q, k, v, pos, 1, N, H, Hkv, D, stream);
    case 2:
      return launch_forward<2>(out, lse, q, k, v, pos, 1, N, H, Hkv, D, stream);
    default:
      return launch_forward<4>(out, lse, q, k, v, pos, 1, N, H, Hkv, D, stream);
  }
}

void attention_backward_varlen_cuda(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                                    const float* lse, const bf16* q, const bf16* k, const bf16* v,
                                    const int32_t* pos, int64_t N, int64_t H, int64_t Hkv,
                                    int64_t D, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("attention_backward_varlen_cuda", 1, N, H, Hkv, D);
  RLHF_CHECK(pos != nullptr, "attention_backward_varlen_cuda: pos is null");
  switch (d_chunks(D)) {
    case 1:
      return launch_backward<1>(dq, dk, dv, dout, out, lse, q, k, v, pos, 1, N, H, Hkv, D, stream);
    case 2:
      return launch_backward<2>(dq, dk, dv, dout, out, lse, q, k, v, pos, 1, N, H, Hkv, D, stream);
    default:
      return launch_backward<4>(dq, dk, dv, dout, out, lse, q, k, v, pos, 1, N, H, Hkv, D, stream);
  }
}

}  // namespace rlhf::model

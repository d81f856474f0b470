// Attention of decode steps on the GPU (model/ops/attention_decode.h): each sequence's new query
// rows against its cached keys and values (contiguous or paged), the keys split over
// kAttentionDecodeCtas blocks per (sequence, KV head) whose partial softmax states are then
// combined. Shares the flash kernels' thread geometry (attention_common.cuh).
#include "model/ops/attention.h"
#include "model/ops/attention_decode.h"
#include "model/ops/cuda/attention_common.cuh"
#include "model/ops/cuda/cuda_common.cuh"

namespace rlhf::model {

using cuda::bf16_pair_to_f32;
using cuda::kWarpSize;
using cuda::to_bf16;
using cuda::to_f32;
using cuda::warp_max;
using cuda::warp_sum;
using namespace attn;

namespace {

// --- decode ----------------------------------------------------------------------------------

// Where position s of sequence b, KV head g lives in a cache: block blk = table[b·max_blocks +
// s / block_size] (paged) or b (contiguous, table == nullptr), row s % block_size (paged) or s;
// element offset blk·blk_stride + g·head_stride + row·row_stride.
struct KvAddr {
  const int32_t* table = nullptr;
  int max_blocks = 0, block_size = 0;
  int64_t blk_stride = 0, head_stride = 0, row_stride = 0;
};

__device__ __forceinline__ int64_t kv_offset(const KvAddr& a, int b, int g, int s) {
  int64_t blk = b, row = s;
  if (a.table != nullptr) {
    blk = a.table[static_cast<int64_t>(b) * a.max_blocks + s / a.block_size];
    row = s % a.block_size;
  }
  return blk * a.blk_stride + static_cast<int64_t>(g) * a.head_stride + row * a.row_stride;
}

// Loads positions [s0, s0 + kBc) of (b, g) from both caches into (kBc, D + 1) fp32 shared tiles;
// positions at or beyond `limit` become zeros. One cache-row address per 8 elements and 16-byte
// loads (K and V issued together) when D % 8 == 0 (every row then starts 16-byte aligned), else
// element by element.
__device__ __forceinline__ void load_kv_tiles(float* __restrict__ tk, float* __restrict__ tv,
                                              const bf16* __restrict__ k_cache,
                                              const bf16* __restrict__ v_cache, const KvAddr& a,
                                              int b, int g, int s0, int limit, int D) {
  const int ks = D + 1;
  if (D % 8 == 0) {
    const int vpr = D / 8;  // 16-byte vectors per row
    for (int i = threadIdx.x; i < kBc * vpr; i += blockDim.x) {
      const int j = i / vpr, d0 = (i % vpr) * 8, s = s0 + j;
      uint4 rk{0, 0, 0, 0}, rv{0, 0, 0, 0};  // zeros at or beyond limit
      if (s < limit) {
        const int64_t off = kv_offset(a, b, g, s) + d0;
        rk = *reinterpret_cast<const uint4*>(k_cache + off);
        rv = *reinterpret_cast<const uint4*>(v_cache + off);
      }
      const uint32_t wk[4] = {rk.x, rk.y, rk.z, rk.w}, wv[4] = {rv.x, rv.y, rv.z, rv.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        tk[j * ks + d0 + e] = bf16_pair_to_f32(wk[e / 2], e % 2);
        tv[j * ks + d0 + e] = bf16_pair_to_f32(wv[e / 2], e % 2);
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < kBc * D; i += blockDim.x) {
    const int j = i / D, d = i % D, s = s0 + j;
    const int64_t off = s < limit ? kv_offset(a, b, g, s) + d : 0;
    tk[j * ks + d] = s < limit ? to_f32(k_cache[off]) : 0.0f;
    tv[j * ks + d] = s < limit ? to_f32(v_cache[off]) : 0.0f;
  }
}

// Block: (b, KV head g, part) for part < kAttentionDecodeCtas; it owns the key splits part,
// part + P, part + 2P, ... (P = kAttentionDecodeCtas, kAttentionDecodeSplit keys each) below
// len = lens[b] clamped to [0, cap], in that order, in tiles of 32, and writes their joint partial
// state (m, l, un-normalised acc) for every head of the group; a block that owns no key writes
// nothing (the combine reads only blocks part < ceil(len / split)). The grid does not grow with
// cap, so short sequences in a long cache neither wait on one block's serial walk nor launch
// empty blocks. Warp w handles the query heads hh = w, w + 4, ... (< G) of the group, so K/V are
// read once per group. Shared: q rows (G, D), K, V tiles.
template <int kDC>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    attn_decode_kernel(float* part_acc, float* part_ml, const bf16* q, const bf16* k_cache,
                       const bf16* v_cache, const int32_t* lens, KvAddr addr, int cap, int H,
                       int Hkv, int D, float scale) {
  extern __shared__ float smem[];
  constexpr int P = static_cast<int>(kAttentionDecodeCtas);
  constexpr int kSplit = static_cast<int>(kAttentionDecodeSplit);
  const int ks = D + 1;
  const int G = H / Hkv;
  float* sq = smem;        // (G, D)
  float* sk = sq + G * D;  // (kBc, ks)
  float* sv = sk + kBc * ks;
  const int part = static_cast<int>(blockIdx.x % P);  // not p: the softmax weight below
  const int bg = static_cast<int>(blockIdx.x / P);
  const int b = bg / Hkv, g = bg % Hkv;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int len = max(0, min(cap, lens[b]));
  if (part * kSplit >= len) return;  // block-uniform, before any barrier
  for (int i = threadIdx.x; i < G * D; i += blockDim.x)
    sq[i] = to_f32(q[(static_cast<int64_t>(b) * H + g * G) * D + i]);  // heads g·G .. g·G+G−1
  float m[kDecodeMaxHeadsPerWarp], l[kDecodeMaxHeadsPerWarp], acc[kDecodeMaxHeadsPerWarp][kDC];
#pragma unroll
  for (int i = 0; i < kDecodeMaxHeadsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDC; ++c) acc[i][c] = 0.0f;
  }
  for (int sp = part; sp * kSplit < len; sp += P) {  // block-uniform
    const int c0 = sp * kSplit, c1 = min(len, c0 + kSplit);
    for (int s0 = c0; s0 < c1; s0 += kBc) {  // block-uniform
      __syncthreads();
      load_kv_tiles(sk, sv, k_cache, v_cache, addr, b, g, s0, c1, D);
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kDecodeMaxHeadsPerWarp; ++i) {
        const int hh = warp + kWarps * i;
        if (hh >= G) continue;  // warp-uniform
        const int s = s0 + lane;
        const float score = s < c1 ? dot_shared(sq + hh * D, sk + lane * ks, D) * scale : -INFINITY;
        const float m_new = fmaxf(m[i], warp_max(score));  // finite: key s0 < c1
        const float corr = expf(m[i] - m_new);
        const float p = expf(score - m_new);
        l[i] = l[i] * corr + warp_sum(p);
#pragma unroll
        for (int c = 0; c < kDC; ++c) acc[i][c] *= corr;
        for (int j = 0; j < kBc; ++j) {
          const float pj = __shfl_sync(kFull, p, j);
          const float* vrow = sv + j * ks;
#pragma unroll
          for (int c = 0; c < kDC; ++c) {
            const int d = lane + kWarpSize * c;
            if (d < D) acc[i][c] += pj * vrow[d];
          }
        }
        m[i] = m_new;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kDecodeMaxHeadsPerWarp; ++i) {
    const int hh = warp + kWarps * i;
    if (hh >= G) continue;
    const int64_t slot = (static_cast<int64_t>(b) * H + g * G + hh) * P + part;
#pragma unroll
    for (int c = 0; c < kDC; ++c) {
      const int d = lane + kWarpSize * c;
      if (d < D) part_acc[slot * D + d] = acc[i][c];
    }
    if (lane == 0) {
      part_ml[2 * slot] = m[i];
      part_ml[2 * slot + 1] = l[i];
    }
  }
}

// Block per (b, h), threads over d: over the blocks p < n = min(P, ceil(len / split)) that wrote a
// partial state (attn_decode_kernel), M = max of m over those with l > 0, L = Σ l·exp(m − M),
// out = Σ acc·exp(m − M) / L (0 when len = 0). Partials combined in index order.
__global__ void attn_decode_combine_kernel(bf16* out, const float* part_acc, const float* part_ml,
                                           const int32_t* lens, int cap, int H, int D) {
  constexpr int P = static_cast<int>(kAttentionDecodeCtas);
  constexpr int kSplit = static_cast<int>(kAttentionDecodeSplit);
  const int64_t bh = blockIdx.x;
  const int len = max(0, min(cap, lens[bh / H]));
  const int n = min(P, (len + kSplit - 1) / kSplit);
  const float* ml = part_ml + bh * P * 2;
  const float* pa = part_acc + bh * P * D;
  float M = -INFINITY;
  for (int i = 0; i < n; ++i)
    if (ml[2 * i + 1] > 0.0f) M = fmaxf(M, ml[2 * i]);
  float L = 0.0f;
  for (int i = 0; i < n; ++i)
    if (ml[2 * i + 1] > 0.0f) L += ml[2 * i + 1] * expf(ml[2 * i] - M);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int i = 0; i < n; ++i)
      if (ml[2 * i + 1] > 0.0f) o += pa[static_cast<int64_t>(i) * D + d] * expf(ml[2 * i] - M);
    out[bh * D + d] = to_bf16(L > 0.0f ? o / L : 0.0f);
  }
}

template <int kDC>
void launch_decode(float* part_acc, float* part_ml, const bf16* q, const bf16* k_cache,
                   const bf16* v_cache, const int32_t* lens, const KvAddr& addr, int64_t cap,
                   int64_t B, int64_t H, int64_t Hkv, int64_t D, cudaStream_t stream) {
  const int64_t G = H / Hkv;
  const size_t smem = sizeof(float) * static_cast<size_t>(G * D + 2 * kBc * (D + 1));
  const unsigned grid = grid_1d(B * Hkv * kAttentionDecodeCtas, "attention_decode_cuda");
  attn_decode_kernel<kDC><<<grid, kWarps * kWarpSize, smem, stream>>>(
      part_acc, part_ml, q, k_cache, v_cache, lens, addr, static_cast<int>(cap),
      static_cast<int>(H), static_cast<int>(Hkv), static_cast<int>(D),
      1.0f / sqrtf(static_cast<float>(D)));
  CUDA_CHECK(cudaGetLastError());
}

// Both decode entry points: split over keys up to `cap` positions, then combine.
void decode(bf16* out, float* workspace, const bf16* q, const bf16* k_cache, const bf16* v_cache,
            const int32_t* lens, const KvAddr& addr, int64_t cap, int64_t B, int64_t H, int64_t Hkv,
            int64_t D, cudaStream_t stream) {
  RLHF_CHECK(H / Hkv <= kWarps * kDecodeMaxHeadsPerWarp,
             "attention_decode_cuda: {} query heads per KV head (H={} Hkv={}) is above the {} this "
             "kernel supports",
             H / Hkv, H, Hkv, kWarps * kDecodeMaxHeadsPerWarp);
  RLHF_CHECK(workspace != nullptr, "attention_decode_cuda: workspace is null");
  float* part_acc = workspace;                                    // (B, H, P, D)
  float* part_ml = workspace + B * H * kAttentionDecodeCtas * D;  // (B, H, P, 2)
  switch (d_chunks(D)) {
    case 1:
      launch_decode<1>(part_acc, part_ml, q, k_cache, v_cache, lens, addr, cap, B, H, Hkv, D,
                       stream);
      break;
    case 2:
      launch_decode<2>(part_acc, part_ml, q, k_cache, v_cache, lens, addr, cap, B, H, Hkv, D,
                       stream);
      break;
    default:
      launch_decode<4>(part_acc, part_ml, q, k_cache, v_cache, lens, addr, cap, B, H, Hkv, D,
                       stream);
      break;
  }
  const int block = D <= 32 ? 32 : D <= 64 ? 64 : 128;
  attn_decode_combine_kernel<<<grid_1d(B * H, "attention_decode_cuda"), block, 0, stream>>>(
      out, part_acc, part_ml, lens, static_cast<int>(cap), static_cast<int>(H),
      static_cast<int>(D));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

size_t attention_decode_cuda_workspace_bytes(int64_t B, int64_t H, int64_t D, int64_t T_max) {
  RLHF_CHECK(B > 0 && H > 0 && D > 0 && T_max > 0,
             "attention_decode_cuda_workspace_bytes: dimensions must be > 0, got B={} H={} D={} "
             "T_max={}",
             B, H, D, T_max);
  return static_cast<size_t>(B * H * kAttentionDecodeCtas * (D + 2)) * sizeof(float);
}

void attention_decode_cuda(bf16* out, float* workspace, const bf16* q, const bf16* k_cache,
                           const bf16* v_cache, const int32_t* lens, int64_t B, int64_t T_max,
                           int64_t H, int64_t Hkv, int64_t D, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("attention_decode_cuda", B, T_max, H, Hkv, D);
  KvAddr a;  // (B, T_max, Hkv, D): sequence b is "block" b, token-major
  a.blk_stride = T_max * Hkv * D;
  a.head_stride = D;
  a.row_stride = Hkv * D;
  decode(out, workspace, q, k_cache, v_cache, lens, a, T_max, B, H, Hkv, D, stream);
}

size_t attention_decode_paged_cuda_workspace_bytes(int64_t B, int64_t H, int64_t D,
                                                   int64_t max_blocks, int64_t block_size) {
  RLHF_CHECK(max_blocks > 0 && block_size > 0,
             "attention_decode_paged_cuda_workspace_bytes: max_blocks and block_size must be > 0, "
             "got {} and {}",
             max_blocks, block_size);
  return attention_decode_cuda_workspace_bytes(B, H, D, max_blocks * block_size);
}

void attention_decode_paged_cuda(bf16* out, float* workspace, const bf16* q, const bf16* k_cache,
                                 const bf16* v_cache, const int32_t* block_table,
                                 const int32_t* seq_lens, int64_t B, int64_t H, int64_t Hkv,
                                 int64_t D, int64_t num_blocks, int64_t block_size,
                                 int64_t max_blocks, cudaStream_t stream) {
  NVTX_RANGE_FN();
  check_dims("attention_decode_paged_cuda", B, max_blocks * block_size, H, Hkv, D);
  RLHF_CHECK(num_blocks > 0 && block_size > 0 && max_blocks > 0 && block_table != nullptr,
             "attention_decode_paged_cuda: need num_blocks, block_size, max_blocks > 0 and a "
             "block table, got {}, {}, {}",
             num_blocks, block_size, max_blocks);
  KvAddr a;  // (num_blocks, Hkv, block_size, D): head-major blocks (vLLM's layout)
  a.table = block_table;
  a.max_blocks = static_cast<int>(max_blocks);
  a.block_size = static_cast<int>(block_size);
  a.blk_stride = Hkv * block_size * D;
  a.head_stride = block_size * D;
  a.row_stride = D;
  decode(out, workspace, q, k_cache, v_cache, seq_lens, a, max_blocks * block_size, B, H, Hkv, D,
         stream);
}

}  // namespace rlhf::model

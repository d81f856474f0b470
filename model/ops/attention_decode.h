// Decode attention: one new query token per sequence attending over that sequence's cached keys
// and values, for a batch of sequences of different lengths (grouped-query aware). The cache is
// paged (vLLM's PagedAttention layout): fixed-size blocks of positions, and a block table per
// sequence that lists its blocks in order. A contiguous per-sequence cache is the special case
// block_size = capacity with one block per sequence.
#pragma once

#include <cstdint>

#include "model/ops/cuda_types.h"
#include "model/ops/half.h"

namespace rlhf::model {

/// For each sequence b and query head h (g = h / (H/Hkv), n = seq_lens[b]):
///   out[b,h,:] = Σ_{s<n} softmax_s(q[b,h]·K_b[s,g] / sqrt(D)) · V_b[s,g]
/// where position s of sequence b lives in block blk = block_table[b·max_blocks + s / block_size],
/// row r = s % block_size, and each block stores its KV heads one after the other (head-major, as
/// vLLM's cache does, so that one head's rows of a block are contiguous):
///   K_b[s,g] = k_cache[((blk·Hkv + g)·block_size + r)·D ... + D)   (same for V).
/// The query attends to all n cached positions, so the current token's K/V must already be in the
/// cache (position n − 1) — the same result as row n − 1 of attention_forward_cpu over the whole
/// prefix.
///
/// out, q: (B, H, D) (q after RoPE); k_cache, v_cache: (num_blocks, Hkv, block_size, D);
/// block_table: (B, max_blocks) int32 block ids in [0, num_blocks) (entries past a sequence's
/// ceil(n / block_size) blocks are not read); seq_lens: (B) int32 in [1, max_blocks·block_size].
/// out is assigned (=) and must not alias q. Each (b, h) is computed alone (scores, softmax with
/// exp_fast for float, weighted sum of values, in position order), so a sequence's result does not
/// depend on the other sequences of the batch or on the thread count. OpenMP over (b, KV head);
/// fp32 with head_dim ≤ 128 takes an AVX-512 path when the build has it.
/// KV, the cache's element type: T, or f16 (model/ops/half.h; instantiated for T = float and
/// double) — each element widened exactly to T as it is read, so the result is that of the T
/// kernel on the fp16-rounded keys and values, from half the bytes.
/// Throws rlhf::Error, before computing anything, on a dimension ≤ 0, H % Hkv != 0, a length out
/// of range or a block id out of range.
template <typename T, typename KV = T>
void attention_decode_cpu(T* out, const T* q, const KV* k_cache, const KV* v_cache,
                          const int32_t* block_table, const int32_t* seq_lens, int64_t B, int64_t H,
                          int64_t Hkv, int64_t D, int64_t num_blocks, int64_t block_size,
                          int64_t max_blocks);

#ifdef RLHF_CUDA
/// fp32 workspace bytes attention_decode_paged_cuda needs (kAttentionDecodeCtas partial results
/// per sequence and query head, model/ops/attention.h; max_blocks and block_size are validated).
size_t attention_decode_paged_cuda_workspace_bytes(int64_t B, int64_t H, int64_t D,
                                                   int64_t max_blocks, int64_t block_size);

/// attention_decode_cpu on the GPU: the same paged layout, the same result (the flash-decoding
/// kernel of attention_decode_cuda, model/ops/attention.h, reading K/V through the block table).
/// out, q (B, H, D) bf16; k_cache, v_cache (num_blocks, Hkv, block_size, D) bf16; block_table
/// (B, max_blocks) and seq_lens (B) int32 in device memory (lengths clamped to
/// [0, max_blocks·block_size]; 0 gives out = 0); workspace of
/// attention_decode_paged_cuda_workspace_bytes bytes. Block ids and lengths are not validated on
/// the device: the host that builds the table keeps them in range. Throws rlhf::Error on bad
/// dimensions (D > 128, H/Hkv > 16, non-positive sizes).
void attention_decode_paged_cuda(bf16* out, float* workspace, const bf16* q, const bf16* k_cache,
                                 const bf16* v_cache, const int32_t* block_table,
                                 const int32_t* seq_lens, int64_t B, int64_t H, int64_t Hkv,
                                 int64_t D, int64_t num_blocks, int64_t block_size,
                                 int64_t max_blocks, cudaStream_t stream);
#endif

}  // namespace rlhf::model

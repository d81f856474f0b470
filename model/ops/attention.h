// Causal grouped-query scaled-dot-product attention (Vaswani et al. 2017, eq. 1; GQA: Ainslie et
// al. 2023): query head h reads key/value head h / (H / Hkv).
#pragma once

#include <cstdint>

#include "model/ops/cuda_types.h"

namespace rlhf::model {

/// out[b,t,h,:] = Σ_{s≤t} softmax_s(q[b,t,h]·k[b,s,g] / sqrt(D)) · v[b,s,g], g = h / (H/Hkv).
/// q, out: (B, T, H, D); k, v: (B, T, Hkv, D); att: (B, H, T, T) softmax probabilities saved for
/// backward (entries s > t are zero). All assigned (=). q/k/v are expected after RoPE.
/// CPU: OpenMP over (b, h), BLAS GEMMs per block of query rows (single-threaded inside the
/// parallel region), the masked upper triangle skipped block by block. Inputs must be finite:
/// inside a block of 64 query rows a non-finite v at a later position meets a zero probability,
/// and 0·NaN would reach the earlier rows. Throws rlhf::Error if a dimension is ≤ 0 or
/// H % Hkv != 0.
template <typename T>
void attention_forward_cpu(T* out, T* att, const T* q, const T* k, const T* v, int64_t B,
                           int64_t T_, int64_t H, int64_t Hkv, int64_t D);

/// Backward of attention_forward_cpu, with P = att, S = q·kᵀ/sqrt(D):
///   dv = Pᵀ·dout,  dP = dout·vᵀ,  dS = P ⊙ (dP − rowsum(P ⊙ dP)),
///   dq = dS·k / sqrt(D),  dk = dSᵀ·q / sqrt(D)
/// (all assigned (=); dk/dv sum over the H/Hkv query heads of each group, in a fixed order, so the
/// result is deterministic and independent of the thread count). dq, dout: (B, T, H, D);
/// dk, dv: (B, T, Hkv, D); att, q, k, v as in forward. Needs no scratch from the caller (allocates
/// one (64, T) block per thread per call). Throws like forward.
template <typename T>
void attention_backward_cpu(T* dq, T* dk, T* dv, const T* dout, const T* att, const T* q,
                            const T* k, const T* v, int64_t B, int64_t T_, int64_t H, int64_t Hkv,
                            int64_t D);

/// Sample packing (varlen, as flash-attn's *_varlen_func): q, out (N, H, D), k, v (N, Hkv, D) hold
/// n_seqs samples end to end, sample s at tokens [cu_seqlens[s], cu_seqlens[s+1]) (cu_seqlens:
/// (n_seqs + 1) int32 from 0, strictly ascending); each token attends causally to its own sample
/// only (block-diagonal causal mask). att: the probabilities of sample s as (H, n_s, n_s) at
/// offset H·Σ_{s'<s} n_s'² (at most H·N·max n_s elements). Same kernel as attention_forward_cpu
/// (which is this function with cu_seqlens = 0, T, 2T, ...): each sample's result is bit for bit
/// that of the sample alone. Throws rlhf::Error on bad dimensions or cu_seqlens.
template <typename T>
void attention_forward_varlen_cpu(T* out, T* att, const T* q, const T* k, const T* v,
                                  const int32_t* cu_seqlens, int64_t n_seqs, int64_t H, int64_t Hkv,
                                  int64_t D);

/// Backward of attention_forward_varlen_cpu (the formulas of attention_backward_cpu per sample);
/// shapes and layout as forward, dq, dk, dv assigned.
template <typename T>
void attention_backward_varlen_cpu(T* dq, T* dk, T* dv, const T* dout, const T* att, const T* q,
                                   const T* k, const T* v, const int32_t* cu_seqlens,
                                   int64_t n_seqs, int64_t H, int64_t Hkv, int64_t D);

#ifdef RLHF_CUDA
/// The implementation behind attention_forward_cuda / attention_backward_cuda (process-wide,
/// --attn_implementation): kFlash, the flash-attention kernels of model/ops/cuda/attention.cu
/// (deterministic; the default), or kCudnn, cuDNN's fused attention wherever
/// attention_cudnn_available says it can serve the shape, the kernels elsewhere. The two share
/// the lse contract, so a forward by one and a backward by the other agree.
enum class AttentionImpl { kFlash, kCudnn };
void set_attention_impl(AttentionImpl impl) noexcept;
AttentionImpl attention_impl() noexcept;

/// CUDA forward, flash-attention style (Dao et al. 2022, Alg. 1 with the FA-2 loop order): same
/// causal GQA result, but instead of the (B, H, T, T) probabilities it saves the row
/// log-sum-exp for backward. out, q (B, T, H, D) bf16; k, v (B, T, Hkv, D) bf16; lse (B, H, T)
/// fp32 = log Σ_{s≤t} exp(q·k_s/sqrt(D)). One block per (b, h, 16 query rows): K/V tiles of 32
/// keys in shared memory, online softmax in fp32 registers (scalar FMA, no tensor cores), tiles
/// above the diagonal skipped. D <= 128 (any value, odd included). Throws rlhf::Error like the CPU
/// version, and if D > 128.
void attention_forward_cuda(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                            int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                            cudaStream_t stream);
/// The same with the implementation chosen by the caller instead of attention_impl(): the
/// generation engine's prefill passes kFlash, since prompt lengths vary per request and cuDNN
/// would build (compile) a plan for every new length.
void attention_forward_cuda(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                            int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                            cudaStream_t stream, AttentionImpl impl);

/// CUDA backward (FA-2 backward, recomputing P from q, k and lse): dq (B, T, H, D), dk, dv
/// (B, T, Hkv, D) bf16, all assigned. dout, out (B, T, H, D) bf16 (out: forward's output, for
/// Δ_t = rowsum(dout ⊙ out)); lse from forward; q, k, v as forward. Deterministic without atomics:
/// one kernel owns blocks of 32 keys of a KV head and loops over its G query heads and all later
/// query rows in a fixed order (dk, dv), another owns blocks of 8 query rows (dq).
void attention_backward_cuda(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                             const float* lse, const bf16* q, const bf16* k, const bf16* v,
                             int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                             cudaStream_t stream);

/// Sample packing on the device (varlen; the CPU's attention_forward_varlen_cpu): q, out (N, H, D),
/// k, v (N, Hkv, D) bf16 hold samples end to end; pos (N) int32 device, the RoPE positions, which
/// restart at 0 at each sample's first token and count up by one inside it (any other layout is
/// the caller's error: the kernels read lo_t = t − pos[t] as the first key row t may see). Token t
/// attends to keys lo_t..t only (block-diagonal causal). lse (H, N) fp32. The flash kernels of
/// attention_forward_cuda with the extra lower bound (the same masks and lse contract, so a sample
/// alone gives the same result up to the online softmax's tile split); always the flash kernels,
/// whatever attention_impl() says: cuDNN's graphs here are built per dense (B, T) shape and would
/// need a plan per packing layout. Throws rlhf::Error like attention_forward_cuda.
void attention_forward_varlen_cuda(bf16* out, float* lse, const bf16* q, const bf16* k,
                                   const bf16* v, const int32_t* pos, int64_t N, int64_t H,
                                   int64_t Hkv, int64_t D, cudaStream_t stream);

/// Backward of attention_forward_varlen_cuda (the flash backward of attention_backward_cuda with
/// the same lower bound; deterministic): dq (N, H, D), dk, dv (N, Hkv, D) bf16 assigned; the other
/// arguments as forward and attention_backward_cuda.
void attention_backward_varlen_cuda(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                                    const float* lse, const bf16* q, const bf16* k, const bf16* v,
                                    const int32_t* pos, int64_t N, int64_t H, int64_t Hkv,
                                    int64_t D, cudaStream_t stream);

/// Keys per split of attention_decode_cuda (flash-decoding: the keys of one sequence and KV head
/// are cut into splits of this many positions; a second kernel combines the partial results).
inline constexpr int64_t kAttentionDecodeSplit = 64;
/// Blocks per (sequence, KV head) of attention_decode_cuda: block p takes splits p, p + P, ...,
/// so a short sequence in a long cache spreads its few splits over several blocks and the grid
/// (and workspace) does not grow with the cache length. Fixed, so results do not depend on the
/// device, the cache capacity or the batch.
inline constexpr int64_t kAttentionDecodeCtas = 16;

/// fp32 workspace bytes attention_decode_cuda needs: B·H·kAttentionDecodeCtas·(D + 2)·4 (T_max is
/// validated, and does not change the size).
size_t attention_decode_cuda_workspace_bytes(int64_t B, int64_t H, int64_t D, int64_t T_max);

/// One decoding step over a KV cache (one query per sequence, it attends to every cached position
/// s < lens[b], its own included). out, q (B, H, D) bf16; k_cache, v_cache (B, T_max, Hkv, D)
/// bf16 (sequence b's keys at positions 0..lens[b]−1); lens (B) int32 device, clamped to
/// [0, T_max]; a sequence with lens[b] = 0 gets out = 0. workspace: device memory of
/// attention_decode_cuda_workspace_bytes(B, H, D, T_max) bytes (fp32 partial results; contents on
/// entry ignored). K/V of a group are read once for its G query heads. D <= 128, G = H/Hkv <= 16.
/// Throws rlhf::Error on bad dimensions.
void attention_decode_cuda(bf16* out, float* workspace, const bf16* q, const bf16* k_cache,
                           const bf16* v_cache, const int32_t* lens, int64_t B, int64_t T_max,
                           int64_t H, int64_t Hkv, int64_t D, cudaStream_t stream);

// --- cuDNN fused attention (model/ops/cuda/attention_cudnn.cpp) ---------------------------------
// cuDNN's fused flash-attention engines (tensor cores), one graph per shape built with NVIDIA's
// cudnn-frontend (its SDPA forward and backward nodes): the same causal GQA attention and the
// same lse contract as attention_forward_cuda / attention_backward_cuda, so either backward can
// follow either forward. Built only with RLHF_CUDNN (cuDNN and the cudnn-frontend headers found
// at configure time); without it, and on the CUDA emulator, the three functions refuse every
// problem (bad dimensions still throw) and the caller uses the hand-written kernels.

/// True when cuDNN's fused attention can serve this problem on the current device: a device is
/// present, cuDNN 9 at run time (not 9.10.0/9.10.1), compute capability >= 8.0, T > 1,
/// D % 8 == 0 and D <= 128, H % Hkv == 0, and cuDNN builds both the forward and the backward
/// execution plan for (B, T, H, Hkv, D); T need not be a multiple of anything. Plans are built on
/// the first query of a shape (this can take a second or more: cuDNN compiles the kernels) and
/// cached per (device, shape, direction), a negative answer included. Never throws (any failure
/// answers false).
bool attention_cudnn_available(int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D) noexcept;

/// cuDNN's version (cudnnGetVersion(), e.g. 91400 for 9.14.0) when its fused attention can run
/// on the current device — a build with cuDNN and cudnn-frontend, a cuDNN at run time that
/// attention_cudnn_available accepts, compute capability >= 8.0 — else 0 (builds without cuDNN,
/// the CUDA emulator, older GPUs). What --attn_implementation auto decides by. Never throws.
int64_t attention_cudnn_runtime_version() noexcept;

/// Same contract as attention_forward_cuda: out (B, T, H, D) bf16 =, lse (B, H, T) fp32 =
/// natural-log log-sum-exp of the scaled causal scores q·k/sqrt(D); q (B, T, H, D), k, v
/// (B, T, Hkv, D) bf16; query head h reads KV head h / (H/Hkv). Enqueued on `stream` (workspace
/// via cudaMallocAsync/cudaFreeAsync on it). Returns false, and launches nothing, when cuDNN
/// cannot serve the problem (see attention_cudnn_available; also when a pointer is not 16-byte
/// aligned); the caller then falls back to attention_forward_cuda. Throws rlhf::Error like
/// attention_forward_cuda on bad dimensions (a dimension <= 0, H % Hkv != 0), and (CUDNN_CHECK /
/// CUDA_CHECK) when a call fails after the plan was built.
bool attention_forward_cudnn(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                             int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                             cudaStream_t stream);

/// Same contract as attention_backward_cuda: dq (B, T, H, D), dk, dv (B, T, Hkv, D) bf16, all
/// assigned (=); dout, out (B, T, H, D) bf16; lse (B, H, T) fp32 from either forward; q, k, v as
/// forward. dQ is accumulated in fp32 in a workspace (cuDNN may use atomics there, so unlike
/// attention_backward_cuda the result is not guaranteed bitwise reproducible). Returns false and
/// launches nothing when cuDNN cannot serve the problem; throws like attention_forward_cudnn.
bool attention_backward_cudnn(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out,
                              const float* lse, const bf16* q, const bf16* k, const bf16* v,
                              int64_t B, int64_t T_, int64_t H, int64_t Hkv, int64_t D,
                              cudaStream_t stream);
#endif

}  // namespace rlhf::model

// bf16 GEMMs on the CPU through oneDNN's matmul: bfloat16 operands, fp32 accumulation and fp32
// results — the numerics of the CUDA backend's cuBLASLt GEMMs (CUBLAS_COMPUTE_32F) with fp32
// outputs. oneDNN picks the kernel for the CPU it runs on (AMX tiles, AVX512-BF16 dot products, or
// an emulation through fp32 FMAs on older AVX-512 parts; onednn_matmul_impl names it).
//
// Built without oneDNN (CMake RLHF_ONEDNN=OFF or libdnnl-dev missing) every function below still
// links: onednn_available() is false and the GEMMs throw rlhf::Error; the CPU then computes in fp32
// only (model/ops/linear.h).
//
// Primitives are created once per (data type, shapes, transposes, leading dimensions, accumulate,
// bias, OpenMP thread count) and cached for the life of the process; the threads are OpenMP's
// (`--threads`: omp_get_max_threads() when the call is made). At a fixed shape and thread count the
// results are bit-identical from call to call (tests/ops/test_matmul_bf16.cpp checks it); across
// thread counts they may differ in the last bits (oneDNN may split K differently).
#pragma once

#include <cstdint>
#include <string>

#include "model/ops/half.h"

namespace rlhf::model {

/// True when this build calls oneDNN (compile definition RLHF_ONEDNN).
bool onednn_available();

/// "oneDNN 2.6.3 (OpenMP)" from the library at run time, or "none (built without oneDNN)".
std::string onednn_version_string();

/// The kernel oneDNN chooses for a GEMM of M×N×K (C = A·Bᵀ, the linear layer's forward) in the
/// given operand type: its impl_info_str(), e.g. "brg:avx512_core_amx", "gemm:jit". bf16 = false:
/// fp32 operands. Creates (and caches) the primitive. "none (built without oneDNN)" without it.
/// Throws rlhf::Error when oneDNN refuses the shape.
std::string onednn_matmul_impl(bool bf16, int64_t M, int64_t N, int64_t K);

/// Primitives the cache holds at most by default. Ragged micro-batches (--packing_samples,
/// --use_dynamic_batch) give a new M, hence a new primitive, at nearly every step; the least
/// recently used ones go past this bound, so the cache stays bounded over a long run.
inline constexpr int64_t kDefaultMatmulCacheCapacity = 256;

/// The oneDNN primitive cache of the GEMMs here (one primitive per shape: operand type,
/// transposes, M, N, K, leading dimensions, accumulation and omp_get_max_threads(), so a change of
/// --threads creates new primitives sized for it; least recently used ones evicted past
/// `capacity`): entries held, and lookups that found an entry (hits) or created one (misses) and
/// entries dropped (evictions) since the process started. Counts zero without oneDNN.
struct MatmulCacheStats {
  int64_t entries = 0, hits = 0, misses = 0, evictions = 0;
  int64_t capacity = kDefaultMatmulCacheCapacity;
};
MatmulCacheStats onednn_matmul_cache_stats();

/// Sets the cache's bound (entries, >= 1), evicting the least recently used entries past it, and
/// returns the previous bound (for tests). Throws rlhf::Error when capacity < 1.
int64_t set_onednn_matmul_cache_capacity(int64_t capacity);

/// C (M, N) fp32 = op(A) · op(B), or += when accumulate, with bf16 operands and fp32 accumulation.
/// Row-major: op(A) is (M, K) — A is (M, K) with leading dimension lda, or (K, M) when trans_a;
/// op(B) is (K, N) — B is (K, N), or (N, K) when trans_b. bias: (N) fp32 added to every row, or
/// nullptr. M == 0 or N == 0 is a no-op; K == 0 gives C = 0 (or leaves it, accumulating) plus the
/// bias. Throws rlhf::Error on a negative dimension, a leading dimension smaller than its row, or
/// without oneDNN.
void matmul_bf16_cpu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bfloat16* A,
                     int64_t lda, const bfloat16* B, int64_t ldb, const float* bias, float* C,
                     int64_t ldc, bool accumulate);

/// matmul_bf16_cpu without the bias (C = op(A)·op(B), or += when accumulate), run on the calling
/// thread alone: for many small GEMMs issued from inside an OpenMP parallel region, one per thread
/// (CPU attention in bf16, model/ops/attention_bf16.h). Each call brings its thread's own oneDNN
/// scratchpad (the primitive is created in oneDNN's user scratchpad mode), so threads may run the
/// same cached primitive at once. Not counted by OpClock. Throws like matmul_bf16_cpu.
void matmul_bf16_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        const bfloat16* A, int64_t lda, const bfloat16* B, int64_t ldb, float* C,
                        int64_t ldc, bool accumulate);

/// matmul_bf16_cpu's contract with fp32 operands (oneDNN's fp32 matmul: the benchmark's second
/// reference, next to OpenBLAS sgemm).
void matmul_f32_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                       int64_t lda, const float* B, int64_t ldb, const float* bias, float* C,
                       int64_t ldc, bool accumulate);

/// The linear layer's forward in bf16: y (N, OC) fp32 = x (N, IC) · w (OC, IC)ᵀ + b (OC) fp32 or
/// nullptr, assigned. x, w bfloat16. Throws like matmul_bf16_cpu.
void linear_forward_bf16(float* y, const bfloat16* x, const bfloat16* w, const float* b, int64_t N,
                         int64_t IC, int64_t OC);

/// The linear layer's backward in bf16, with fp32 results (linear_backward_cpu's contract):
///   dx (N, IC)  = dy · w   (+= when accumulate_dx; skipped when dx is nullptr)
///   dw (OC, IC) += dyᵀ · x (skipped when dw is nullptr: a frozen weight)
///   db (OC)     += Σ_n dy  (skipped when db is nullptr; fp32 column sums in row order, which do
///                           not depend on the thread count)
/// dy (N, OC), x (N, IC), w (OC, IC) bfloat16. Throws like matmul_bf16_cpu.
void linear_backward_bf16(float* dx, float* dw, float* db, const bfloat16* dy, const bfloat16* x,
                          const bfloat16* w, int64_t N, int64_t IC, int64_t OC, bool accumulate_dx);

/// linear_forward_cpu<float>'s signature (model::LinearFn<float>) computed in bf16: x and w are
/// rounded to bfloat16 (to nearest, ties to even) into thread-local scratch, then
/// linear_forward_bf16. y = round(x) · round(w)ᵀ + b in fp32, not rounded itself.
void linear_forward_bf16_cpu(float* y, const float* x, const float* w, const float* b, int64_t N,
                             int64_t IC, int64_t OC);

/// linear_backward_cpu<float>'s signature computed in bf16: dy, x and w are rounded to bfloat16
/// into thread-local scratch (only those a requested output needs), then linear_backward_bf16;
/// db sums the fp32 dy as given. dw == nullptr skips the weight gradient (a frozen weight).
void linear_backward_bf16_cpu(float* dx, float* dw, float* db, const float* dy, const float* x,
                              const float* w, int64_t N, int64_t IC, int64_t OC,
                              bool accumulate_dx);

}  // namespace rlhf::model

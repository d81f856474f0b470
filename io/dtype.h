// Stored element types of model files and their conversion to and from fp32: IEEE half (F16),
// bfloat16 (BF16), and ggml's block quantisations Q8_0, Q4_0, Q4_1 (dequantised to fp32).
#pragma once

#include <cstdint>
#include <string>

namespace rlhf::io {

/// An element type as stored in a file.
enum class DType { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1 };

/// "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1" (safetensors / ggml spelling).
const char* to_string(DType t);

/// Elements per block: 1 for F32/F16/BF16, 32 for the ggml quantisations.
int64_t dtype_block_elems(DType t);
/// Bytes per block: 4, 2, 2, 34 (Q8_0: f16 scale + 32 int8), 18 (Q4_0: f16 scale + 16 bytes),
/// 20 (Q4_1: f16 scale, f16 min + 16 bytes).
int64_t dtype_block_bytes(DType t);
/// Bytes of `n` elements; throws rlhf::Error (naming `source`) when n is negative, not a multiple
/// of the block size, or the product overflows.
int64_t dtype_bytes(DType t, int64_t n, const std::string& source);

/// bfloat16 bits → fp32 (exact).
inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
/// fp32 → bfloat16 bits, round to nearest even; NaN stays NaN (quiet).
uint16_t float_to_bf16(float f);
/// IEEE binary16 bits → fp32 (exact, subnormals and Inf/NaN included).
float f16_to_float(uint16_t h);
/// fp32 → IEEE binary16 bits, round to nearest even; overflow → ±Inf; NaN stays NaN.
uint16_t float_to_f16(float f);

/// Converts `n` elements of type `t` at `src` (dtype_bytes(t, n) bytes, any alignment) to fp32.
/// n must be a multiple of the block size (callers check with dtype_bytes first).
/// Quantised blocks, per ggml: Q8_0 x = d·q; Q4_0 x = d·(nibble − 8); Q4_1 x = d·nibble + m, with
/// the low nibbles giving elements 0..15 of the block and the high nibbles 16..31.
void convert_to_f32(DType t, const uint8_t* src, float* dst, int64_t n);

/// Converts `n` fp32 values to type `t` (F32, F16 or BF16 only; throws rlhf::Error otherwise),
/// writing dtype_bytes(t, n) bytes to `dst`.
void convert_from_f32(DType t, const float* src, uint8_t* dst, int64_t n);

}  // namespace rlhf::io

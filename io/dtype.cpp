#include "io/dtype.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "io/bytes.h"

namespace rlhf::io {

const char* to_string(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kQ8_0:
      return "Q8_0";
    case DType::kQ4_0:
      return "Q4_0";
    case DType::kQ4_1:
      return "Q4_1";
  }
  return "?";
}

int64_t dtype_block_elems(DType t) {
  return (t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_1) ? 32 : 1;
}

int64_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kQ8_0:
      return 34;
    case DType::kQ4_0:
      return 18;
    case DType::kQ4_1:
      return 20;
  }
  return 0;
}

int64_t dtype_bytes(DType t, int64_t n, const std::string& source) {
  RLHF_CHECK(n >= 0, "{}: negative element count {}", source, n);
  const int64_t be = dtype_block_elems(t);
  RLHF_CHECK(n % be == 0, "{}: {} elements of {} are not a whole number of {}-element blocks",
             source, n, to_string(t), be);
  return checked_mul(n / be, dtype_block_bytes(t), source, "tensor byte size");
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  float out;
  if (exp == 0) {
    // zero or subnormal: man · 2^-24
    out = std::ldexp(static_cast<float>(man), -24);
    if (sign) out = -out;
    return out;
  }
  uint32_t u;
  if (exp == 31)
    u = sign | 0x7f800000u | (man << 13);  // Inf / NaN
  else
    u = sign | ((exp + 112u) << 23) | (man << 13);
  std::memcpy(&out, &u, 4);
  return out;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24 rounded to nearest even.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;    // exact: a < 2^-14, scaled < 2^10
    const float r = std::nearbyint(scaled);  // default rounding mode: to nearest even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  // Normal: rebias the exponent, round the mantissa to 10 bits (nearest even).
  const uint32_t rounding = 0xfffu + ((abs >> 13) & 1u);
  const uint32_t v = (abs - (112u << 23) + rounding) >> 13;
  return static_cast<uint16_t>(sign | v);
}

void convert_to_f32(DType t, const uint8_t* src, float* dst, int64_t n) {
  auto u16 = [](const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  };
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(u16(src + 2 * i));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(u16(src + 2 * i));
      return;
    case DType::kQ8_0:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + 34 * b;
        const float d = f16_to_float(u16(blk));
        for (int j = 0; j < 32; ++j)
          dst[32 * b + j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
      }
      return;
    case DType::kQ4_0:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + 18 * b;
        const float d = f16_to_float(u16(blk));
        for (int j = 0; j < 16; ++j) {
          dst[32 * b + j] = d * static_cast<float>((blk[2 + j] & 0x0f) - 8);
          dst[32 * b + j + 16] = d * static_cast<float>((blk[2 + j] >> 4) - 8);
        }
      }
      return;
    case DType::kQ4_1:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + 20 * b;
        const float d = f16_to_float(u16(blk)), m = f16_to_float(u16(blk + 2));
        for (int j = 0; j < 16; ++j) {
          dst[32 * b + j] = d * static_cast<float>(blk[4 + j] & 0x0f) + m;
          dst[32 * b + j + 16] = d * static_cast<float>(blk[4 + j] >> 4) + m;
        }
      }
      return;
  }
}

void convert_from_f32(DType t, const float* src, uint8_t* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = float_to_f16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = float_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    default:
      RLHF_FAIL("writing {} tensors is not supported (F32, F16 and BF16 are)", to_string(t));
  }
}

}  // namespace rlhf::io

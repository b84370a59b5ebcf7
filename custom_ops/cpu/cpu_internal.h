// Shared by the CPU kernel translation units: element tags, scalar float16/bfloat16 conversions,
// and the per-instruction-set entry points that dispatch.cc chooses from.
//
// Every translation unit compiled with extra instruction-set flags (isa_avx2.cc, isa_avx512.cc)
// keeps its code in an anonymous namespace: an inline or template function with external linkage
// would be emitted in several units with different flags, and the linker could keep the AVX-512
// copy for a caller on a CPU without it. So the helpers here have internal linkage too.
#pragma once

#include <cstdint>
#include <cstring>

#include "onnxnorm/kernels.h"

namespace onnxnorm {
namespace cpu {

// Entry points of the instruction-set units; nullptr when the combination is not implemented.
NormRowsFn GetNormRowsPortable(NormKind norm, ResidualKind residual, ElemType x, ElemType w);
#if defined(ONNXNORM_X86_KERNELS)
NormRowsFn GetNormRowsAvx2(NormKind norm, ResidualKind residual, ElemType x, ElemType w);
NormRowsFn GetNormRowsAvx512(NormKind norm, ResidualKind residual, ElemType x, ElemType w);
#endif

namespace {

// Element tags: how a tensor's elements are stored.
struct F32 {
  using St = float;
};
struct F16 {
  using St = uint16_t;
};
struct BF16 {
  using St = uint16_t;
};

inline uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float FloatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// float16 -> float32 (exact).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return FloatOf(sign | 0x7f800000u | (mantissa << 13));  // Inf / NaN
  return FloatOf(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// float32 -> float16, rounding to nearest even; NaN stays NaN, overflow gives Inf.
inline uint16_t FloatToHalf(float f) {
  uint32_t x = BitsOf(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // Inf or NaN (keep NaN quiet and non-zero)
    return static_cast<uint16_t>(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u | ((x >> 13) & 0x3ffu) : 0u));
  }
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to Inf
  if (x < 0x38800000u) {
    // Below the smallest normal float16 (2^-14): a multiple of 2^-24. Scale to units of 2^-24
    // (exact) and round to an integer with the 2^23 trick (round to nearest even in the
    // default rounding mode); 1024 units is the smallest normal, encoded the same way.
    volatile float units = FloatOf(x) * 0x1p24f;
    const float rounded = (units + 0x1p23f) - 0x1p23f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  x += 0xc8000fffu + ((x >> 13) & 1u);
  return static_cast<uint16_t>(sign | (x >> 13));
}

// bfloat16 -> float32 (exact).
inline float BFloat16ToFloat(uint16_t b) { return FloatOf(static_cast<uint32_t>(b) << 16); }

// float32 -> bfloat16, rounding to nearest even; NaN stays a quiet NaN.
inline uint16_t FloatToBFloat16(float f) {
  const uint32_t x = BitsOf(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float ToFloat(F32, float v) { return v; }
inline float ToFloat(F16, uint16_t v) { return HalfToFloat(v); }
inline float ToFloat(BF16, uint16_t v) { return BFloat16ToFloat(v); }
inline float FromFloat(F32, float v) { return v; }
inline uint16_t FromFloat(F16, float v) { return FloatToHalf(v); }
inline uint16_t FromFloat(BF16, float v) { return FloatToBFloat16(v); }

// v rounded to the precision of tag E (as a float).
template <class E>
inline float RoundScalar(float v) {
  return ToFloat(E{}, FromFloat(E{}, v));
}

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm

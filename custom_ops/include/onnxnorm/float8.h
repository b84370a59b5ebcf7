// float32 -> float8 e4m3fn, the one conversion of the quantized ops' float8 Y: the CPU kernels
// (custom_ops/cpu/quant_rows.h), the CUDA kernels (custom_ops/cuda/norm_kernels.cuh) and the
// CUDA host emulation (custom_ops/cuda/emulation) all compile this code.
//
// It is ONNX QuantizeLinear's conversion with its default saturate = 1 (as ONNX Runtime computes
// it): round to nearest, ties to even; |v| >= 448 (Inf included) gives +-448, the largest finite
// e4m3fn value; NaN gives NaN (0x7F) with v's sign bit (0xFF); a value that rounds to zero keeps
// its sign (0x80 for -0 and tiny negatives).
//
// e4m3fn: a sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 is
// NaN, so the largest finite value is S.1111.110 = 1.75 * 2^8 = 448. Normal values are
// (1 + m / 8) * 2^(e - 7), e in 1..15, the smallest 2^-6; subnormals (e = 0) are m * 2^-9, m in
// 0..7. Code k in 0..8 is k * 2^-9 for every k (code 8, 0.0001.000, is 2^-6): below 2^-6 the
// code is the value counted in units of 2^-9.
//
// The conversion is integer and float operations with selects, no branch, so that a loop of it
// over a block of values compiles to vector instructions on the CPU.
#pragma once

#include <cstdint>
#include <cstring>

// The functions' qualifiers: host and device code under nvcc; elsewhere (g++, and the CUDA host
// emulation) plain host functions. Internal linkage either way: the CPU kernels compile this
// header in translation units with different instruction-set flags, and an out-of-line copy with
// external linkage from the AVX-512 unit could be the one the linker keeps for every caller (see
// custom_ops/cpu/cpu_internal.h). Forced inlining too, unless ONNXNORM_NO_FORCE_INLINE (the
// test suite's sanitized build) leaves it to the compiler.
#if defined(__CUDACC__)
#define ONNXNORM_HOST_DEVICE static __host__ __device__ __forceinline__
#elif defined(__GNUC__) && !defined(ONNXNORM_NO_FORCE_INLINE)
#define ONNXNORM_HOST_DEVICE static inline __attribute__((always_inline))
#else
#define ONNXNORM_HOST_DEVICE static inline
#endif

namespace onnxnorm {
namespace float8 {

// The bits of float8 e4m3fn's largest finite value, 448, and of its (positive) NaN.
inline constexpr uint32_t kE4M3FNMaxBits = 0x7Eu;
inline constexpr uint32_t kE4M3FNNaNBits = 0x7Fu;
// The largest finite e4m3fn value (QuantizeLinear's saturation bound) and the float32 bits of
// 448 = 1.75 * 2^8: exponent 8 + 127 = 135, mantissa 0.75 = 0x600000.
inline constexpr float kE4M3FNMax = 448.0f;
inline constexpr uint32_t kFloatBits448 = 0x43E00000u;
// float32 bits of 2^-6 (exponent 121), the smallest normal e4m3fn value.
inline constexpr uint32_t kFloatBitsMinNormal = 0x3C800000u;
// float32 bits of +Inf: above it, NaN.
inline constexpr uint32_t kFloatBitsInf = 0x7F800000u;
// 2^14: every float32 in [2^14, 2^15) is a multiple of 2^(14 - 23) = 2^-9, and its bits are 2^14's
// plus that multiple's count.
inline constexpr float kUnits2m9 = 16384.0f;
inline constexpr uint32_t kFloatBits2p14 = 0x46800000u;

ONNXNORM_HOST_DEVICE uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

ONNXNORM_HOST_DEVICE float FloatFromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// a where c, else b, with a mask rather than a branch.
ONNXNORM_HOST_DEVICE uint32_t SelectBits(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// The float8 e4m3fn bits (in the low byte) of float32 v: QuantizeLinear's saturating conversion.
ONNXNORM_HOST_DEVICE uint32_t FloatToE4M3FNBits(float v) {
  const uint32_t x = FloatBits(v);
  const uint32_t sign = (x >> 24) & 0x80u;  // float32's sign bit in float8's place
  uint32_t a = x & 0x7FFFFFFFu;             // |v|'s bits: they order as the values do
  const bool nan = a > kFloatBitsInf;
  // saturate: |v| >= 448 (Inf, and NaN, handled below) becomes 448. Exact: the bits of
  // non-negative floats order as their values, so the integer minimum is the float minimum.
  // (Clamping before rounding equals rounding then clamping: 448 is an e4m3fn value, and every
  // float32 in (448, 464) rounds to 448 while from 464 on saturation gives 448 too.)
  a = a < kFloatBits448 ? a : kFloatBits448;
  // |v| >= 2^-6: round float32's 23 mantissa bits to e4m3fn's 3, to nearest even: adding
  // 0x7FFFF (half a unit of the kept last bit, less one) plus that kept last bit carries into it
  // exactly when the 20 dropped bits are above half, or at half with the kept bit odd; the carry
  // may run into the exponent, which is the right result (the next binade's 1.0). The integer
  // add cannot overflow (a <= 0x43E00000). Shifted down, the exponent 127-biased stands above the
  // 3 mantissa bits; subtracting (127 - 7) << 3 rebiases it to 7. 448 stays 448 (its dropped bits
  // are 0): 0x43E - 0x3C0 = 0x7E.
  const uint32_t normal = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
  // |v| < 2^-6: the code is |v| counted in units of 2^-9, rounded to nearest even. Adding 2^14
  // does that rounding exactly: the sum lies in [2^14, 2^14 + 2^-6], where float32's spacing is
  // 2^-9, and IEEE addition rounds to nearest even; the sum's bits minus 2^14's are the count
  // (0..8; 8, 2^-6, is the code of 2^-6 too). (For a >= 2^-6 this value is computed and unused.)
#if defined(__CUDA_ARCH__)
  const float shifted = __fadd_rn(FloatFromBits(a), kUnits2m9);  // (never contracted or reordered)
#else
  const float shifted = FloatFromBits(a) + kUnits2m9;
#endif
  const uint32_t small = FloatBits(shifted) - kFloatBits2p14;
  uint32_t code = SelectBits(a < kFloatBitsMinNormal, small, normal);
  code = SelectBits(nan, kE4M3FNNaNBits, code);
  return sign | code;
}

ONNXNORM_HOST_DEVICE uint8_t FloatToE4M3FN(float v) { return static_cast<uint8_t>(FloatToE4M3FNBits(v)); }

}  // namespace float8
}  // namespace onnxnorm

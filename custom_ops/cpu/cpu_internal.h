// Shared by the CPU kernel translation units: element tags, scalar float16/bfloat16 conversions,
// and the per-instruction-set entry points that dispatch.cc chooses from.
//
// Every translation unit compiled with extra instruction-set flags (isa_avx2.cc, isa_avx512.cc, ...)
// keeps its code in an anonymous namespace: an inline or template function with external linkage
// would be emitted in several units with different flags, and the linker could keep the AVX-512
// copy for a caller on a CPU without it. So the helpers here have internal linkage too.
#pragma once

#include <cstdint>
#include <cstring>

#include "onnxnorm/kernels.h"

// The kernels are small functions over vectors that must be inlined into their loops; a translation
// unit with many kernel instances can exhaust the compiler's inlining budget, and a vector passed
// to an out-of-line call goes through memory (the portable kernels' vectors are structs).
// ONNXNORM_NO_FORCE_INLINE (the sanitized build of the test suite, at -O0) leaves inlining to the
// compiler: the same accesses, each checked where it is written, in a third to a half of the
// compile time.
#if !defined(ONNXNORM_INLINE)
#if defined(__GNUC__) && !defined(ONNXNORM_NO_FORCE_INLINE)
#define ONNXNORM_INLINE inline __attribute__((always_inline))
#else
#define ONNXNORM_INLINE inline
#endif
#endif

namespace onnxnorm {
namespace cpu {

// Entry points of the instruction-set units; nullptr when the combination is not implemented.
NormRowsFn GetNormRowsPortable(NormKind norm, ResidualKind residual, ElemType x, ElemType w, ElemType y);
QuantRowsFn GetQuantRowsPortable(NormKind norm, ResidualKind residual, QuantPass pass, ElemType x, ElemType w,
                                 ElemType q);
#if defined(ONNXNORM_X86_KERNELS)
NormRowsFn GetNormRowsAvx2(NormKind norm, ResidualKind residual, ElemType x, ElemType w, ElemType y);
NormRowsFn GetNormRowsAvx512(NormKind norm, ResidualKind residual, ElemType x, ElemType w, ElemType y);
NormRowsFn GetNormRowsAvx512Bf16(NormKind norm, ResidualKind residual, ElemType x, ElemType w,
                                 ElemType y);  // bfloat16 X only
QuantRowsFn GetQuantRowsAvx2(NormKind norm, ResidualKind residual, QuantPass pass, ElemType x, ElemType w, ElemType q);
QuantRowsFn GetQuantRowsAvx512(NormKind norm, ResidualKind residual, QuantPass pass, ElemType x, ElemType w,
                               ElemType q);
// Whether this CPU and operating system run AVX512-FP16 (half-precision arithmetic; the rotary
// ops' float16 kernels use it, rotary_avx512_fp16.cc).
bool HasAvx512Fp16();
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

// The conversions below are branch-free integer arithmetic with selects, so that a loop of them
// over the lanes of a vector compiles to vector instructions (the portable kernels rely on this);
// they give the same bits as F16C's vcvtph2ps / vcvtps2ph (round to nearest even) and as the
// AVX2 / AVX-512 bfloat16 rounding, NaN included.

// a where c, else b, with masks rather than a branch (a conditional float operation would keep
// the compiler from vectorizing a loop of these).
inline uint32_t Select(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// float16 bits -> float32 bits (exact).
inline uint32_t HalfBitsToFloatBits(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t em = (h & 0x7fffu) << 13;  // exponent and mantissa, in float32's places
  // normal: rebias the exponent (15 -> 127); Inf / NaN: all exponent bits set, a NaN made quiet
  // with its payload kept
  const uint32_t normal = em + (112u << 23);
  const uint32_t special = em | Select(em > (0x7c00u << 13), 0x7fc00000u, 0x7f800000u);
  // zero or subnormal (m * 2^-24): (2^-14 + m * 2^-24) - 2^-14, both exact in float32
  const uint32_t small = BitsOf(FloatOf(em + (113u << 23)) - 0x1p-14f);
  uint32_t r = Select(em >= (0x7c00u << 13), special, normal);
  r = Select(em < (0x0400u << 13), small, r);
  return sign | r;
}

// float32 bits -> float16 bits, rounding to nearest even; NaN stays a quiet NaN with the top of
// its payload, overflow gives Inf.
inline uint32_t FloatBitsToHalfBits(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  // normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even
  const uint32_t normal = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
  // below the smallest normal float16 (2^-14): adding 0.5 leaves the value in units of 2^-24 in
  // the low mantissa bits, rounded to nearest even by the addition itself (1024 units, the
  // smallest normal, comes out encoded as such)
  const uint32_t small = BitsOf(FloatOf(x) + 0.5f) - 0x3f000000u;
  const uint32_t nan = 0x7e00u | ((x >> 13) & 0x3ffu);
  uint32_t r = Select(x < 0x38800000u, small, normal);
  r = Select(x >= 0x477ff000u, 0x7c00u, r);  // >= 65520 rounds to Inf
  r = Select(x > 0x7f800000u, nan, r);
  return sign | r;
}

// bfloat16 bits -> float32 bits (exact).
inline uint32_t BFloat16BitsToFloatBits(uint32_t b) { return b << 16; }

// float32 bits -> bfloat16 bits, rounding to nearest even; NaN stays a quiet NaN.
inline uint32_t FloatBitsToBFloat16Bits(uint32_t x) {
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40u;
  return Select((x & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

inline float HalfToFloat(uint16_t h) { return FloatOf(HalfBitsToFloatBits(h)); }
inline uint16_t FloatToHalf(float f) { return static_cast<uint16_t>(FloatBitsToHalfBits(BitsOf(f))); }
inline float BFloat16ToFloat(uint16_t b) { return FloatOf(BFloat16BitsToFloatBits(b)); }
inline uint16_t FloatToBFloat16(float f) { return static_cast<uint16_t>(FloatBitsToBFloat16Bits(BitsOf(f))); }

inline float ToFloat(F32, float v) { return v; }
inline float ToFloat(F16, uint16_t v) { return HalfToFloat(v); }
inline float ToFloat(BF16, uint16_t v) { return BFloat16ToFloat(v); }
inline float FromFloat(F32, float v) { return v; }
inline uint16_t FromFloat(F16, float v) { return FloatToHalf(v); }
inline uint16_t FromFloat(BF16, float v) { return FloatToBFloat16(v); }

// Isa::Pow2(t): 2^(n + kPow2Offset) from t = n + 1.5 * 2^23, whose low mantissa bits hold the
// whole number n: (bits(t) - kPow2Bits) << 23 with kPow2Bits the bits of 1.5 * 2^23 less the
// exponent field's bias 127 and the offset. (The offset keeps 2^(n + 64) normal for the n of
// exp's arguments down to -150, norm_rows.h.)
constexpr int kPow2Offset = 64;
constexpr uint32_t kPow2Bits = 0x4B400000u - 127u - static_cast<uint32_t>(kPow2Offset);

// v rounded to the precision of tag E (as a float).
template <class E>
inline float RoundScalar(float v) {
  return ToFloat(E{}, FromFloat(E{}, v));
}

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm

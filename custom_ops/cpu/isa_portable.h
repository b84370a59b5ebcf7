// Portable row kernels: plain C++ over fixed-width blocks of 8 floats that the compiler maps onto
// whatever vector unit the target has (SSE2, NEON, ...). Used on CPUs without AVX2 + FMA + F16C,
// and on non-x86 machines. float16 and bfloat16 are converted a block at a time with the
// branch-free integer conversions of cpu_internal.h, which vectorize like the arithmetic. The
// results are bit for bit those of the AVX2 and AVX-512 kernels (norm_rows.h). MulAdd is
// std::fma, a fused multiply-add instruction where the target has one (else a slower library
// call, used by GatedRMSNorm's activation only).
//
// The instruction-set struct Isa of this unit (norm_rows.h documents what it holds), in a header
// of its own so that the quantized ops' unit (quant_portable.cc) builds on the same vectors.
#pragma once

#include <cmath>
#include <cstring>

// Plain inline: forced inlining of these vector structs everywhere made this file take minutes to
// compile, for no faster code.
#define ONNXNORM_INLINE inline
#include "cpu_internal.h"

#if defined(__GNUC__)
#define ONNXNORM_NOINLINE_FN __attribute__((noinline))
#else
#define ONNXNORM_NOINLINE_FN
#endif

namespace onnxnorm {
namespace cpu {
namespace {

struct Isa {
  static constexpr int W = 8;
  struct V {
    float v[W];
  };
  static V Zero() { return Set1(0.f); }
  static V Set1(float f) {
    V r;
    for (int k = 0; k < W; ++k) r.v[k] = f;
    return r;
  }
  static V Add(V a, V b) {
    for (int k = 0; k < W; ++k) a.v[k] += b.v[k];
    return a;
  }
  static V Sub(V a, V b) {
    for (int k = 0; k < W; ++k) a.v[k] -= b.v[k];
    return a;
  }
  static V Mul(V a, V b) {
    for (int k = 0; k < W; ++k) a.v[k] *= b.v[k];
    return a;
  }
  // a * b + c rounded once (fused), as the x86 FMA instructions compute it
  static V MulAdd(V a, V b, V c) {
    for (int k = 0; k < W; ++k) a.v[k] = std::fma(a.v[k], b.v[k], c.v[k]);
    return a;
  }
  // Halving folds (lane k + lane k + 4, then + 2, then + 1), as the x86 kernels add.
  static float HSum(V a) { return ((a.v[0] + a.v[4]) + (a.v[2] + a.v[6])) + ((a.v[1] + a.v[5]) + (a.v[3] + a.v[7])); }
  static V MaskN(V a, int n) {
    for (int k = n; k < W; ++k) a.v[k] = 0.f;
    return a;
  }
  static V Div(V a, V b) {
    for (int k = 0; k < W; ++k) a.v[k] /= b.v[k];
    return a;
  }
  // a > b ? a : b, lane by lane (b where either is NaN), as x86's max instructions take them.
  static V Max(V a, V b) {
    for (int k = 0; k < W; ++k) a.v[k] = a.v[k] > b.v[k] ? a.v[k] : b.v[k];
    return a;
  }
  // Bits of a block of 32-bit lanes, and back.
  struct Bits {
    uint32_t u[W];
  };
  static Bits BitsOfV(V a) {
    Bits b;
    std::memcpy(b.u, a.v, sizeof(b.u));
    return b;
  }
  static V VOfBits(Bits b) {
    V a;
    std::memcpy(a.v, b.u, sizeof(a.v));
    return a;
  }
  // (Out of line: inlined into every use, the conversions made this file take minutes to compile.)
  ONNXNORM_NOINLINE_FN static V Widen(F16, const uint16_t* p) {
    Bits b;
    for (int k = 0; k < W; ++k) b.u[k] = HalfBitsToFloatBits(p[k]);
    return VOfBits(b);
  }
  ONNXNORM_NOINLINE_FN static V Widen(BF16, const uint16_t* p) {
    Bits b;
    for (int k = 0; k < W; ++k) b.u[k] = BFloat16BitsToFloatBits(p[k]);
    return VOfBits(b);
  }
  ONNXNORM_NOINLINE_FN static void Narrow(F16, uint16_t* p, V a) {
    const Bits b = BitsOfV(a);
    for (int k = 0; k < W; ++k) p[k] = static_cast<uint16_t>(FloatBitsToHalfBits(b.u[k]));
  }
  ONNXNORM_NOINLINE_FN static void Narrow(BF16, uint16_t* p, V a) {
    const Bits b = BitsOfV(a);
    for (int k = 0; k < W; ++k) p[k] = static_cast<uint16_t>(FloatBitsToBFloat16Bits(b.u[k]));
  }

  static V Load(F32, const float* p) {
    V r;
    std::memcpy(r.v, p, sizeof(r.v));
    return r;
  }
  template <class E>
  static V Load(E e, const uint16_t* p) {
    return Widen(e, p);
  }
  template <class E>
  static V LoadN(E e, const typename E::St* p, int n) {
    typename E::St block[W] = {};
    std::memcpy(block, p, sizeof(block[0]) * static_cast<size_t>(n));
    return Load(e, block);
  }
  static void Store(F32, float* p, V a) { std::memcpy(p, a.v, sizeof(a.v)); }
  template <class E>
  static void Store(E e, uint16_t* p, V a) {
    Narrow(e, p, a);
  }
  template <class E>
  static void StoreN(E e, typename E::St* p, V a, int n) {
    typename E::St block[W];
    Store(e, block, a);
    std::memcpy(p, block, sizeof(block[0]) * static_cast<size_t>(n));
  }
  // -|a| (the sign bit set; NaN stays NaN).
  static V NegAbs(V a) {
    Bits b = BitsOfV(a);
    for (int k = 0; k < W; ++k) b.u[k] |= 0x80000000u;
    return VOfBits(b);
  }
  // a where the sign bit of s is set (negative numbers, -0, NaN with the sign), else b.
  static V SelectNegative(V s, V a, V b) {
    const Bits sb = BitsOfV(s), ab = BitsOfV(a), bb = BitsOfV(b);
    Bits r;
    for (int k = 0; k < W; ++k) r.u[k] = Select((sb.u[k] >> 31) != 0u, ab.u[k], bb.u[k]);
    return VOfBits(r);
  }
  // 2^(n + kPow2Offset) from t = n + 1.5 * 2^23 for whole n (the sum that rounded n: its low
  // mantissa bits hold n), n + kPow2Offset in [-126, 127], exactly: those bits become the
  // exponent field (kPow2Bits, cpu_internal.h).
  static V Pow2(V t) {
    Bits b = BitsOfV(t);
    for (int k = 0; k < W; ++k) b.u[k] = (b.u[k] - kPow2Bits) << 23;
    return VOfBits(b);
  }

  static constexpr bool kHasStream = false;
  template <class E>
  static void Stream(E e, typename E::St* p, V a) {
    Store(e, p, a);
  }
  static void Fence() {}
  static V Round(F32, V a) { return a; }
  template <class E>
  static V Round(E e, V a) {
    uint16_t block[W];
    Narrow(e, block, a);
    return Widen(e, block);
  }
};

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm

// The float16 head kernels in half-precision arithmetic (AVX512-FP16) of the rotary rows
// (rotary_rows.h), included there by rotary_avx512_fp16.cc's instantiation alone
// (ONNXNORM_NATIVE_HALF, compiled with -mavx512fp16): a float16 head's half-split pairs normalized
// (in order A with its product by the weight in half precision) and rotated (rotary_in_t = 1) in
// vectors of 32 halves, with the bits of the float32 arithmetic of the other units. Internal
// linkage, as rotary_rows.h.
#pragma once

#if !defined(ONNXNORM_NATIVE_HALF)
#error "rotary_half.h is for the AVX512-FP16 unit (rotary_avx512_fp16.cc)"
#endif

#include <cstdint>
#include <type_traits>

#include "norm_rows.h"

namespace onnxnorm {
namespace cpu {
namespace {

// AVX512-FP16 (rotary_avx512_fp16.cc): the rotation of a float16 head in half-precision
// arithmetic, 32 values to a vector. With rotary_in_t = 1 each product and each sum is rounded to
// float16, which one vmulph / vaddph / vsubph does exactly: the product of two float16 values is
// exact in float32 (11 + 11 bits), so float32's product rounded to float16 is the product rounded
// once; and a sum rounded to float32 and then to float16 is the sum rounded once to float16
// (24 >= 2 * 11 + 2 bits: the second rounding cannot land on the first's tie). The same bits as
// the float32 arithmetic of the other instruction sets.
ONNXNORM_INLINE __mmask32 HalfMask(int count) {
  return count >= 32 ? static_cast<__mmask32>(0xffffffffu) : static_cast<__mmask32>((1u << count) - 1u);
}
ONNXNORM_INLINE __m512h LoadHalves(const uint16_t* p, int count) {
  return _mm512_castsi512_ph(_mm512_maskz_loadu_epi16(HalfMask(count), p));
}
ONNXNORM_INLINE void StoreHalves(uint16_t* p, __m512h v, int count) {
  _mm512_mask_storeu_epi16(p, HalfMask(count), _mm512_castph_si512(v));
}
// `count` angles of A as float16 (float32 angles rounded to float16, as rotary_in_t = 1 asks)
template <class A>
ONNXNORM_INLINE __m512h LoadHalfAngles(const typename A::St* p, int count) {
  if constexpr (std::is_same<A, F32>::value) {
    const int low = count < 16 ? count : 16, high = count - low;
    const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << low) - 1u), p);
    const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << high) - 1u), p + 16);
    const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i both =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(lo, mode)), _mm512_cvtps_ph(hi, mode), 1);
    return _mm512_castsi512_ph(both);
  } else {
    return LoadHalves(p, count);
  }
}

// A float16 head's values i.. i + count (count <= 32) normalized, as float16 in half precision's
// vector: the bits NormalizeHead leaves in its buffer. HalfHeadOf: a NormalizedSource's float32
// values (rotary_rows.h), two vectors of 16 each rounded to float16 once. HalfHeadOrderA:
// rounding order A with the weights in float16 (PreparedTensorWeights' halves): the normalized
// value as Apply computes it in float32, rounded to float16, times the Scale (or the
// normalizer's constant) in half precision (the product of two float16 values rounded once, as
// order A's float32 product rounded to float16), plus the Bias (a sum rounded once).
// (Constructors, not aggregates: an aggregate's padding was zeroed on every head.)
ONNXNORM_INLINE __m512h JoinHalves(V lo, V hi) {
  const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return _mm512_castsi512_ph(
      _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(lo, mode)), _mm512_cvtps_ph(hi, mode), 1));
}
// values i.. i + count of src (count <= 16), zeros past them
template <class Src>
ONNXNORM_INLINE V SourcePart(const Src& src, int64_t i, int count) {
  if (count >= 16) return src.Load(i);
  return count > 0 ? src.LoadN(i, count) : Isa::Zero();
}
// (Values: a NormalizedSource that leaves the rounding to the conversion)
template <class Values>
struct HalfHeadOf {
  Values values;
  explicit HalfHeadOf(const Values& normalized) : values(normalized) {}
  ONNXNORM_INLINE __m512h operator()(int64_t i, int count) const {
    return JoinHalves(SourcePart(values, i, count < 16 ? count : 16), SourcePart(values, i + 16, count - 16));
  }
};

template <NormKind NK, bool kScale, bool kBias, class Src>
struct HalfHeadOrderA {
  Normalizer<NK, F16, true> nz;
  Src src;
  const uint16_t* scale;  // float16 weights (kScale, kBias)
  const uint16_t* bias;
  HalfHeadOrderA(const Src& values, const Normalizer<NK, F16, true>& normalizer, const uint16_t* scale_values,
                 const uint16_t* bias_values)
      : nz(normalizer), src(values), scale(scale_values), bias(bias_values) {}
  ONNXNORM_INLINE __m512h operator()(int64_t i, int count) const {
    const __m512h h = JoinHalves(nz.Normalized(SourcePart(src, i, count < 16 ? count : 16)),
                                 nz.Normalized(SourcePart(src, i + 16, count - 16)));
    const __m512h s =
        kScale ? LoadHalves(scale + i, count) : _mm512_set1_ph(static_cast<_Float16>(_mm512_cvtss_f32(nz.vconst)));
    const __m512h y = _mm512_mul_ph(h, s);
    return kBias ? _mm512_add_ph(y, LoadHalves(bias + i, count)) : y;
  }
};

// A float16 head's half-split pairs normalized (head: HalfHeadOf or HalfHeadOrderA) and rotated
// in half precision (rotary_in_t = 1) into y in one pass, 32 pairs at a time; angles per pair, or
// per value (per_value) as RotateHalves reads them.
template <class A, class Head>
ONNXNORM_INLINE void NormalizeRotateHalvesInHalf(const Head& normalized, const typename A::St* c,
                                                 const typename A::St* s, int64_t half, bool per_value, uint16_t* y) {
  const Head head = normalized;
  const int64_t second = per_value ? half : 0;
  for (int64_t j = 0; j < half; j += 32) {
    const int n = half - j < 32 ? static_cast<int>(half - j) : 32;
    const __m512h a = head(j, n), b = head(j + half, n);
    const __m512h ca = LoadHalfAngles<A>(c + j, n), sa = LoadHalfAngles<A>(s + j, n);
    const __m512h cb = per_value ? LoadHalfAngles<A>(c + j + second, n) : ca;
    const __m512h sb = per_value ? LoadHalfAngles<A>(s + j + second, n) : sa;
    StoreHalves(y + j, _mm512_sub_ph(_mm512_mul_ph(a, ca), _mm512_mul_ph(b, sa)), n);
    StoreHalves(y + j + half, _mm512_add_ph(_mm512_mul_ph(b, cb), _mm512_mul_ph(a, sb)), n);
  }
}

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm

// AVX-512 (F, BW, VL) row kernels (this file alone is compiled with -mavx512f -mavx512bw
// -mavx512vl; dispatch.cc calls it only on CPUs and operating systems that have them). Row tails
// use masked loads and stores, so odd widths cost one masked vector.
//
// The instruction-set struct Isa of this unit (norm_rows.h documents what it holds), in a header
// of its own so that the quantized ops' unit (quant_avx512.cc) builds on the same vectors, and
// the bfloat16 unit (isa_avx512_bf16.cc, which defines ONNXNORM_AVX512_BF16 and is compiled with
// -mavx512bf16 -mavx512dq too) on the same vectors with the bfloat16 conversion instruction.
#pragma once

#include "cpu_internal.h"

#if defined(ONNXNORM_X86_KERNELS)
#include <immintrin.h>

namespace onnxnorm {
namespace cpu {
namespace {

struct Isa {
  static constexpr int W = 16;
  using V = __m512;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float f) { return _mm512_set1_ps(f); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V MulAdd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float HSum(V a) {
    const __m256 h =
        _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static __mmask16 Mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static V MaskN(V a, int n) { return _mm512_maskz_mov_ps(Mask(n), a); }
  static V Div(V a, V b) { return _mm512_div_ps(a, b); }
  // a > b ? a : b per lane (b where either is NaN)
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  // -|a| (an integer instruction: the float OR is AVX512DQ's)
  static V NegAbs(V a) {
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)));
  }
  // a where the sign bit of s is set, else b
  static V SelectNegative(V s, V a, V b) {
    return _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(_mm512_castps_si512(s), _mm512_setzero_si512()), b, a);
  }
  // 2^(n + kPow2Offset) from t = n + 1.5 * 2^23 (isa_portable.h says how)
  static V Pow2(V t) {
    const __m512i bits = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(static_cast<int>(kPow2Bits)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 23));
  }

  static V FromHalf(__m256i h) { return _mm512_cvtph_ps(h); }
#if defined(ONNXNORM_AVX512_BF16)
  // bfloat16 words 0..15 (from = 0) or 16..31 (from = 16) of w as float32: each word placed in the
  // high half of its lane and the low half zeroed by one masked permutation (one instruction
  // where widening and shifting take two)
  static ONNXNORM_INLINE V WordsToFloat(__m512i w, int from) {
    const __m512i index =
        _mm512_add_epi16(_mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17,
                                                            16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           1),
                         _mm512_set1_epi16(static_cast<short>(from)));
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xaaaaaaaau, index, w));
  }
  static ONNXNORM_INLINE V FromBFloat16(__m256i b) { return WordsToFloat(_mm512_castsi256_si512(b), 0); }
#else
  static V FromBFloat16(__m256i b) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)); }
#endif
  static V Load(F32, const float* p) { return _mm512_loadu_ps(p); }
  static V Load(F16, const uint16_t* p) { return FromHalf(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V Load(BF16, const uint16_t* p) {
    return FromBFloat16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V LoadN(F32, const float* p, int n) { return _mm512_maskz_loadu_ps(Mask(n), p); }
  static V LoadN(F16, const uint16_t* p, int n) { return FromHalf(_mm256_maskz_loadu_epi16(Mask(n), p)); }
  static V LoadN(BF16, const uint16_t* p, int n) { return FromBFloat16(_mm256_maskz_loadu_epi16(Mask(n), p)); }

  // float32 -> bfloat16 bits (in the high half of each 32-bit lane), nearest even, NaN kept quiet.
  static __m512i BFloat16High(V a) {
    const __m512i x = _mm512_castps_si512(a);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    const __mmask16 nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(x, _mm512_set1_epi32(0x400000)));
  }
  static ONNXNORM_INLINE __m256i ToBFloat16(V a) {
#if defined(ONNXNORM_AVX512_BF16)
    // vcvtneps2bf16 rounds to nearest even and keeps NaN quiet as the integer rounding does, in
    // one instruction instead of nine, but reads float32 subnormals as zero: vectors that hold one
    // (rare; a fpclass test and a branch) take the integer rounding.
    if (__builtin_expect(_mm512_fpclass_ps_mask(a, 0x20) == 0, 1)) {
      return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(a));
    }
#endif
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(BFloat16High(a), 16));
  }
  static __m256i ToHalf(V a) { return _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT); }

  static void Store(F32, float* p, V a) { _mm512_storeu_ps(p, a); }
  static void Store(F16, uint16_t* p, V a) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ToHalf(a)); }
  static void Store(BF16, uint16_t* p, V a) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ToBFloat16(a)); }
  static void StoreN(F32, float* p, V a, int n) { _mm512_mask_storeu_ps(p, Mask(n), a); }
  static void StoreN(F16, uint16_t* p, V a, int n) { _mm256_mask_storeu_epi16(p, Mask(n), ToHalf(a)); }
  static void StoreN(BF16, uint16_t* p, V a, int n) { _mm256_mask_storeu_epi16(p, Mask(n), ToBFloat16(a)); }

  static constexpr bool kHasStream = true;
  static void Stream(F32, float* p, V a) { _mm512_stream_ps(p, a); }
  static void Stream(F16, uint16_t* p, V a) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), ToHalf(a)); }
  static void Stream(BF16, uint16_t* p, V a) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), ToBFloat16(a)); }
  static void Fence() { _mm_sfence(); }

  static V Round(F32, V a) { return a; }
  static V Round(F16, V a) { return FromHalf(ToHalf(a)); }
  // (always inlined: with the branch, the compiler made it a call in the rotary rows)
  static ONNXNORM_INLINE V Round(BF16, V a) {
#if defined(ONNXNORM_AVX512_BF16)
    // (ToBFloat16's conversion instruction and back: three instructions instead of nine)
    if (__builtin_expect(_mm512_fpclass_ps_mask(a, 0x20) == 0, 1)) {
      return FromBFloat16(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(a)));
    }
#endif
    return _mm512_castsi512_ps(_mm512_and_si512(BFloat16High(a), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
#if defined(ONNXNORM_AVX512_BF16)
  // Round(BF16, a) and Round(BF16, b) with one conversion instruction for both (vcvtne2ps2bf16
  // costs what vcvtneps2bf16 does) and one subnormal test
  static ONNXNORM_INLINE void RoundBoth(BF16, V* a, V* b) {
    if (__builtin_expect(_kortestz_mask16_u8(_mm512_fpclass_ps_mask(*a, 0x20), _mm512_fpclass_ps_mask(*b, 0x20)), 1)) {
      const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(*b, *a));  // words: a's, then b's
      *a = WordsToFloat(both, 0);
      *b = WordsToFloat(both, 16);
      return;
    }
    *a = Round(BF16{}, *a);
    *b = Round(BF16{}, *b);
  }
  // Store(BF16, pa, a) and Store(BF16, pb, b) with one conversion instruction for both
  static ONNXNORM_INLINE void StoreBoth(BF16, uint16_t* pa, V a, uint16_t* pb, V b) {
    if (__builtin_expect(_kortestz_mask16_u8(_mm512_fpclass_ps_mask(a, 0x20), _mm512_fpclass_ps_mask(b, 0x20)), 1)) {
      const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));  // words: a's, then b's
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pa), _mm512_castsi512_si256(both));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb), _mm512_extracti64x4_epi64(both, 1));
      return;
    }
    Store(BF16{}, pa, a);
    Store(BF16{}, pb, b);
  }
#endif
};

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm
#endif  // ONNXNORM_X86_KERNELS

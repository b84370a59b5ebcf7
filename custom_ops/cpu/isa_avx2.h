// AVX2 + FMA + F16C row kernels (this file alone is compiled with -mavx2 -mfma -mf16c; dispatch.cc
// calls it only on CPUs that have them).
//
// The instruction-set struct Isa of this unit (norm_rows.h documents what it holds), in a header
// of its own so that the quantized ops' unit (quant_avx2.cc) builds on the same vectors.
#pragma once

#include <cstring>

#include "cpu_internal.h"

#if defined(ONNXNORM_X86_KERNELS)
#include <immintrin.h>

namespace onnxnorm {
namespace cpu {
namespace {

struct Isa {
  static constexpr int W = 8;
  using V = __m256;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float f) { return _mm256_set1_ps(f); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V MulAdd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float HSum(V a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static __m256i LaneMask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V MaskN(V a, int n) { return _mm256_and_ps(a, _mm256_castsi256_ps(LaneMask(n))); }
  static V Div(V a, V b) { return _mm256_div_ps(a, b); }
  // a > b ? a : b per lane (b where either is NaN)
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  // -|a|
  static V NegAbs(V a) { return _mm256_or_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))); }
  // a where the sign bit of s is set, else b
  static V SelectNegative(V s, V a, V b) { return _mm256_blendv_ps(b, a, s); }
  // 2^(n + kPow2Offset) from t = n + 1.5 * 2^23 (isa_portable.h says how)
  static V Pow2(V t) {
    const __m256i bits = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(static_cast<int>(kPow2Bits)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 23));
  }

  static V Load(F32, const float* p) { return _mm256_loadu_ps(p); }
  static V Load(F16, const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static V Load(BF16, const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static V LoadN(F32, const float* p, int n) { return _mm256_maskload_ps(p, LaneMask(n)); }
  template <class E>
  static V LoadN(E e, const uint16_t* p, int n) {
    alignas(16) uint16_t buffer[W] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(buffer, p, sizeof(uint16_t) * static_cast<size_t>(n));
    return Load(e, buffer);
  }

  // float32 -> bfloat16 bits (in the high half of each 32-bit lane), nearest even, NaN kept quiet.
  static __m256i BFloat16High(V a) {
    const __m256i x = _mm256_castps_si256(a);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x400000));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, quiet, nan);
  }
  static __m128i ToBFloat16(V a) {
    const __m256i h = _mm256_srli_epi32(BFloat16High(a), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  }
  static __m128i ToHalf(V a) { return _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT); }

  static void Store(F32, float* p, V a) { _mm256_storeu_ps(p, a); }
  static void Store(F16, uint16_t* p, V a) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), ToHalf(a)); }
  static void Store(BF16, uint16_t* p, V a) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), ToBFloat16(a)); }
  static void StoreN(F32, float* p, V a, int n) { _mm256_maskstore_ps(p, LaneMask(n), a); }
  template <class E>
  static void StoreN(E e, uint16_t* p, V a, int n) {
    alignas(16) uint16_t buffer[W];
    Store(e, buffer, a);
    std::memcpy(p, buffer, sizeof(uint16_t) * static_cast<size_t>(n));
  }

  static constexpr bool kHasStream = true;
  static void Stream(F32, float* p, V a) { _mm256_stream_ps(p, a); }
  static void Stream(F16, uint16_t* p, V a) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), ToHalf(a)); }
  static void Stream(BF16, uint16_t* p, V a) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), ToBFloat16(a)); }
  static void Fence() { _mm_sfence(); }

  static V Round(F32, V a) { return a; }
  static V Round(F16, V a) { return _mm256_cvtph_ps(ToHalf(a)); }
  static V Round(BF16, V a) {
    return _mm256_castsi256_ps(_mm256_and_si256(BFloat16High(a), _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm
#endif  // ONNXNORM_X86_KERNELS

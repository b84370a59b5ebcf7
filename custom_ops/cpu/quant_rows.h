// The row algorithms of the quantized ops (a LayerNorm / RMSNorm or its Skip form followed by
// QuantizeLinear or DynamicQuantizeLinear), over the same vectors and the same norm code as
// norm_rows.h, so that Y_float is bit for bit the float op's Y.
//
// Included by one translation unit per instruction set (quant_portable.cc, quant_avx2.cc,
// quant_avx512.cc) after its isa_<set>.h. Everything has internal linkage (see cpu_internal.h).
//
// Per row:
//   kStatic:   the statistics (norm_rows.h's RowStats), then one pass that computes each Y value
//              in float32, rounds it to X's type (writing it to Y_float when wanted, and Z to Sum)
//              and quantizes it. X (and Residual) are read from memory once; the statistics
//              passes and the last pass read the row from cache.
//   kRange:    the statistics, kept in the row's scratch, and a pass that takes the min and max
//              of the row's Y rounded to X's type (NaN left out); a Skip op writes Sum here.
//   kQuantize: as kStatic, with the statistics kept by kRange (a Skip op with Sum reads its Z
//              back from Sum: one tensor from memory instead of X and Residual).
// A Skip op with Sum writes it in its statistics pass and its later passes read Z from it.
// The quantization of a value v (X's type, taken to float32) is ONNX Runtime's: v / scale in
// float32 (a division, as ORT divides: v * (1 / scale) would differ), NaN to the minimum,
// clamped to [min - zero_point, max - zero_point] (whole numbers, so clamping before the
// rounding equals clamping after it), rounded half to even, plus the zero point. A float8 e4m3fn
// Y (static pass only) is v / scale, the same division, converted by onnxnorm/float8.h (the CUDA
// kernels' conversion too): saturated to +-448, rounded half to even, NaN kept; the zero point's
// value is not used, as ORT's QuantizeLinear does not use it for float8. The quantizing
// loop is plain scalar code over a block of W values, which the compiler vectorizes; each value
// goes through the same float32 operations on every instruction set.
#pragma once

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "norm_rows.h"
#include "onnxnorm/float8.h"

namespace onnxnorm {
namespace cpu {
namespace {

// What a quantizing pass needs: the scale, the clamp bounds relative to the zero point, the zero
// point.
struct QuantParams {
  float scale, lo, hi, zero_point;
};

// 1.5 * 2^23: adding and subtracting it rounds a float of magnitude below 2^22 to a whole
// number, half to even, in the default rounding mode (the clamped values are within 255)
constexpr float kRoundWhole = 12582912.f;

// Quantized element tags: their storage, and Code(t): the stored value (as an int32 within the
// storage type's range) of the quotient t = v / scale.
template <class St_, int kMin_, int kMax_>
struct IntQuant {
  using St = St_;
  static constexpr float kMin = static_cast<float>(kMin_);
  static constexpr float kMax = static_cast<float>(kMax_);
  static ONNXNORM_INLINE int32_t Code(float t, const QuantParams& qp) {
    t = t > qp.lo ? t : qp.lo;  // (false for NaN: the minimum)
    t = t < qp.hi ? t : qp.hi;
    t = (t + kRoundWhole) - kRoundWhole;
    return static_cast<int32_t>(t + qp.zero_point);
  }
  static QuantParams Params(const QuantArgs& qa) {
    const float zp = static_cast<float>(qa.zero_point);
    return QuantParams{qa.scale, kMin - zp, kMax - zp, zp};
  }
};
using U8 = IntQuant<uint8_t, 0, 255>;
using I8 = IntQuant<int8_t, -128, 127>;
// float8 e4m3fn: the bits, 0..255 (no range, no zero point).
struct F8 {
  using St = uint8_t;
  static ONNXNORM_INLINE int32_t Code(float t, const QuantParams&) {
    return static_cast<int32_t>(float8::FloatToE4M3FNBits(t));
  }
  static QuantParams Params(const QuantArgs& qa) { return QuantParams{qa.scale, 0.f, 0.f, 0.f}; }
};

template <class Q>
QuantParams MakeQuantParams(const QuantArgs& qa) {
  return Q::Params(qa);
}

// QuantizeLinear of v[0..n) (n <= W) into out; kN: n known at compile time (a whole vector, which
// the compiler vectorizes), else 0.
template <class Q, int kN>
ONNXNORM_INLINE void QuantizeBlock(const float* v, typename Q::St* out, int n, const QuantParams& qp) {
  const int count = kN > 0 ? kN : n;
  int32_t whole[W];
  // (not unrolled: a loop of constant count unrolled early is left scalar, where the loop
  // vectorizer makes one vector of it)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 1
#endif
  for (int k = 0; k < count; ++k) whole[k] = Q::Code(v[k] / qp.scale, qp);
#if defined(__SSE2__) && !defined(__AVX512BW__)
  if constexpr (kN == 8) {
    // 8 lanes narrowed with packs (exact: the values are within Q's range; float8's bits, 0..255,
    // pack as uint8's do), which compilers without AVX-512's narrowing moves otherwise do one
    // lane at a time
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(whole));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(whole + 4));
    const __m128i half = _mm_packs_epi32(lo, hi);
    const __m128i bytes = std::is_same<Q, I8>::value ? _mm_packs_epi16(half, half) : _mm_packus_epi16(half, half);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), bytes);
    return;
  }
#endif
  for (int k = 0; k < count; ++k) out[k] = static_cast<typename Q::St>(whole[k]);
}

// The pass that writes a row's quantized Y (and Y_float, Sum when not null) from its statistics.
template <bool kScale, bool kBias, class E, class Q, class Nz, class Wt, class Src>
void QuantizeRow(const Src& source, const Nz& normalizer, const Wt& weights, typename Q::St* q, typename E::St* y_float,
                 typename E::St* sum, int64_t n, const QuantParams& params) {
  const Src src = source;
  const Nz nz = normalizer;
  const Wt wt = weights;
  const QuantParams qp = params;
  const V zero = Isa::Zero();
  alignas(64) float block[W];
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const V zv = src.Load(i);
    if (sum != nullptr) Isa::Store(E{}, sum + i, zv);
    const V sv = kScale ? wt.Scale(i) : zero;
    const V bv = kBias ? wt.Bias(i) : zero;
    const V yv = Isa::Round(E{}, nz.template Apply<kScale, kBias>(zv, sv, bv));
    if (y_float != nullptr) Isa::Store(E{}, y_float + i, yv);
    Isa::Store(F32{}, block, yv);
    QuantizeBlock<Q, W>(block, q + i, W, qp);
  }
  if (i < n) {
    const int rem = static_cast<int>(n - i);
    const V zv = src.LoadN(i, rem);
    if (sum != nullptr) Isa::StoreN(E{}, sum + i, zv, rem);
    const V sv = kScale ? wt.ScaleN(i, rem) : zero;
    const V bv = kBias ? wt.BiasN(i, rem) : zero;
    const V yv = Isa::Round(E{}, nz.template Apply<kScale, kBias>(zv, sv, bv));
    if (y_float != nullptr) Isa::StoreN(E{}, y_float + i, yv, rem);
    Isa::Store(F32{}, block, yv);
    QuantizeBlock<Q, 0>(block, q + i, rem, qp);
  }
}

// The min and max of a row's Y rounded to X's type, NaN left out (+Inf and -Inf when nothing
// else is there).
template <bool kScale, bool kBias, class E, class Nz, class Wt, class Src>
void RangeRow(const Src& source, const Nz& normalizer, const Wt& weights, int64_t n, float* lo_out, float* hi_out) {
  const Src src = source;
  const Nz nz = normalizer;
  const Wt wt = weights;
  const V zero = Isa::Zero();
  alignas(64) float lo[W], hi[W], block[W];
  for (int k = 0; k < W; ++k) {
    lo[k] = INFINITY;
    hi[k] = -INFINITY;
  }
  auto take = [&](int count) {
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 1
#endif
    for (int k = 0; k < count; ++k) {
      lo[k] = block[k] < lo[k] ? block[k] : lo[k];  // (false for NaN: left out)
      hi[k] = block[k] > hi[k] ? block[k] : hi[k];
    }
  };
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const V sv = kScale ? wt.Scale(i) : zero;
    const V bv = kBias ? wt.Bias(i) : zero;
    Isa::Store(F32{}, block, Isa::Round(E{}, nz.template Apply<kScale, kBias>(src.Load(i), sv, bv)));
    take(W);
  }
  if (i < n) {
    const int rem = static_cast<int>(n - i);
    const V sv = kScale ? wt.ScaleN(i, rem) : zero;
    const V bv = kBias ? wt.BiasN(i, rem) : zero;
    Isa::Store(F32{}, block, Isa::Round(E{}, nz.template Apply<kScale, kBias>(src.LoadN(i, rem), sv, bv)));
    take(rem);
  }
  float l = INFINITY, h = -INFINITY;
  for (int k = 0; k < W; ++k) {
    l = lo[k] < l ? lo[k] : l;
    h = hi[k] > h ? hi[k] : h;
  }
  *lo_out = l;
  *hi_out = h;
}

// One row of a pass, with its weights' presence resolved at compile time.
// The statistics come from stats_src (unless kept by kRange), the values of the last pass from src.
template <QuantPass kPass, NormKind NK, class E, class Q, bool kOrderA, class Wt, class StatsSrc, class Src>
inline void QuantRow(const StatsSrc& stats_src, const Src& src, const Wt& weights, bool has_scale, bool has_bias,
                     typename Q::St* q, typename E::St* y_float, typename E::St* sum, float* scratch,
                     const RowParams& p, const QuantParams& qp) {
  Stats st;
  if (kPass == QuantPass::kQuantize) {
    st.hi = scratch[0];
    st.lo = scratch[1];
    st.inv = scratch[2];
  } else {
    st = RowStats<NK>(stats_src, p);
  }
  const Normalizer<NK, E, kOrderA> nz(st, p.offset);
  auto run = [&](auto scale_tag, auto bias_tag) {
    constexpr bool kScale = decltype(scale_tag)::value;
    constexpr bool kBias = decltype(bias_tag)::value;
    if constexpr (kPass == QuantPass::kRange) {
      scratch[0] = st.hi;
      scratch[1] = st.lo;
      scratch[2] = st.inv;
      RangeRow<kScale, kBias, E>(src, nz, weights, p.n, &scratch[3], &scratch[4]);
    } else {
      QuantizeRow<kScale, kBias, E, Q>(src, nz, weights, q, y_float, sum, p.n, qp);
    }
  };
  using Yes = std::true_type;
  using No = std::false_type;
  if (has_scale) {
    if (has_bias) {
      run(Yes{}, Yes{});
    } else {
      run(Yes{}, No{});
    }
  } else if (has_bias) {
    run(No{}, Yes{});
  } else {
    run(No{}, No{});
  }
}

template <QuantPass kPass, NormKind NK, ResidualKind RK, class E, class S, class Q, bool kOrderA>
void QuantRowsInOrder(const NormArgs& a, const QuantArgs& qa, int64_t row_begin, int64_t row_end) {
  using T = typename E::St;
  using WT = typename S::St;
  const int64_t n = a.cols;
  RowParams p;
  p.n = n;
  p.inv_n = 1.0 / static_cast<double>(n);
  p.epsilon = static_cast<double>(a.epsilon);
  p.offset = a.scale_offset;
  const QuantParams qp = MakeQuantParams<Q>(qa);
  const T* x = static_cast<const T*>(a.x);
  const T* residual = static_cast<const T*>(a.residual);
  T* y = static_cast<T*>(a.y);
  T* sum = static_cast<T*>(a.sum);
  auto* q = static_cast<typename Q::St*>(qa.q);
  WeightRows<WT> scale(a.scale, a.scale_rows, n, row_begin), bias(a.bias, a.bias_rows, n, row_begin);
  WeightRows<WT> xbias(a.xbias, a.xbias_rows, n, row_begin);
  const bool has_scale = a.scale != nullptr, has_bias = a.bias != nullptr;
  const WeightPrep<E, S, kOrderA> prep(p.offset);
  const V alpha = Isa::Set1(a.alpha);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t at = r * n;
    const StoredWeights<E, S, kOrderA> weights{scale.Get(), bias.Get(), prep};
    float* scratch = qa.row_scratch != nullptr ? qa.row_scratch + r * kQuantScratchFloats : nullptr;
    typename Q::St* qr = q != nullptr ? q + at : nullptr;
    T* yr = y != nullptr ? y + at : nullptr;
    T* sr = sum != nullptr ? sum + at : nullptr;
    if constexpr (RK == ResidualKind::kNone) {
      const PlainSource<E> src{x + at};
      QuantRow<kPass, NK, E, Q, kOrderA>(src, src, weights, has_scale, has_bias, qr, yr, nullptr, scratch, p, qp);
    } else {
      const SkipSource<E, S> src{x + at, residual + at, xbias.Get(), alpha, a.alpha != 1.f};
      if (sr == nullptr) {
        QuantRow<kPass, NK, E, Q, kOrderA>(src, src, weights, has_scale, has_bias, qr, yr, nullptr, scratch, p, qp);
      } else if constexpr (kPass == QuantPass::kQuantize) {
        // Sum, written by the range pass, is the row's Z: one tensor to read instead of two
        const PlainSource<E> z{sr};
        QuantRow<kPass, NK, E, Q, kOrderA>(z, z, weights, has_scale, has_bias, qr, yr, nullptr, scratch, p, qp);
      } else {
        // the statistics pass writes Sum, the later passes read Z back from it (from cache)
        QuantRow<kPass, NK, E, Q, kOrderA>(StoringSource<E, SkipSource<E, S>>{src, sr}, PlainSource<E>{sr}, weights,
                                           has_scale, has_bias, qr, yr, nullptr, scratch, p, qp);
      }
      xbias.Next();
    }
    scale.Next();
    bias.Next();
  }
}

template <QuantPass kPass, NormKind NK, ResidualKind RK, class E, class S, class Q>
void QuantRows(const NormArgs& a, const QuantArgs& qa, int64_t row_begin, int64_t row_end) {
  if (row_begin >= row_end || a.cols <= 0) return;
  if constexpr (!std::is_same<E, F32>::value) {
    if (a.cast_before_scale) {
      QuantRowsInOrder<kPass, NK, RK, E, S, Q, true>(a, qa, row_begin, row_end);
      return;
    }
  }
  QuantRowsInOrder<kPass, NK, RK, E, S, Q, false>(a, qa, row_begin, row_end);
}

template <QuantPass kPass, NormKind NK, ResidualKind RK, class Q>
QuantRowsFn PickQuantTypes(ElemType x, ElemType w) {
  switch (x) {
    case ElemType::kFloat32: return w == ElemType::kFloat32 ? &QuantRows<kPass, NK, RK, F32, F32, Q> : nullptr;
    case ElemType::kFloat16:
      return w == ElemType::kFloat16   ? &QuantRows<kPass, NK, RK, F16, F16, Q>
             : w == ElemType::kFloat32 ? &QuantRows<kPass, NK, RK, F16, F32, Q>
                                       : nullptr;
    case ElemType::kBFloat16:
      return w == ElemType::kBFloat16  ? &QuantRows<kPass, NK, RK, BF16, BF16, Q>
             : w == ElemType::kFloat32 ? &QuantRows<kPass, NK, RK, BF16, F32, Q>
                                       : nullptr;
    default: return nullptr;
  }
}

template <NormKind NK, ResidualKind RK>
QuantRowsFn PickQuantPass(QuantPass pass, ElemType x, ElemType w, ElemType q) {
  switch (pass) {
    case QuantPass::kStatic:
      if (q == ElemType::kUInt8) return PickQuantTypes<QuantPass::kStatic, NK, RK, U8>(x, w);
      if (q == ElemType::kInt8) return PickQuantTypes<QuantPass::kStatic, NK, RK, I8>(x, w);
      if (q == ElemType::kFloat8E4M3FN) return PickQuantTypes<QuantPass::kStatic, NK, RK, F8>(x, w);
      return nullptr;
    case QuantPass::kRange:
      return q == ElemType::kUInt8 ? PickQuantTypes<QuantPass::kRange, NK, RK, U8>(x, w) : nullptr;
    case QuantPass::kQuantize:
      return q == ElemType::kUInt8 ? PickQuantTypes<QuantPass::kQuantize, NK, RK, U8>(x, w) : nullptr;
  }
  return nullptr;
}

template <NormKind NK>
QuantRowsFn PickQuantResidual(ResidualKind residual, QuantPass pass, ElemType x, ElemType w, ElemType q) {
  switch (residual) {
    case ResidualKind::kNone: return PickQuantPass<NK, ResidualKind::kNone>(pass, x, w, q);
    case ResidualKind::kSkip: return PickQuantPass<NK, ResidualKind::kSkip>(pass, x, w, q);
    default: return nullptr;
  }
}

inline QuantRowsFn PickQuantKernel(NormKind norm, ResidualKind residual, QuantPass pass, ElemType x, ElemType w,
                                   ElemType q) {
  switch (norm) {
    case NormKind::kRms: return PickQuantResidual<NormKind::kRms>(residual, pass, x, w, q);
    case NormKind::kLayer: return PickQuantResidual<NormKind::kLayer>(residual, pass, x, w, q);
    case NormKind::kL2: return nullptr;  // (no quantized L2Norm)
  }
  return nullptr;
}

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm

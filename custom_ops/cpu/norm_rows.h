// The row algorithms of every op, written once over a vector "instruction set" type Isa.
//
// Included by exactly one translation unit per instruction set (isa_portable.cc, isa_avx2.cc,
// isa_avx512.cc), after that unit has defined, in an anonymous namespace of onnxnorm::cpu, a
// struct Isa with:
//   W (lanes), V (a vector of W floats), Zero(), Set1(f), Add, Sub, Mul, Fma(a, b, c) = a*b + c,
//   HSum(v), MaskN(v, n) (lanes >= n set to 0), and per element tag E (F32, F16, BF16):
//   Load(E, p), LoadN(E, p, n) (lanes >= n read as 0, nothing past p + n touched), Store(E, p, v),
//   StoreN(E, p, v, n) (rounding to E's type, nearest even), Round(E, v) (v rounded to E's type);
//   kHasStream, Stream(E, p, v) (a non-temporal Store to a 64-byte aligned row) and Fence().
// Everything here has internal linkage (see cpu_internal.h).
//
// Per row, the algorithm is:
//   RMSNorm:   pass 1 sum of squares; pass 2 Y = X * inv_rms * (Scale + offset) + Bias.
//   LayerNorm: pass 1 sums of D and D^2 with D = X - shift, the shift being the mean of the first
//              vector of the row (near the row's mean, so D is exact for rows with a large mean and
//              E[D^2] - E[D]^2 does not cancel); only when the shift was far from the mean
//              (E[D^2] > 4 var), a second such pass around the mean found (split into a float pair,
//              so X - mean is exact to float precision); last pass writes Y. The row is read from
//              memory once; later passes read it from cache.
//   Skip:      Z = alpha * Residual + X (+ XBias) rounded to X's type is recomputed on every pass
//              from the cached inputs (no buffer), and written to Sum by the last pass.
//   Sandwich:  the inner norm of X is written to Sum (or Y), Residual is added in place (rounded),
//              then the outer norm of that into Y.
#pragma once

#include <math.h>

#include <cstdint>
#include <type_traits>

#include "cpu_internal.h"

namespace onnxnorm {
namespace cpu {
namespace {

using V = Isa::V;
constexpr int W = Isa::W;

struct RowParams {
  int64_t n;
  double inv_n;
  double epsilon;
  float offset;
  bool order_a;  // cast_before_scale, for 16-bit X only
};

// Outputs of a call larger than this (bytes read and written) are written with non-temporal
// stores where the instruction set has them: they would not stay in the last-level cache anyway,
// and streaming them saves the read-for-ownership of every output line.
constexpr int64_t kStreamBytes = 24ll << 20;

// Where a row's values Z come from: X itself, or Skip's alpha * Residual + X (+ XBias) rounded to
// X's type, recomputed on every pass from the (cached) inputs instead of written and read back.
template <class E>
struct PlainSource {
  const typename E::St* x;
  V Load(int64_t i) const { return Isa::Load(E{}, x + i); }
  V LoadN(int64_t i, int rem) const { return Isa::LoadN(E{}, x + i, rem); }
};

template <class E, class S, bool kXBias>
struct SkipSource {
  const typename E::St* x;
  const typename E::St* residual;
  const typename S::St* xbias;
  V alpha;
  V Load(int64_t i) const {
    V v = Isa::Fma(alpha, Isa::Load(E{}, residual + i), Isa::Load(E{}, x + i));
    if (kXBias) v = Isa::Add(v, Isa::Load(S{}, xbias + i));
    return Isa::Round(E{}, v);
  }
  V LoadN(int64_t i, int rem) const {
    V v = Isa::Fma(alpha, Isa::LoadN(E{}, residual + i, rem), Isa::LoadN(E{}, x + i, rem));
    if (kXBias) v = Isa::Add(v, Isa::LoadN(S{}, xbias + i, rem));
    return Isa::Round(E{}, v);
  }
};

template <class E>
inline void StoreOut(typename E::St* p, V v, bool stream) {
  if constexpr (Isa::kHasStream) {
    if (stream) {
      Isa::Stream(E{}, p, v);
      return;
    }
  }
  Isa::Store(E{}, p, v);
}

// Sum over the row of term(z) (a vector of W elements), with four independent accumulators.
template <class Src, class Term>
inline float ReduceRow(const Src& src, int64_t n, Term term) {
  V a0 = Isa::Zero(), a1 = Isa::Zero(), a2 = Isa::Zero(), a3 = Isa::Zero();
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = Isa::Add(a0, term(src.Load(i)));
    a1 = Isa::Add(a1, term(src.Load(i + W)));
    a2 = Isa::Add(a2, term(src.Load(i + 2 * W)));
    a3 = Isa::Add(a3, term(src.Load(i + 3 * W)));
  }
  for (; i + W <= n; i += W) a0 = Isa::Add(a0, term(src.Load(i)));
  if (i < n) {
    const int rem = static_cast<int>(n - i);
    a1 = Isa::Add(a1, Isa::MaskN(term(src.LoadN(i, rem)), rem));
  }
  return Isa::HSum(Isa::Add(Isa::Add(a0, a1), Isa::Add(a2, a3)));
}

// Sums of D and D^2 over the row, D = (z - hi) - lo.
template <class Src>
inline void CentredSums(const Src& src, int64_t n, float hi, float lo, float* sum_d, float* sum_dd) {
  const V vh = Isa::Set1(hi), vl = Isa::Set1(lo);
  V d0 = Isa::Zero(), d1 = Isa::Zero(), q0 = Isa::Zero(), q1 = Isa::Zero();
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const V a = Isa::Sub(Isa::Sub(src.Load(i), vh), vl);
    const V b = Isa::Sub(Isa::Sub(src.Load(i + W), vh), vl);
    d0 = Isa::Add(d0, a);
    d1 = Isa::Add(d1, b);
    q0 = Isa::Fma(a, a, q0);
    q1 = Isa::Fma(b, b, q1);
  }
  for (; i + W <= n; i += W) {
    const V a = Isa::Sub(Isa::Sub(src.Load(i), vh), vl);
    d0 = Isa::Add(d0, a);
    q0 = Isa::Fma(a, a, q0);
  }
  if (i < n) {
    const int rem = static_cast<int>(n - i);
    const V a = Isa::MaskN(Isa::Sub(Isa::Sub(src.LoadN(i, rem), vh), vl), rem);
    d1 = Isa::Add(d1, a);
    q1 = Isa::Fma(a, a, q1);
  }
  *sum_d = Isa::HSum(Isa::Add(d0, d1));
  *sum_dd = Isa::HSum(Isa::Add(q0, q1));
}

// Row statistics: the normalized value is ((z - hi) - lo) * inv (LayerNorm) or z * inv (RMSNorm).
template <NormKind NK, class Src>
inline void RowStats(const Src& src, const RowParams& p, float* hi, float* lo, float* inv) {
  if (NK == NormKind::kLayer) {
    // One pass of shifted sums around the mean of the first vector (close to the row's mean, so
    // z - shift is exact for rows with a large mean and the sums do not cancel), and a second
    // pass around the mean it gives only when the shift turned out far from the mean
    // (E[d^2] > 4 var: at most two of the row's digits lost to cancellation), or for NaN/Inf.
    const int first = p.n < W ? static_cast<int>(p.n) : W;
    const float shift = Isa::HSum(src.LoadN(0, first)) / static_cast<float>(first);
    float sum_d = 0.f, sum_dd = 0.f;
    CentredSums(src, p.n, shift, 0.f, &sum_d, &sum_dd);
    double mean_d = static_cast<double>(sum_d) * p.inv_n;
    double mean_dd = static_cast<double>(sum_dd) * p.inv_n;
    double var = mean_dd - mean_d * mean_d;
    double mean = static_cast<double>(shift) + mean_d;
    float h = static_cast<float>(mean);
    float l = static_cast<float>(mean - static_cast<double>(h));
    if (!(mean_dd <= 4.0 * var)) {
      CentredSums(src, p.n, h, l, &sum_d, &sum_dd);
      mean_d = static_cast<double>(sum_d) * p.inv_n;
      var = static_cast<double>(sum_dd) * p.inv_n - mean_d * mean_d;
      mean += mean_d;
      h = static_cast<float>(mean);
      l = static_cast<float>(mean - static_cast<double>(h));
    }
    if (var < 0.0) var = 0.0;  // (false for NaN, which propagates)
    *hi = h;
    *lo = l;
    *inv = static_cast<float>(1.0 / sqrt(var + p.epsilon));
  } else {
    const float squares = ReduceRow(src, p.n, [](V v) { return Isa::Mul(v, v); });
    *hi = 0.f;
    *lo = 0.f;
    *inv = static_cast<float>(1.0 / sqrt(static_cast<double>(squares) * p.inv_n + p.epsilon));
  }
}

// A weight vector rounded to X's type (order A rounds Scale and Bias to X's type first).
template <class E, class S>
inline V RoundWeight(V w) {
  if constexpr (std::is_same<E, S>::value || std::is_same<E, F32>::value) {
    return w;
  } else {
    return Isa::Round(E{}, w);
  }
}

// Pass over the row writing Y (and Z to sum, when not null) from the statistics. y may be the
// source's own storage (in place).
template <NormKind NK, class E, class S, bool kScale, bool kBias, bool kOrderA, class Src>
void FinishRow(const Src& src, typename E::St* y, typename E::St* sum, const typename S::St* scale,
               const typename S::St* bias, int64_t n, float hi, float lo, float inv, float offset, bool stream) {
  const V vh = Isa::Set1(hi), vl = Isa::Set1(lo), vinv = Isa::Set1(inv);
  V voff, vconst;
  if (kOrderA) {
    const float o = RoundScalar<E>(offset);
    voff = Isa::Set1(o);
    vconst = Isa::Set1(RoundScalar<E>(1.f + o));
  } else {
    voff = Isa::Set1(offset);
    vconst = Isa::Set1(1.f + offset);
  }
  auto compute = [&](V zv, V sv, V bv) -> V {
    V h = NK == NormKind::kLayer ? Isa::Mul(Isa::Sub(Isa::Sub(zv, vh), vl), vinv) : Isa::Mul(zv, vinv);
    if (!kOrderA) {
      const V s = kScale ? Isa::Add(sv, voff) : vconst;
      return kBias ? Isa::Fma(h, s, bv) : Isa::Mul(h, s);
    }
    h = Isa::Round(E{}, h);
    const V s = kScale ? Isa::Round(E{}, Isa::Add(RoundWeight<E, S>(sv), voff)) : vconst;
    const V out = Isa::Round(E{}, Isa::Mul(h, s));
    return kBias ? Isa::Add(out, RoundWeight<E, S>(bv)) : out;  // the store rounds the sum
  };
  const V zero = Isa::Zero();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const V zv = src.Load(i);
    if (sum != nullptr) StoreOut<E>(sum + i, zv, stream);
    const V sv = kScale ? Isa::Load(S{}, scale + i) : zero;
    const V bv = kBias ? Isa::Load(S{}, bias + i) : zero;
    StoreOut<E>(y + i, compute(zv, sv, bv), stream);
  }
  if (i < n) {
    const int rem = static_cast<int>(n - i);
    const V zv = src.LoadN(i, rem);
    if (sum != nullptr) Isa::StoreN(E{}, sum + i, zv, rem);
    const V sv = kScale ? Isa::LoadN(S{}, scale + i, rem) : zero;
    const V bv = kBias ? Isa::LoadN(S{}, bias + i, rem) : zero;
    Isa::StoreN(E{}, y + i, compute(zv, sv, bv), rem);
  }
}

// One normalized row: Y = Norm(Z) * (Scale + offset) + Bias in the requested rounding order.
template <NormKind NK, class E, class S, class Src>
inline void NormRow(const Src& src, typename E::St* y, typename E::St* sum, const typename S::St* scale,
                    const typename S::St* bias, const RowParams& p, bool stream) {
  float hi, lo, inv;
  RowStats<NK>(src, p, &hi, &lo, &inv);
  constexpr bool k16 = !std::is_same<E, F32>::value;
  const int variant = (scale != nullptr ? 1 : 0) | (bias != nullptr ? 2 : 0) | (k16 && p.order_a ? 4 : 0);
#define ONNXNORM_FINISH(S_, B_, A_) \
  FinishRow<NK, E, S, S_, B_, A_>(src, y, sum, scale, bias, p.n, hi, lo, inv, p.offset, stream)
  switch (variant) {
    case 0: ONNXNORM_FINISH(false, false, false); break;
    case 1: ONNXNORM_FINISH(true, false, false); break;
    case 2: ONNXNORM_FINISH(false, true, false); break;
    case 3: ONNXNORM_FINISH(true, true, false); break;
    default:
      if constexpr (k16) {
        switch (variant) {
          case 4: ONNXNORM_FINISH(false, false, true); break;
          case 5: ONNXNORM_FINISH(true, false, true); break;
          case 6: ONNXNORM_FINISH(false, true, true); break;
          default: ONNXNORM_FINISH(true, true, true); break;
        }
      }
      break;
  }
#undef ONNXNORM_FINISH
}

// z += residual, rounded to X's type.
template <class E>
void AddRow(typename E::St* z, const typename E::St* residual, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) Isa::Store(E{}, z + i, Isa::Add(Isa::Load(E{}, z + i), Isa::Load(E{}, residual + i)));
  if (i < n) {
    const int rem = static_cast<int>(n - i);
    Isa::StoreN(E{}, z + i, Isa::Add(Isa::LoadN(E{}, z + i, rem), Isa::LoadN(E{}, residual + i, rem)), rem);
  }
}

// Row r's row of a weight with weight_rows rows (row r uses r % weight_rows); nullptr if absent.
template <class T>
inline const T* WeightRow(const void* weight, int64_t weight_rows, int64_t r, int64_t n) {
  if (weight == nullptr) return nullptr;
  const T* w = static_cast<const T*>(weight);
  return weight_rows > 1 ? w + (r % weight_rows) * n : w;
}

// Whether every row of p (row length n elements of T) starts on a 64-byte boundary.
template <class T>
inline bool RowsAligned(const void* p, int64_t n) {
  return p == nullptr || (reinterpret_cast<uintptr_t>(p) % 64 == 0 && (n * static_cast<int64_t>(sizeof(T))) % 64 == 0);
}

template <NormKind NK, ResidualKind RK, class E, class S>
void Rows(const NormArgs& a, int64_t row_begin, int64_t row_end) {
  if (row_begin >= row_end || a.cols <= 0) return;
  using T = typename E::St;
  using WT = typename S::St;
  const int64_t n = a.cols;
  RowParams p;
  p.n = n;
  p.inv_n = 1.0 / static_cast<double>(n);
  p.epsilon = static_cast<double>(a.epsilon);
  p.offset = a.scale_offset;
  p.order_a = a.cast_before_scale;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const T* residual = static_cast<const T*>(a.residual);
  T* sum = static_cast<T*>(a.sum);

  const int64_t tensors = RK == ResidualKind::kNone ? 2 : (sum != nullptr ? 4 : 3);
  const bool stream = Isa::kHasStream && a.rows * n * static_cast<int64_t>(sizeof(T)) * tensors >= kStreamBytes &&
                      RowsAligned<T>(y, n) && RowsAligned<T>(sum, n);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    const WT* scale = WeightRow<WT>(a.scale, a.scale_rows, r, n);
    const WT* bias = WeightRow<WT>(a.bias, a.bias_rows, r, n);
    if constexpr (RK == ResidualKind::kNone) {
      NormRow<NK, E, S>(PlainSource<E>{xr}, yr, nullptr, scale, bias, p, stream);
    } else if constexpr (RK == ResidualKind::kSkip) {
      T* sr = sum != nullptr ? sum + r * n : nullptr;
      const WT* xbias = WeightRow<WT>(a.xbias, a.xbias_rows, r, n);
      const V alpha = Isa::Set1(a.alpha);
      if (xbias != nullptr) {
        NormRow<NK, E, S>(SkipSource<E, S, true>{xr, residual + r * n, xbias, alpha}, yr, sr, scale, bias, p, stream);
      } else {
        NormRow<NK, E, S>(SkipSource<E, S, false>{xr, residual + r * n, nullptr, alpha}, yr, sr, scale, bias, p,
                          stream);
      }
    } else {
      // The inner norm goes to Sum when it is wanted, else into Y; the residual is added there
      // and the outer norm reads it back from cache.
      T* z = sum != nullptr ? sum + r * n : yr;
      const WT* inner_scale = WeightRow<WT>(a.inner_scale, a.inner_scale_rows, r, n);
      const WT* inner_bias = WeightRow<WT>(a.inner_bias, a.inner_bias_rows, r, n);
      NormRow<NK, E, S>(PlainSource<E>{xr}, z, nullptr, inner_scale, inner_bias, p, false);
      AddRow<E>(z, residual + r * n, n);
      NormRow<NK, E, S>(PlainSource<E>{z}, yr, nullptr, scale, bias, p, stream);
    }
  }
  if (stream) Isa::Fence();  // the streamed stores are visible before the pool reports done
}

template <NormKind NK, ResidualKind RK>
NormRowsFn PickTypes(ElemType x, ElemType w) {
  switch (x) {
    case ElemType::kFloat32:
      return w == ElemType::kFloat32 ? &Rows<NK, RK, F32, F32> : nullptr;
    case ElemType::kFloat16:
      return w == ElemType::kFloat16 ? &Rows<NK, RK, F16, F16>
             : w == ElemType::kFloat32 ? &Rows<NK, RK, F16, F32>
                                       : nullptr;
    case ElemType::kBFloat16:
      return w == ElemType::kBFloat16 ? &Rows<NK, RK, BF16, BF16>
             : w == ElemType::kFloat32 ? &Rows<NK, RK, BF16, F32>
                                       : nullptr;
  }
  return nullptr;
}

template <NormKind NK>
NormRowsFn PickResidual(ResidualKind residual, ElemType x, ElemType w) {
  switch (residual) {
    case ResidualKind::kNone: return PickTypes<NK, ResidualKind::kNone>(x, w);
    case ResidualKind::kSkip: return PickTypes<NK, ResidualKind::kSkip>(x, w);
    case ResidualKind::kSandwich: return PickTypes<NK, ResidualKind::kSandwich>(x, w);
  }
  return nullptr;
}

inline NormRowsFn PickKernel(NormKind norm, ResidualKind residual, ElemType x, ElemType w) {
  switch (norm) {
    case NormKind::kRms: return PickResidual<NormKind::kRms>(residual, x, w);
    case NormKind::kLayer: return PickResidual<NormKind::kLayer>(residual, x, w);
  }
  return nullptr;
}

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm

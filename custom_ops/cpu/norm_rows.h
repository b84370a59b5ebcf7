// The row algorithms of every op, written once over a vector "instruction set" type Isa.
//
// Included by exactly one translation unit per instruction set (isa_portable.cc, isa_avx2.cc,
// isa_avx512.cc), after that unit has defined, in an anonymous namespace of onnxnorm::cpu, a
// struct Isa with:
//   W (lanes: 8 or 16), V (a vector of W floats), Zero(), Set1(f), Add, Sub, Mul, HSum(v) (the
//   halving folds: lane k + lane k + W/2, ..., down to one), MaskN(v, n) (lanes >= n set to 0),
//   and per element tag E (F32, F16, BF16): Load(E, p), LoadN(E, p, n) (lanes >= n read as 0,
//   nothing past p + n touched), Store(E, p, v), StoreN(E, p, v, n) (rounding to E's type,
//   nearest even), Round(E, v) (v rounded to E's type); kHasStream, Stream(E, p, v) (a
//   non-temporal Store to a 64-byte aligned address) and Fence().
// Everything here has internal linkage (see cpu_internal.h).
//
// Every instruction set gives the same bits: each element goes through the same float32
// operations (no fused multiply-add: a product is rounded before it is added, as the
// portable code does), and the row sums are taken in one order that does not depend on W: element
// j of each block of 64 (sum of squares) or 32 (the LayerNorm sums) is added into lane j of its
// own accumulator, and the lanes are then folded in halves (lane k + lane k + 32, + 16, ..., + 1).
//
// Per row, the algorithm is:
//   RMSNorm:   pass 1 sum of squares; pass 2 Y = X * inv_rms * (Scale + offset) + Bias.
//   LayerNorm: pass 1 sums of D and D^2 with D = X - shift, the shift being the mean of the row's
//              first 8 values (near the row's mean, so D is exact for rows with a large mean and
//              E[D^2] - E[D]^2 does not cancel); only when the shift was far from the mean
//              (E[D^2] > 4 var), a second such pass around the mean found (split into a float
//              pair, so X - mean is exact to float precision); last pass writes Y. The row is read
//              from memory once; later passes read it from cache.
//   Skip:      Z = alpha * Residual + X (+ XBias), rounded to X's type.
//   Sandwich:  Z = Residual + InnerNorm(X), rounded to X's type; a first pass takes the inner
//              statistics of X.
//   For both, the statistics pass computes Z from the inputs and, when Sum is wanted, writes it
//   there; the last pass reads Z back from Sum (from cache). When Sum is not wanted, or is streamed,
//   every pass computes Z again from the (cached) inputs, and the last pass writes Sum.
//   So every op reads its inputs from memory once and writes each output once. The last pass
//   writes each row from Y's first 64-byte boundary on a whole vector at a time (the few elements
//   before it first), and calls that move kStreamBytes or more stream their outputs past the cache
//   (non-temporal stores).
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

// The widths of the two kinds of row sums (see the top of this file): each a multiple of every W.
constexpr int kSquareLanes = 64;
constexpr int kCentredLanes = 32;
static_assert(kSquareLanes % W == 0 && kCentredLanes % W == 0, "lanes of the row sums");

// Calls that move at least kStreamMinBytes (onnxnorm/kernels.h; inputs read and outputs written)
// write their outputs with non-temporal stores where the instruction set has them: the outputs
// would not stay in the cache anyway, and streaming them saves reading every output line before
// it is written. Below it, ordinary stores keep the tensors in the last-level cache, which is
// faster while they fit (docs/benchmarks.md has the measurements behind the value). Only rows at
// least kStreamMinRowBytes long, or that each start on a 64-byte boundary, are streamed: a row
// that starts or ends inside a cache line writes that line with ordinary stores, which a short
// row would do for a large share of its lines.
constexpr int64_t kStreamBytes = kStreamMinBytes;
constexpr int64_t kStreamRowBytes = kStreamMinRowBytes;

struct RowParams {
  int64_t n;
  double inv_n;
  double epsilon;
  float offset;
};

// Row statistics: the normalized value is ((z - hi) - lo) * inv (LayerNorm) or z * inv (RMSNorm).
struct Stats {
  float hi = 0.f, lo = 0.f, inv = 1.f;
};

// A weight vector rounded to X's type (order A rounds Scale and Bias to X's type first).
template <class E, class S>
inline V RoundWeight(V w) {
  if constexpr (std::is_same<E, S>::value || std::is_same<E, F32>::value) {
    return w;
  } else {
    return Isa::Round(E{}, w);
  }
}

// Y from Z for one row: Norm(Z) * (Scale + offset) + Bias in the rounding order kOrderA (for
// 16-bit X; float32 always takes order B, where the two agree).
template <NormKind NK, class E, class S, bool kOrderA>
struct Normalizer {
  V vh, vl, vinv, voff, vconst;
  Normalizer(const Stats& st, float offset)
      : vh(Isa::Set1(st.hi)), vl(Isa::Set1(st.lo)), vinv(Isa::Set1(st.inv)) {
    if (kOrderA) {
      const float o = RoundScalar<E>(offset);
      voff = Isa::Set1(o);
      vconst = Isa::Set1(RoundScalar<E>(1.f + o));
    } else {
      voff = Isa::Set1(offset);
      vconst = Isa::Set1(1.f + offset);
    }
  }
  template <bool kScale, bool kBias>
  V Apply(V zv, V sv, V bv) const {
    V h = NK == NormKind::kLayer ? Isa::Mul(Isa::Sub(Isa::Sub(zv, vh), vl), vinv) : Isa::Mul(zv, vinv);
    if (!kOrderA) {
      const V s = kScale ? Isa::Add(sv, voff) : vconst;
      return kBias ? Isa::Add(Isa::Mul(h, s), bv) : Isa::Mul(h, s);
    }
    h = Isa::Round(E{}, h);
    const V s = kScale ? Isa::Round(E{}, Isa::Add(RoundWeight<E, S>(sv), voff)) : vconst;
    const V out = Isa::Round(E{}, Isa::Mul(h, s));
    return kBias ? Isa::Add(out, RoundWeight<E, S>(bv)) : out;  // the store rounds the sum
  }
};

// Where a row's values Z come from: X itself, Skip's alpha * Residual + X (+ XBias), or the
// Sandwich's Residual + InnerNorm(X), the last two rounded to X's type and recomputed on every
// pass from the (cached) inputs instead of written and read back.
template <class E>
struct PlainSource {
  const typename E::St* x;
  V Load(int64_t i) const { return Isa::Load(E{}, x + i); }
  V LoadN(int64_t i, int rem) const { return Isa::LoadN(E{}, x + i, rem); }
};

// kAlpha: alpha is not 1 (1 * Residual is Residual, so the product is left out then).
template <class E, class S, bool kXBias, bool kAlpha>
struct SkipSource {
  const typename E::St* x;
  const typename E::St* residual;
  const typename S::St* xbias;
  V alpha;
  V Load(int64_t i) const {
    V r = Isa::Load(E{}, residual + i);
    if (kAlpha) r = Isa::Mul(alpha, r);
    V v = Isa::Add(r, Isa::Load(E{}, x + i));
    if (kXBias) v = Isa::Add(v, Isa::Load(S{}, xbias + i));
    return Isa::Round(E{}, v);
  }
  V LoadN(int64_t i, int rem) const {
    V r = Isa::LoadN(E{}, residual + i, rem);
    if (kAlpha) r = Isa::Mul(alpha, r);
    V v = Isa::Add(r, Isa::LoadN(E{}, x + i, rem));
    if (kXBias) v = Isa::Add(v, Isa::LoadN(S{}, xbias + i, rem));
    return Isa::Round(E{}, v);
  }
};

template <NormKind NK, class E, class S, bool kOrderA>
struct SandwichSource {
  const typename E::St* x;
  const typename E::St* residual;
  const typename S::St* inner_scale;  // nullptr: absent
  const typename S::St* inner_bias;   // nullptr: absent
  Normalizer<NK, E, S, kOrderA> inner;
  V Inner(V xv, V sv, V bv) const {
    if (inner_scale != nullptr) {
      return inner_bias != nullptr ? inner.template Apply<true, true>(xv, sv, bv)
                                   : inner.template Apply<true, false>(xv, sv, bv);
    }
    return inner_bias != nullptr ? inner.template Apply<false, true>(xv, sv, bv)
                                 : inner.template Apply<false, false>(xv, sv, bv);
  }
  V Load(int64_t i) const {
    const V sv = inner_scale != nullptr ? Isa::Load(S{}, inner_scale + i) : Isa::Zero();
    const V bv = inner_bias != nullptr ? Isa::Load(S{}, inner_bias + i) : Isa::Zero();
    const V h = Isa::Round(E{}, Inner(Isa::Load(E{}, x + i), sv, bv));
    return Isa::Round(E{}, Isa::Add(h, Isa::Load(E{}, residual + i)));
  }
  V LoadN(int64_t i, int rem) const {
    const V sv = inner_scale != nullptr ? Isa::LoadN(S{}, inner_scale + i, rem) : Isa::Zero();
    const V bv = inner_bias != nullptr ? Isa::LoadN(S{}, inner_bias + i, rem) : Isa::Zero();
    const V h = Isa::Round(E{}, Inner(Isa::LoadN(E{}, x + i, rem), sv, bv));
    return Isa::Round(E{}, Isa::Add(h, Isa::LoadN(E{}, residual + i, rem)));
  }
};

// The K accumulators of a row sum folded in halves into one vector (lane k + lane k + K*W/2, ...).
template <int K>
inline V Fold(V* a) {
  for (int half = K / 2; half >= 1; half /= 2) {
    for (int k = 0; k < half; ++k) a[k] = Isa::Add(a[k], a[k + half]);
  }
  return a[0];
}

// Sum over the row of z * z.
// (The passes copy their source and constants into locals: through a reference, the compiler would
// reload every vector constant after each store, as a store of floats might change it.)
template <class Src>
inline float SumOfSquares(const Src& source, int64_t n) {
  const Src src = source;
  constexpr int K = kSquareLanes / W;
  V a[K];
  for (V& v : a) v = Isa::Zero();
  int64_t i = 0;
  for (; i + kSquareLanes <= n; i += kSquareLanes) {
    for (int k = 0; k < K; ++k) {
      const V z = src.Load(i + k * W);
      a[k] = Isa::Add(a[k], Isa::Mul(z, z));
    }
  }
  for (int k = 0; k < K && i < n; ++k) {
    if (i + W <= n) {
      const V z = src.Load(i);
      a[k] = Isa::Add(a[k], Isa::Mul(z, z));
      i += W;
    } else {
      const int rem = static_cast<int>(n - i);
      const V z = src.LoadN(i, rem);
      a[k] = Isa::Add(a[k], Isa::MaskN(Isa::Mul(z, z), rem));
      i = n;
    }
  }
  return Isa::HSum(Fold<K>(a));
}

// Sums of D and D^2 over the row, D = (z - hi) - lo.
template <class Src>
inline void CentredSums(const Src& source, int64_t n, float hi, float lo, float* sum_d, float* sum_dd) {
  const Src src = source;
  constexpr int K = kCentredLanes / W;
  const V vh = Isa::Set1(hi), vl = Isa::Set1(lo);
  V d[K], q[K];
  for (int k = 0; k < K; ++k) d[k] = q[k] = Isa::Zero();
  int64_t i = 0;
  for (; i + kCentredLanes <= n; i += kCentredLanes) {
    for (int k = 0; k < K; ++k) {
      const V a = Isa::Sub(Isa::Sub(src.Load(i + k * W), vh), vl);
      d[k] = Isa::Add(d[k], a);
      q[k] = Isa::Add(q[k], Isa::Mul(a, a));
    }
  }
  for (int k = 0; k < K && i < n; ++k) {
    V a;
    if (i + W <= n) {
      a = Isa::Sub(Isa::Sub(src.Load(i), vh), vl);
      i += W;
    } else {
      const int rem = static_cast<int>(n - i);
      a = Isa::MaskN(Isa::Sub(Isa::Sub(src.LoadN(i, rem), vh), vl), rem);
      i = n;
    }
    d[k] = Isa::Add(d[k], a);
    q[k] = Isa::Add(q[k], Isa::Mul(a, a));
  }
  *sum_d = Isa::HSum(Fold<K>(d));
  *sum_dd = Isa::HSum(Fold<K>(q));
}

template <NormKind NK, class Src>
inline Stats RowStats(const Src& src, const RowParams& p) {
  Stats st;
  if (NK == NormKind::kLayer) {
    // One pass of shifted sums around the mean of the row's first 8 values (close to the row's
    // mean, so z - shift is exact for rows with a large mean and the sums do not cancel), and a
    // second pass around the mean it gives only when the shift turned out far from the mean
    // (E[d^2] > 4 var: at most two of the row's digits lost to cancellation), or for NaN/Inf.
    const int first = p.n < 8 ? static_cast<int>(p.n) : 8;
    float head[W];
    Isa::Store(F32{}, head, src.LoadN(0, first));
    const float head_sum = ((head[0] + head[4]) + (head[2] + head[6])) + ((head[1] + head[5]) + (head[3] + head[7]));
    const float shift = head_sum / static_cast<float>(first);
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
    st.hi = h;
    st.lo = l;
    st.inv = static_cast<float>(1.0 / sqrt(var + p.epsilon));
  } else {
    const float squares = SumOfSquares(src, p.n);
    st.inv = static_cast<float>(1.0 / sqrt(static_cast<double>(squares) * p.inv_n + p.epsilon));
  }
  return st;
}

// Where a call's outputs go: streamed (non-temporal) or stored; Sum is streamed only when it
// reaches a 64-byte boundary at the same element as Y.
struct OutputPlan {
  bool stream_y = false;
  bool stream_sum = false;
};

// Elements of T before p reaches a 64-byte boundary (p is aligned to its element).
template <class T>
inline int64_t ElementsToLine(const T* p) {
  return static_cast<int64_t>((64 - reinterpret_cast<uintptr_t>(p) % 64) % 64) / static_cast<int64_t>(sizeof(T));
}

// Rows at least this many vectors wide start their last pass with the elements before Y's first
// 64-byte boundary, so that the rest of Y is written a whole vector per cache line (and, when X
// sits at the same distance from a boundary, as tensors from one allocator do, read so too).
// Each element's result does not depend on how the row is cut into vectors.
constexpr int64_t kAlignRowVectors = 4;

// The pass over a row that writes Y (and Z to sum, when not null) from the statistics.
template <bool kScale, bool kBias, class E, class S, class Nz, class Src>
void FinishRow(const Src& source, const Nz& normalizer, typename E::St* y, typename E::St* sum,
               const typename S::St* scale, const typename S::St* bias, int64_t n, const OutputPlan& plan) {
  const Src src = source;
  const Nz nz = normalizer;
  const V zero = Isa::Zero();
  auto partial = [&](int64_t i, int rem) {
    const V zv = src.LoadN(i, rem);
    if (sum != nullptr) Isa::StoreN(E{}, sum + i, zv, rem);
    const V sv = kScale ? Isa::LoadN(S{}, scale + i, rem) : zero;
    const V bv = kBias ? Isa::LoadN(S{}, bias + i, rem) : zero;
    Isa::StoreN(E{}, y + i, nz.template Apply<kScale, kBias>(zv, sv, bv), rem);
  };
  int64_t i = 0;
  if (n >= kAlignRowVectors * W || plan.stream_y) {
    int64_t head = ElementsToLine(y);
    if (head > n) head = n;
    while (i < head) {
      const int rem = head - i < W ? static_cast<int>(head - i) : W;
      partial(i, rem);
      i += rem;
    }
  }
  if constexpr (Isa::kHasStream) {
    if (plan.stream_y) {
      for (; i + W <= n; i += W) {
        const V zv = src.Load(i);
        if (sum != nullptr) {
          if (plan.stream_sum) {
            Isa::Stream(E{}, sum + i, zv);
          } else {
            Isa::Store(E{}, sum + i, zv);
          }
        }
        const V sv = kScale ? Isa::Load(S{}, scale + i) : zero;
        const V bv = kBias ? Isa::Load(S{}, bias + i) : zero;
        Isa::Stream(E{}, y + i, nz.template Apply<kScale, kBias>(zv, sv, bv));
      }
      if (i < n) partial(i, static_cast<int>(n - i));
      return;
    }
  }
  for (; i + W <= n; i += W) {
    const V zv = src.Load(i);
    if (sum != nullptr) Isa::Store(E{}, sum + i, zv);
    const V sv = kScale ? Isa::Load(S{}, scale + i) : zero;
    const V bv = kBias ? Isa::Load(S{}, bias + i) : zero;
    Isa::Store(E{}, y + i, nz.template Apply<kScale, kBias>(zv, sv, bv));
  }
  if (i < n) partial(i, static_cast<int>(n - i));
}

// One normalized row: Y = Norm(Z) * (Scale + offset) + Bias, and Sum = Z when sum is not null.
template <NormKind NK, class E, class S, bool kOrderA, class Src, class FinishSrc>
inline void NormRowFrom(const Src& stats_src, const FinishSrc& finish_src, typename E::St* y, typename E::St* sum,
                        const typename S::St* scale, const typename S::St* bias, const RowParams& p,
                        const OutputPlan& plan) {
  const Normalizer<NK, E, S, kOrderA> nz(RowStats<NK>(stats_src, p), p.offset);
  if (scale != nullptr) {
    if (bias != nullptr) {
      FinishRow<true, true, E, S>(finish_src, nz, y, sum, scale, bias, p.n, plan);
    } else {
      FinishRow<true, false, E, S>(finish_src, nz, y, sum, scale, bias, p.n, plan);
    }
  } else if (bias != nullptr) {
    FinishRow<false, true, E, S>(finish_src, nz, y, sum, scale, bias, p.n, plan);
  } else {
    FinishRow<false, false, E, S>(finish_src, nz, y, sum, scale, bias, p.n, plan);
  }
}

// A source that also writes each Z it gives to sum (ordinary stores): the statistics pass of a
// residual op writes Sum, and the last pass reads Z back from there (from cache).
template <class E, class Src>
struct StoringSource {
  Src src;
  typename E::St* sum;
  V Load(int64_t i) const {
    const V z = src.Load(i);
    Isa::Store(E{}, sum + i, z);
    return z;
  }
  V LoadN(int64_t i, int rem) const {
    const V z = src.LoadN(i, rem);
    Isa::StoreN(E{}, sum + i, z, rem);
    return z;
  }
};

// NormRowFrom for a row whose Z is computed from several inputs (Skip, Sandwich). With Sum wanted
// and not streamed, Z is written to Sum by the statistics pass and read back by the last pass (two
// loads fewer per element than computing it again); otherwise every pass computes it again, and
// the last pass writes (streams) Sum.
template <NormKind NK, class E, class S, bool kOrderA, class Src>
inline void NormRow(const Src& src, typename E::St* y, typename E::St* sum, const typename S::St* scale,
                    const typename S::St* bias, const RowParams& p, const OutputPlan& plan) {
  if (sum != nullptr && !plan.stream_y) {
    NormRowFrom<NK, E, S, kOrderA>(StoringSource<E, Src>{src, sum}, PlainSource<E>{sum}, y, nullptr, scale, bias, p,
                                   plan);
  } else {
    NormRowFrom<NK, E, S, kOrderA>(src, src, y, sum, scale, bias, p, plan);
  }
}

// Row r's row of a weight with `rows` rows (row r uses row r % rows), stepping through the rows
// without a division per row; nullptr throughout when the weight is absent.
template <class T>
class WeightRows {
 public:
  WeightRows(const void* weight, int64_t rows, int64_t n, int64_t first_row)
      : base_(static_cast<const T*>(weight)), rows_(rows > 1 ? rows : 1), n_(n), row_(rows > 1 ? first_row % rows : 0) {}
  const T* Get() const { return base_ == nullptr ? nullptr : base_ + row_ * n_; }
  void Next() {
    if (++row_ == rows_) row_ = 0;
  }

 private:
  const T* base_;
  int64_t rows_, n_, row_;
};

template <NormKind NK, ResidualKind RK, class E, class S, bool kOrderA>
void RowsInOrder(const NormArgs& a, int64_t row_begin, int64_t row_end) {
  using T = typename E::St;
  using WT = typename S::St;
  const int64_t n = a.cols;
  RowParams p;
  p.n = n;
  p.inv_n = 1.0 / static_cast<double>(n);
  p.epsilon = static_cast<double>(a.epsilon);
  p.offset = a.scale_offset;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const T* residual = static_cast<const T*>(a.residual);
  T* sum = static_cast<T*>(a.sum);

  OutputPlan plan;
  const int64_t tensors = RK == ResidualKind::kNone ? 2 : (sum != nullptr ? 4 : 3);
  const int64_t row_bytes = n * static_cast<int64_t>(sizeof(T));
  const bool whole_lines = row_bytes % 64 == 0 && reinterpret_cast<uintptr_t>(y) % 64 == 0;
  plan.stream_y = Isa::kHasStream && a.rows * row_bytes * tensors >= kStreamBytes &&
                  reinterpret_cast<uintptr_t>(y) % sizeof(T) == 0 && (row_bytes >= kStreamRowBytes || whole_lines);
  plan.stream_sum = plan.stream_y && sum != nullptr &&
                    (reinterpret_cast<uintptr_t>(sum) - reinterpret_cast<uintptr_t>(y)) % 64 == 0;

  WeightRows<WT> scale(a.scale, a.scale_rows, n, row_begin), bias(a.bias, a.bias_rows, n, row_begin);
  WeightRows<WT> xbias(a.xbias, a.xbias_rows, n, row_begin);
  WeightRows<WT> inner_scale(a.inner_scale, a.inner_scale_rows, n, row_begin);
  WeightRows<WT> inner_bias(a.inner_bias, a.inner_bias_rows, n, row_begin);
  const V alpha = Isa::Set1(a.alpha);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    T* sr = sum != nullptr ? sum + r * n : nullptr;
    if constexpr (RK == ResidualKind::kNone) {
      const PlainSource<E> src{xr};
      NormRowFrom<NK, E, S, kOrderA>(src, src, yr, nullptr, scale.Get(), bias.Get(), p, plan);
    } else if constexpr (RK == ResidualKind::kSkip) {
      const T* rr = residual + r * n;
      const WT* xb = xbias.Get();
      if (a.alpha != 1.f) {
        if (xb != nullptr) {
          NormRow<NK, E, S, kOrderA>(SkipSource<E, S, true, true>{xr, rr, xb, alpha}, yr, sr, scale.Get(),
                                     bias.Get(), p, plan);
        } else {
          NormRow<NK, E, S, kOrderA>(SkipSource<E, S, false, true>{xr, rr, xb, alpha}, yr, sr, scale.Get(),
                                     bias.Get(), p, plan);
        }
      } else if (xb != nullptr) {
        NormRow<NK, E, S, kOrderA>(SkipSource<E, S, true, false>{xr, rr, xb, alpha}, yr, sr, scale.Get(),
                                   bias.Get(), p, plan);
      } else {
        NormRow<NK, E, S, kOrderA>(SkipSource<E, S, false, false>{xr, rr, xb, alpha}, yr, sr, scale.Get(),
                                   bias.Get(), p, plan);
      }
      xbias.Next();
    } else {
      const Stats inner = RowStats<NK>(PlainSource<E>{xr}, p);
      const SandwichSource<NK, E, S, kOrderA> src{xr, residual + r * n, inner_scale.Get(), inner_bias.Get(),
                                                  Normalizer<NK, E, S, kOrderA>(inner, p.offset)};
      NormRow<NK, E, S, kOrderA>(src, yr, sr, scale.Get(), bias.Get(), p, plan);
      inner_scale.Next();
      inner_bias.Next();
    }
    scale.Next();
    bias.Next();
  }
  if (plan.stream_y) Isa::Fence();  // the streamed stores are visible before the pool reports done
}

template <NormKind NK, ResidualKind RK, class E, class S>
void Rows(const NormArgs& a, int64_t row_begin, int64_t row_end) {
  if (row_begin >= row_end || a.cols <= 0) return;
  if constexpr (!std::is_same<E, F32>::value) {
    if (a.cast_before_scale) {
      RowsInOrder<NK, RK, E, S, true>(a, row_begin, row_end);
      return;
    }
  }
  RowsInOrder<NK, RK, E, S, false>(a, row_begin, row_end);
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

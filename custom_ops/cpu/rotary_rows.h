// The row algorithm of the rotary ops (onnxnorm/rotary_kernels.h), written once over the vector
// "instruction set" type Isa of norm_rows.h, whose statistics, normalizer and weights it uses:
// a rotary row's norm gives the bits of the norm kernels' row of the same values.
//
// Included by the rotary unit of each instruction set (rotary_portable.cc, rotary_avx2.cc,
// rotary_avx512.cc, rotary_avx512_bf16.cc, rotary_avx512_fp16.cc) after its isa_<set>.h; a unit
// that defines ONNXNORM_ONLY_BFLOAT16 (ONNXNORM_ONLY_FLOAT16) holds the kernels of a bfloat16
// (float16) T only, and ONNXNORM_NATIVE_HALF rotates float16 heads in half precision
// (rotary_half.h). Everything here has internal linkage (see cpu_internal.h).
//
// Per row (one head, or with per_head = 0 one token's heads), reading the row's input once:
//   rotary_first = 0: the statistics of the row (norm_rows.h's RowStats: the same float32 sums
//     in the same order; of a 16-bit T taken for a block of rows before the block is normalized,
//     so that each row's chain of a horizontal sum, a square root and a division overlaps other
//     rows' work);
//     then for each head of the row, its half-split pairs normalized and scaled in registers,
//     rounded to T as a float32 buffer would hold them, rotated and stored at the head's place in
//     the output (layout 2: [batch, heads, seq, head_size]) in one pass, the values past
//     rotary_dim normalized and stored; interleaved pairs: the head normalized into a float32
//     buffer, rotated there, then stored.
// The weights of Q and of K are prepared once per call (WeightPrep's float32 values) where they
// fit a small buffer, so that each row reads them without converting; rounding to T is left out
// where the values are of T's precision already (angles of T, order A's unbiased products).
//   rotary_first = 1: each head of the row rotated into a float32 row buffer, rounded to T; the
//     statistics of the buffer; each head normalized from it into the output.
// The rotation of a pair (a, b) with angles (cos_a, sin_a) for a and (cos_b, sin_b) for b:
//   a' = a * cos_a - b * sin_a,  b' = b * cos_b + a * sin_b
// each product rounded to float32 (no fused multiply-add), the sum rounded to T; rotary_in_t = 1
// (a 16-bit T) rounds the angles and each product to T first. Half-split pairs (value j with
// j + rotary_dim / 2) rotate a vector of W pairs at a time; interleaved pairs (2j, 2j + 1) are
// gathered W at a time into blocks and rotated by the same vector code. The vectors of a and of
// b are rounded (normalized, multiplied, stored) together, RoundBoth and StoreBoth: in bfloat16
// one conversion instruction for both, half the conversions (and one subnormal test).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "norm_rows.h"
#include "onnxnorm/rotary_kernels.h"
#if defined(ONNXNORM_NATIVE_HALF)
#include "rotary_half.h"  // (the float16 heads in half-precision arithmetic)
#endif

namespace onnxnorm {
namespace cpu {
namespace {

// Loads n values of T into a float32 buffer (exactly), or stores a float32 buffer of T's
// precision as T.
template <class E>
inline void Widen(const typename E::St* x, float* h, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) Isa::Store(F32{}, h + i, Isa::Load(E{}, x + i));
  if (i < n) Isa::StoreN(F32{}, h + i, Isa::LoadN(E{}, x + i, static_cast<int>(n - i)), static_cast<int>(n - i));
}
template <class E>
inline void Narrow(const float* h, typename E::St* y, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) Isa::Store(E{}, y + i, Isa::Load(F32{}, h + i));
  if (i < n) Isa::StoreN(E{}, y + i, Isa::LoadN(F32{}, h + i, static_cast<int>(n - i)), static_cast<int>(n - i));
}

// The rotation of W pairs (a, b) with their angles, before its final rounding to T (E): the
// caller rounds it (into a float32 buffer) or stores it as T, which rounds once. kInT: the
// angles (where A is wider than T) and the products rounded to T as well.
template <class E, class A, bool kInT>
ONNXNORM_INLINE void RotateVectors(V a, V b, V ca, V sa, V cb, V sb, V* ra, V* rb) {
  if constexpr (kInT) {
    if constexpr (!std::is_same<A, E>::value) {
      RoundBoth<E>(&ca, &sa);
      RoundBoth<E>(&cb, &sb);
    }
    V pa = Isa::Mul(a, ca), pb = Isa::Mul(b, sa), qa = Isa::Mul(b, cb), qb = Isa::Mul(a, sb);
    RoundBoth<E>(&pa, &pb);
    RoundBoth<E>(&qa, &qb);
    *ra = Isa::Sub(pa, pb);
    *rb = Isa::Add(qa, qb);
  } else {
    *ra = Isa::Sub(Isa::Mul(a, ca), Isa::Mul(b, sa));
    *rb = Isa::Add(Isa::Mul(b, cb), Isa::Mul(a, sb));
  }
}

// Where values go: a float32 buffer (rounded to T, unless kRounded says they are) or T's output
// (the store rounds).
template <class E>
struct ToBuffer {
  float* out;
  template <bool kRounded = false>
  ONNXNORM_INLINE void Put(int64_t i, V v) const {
    Isa::Store(F32{}, out + i, kRounded ? v : Isa::Round(E{}, v));
  }
  template <bool kRounded = false>
  ONNXNORM_INLINE void PutN(int64_t i, V v, int rem) const {
    Isa::StoreN(F32{}, out + i, kRounded ? v : Isa::Round(E{}, v), rem);
  }
  ONNXNORM_INLINE void PutBoth(int64_t i, V a, int64_t j, V b) const {
    RoundBoth<E>(&a, &b);
    Isa::Store(F32{}, out + i, a);
    Isa::Store(F32{}, out + j, b);
  }
};
template <class E>
struct ToOutput {
  typename E::St* out;
  template <bool kRounded = false>
  ONNXNORM_INLINE void Put(int64_t i, V v) const {
    Isa::Store(E{}, out + i, v);
  }
  template <bool kRounded = false>
  ONNXNORM_INLINE void PutN(int64_t i, V v, int rem) const {
    Isa::StoreN(E{}, out + i, v, rem);
  }
  ONNXNORM_INLINE void PutBoth(int64_t i, V a, int64_t j, V b) const { StoreBoth<E>(out + i, a, out + j, b); }
};

// The half-split pairs (j, j + half) of a head's first rotary_dim values (values: a source of
// float32 values of T's precision, Load(i) / LoadN(i, rem) giving value i: a buffer's, or
// NormalizedSource's) rotated by one token's angles c and s (of A; per_value: one angle per
// value, the second value's at j + half, else one per pair) into dst (the buffer itself, or the
// output).
template <class E, class A, bool kInT, bool kPerValue, class Values, class Dst>
inline void RotateHalves(const Values& source, const typename A::St* c, const typename A::St* s, int64_t half,
                         const Dst& dst) {
  const Values values = source;
  const int64_t second = kPerValue ? half : 0;
  int64_t j = 0;
  for (; j + W <= half; j += W) {
    const V ca = Isa::Load(A{}, c + j), sa = Isa::Load(A{}, s + j);
    const V cb = kPerValue ? Isa::Load(A{}, c + j + second) : ca;
    const V sb = kPerValue ? Isa::Load(A{}, s + j + second) : sa;
    V ra, rb;
    V va, vb;
    values.LoadBoth(j, j + half, &va, &vb);
    RotateVectors<E, A, kInT>(va, vb, ca, sa, cb, sb, &ra, &rb);
    dst.PutBoth(j, ra, j + half, rb);
  }
  if (j < half) {
    const int rem = static_cast<int>(half - j);
    const V ca = Isa::LoadN(A{}, c + j, rem), sa = Isa::LoadN(A{}, s + j, rem);
    const V cb = kPerValue ? Isa::LoadN(A{}, c + j + second, rem) : ca;
    const V sb = kPerValue ? Isa::LoadN(A{}, s + j + second, rem) : sa;
    V ra, rb;
    RotateVectors<E, A, kInT>(values.LoadN(j, rem), values.LoadN(j + half, rem), ca, sa, cb, sb, &ra, &rb);
    dst.PutN(j, ra, rem);
    dst.PutN(j + half, rb, rem);
  }
}

// The first rotary_dim values of a head (float32 values of T's precision, in h) rotated in place
// by one token's angles c and s (of A; angle_width per token: rotary_dim / 2, one per pair, or
// rotary_dim, one per value), rounded to T.
template <class E, class A, bool kInT>
inline void RotateHead(float* h, const typename A::St* c, const typename A::St* s, int64_t rotary_dim, bool per_value,
                       bool interleaved) {
  const int64_t half = rotary_dim / 2;
  if (!interleaved) {
    if (per_value) {
      RotateHalves<E, A, kInT, true>(PlainSource<F32>{h}, c, s, half, ToBuffer<E>{h});
    } else {
      RotateHalves<E, A, kInT, false>(PlainSource<F32>{h}, c, s, half, ToBuffer<E>{h});
    }
    return;
  }
  // interleaved: W pairs at a time, their values and angles gathered into blocks (copies, exact)
  // for the vector rotation, the results scattered back (a scalar rotation of the pairs would be
  // vectorized by the compiler into fused multiply-adds, whatever the contraction flags say)
  for (int64_t j = 0; j < half; j += W) {
    const int count = half - j < W ? static_cast<int>(half - j) : W;
    alignas(64) float block[6][W] = {};
    for (int k = 0; k < count; ++k) {
      const int64_t pair = j + k;
      const int64_t ia = per_value ? 2 * pair : pair, ib = per_value ? 2 * pair + 1 : pair;
      block[0][k] = h[2 * pair];
      block[1][k] = h[2 * pair + 1];
      block[2][k] = ToFloat(A{}, c[ia]);
      block[3][k] = ToFloat(A{}, s[ia]);
      block[4][k] = ToFloat(A{}, c[ib]);
      block[5][k] = ToFloat(A{}, s[ib]);
    }
    V ra, rb;
    RotateVectors<E, A, kInT>(Isa::Load(F32{}, block[0]), Isa::Load(F32{}, block[1]), Isa::Load(F32{}, block[2]),
                              Isa::Load(F32{}, block[3]), Isa::Load(F32{}, block[4]), Isa::Load(F32{}, block[5]), &ra,
                              &rb);
    ToBuffer<E>{block[0]}.Put(0, ra);
    ToBuffer<E>{block[1]}.Put(0, rb);
    for (int k = 0; k < count; ++k) {
      h[2 * (j + k)] = block[0][k];
      h[2 * (j + k) + 1] = block[1][k];
    }
  }
}

// One head's n values from src, normalized by nz with the weights wt, into dst (which skips its
// rounding where the normalizer's result is rounded already).
template <bool kScale, bool kBias, class Nz, class Wt, class Src, class Dst>
inline void NormalizeHead(const Src& source, const Nz& normalizer, const Wt& weights, int64_t n, const Dst& sink) {
  constexpr bool kRounded = Nz::kRoundsUnbiased && !kBias;
  const Src src = source;
  const Nz nz = normalizer;
  const Wt wt = weights;
  const Dst dst = sink;
  const V zero = Isa::Zero();
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const V sv = kScale ? wt.Scale(i) : zero;
    const V bv = kBias ? wt.Bias(i) : zero;
    dst.template Put<kRounded>(i, nz.template Apply<kScale, kBias>(src.Load(i), sv, bv));
  }
  if (i < n) {
    const int rem = static_cast<int>(n - i);
    const V sv = kScale ? wt.ScaleN(i, rem) : zero;
    const V bv = kBias ? wt.BiasN(i, rem) : zero;
    dst.template PutN<kRounded>(i, nz.template Apply<kScale, kBias>(src.LoadN(i, rem), sv, bv), rem);
  }
}

// Calls body(kScale, kBias) (std::bool_constant tags) with the weights that are present
// (kMayBias: false for the norms without a bias).
template <bool kMayBias, class Body>
inline void WithWeightsPresent(bool has_scale, bool has_bias, const Body& body) {
  if constexpr (kMayBias) {
    if (has_bias) {
      if (has_scale) {
        body(std::true_type{}, std::true_type{});
      } else {
        body(std::false_type{}, std::true_type{});
      }
      return;
    }
  }
  if (has_scale) {
    body(std::true_type{}, std::false_type{});
  } else {
    body(std::false_type{}, std::false_type{});
  }
}

// A head's values from src normalized by nz with the weights wt, as a source of values
// (Load(i), LoadN(i, rem)): Apply's result, rounded to T where kRound and Apply has not rounded
// it already (what NormalizeHead leaves in a float32 buffer). RotateHalves rotates the pairs of
// such a source straight into the output, without a buffer's round trip (a store, then loads
// that wait for it, between the two halves of each head).
template <class E, bool kScale, bool kBias, bool kRound, class Src, class Nz, class Wt>
struct NormalizedSource {
  static constexpr bool kRounds = kRound && !(Nz::kRoundsUnbiased && !kBias);
  Src src;
  Nz nz;
  Wt wt;
  NormalizedSource(const Src& values, const Nz& normalizer, const Wt& weights)
      : src(values), nz(normalizer), wt(weights) {}
  ONNXNORM_INLINE V Load(int64_t i) const {
    const V zero = Isa::Zero();
    const V v = nz.template Apply<kScale, kBias>(src.Load(i), kScale ? wt.Scale(i) : zero, kBias ? wt.Bias(i) : zero);
    return kRounds ? Isa::Round(E{}, v) : v;
  }
  ONNXNORM_INLINE V LoadN(int64_t i, int rem) const {
    const V zero = Isa::Zero();
    const V v = nz.template Apply<kScale, kBias>(src.LoadN(i, rem), kScale ? wt.ScaleN(i, rem) : zero,
                                                 kBias ? wt.BiasN(i, rem) : zero);
    return kRounds ? Isa::Round(E{}, v) : v;
  }
  // Load(i) and Load(j), their roundings made together
  ONNXNORM_INLINE void LoadBoth(int64_t i, int64_t j, V* a, V* b) const {
    const V zero = Isa::Zero();
    *a = src.Load(i);
    *b = src.Load(j);
    nz.template ApplyBoth<kScale, kBias>(a, kScale ? wt.Scale(i) : zero, kBias ? wt.Bias(i) : zero, b,
                                         kScale ? wt.Scale(j) : zero, kBias ? wt.Bias(j) : zero);
    if (kRounds) RoundBoth<E>(a, b);
  }
};

// The prepared weights (WeightPrep's values in float32) of Q's and of K's Scale and Bias rows,
// made once per call where they fit kPreparedFloats, so that a row reads them without converting.
inline constexpr int64_t kPreparedFloats = 2048;

template <class E, class S, bool kOrderA>
struct PreparedTensorWeights {
  alignas(64) float values[kPreparedFloats];
  const float* scale = nullptr;
  const float* bias = nullptr;
  bool ready = false;
#if defined(ONNXNORM_NATIVE_HALF)
  // (float16 in order A: the same values in float16, which they are exactly)
  static constexpr bool kHalves = std::is_same<E, F16>::value && kOrderA;
  alignas(64) uint16_t halves[kHalves ? kPreparedFloats : 1];
  const uint16_t* half_scale = nullptr;
  const uint16_t* half_bias = nullptr;
#endif
  // false where the tensor's weight rows do not fit (a row then reads them as stored)
  bool Prepare(const RotaryTensor& t, int64_t d, float offset) {
    if (ready) return true;
    const int64_t scale_n = t.scale != nullptr ? t.scale_rows * d : 0;
    const int64_t bias_n = t.bias != nullptr ? t.bias_rows * d : 0;
    if (scale_n + bias_n > kPreparedFloats) return false;
    const bool with_scale = scale_n > 0, with_bias = bias_n > 0;
    scale = with_scale ? values : nullptr;
    bias = with_bias ? values + scale_n : nullptr;
    const WeightPrep<E, S, kOrderA> prep(offset);
    const auto* sp = static_cast<const typename S::St*>(t.scale);
    const auto* bp = static_cast<const typename S::St*>(t.bias);
    for (int64_t i = 0; i < scale_n; i += W) {
      const int rem = scale_n - i < W ? static_cast<int>(scale_n - i) : W;
      Isa::StoreN(F32{}, values + i, prep.Scale(Isa::LoadN(S{}, sp + i, rem)), rem);
    }
    for (int64_t i = 0; i < bias_n; i += W) {
      const int rem = bias_n - i < W ? static_cast<int>(bias_n - i) : W;
      Isa::StoreN(F32{}, values + scale_n + i, prep.Bias(Isa::LoadN(S{}, bp + i, rem)), rem);
    }
#if defined(ONNXNORM_NATIVE_HALF)
    if constexpr (kHalves) {
      for (int64_t i = 0; i < scale_n + bias_n; i += W) {
        const int rem = scale_n + bias_n - i < W ? static_cast<int>(scale_n + bias_n - i) : W;
        Isa::StoreN(F16{}, halves + i, Isa::LoadN(F32{}, values + i, rem), rem);
      }
      half_scale = with_scale ? halves : nullptr;
      half_bias = with_bias ? halves + scale_n : nullptr;
    }
#endif
    ready = true;
    return true;
  }
};

template <NormKind NK, class E, class S, class A, bool kOrderA, bool kInT>
void RotaryRowsOf(const RotaryArgs& a, int64_t row_begin, int64_t row_end, float* scratch) {
  using T = typename E::St;
  using WT = typename S::St;
  using AT = typename A::St;
  constexpr bool kMayBias = NK == NormKind::kLayer;
  alignas(64) float stack[kRotaryStackFloats];
  float* const buffer = RotaryScratchFloats(a) > kRotaryStackFloats ? scratch : stack;
  PreparedTensorWeights<E, S, kOrderA> prepared[2];  // Q's, K's
  const int64_t d = a.head_size;
  const int64_t rows_q = RotaryRows(a, a.q);
  const bool per_value = a.angle_width == a.rotary_dim;
  const bool interleaved = a.interleaved != 0;
  const WeightPrep<E, S, kOrderA> prep(a.scale_offset);
  const V unit_scale = Normalizer<NK, E, kOrderA>::Constant(a.scale_offset);
  // the parameters of Q's rows and of K's (a token's heads are rows of different widths)
  RowParams params[2];
  for (int k = 0; k < 2; ++k) {
    const int64_t n = (a.per_head ? 1 : (k == 0 ? a.q : a.k).heads) * d;
    // (L2: the sum of squares itself)
    params[k] = RowParams{n, NK == NormKind::kL2 ? 1.0 : 1.0 / static_cast<double>(n), static_cast<double>(a.epsilon),
                          a.scale_offset};
  }
  // With rotary_first = 0 the statistics of a block of 16-bit rows are taken before the block's
  // rows are normalized: each row's statistics end in a chain of dependent operations (the
  // horizontal sum, a square root and a division), which the other rows' work then overlaps
  // instead of waiting for. (Not float32 rows, which wait for memory rather than for that chain:
  // reading a block ahead made their prefills 15-30 % slower.)
  constexpr int64_t kStatsAhead = std::is_same<E, F32>::value ? 1 : 16;
  Stats block_stats[kStatsAhead];
  for (int64_t block = row_begin; block < row_end; block += kStatsAhead) {
    const int64_t block_end = block + kStatsAhead < row_end ? block + kStatsAhead : row_end;
    if (!a.rotary_first) {
      for (int64_t r = block; r < block_end; ++r) {
        const bool is_q = r < rows_q;
        const RowParams& p = params[is_q ? 0 : 1];
        const T* x = static_cast<const T*>((is_q ? a.q : a.k).x) + (is_q ? r : r - rows_q) * p.n;
        block_stats[r - block] = RowStats<NK>(PlainSource<E>{x}, p);
      }
    }
    for (int64_t r = block; r < block_end; ++r) {
      const bool is_q = r < rows_q;
      const RotaryTensor& t = is_q ? a.q : a.k;
      PreparedTensorWeights<E, S, kOrderA>& ready = prepared[is_q ? 0 : 1];
      const bool use_prepared = ready.Prepare(t, d, a.scale_offset);
      const int64_t local = is_q ? r : r - rows_q;
      const int64_t heads = t.heads;
      // the row's token (b, s), its first head and head count
      int64_t b, s, h0 = 0, nh = heads;
      if (!a.per_head) {
        b = local / a.seq;
        s = local % a.seq;
      } else if (a.layout == 1) {
        h0 = local / a.seq % heads;
        b = local / a.seq / heads;
        s = local % a.seq;
        nh = 1;
      } else {
        h0 = local % heads;
        b = local / heads / a.seq;
        s = local / heads % a.seq;
        nh = 1;
      }
      const int64_t n = nh * d;
      const T* xr = static_cast<const T*>(t.x) + local * n;
      const int64_t token = b * a.seq + s;
      const int64_t cache_row = a.position_ids != nullptr ? a.position_ids[token] : (b % a.cache_batch) * a.seq + s;
      const AT* c = static_cast<const AT*>(a.cos) + cache_row * a.angle_width;
      const AT* sn = static_cast<const AT*>(a.sin) + cache_row * a.angle_width;
      // head h's output (layout 2: [batch, heads, seq, head_size]; else where its input is)
      auto out = [&](int64_t hh) {
        const int64_t h = h0 + hh;
        const int64_t at = a.layout == 2 ? ((b * heads + h) * a.seq + s) * d : local * n + hh * d;
        return static_cast<T*>(t.y) + at;
      };
      const RowParams& p = params[is_q ? 0 : 1];
      const bool has_scale = t.scale != nullptr, has_bias = kMayBias && t.bias != nullptr;
      // the offset of head hh's row of a weight of `rows` rows (most have one: no division)
      auto row_at = [&](int64_t rows, int64_t hh) { return rows > 1 ? (h0 + hh) % rows * d : 0; };
      // body(weights, kScale, kBias) with head hh's weights from its value `from` on (prepared or
      // as stored) and the tags of the weights present
      auto with_weights = [&](int64_t hh, int64_t from, const auto& body) {
        const int64_t scale_at = row_at(t.scale_rows, hh) + from;
        const int64_t bias_at = row_at(t.bias_rows, hh) + from;
        auto present = [&](const auto& wt) {
          WithWeightsPresent<kMayBias>(has_scale, has_bias, [&](auto ks, auto kb) { body(wt, ks, kb); });
        };
        if (use_prepared) {
          present(PreparedWeights{ready.scale != nullptr ? ready.scale + scale_at : nullptr,
                                  ready.bias != nullptr ? ready.bias + bias_at : nullptr});
        } else {
          const WT* scale = static_cast<const WT*>(t.scale);
          const WT* bias = static_cast<const WT*>(t.bias);
          present(StoredWeights<E, S, kOrderA>{scale != nullptr ? scale + scale_at : nullptr,
                                               bias != nullptr ? bias + bias_at : nullptr, prep});
        }
      };
      // head hh's values from src normalized into dst (n of them, from its value `from` on)
      auto normalize = [&](int64_t hh, const auto& src, const auto& nz, const auto& dst, int64_t from = 0) {
        with_weights(hh, from, [&](const auto& wt, auto ks, auto kb) {
          NormalizeHead<decltype(ks)::value, decltype(kb)::value>(src, nz, wt, d - from, dst);
        });
      };
      if (!a.rotary_first) {
        const Normalizer<NK, E, kOrderA> nz(block_stats[r - block], unit_scale);
        const int64_t half = a.rotary_dim / 2;
        for (int64_t hh = 0; hh < nh; ++hh) {
          const T* const x = xr + hh * d;
          T* const y = out(hh);
          if (interleaved) {
            normalize(hh, PlainSource<E>{x}, nz, ToBuffer<E>{buffer});
            RotateHead<E, A, kInT>(buffer, c, sn, a.rotary_dim, per_value, true);
            Narrow<E>(buffer, y, d);
            continue;
          }
          const PlainSource<E> src{x};
          with_weights(hh, 0, [&](const auto& wt, auto ks, auto kb) {
            constexpr bool kScale = decltype(ks)::value, kBias = decltype(kb)::value;
#if defined(ONNXNORM_NATIVE_HALF)
            if constexpr (std::is_same<E, F16>::value && kInT) {
              if constexpr (kOrderA) {
                if (use_prepared) {
                  // (order A's product with the weight in half precision, from the float16 weights)
                  const HalfHeadOrderA<NK, kScale, kBias, PlainSource<E>> head(
                      src, nz, kScale ? ready.half_scale + row_at(t.scale_rows, hh) : nullptr,
                      kBias ? ready.half_bias + row_at(t.bias_rows, hh) : nullptr);
                  NormalizeRotateHalvesInHalf<A>(head, c, sn, half, per_value, y);
                  return;
                }
              }
              const HalfHeadOf<NormalizedSource<E, kScale, kBias, false, PlainSource<E>, Normalizer<NK, E, kOrderA>,
                                                std::decay_t<decltype(wt)>>>
                  head({src, nz, wt});
              NormalizeRotateHalvesInHalf<A>(head, c, sn, half, per_value, y);
              return;
            }
#endif
            const NormalizedSource<E, kScale, kBias, true, PlainSource<E>, Normalizer<NK, E, kOrderA>,
                                   std::decay_t<decltype(wt)>>
                values(src, nz, wt);
            if (per_value) {
              RotateHalves<E, A, kInT, true>(values, c, sn, half, ToOutput<E>{y});
            } else {
              RotateHalves<E, A, kInT, false>(values, c, sn, half, ToOutput<E>{y});
            }
          });
          // the values past rotary_dim normalized alone
          if (a.rotary_dim < d) {
            normalize(hh, PlainSource<E>{x + a.rotary_dim}, nz, ToOutput<E>{y + a.rotary_dim}, a.rotary_dim);
          }
        }
      } else {
        for (int64_t hh = 0; hh < nh; ++hh) {
          Widen<E>(xr + hh * d, buffer + hh * d, d);
          RotateHead<E, A, kInT>(buffer + hh * d, c, sn, a.rotary_dim, per_value, interleaved);
        }
        const Normalizer<NK, E, kOrderA> nz(RowStats<NK>(PlainSource<F32>{buffer}, p), unit_scale);
        for (int64_t hh = 0; hh < nh; ++hh) {
          normalize(hh, PlainSource<F32>{buffer + hh * d}, nz, ToOutput<E>{out(hh)});
        }
      }
    }
  }
}

// The kernel of norm NK for T of E, weights of S and angles of A: the rows in the call's rounding
// order (float32 takes order B, where the two agree) and rotation rounding.
template <NormKind NK, class E, class S, class A>
void RotaryRows(const RotaryArgs& a, int64_t row_begin, int64_t row_end, float* scratch) {
  if (row_begin >= row_end || a.head_size <= 0) return;
  if constexpr (!std::is_same<E, F32>::value) {
    const bool in_t = a.rotary_in_t != 0;
    if (a.cast_before_scale && NK != NormKind::kL2) {
      if (in_t) {
        RotaryRowsOf<NK, E, S, A, true, true>(a, row_begin, row_end, scratch);
      } else {
        RotaryRowsOf<NK, E, S, A, true, false>(a, row_begin, row_end, scratch);
      }
      return;
    }
    if (in_t) {
      RotaryRowsOf<NK, E, S, A, false, true>(a, row_begin, row_end, scratch);
      return;
    }
  }
  RotaryRowsOf<NK, E, S, A, false, false>(a, row_begin, row_end, scratch);
}

// The kernels of T = E: weights of S (E or float32; E alone for L2, which has none), angles of
// E or float32.
template <NormKind NK, class E>
RotaryRowsFn PickRotaryTypes(ElemType w, ElemType a) {
  constexpr ElemType kE = std::is_same<E, F32>::value   ? ElemType::kFloat32
                          : std::is_same<E, F16>::value ? ElemType::kFloat16
                                                        : ElemType::kBFloat16;
  if (a != kE && a != ElemType::kFloat32) return nullptr;
  const bool a32 = a == ElemType::kFloat32;
  if (w == kE) return a32 ? &RotaryRows<NK, E, E, F32> : &RotaryRows<NK, E, E, E>;
  if constexpr (NK != NormKind::kL2 && !std::is_same<E, F32>::value) {
    if (w == ElemType::kFloat32) return a32 ? &RotaryRows<NK, E, F32, F32> : &RotaryRows<NK, E, F32, E>;
  }
  return nullptr;
}

template <NormKind NK>
RotaryRowsFn PickRotaryX(ElemType x, ElemType w, ElemType a) {
  switch (x) {
#if !defined(ONNXNORM_ONLY_BFLOAT16) && !defined(ONNXNORM_ONLY_FLOAT16)
    case ElemType::kFloat32: return PickRotaryTypes<NK, F32>(w, a);
#endif
#if !defined(ONNXNORM_ONLY_BFLOAT16)
    case ElemType::kFloat16: return PickRotaryTypes<NK, F16>(w, a);
#endif
#if !defined(ONNXNORM_ONLY_FLOAT16)
    case ElemType::kBFloat16: return PickRotaryTypes<NK, BF16>(w, a);
#endif
    default: return nullptr;
  }
}

inline RotaryRowsFn PickRotary(NormKind norm, ElemType x, ElemType w, ElemType a) {
  switch (norm) {
    case NormKind::kRms: return PickRotaryX<NormKind::kRms>(x, w, a);
    case NormKind::kLayer: return PickRotaryX<NormKind::kLayer>(x, w, a);
    case NormKind::kL2: return PickRotaryX<NormKind::kL2>(x, w, a);
  }
  return nullptr;
}

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm

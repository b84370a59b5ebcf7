// The row algorithms of every op, written once over a vector "instruction set" type Isa.
//
// Included (through norm_table.h, which picks the kernel of each op and type pair, and by
// quant_rows.h) by the units of each instruction set (isa_portable.cc, isa_avx2.cc,
// isa_avx512.cc and their quant_*.cc), after they have defined, in an anonymous namespace of
// onnxnorm::cpu, a struct Isa with:
//   W (lanes: 8 or 16), V (a vector of W floats), Zero(), Set1(f), Add, Sub, Mul, MulAdd(a, b, c)
//   (a * b + c rounded once), Div, Max(a, b)
//   (a > b ? a : b), HSum(v) (the halving folds: lane k + lane k + W/2, ..., down to one),
//   MaskN(v, n) (lanes >= n set to 0), NegAbs (-|v|), SelectNegative(s, a, b) (a where s's sign
//   bit is set, else b), Pow2(t) (2^(n + kPow2Offset) from t = n + 1.5 * 2^23), and per element
//   tag E (F32, F16, BF16): Load(E, p), LoadN(E, p, n) (lanes >= n read as 0,
//   nothing past p + n touched), Store(E, p, v), StoreN(E, p, v, n) (rounding to E's type,
//   nearest even), Round(E, v) (v rounded to E's type); kHasStream, Stream(E, p, v) (a
//   non-temporal Store to a 64-byte aligned address) and Fence(). The bfloat16 unit's Isa
//   (ONNXNORM_AVX512_BF16) has RoundBoth and StoreBoth too (two vectors in one conversion),
//   which RoundBoth<E> and StoreBoth<E> below call.
// Everything here has internal linkage (see cpu_internal.h).
//
// Every instruction set gives the same bits: each element goes through the same float32
// operations (a product is rounded before it is added: no fused multiply-add, but the ones
// that GatedRMSNorm's activation makes on every instruction set), and the row sums are taken
// in one order that does not depend on W: element j of each block of 32 is added into lane j
// of its own accumulator, and the lanes are then folded in halves (lane k + lane k + 16, + 8,
// ..., + 1).
//
// Per row, the algorithm is:
//   RMSNorm:   pass 1 sum of squares; pass 2 Y = X * inv_rms * (Scale + offset) + Bias.
//   L2Norm:    RMSNorm's passes with the sum of squares itself for the mean square (no weights).
//   Gated:     (GatedRMSNorm: RMSNorm's kernels with NormArgs::gate; its groups are rows)
//              norm_before_gate = 1: RMSNorm, and each Y value times act(Gate) before its last
//              rounding (order A: the value rounded to X's type first);
//              norm_before_gate = 0: the norm of Z = X * act(Gate) in float32, not rounded,
//              computed once by the statistics pass into a float32 row buffer (rows wider than
//              kZBufferCols: computed again by the last pass). act (SiLU or sigmoid) is one
//              float32 function of the gate, Sigmoid below, the same operations on every
//              instruction set.
//   LayerNorm: pass 1 sums of D and D^2 with D = X - shift, the shift being the mean of the row's
//              first 8 values (near the row's mean, so D is exact for rows with a large mean and
//              E[D^2] - E[D]^2 does not cancel); only when the shift was far from the mean
//              (E[D^2] > 4 var), a second such pass around the mean found (split into a float
//              pair, so X - mean is exact to float precision); last pass writes Y. The row is read
//              from memory once; later passes read it from cache.
//   Skip:      Z = alpha * Residual + X (+ XBias), rounded to X's type.
//   Sandwich:  Z = Residual + InnerNorm(X), rounded to X's type; a first pass takes the inner
//              statistics of X.
//   For both, the statistics pass computes Z once and keeps it: in Sum when Sum is wanted and not
//   streamed, else, in float32, in a row buffer on the stack (rows wider than kZBufferCols: in
//   Sum all the same, or in Y when Sum is not wanted, which the last pass then overwrites element
//   by element); the last pass writes Sum and Y from it.
//   A range of rows that share their weights prepares them once (converted to float32, the
//   offset added, rounded as the order wants) in stack buffers, instead of in every row.
//   So every op reads its inputs from memory once and writes each output once. The last pass
//   writes each row from Y's first 64-byte boundary on a whole vector at a time (the few elements
//   before it first), and calls that move StreamMinBytes() or more stream their outputs past the
//   cache (non-temporal stores).
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

// Calls that move at least StreamMinBytes() (onnxnorm/kernels.h; inputs read and outputs written)
// write their outputs with non-temporal stores where the instruction set has them: the outputs
// would not stay in the cache anyway, and streaming them saves reading every output line before
// it is written. Below it, ordinary stores keep the tensors in the last-level cache, which is
// faster while they fit (docs/benchmarks.md has the measurements behind the value). Only rows at
// least kStreamMinRowBytes long, or that each start on a 64-byte boundary, are streamed: a row
// that starts or ends inside a cache line writes that line with ordinary stores, which a short
// row would do for a large share of its lines.
constexpr int64_t kStreamRowBytes = kStreamMinRowBytes;

// The stack buffers of the prepared Scale and Bias hold rows of up to this many elements (16 KiB
// each). Wider rows keep their weights as stored: prepared in float32 they would take the room in
// the L1 cache that the row itself needs.
constexpr int64_t kBufferCols = 4096;
// A residual op's Z row buffer holds up to this many elements (64 KiB, in L2 at worst; 8192-wide
// rows are common). Wider rows keep Z in an output tensor.
constexpr int64_t kZBufferCols = 16384;
// Ranges of at least this many rows prepare shared weights once for all of them.
constexpr int64_t kPrepareRows = 2;

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
ONNXNORM_INLINE V RoundWeight(V w) {
  if constexpr (std::is_same<E, S>::value || std::is_same<E, F32>::value) {
    return w;
  } else {
    return Isa::Round(E{}, w);
  }
}

// What a Scale and a Bias value become before they meet the normalized value, in the rounding
// order kOrderA (for 16-bit X; float32 always takes order B, where the two agree): Scale + offset
// (order A: each rounded to X's type first, and the sum), and Bias (order A: rounded to X's type).
template <class E, class S, bool kOrderA>
struct WeightPrep {
  V voff;
  explicit WeightPrep(float offset) : voff(Isa::Set1(kOrderA ? RoundScalar<E>(offset) : offset)) {}
  ONNXNORM_INLINE V Scale(V sv) const {
    return kOrderA ? Isa::Round(E{}, Isa::Add(RoundWeight<E, S>(sv), voff)) : Isa::Add(sv, voff);
  }
  ONNXNORM_INLINE V Bias(V bv) const { return kOrderA ? RoundWeight<E, S>(bv) : bv; }
};

// A row's Scale and Bias as stored, prepared vector by vector, or prepared beforehand in float32.
template <class E, class S, bool kOrderA>
struct StoredWeights {
  const typename S::St* scale;  // nullptr: absent
  const typename S::St* bias;   // nullptr: absent
  WeightPrep<E, S, kOrderA> prep;
  ONNXNORM_INLINE V Scale(int64_t i) const { return prep.Scale(Isa::Load(S{}, scale + i)); }
  ONNXNORM_INLINE V ScaleN(int64_t i, int rem) const { return prep.Scale(Isa::LoadN(S{}, scale + i, rem)); }
  ONNXNORM_INLINE V Bias(int64_t i) const { return prep.Bias(Isa::Load(S{}, bias + i)); }
  ONNXNORM_INLINE V BiasN(int64_t i, int rem) const { return prep.Bias(Isa::LoadN(S{}, bias + i, rem)); }
};

struct PreparedWeights {
  const float* scale;
  const float* bias;
  ONNXNORM_INLINE V Scale(int64_t i) const { return Isa::Load(F32{}, scale + i); }
  ONNXNORM_INLINE V ScaleN(int64_t i, int rem) const { return Isa::LoadN(F32{}, scale + i, rem); }
  ONNXNORM_INLINE V Bias(int64_t i) const { return Isa::Load(F32{}, bias + i); }
  ONNXNORM_INLINE V BiasN(int64_t i, int rem) const { return Isa::LoadN(F32{}, bias + i, rem); }
};

// Writes the prepared Scale and Bias of one weight row into float32 buffers (nullptr: absent).
template <class E, class S, bool kOrderA>
void PrepareWeights(const typename S::St* scale, const typename S::St* bias, int64_t n, float offset, float* scale_out,
                    float* bias_out) {
  const WeightPrep<E, S, kOrderA> prep(offset);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    if (scale != nullptr) Isa::Store(F32{}, scale_out + i, prep.Scale(Isa::Load(S{}, scale + i)));
    if (bias != nullptr) Isa::Store(F32{}, bias_out + i, prep.Bias(Isa::Load(S{}, bias + i)));
  }
  if (i < n) {
    const int rem = static_cast<int>(n - i);
    if (scale != nullptr) Isa::StoreN(F32{}, scale_out + i, prep.Scale(Isa::LoadN(S{}, scale + i, rem)), rem);
    if (bias != nullptr) Isa::StoreN(F32{}, bias_out + i, prep.Bias(Isa::LoadN(S{}, bias + i, rem)), rem);
  }
}

// *a and *b rounded to E's type: Round twice, or once for both where the instruction set has a
// conversion of two vectors (the bfloat16 unit's RoundBoth). The same bits either way.
template <class E>
ONNXNORM_INLINE void RoundBoth(V* a, V* b) {
#if defined(ONNXNORM_AVX512_BF16)
  if constexpr (std::is_same<E, BF16>::value) {
    Isa::RoundBoth(E{}, a, b);
    return;
  }
#endif
  *a = Isa::Round(E{}, *a);
  *b = Isa::Round(E{}, *b);
}
// Store(E, pa, a) and Store(E, pb, b), converted together where RoundBoth rounds together
template <class E>
ONNXNORM_INLINE void StoreBoth(typename E::St* pa, V a, typename E::St* pb, V b) {
#if defined(ONNXNORM_AVX512_BF16)
  if constexpr (std::is_same<E, BF16>::value) {
    Isa::StoreBoth(E{}, pa, a, pb, b);
    return;
  }
#endif
  Isa::Store(E{}, pa, a);
  Isa::Store(E{}, pb, b);
}

// Y from Z for one row, from its statistics: Norm(Z) * s + b with s and b as WeightPrep makes
// them, in the rounding order kOrderA.
template <NormKind NK, class E, bool kOrderA>
struct Normalizer {
  // Apply's result without a bias is already rounded to T (order A rounds the product)
  static constexpr bool kRoundsUnbiased = kOrderA;
  V vh, vl, vinv, vconst;
  // the Scale of a norm without one: 1 + offset (order A: in T's precision)
  static V Constant(float offset) {
    return Isa::Set1(kOrderA ? RoundScalar<E>(1.f + RoundScalar<E>(offset)) : 1.f + offset);
  }
  // (constant: Constant(offset), which rows of many calls take once)
  Normalizer(const Stats& st, V constant)
      : vh(Isa::Set1(st.hi)), vl(Isa::Set1(st.lo)), vinv(Isa::Set1(st.inv)), vconst(constant) {}
  Normalizer(const Stats& st, float offset) : Normalizer(st, Constant(offset)) {}
  // z normalized, before the weights
  ONNXNORM_INLINE V Normalized(V z) const {
    return NK == NormKind::kLayer ? Isa::Mul(Isa::Sub(Isa::Sub(z, vh), vl), vinv) : Isa::Mul(z, vinv);
  }
  template <bool kScale, bool kBias>
  ONNXNORM_INLINE V Apply(V zv, V s, V b) const {
    V h = Normalized(zv);
    if (!kScale) s = vconst;
    if (!kOrderA) return kBias ? Isa::Add(Isa::Mul(h, s), b) : Isa::Mul(h, s);
    const V out = Isa::Round(E{}, Isa::Mul(Isa::Round(E{}, h), s));
    return kBias ? Isa::Add(out, b) : out;  // the store rounds the sum
  }
  // Apply to two vectors (za with sa, ba; zb with sb, bb), the roundings of both made together
  template <bool kScale, bool kBias>
  ONNXNORM_INLINE void ApplyBoth(V* za, V sa, V ba, V* zb, V sb, V bb) const {
    if (!kOrderA) {
      *za = Apply<kScale, kBias>(*za, sa, ba);
      *zb = Apply<kScale, kBias>(*zb, sb, bb);
      return;
    }
    V ha = Normalized(*za), hb = Normalized(*zb);
    RoundBoth<E>(&ha, &hb);
    ha = Isa::Mul(ha, kScale ? sa : vconst);
    hb = Isa::Mul(hb, kScale ? sb : vconst);
    RoundBoth<E>(&ha, &hb);
    *za = kBias ? Isa::Add(ha, ba) : ha;
    *zb = kBias ? Isa::Add(hb, bb) : hb;
  }
};

// Where a row's values Z come from: X itself, Skip's alpha * Residual + X (+ XBias), or the
// Sandwich's Residual + InnerNorm(X), the last two rounded to X's type.
template <class E>
struct PlainSource {
  const typename E::St* x;
  ONNXNORM_INLINE V Load(int64_t i) const { return Isa::Load(E{}, x + i); }
  ONNXNORM_INLINE V LoadN(int64_t i, int rem) const { return Isa::LoadN(E{}, x + i, rem); }
  ONNXNORM_INLINE void LoadBoth(int64_t i, int64_t j, V* a, V* b) const {
    *a = Load(i);
    *b = Load(j);
  }
};

// (1 * Residual is Residual: the product is left out when alpha is 1.)
template <class E, class S>
struct SkipSource {
  const typename E::St* x;
  const typename E::St* residual;
  const typename S::St* xbias;  // nullptr: absent
  V alpha;
  bool scaled;  // alpha is not 1
  ONNXNORM_INLINE V Load(int64_t i) const {
    V r = Isa::Load(E{}, residual + i);
    if (scaled) r = Isa::Mul(alpha, r);
    V v = Isa::Add(r, Isa::Load(E{}, x + i));
    if (xbias != nullptr) v = Isa::Add(v, Isa::Load(S{}, xbias + i));
    return Isa::Round(E{}, v);
  }
  ONNXNORM_INLINE V LoadN(int64_t i, int rem) const {
    V r = Isa::LoadN(E{}, residual + i, rem);
    if (scaled) r = Isa::Mul(alpha, r);
    V v = Isa::Add(r, Isa::LoadN(E{}, x + i, rem));
    if (xbias != nullptr) v = Isa::Add(v, Isa::LoadN(S{}, xbias + i, rem));
    return Isa::Round(E{}, v);
  }
};

template <NormKind NK, class E, class S, bool kOrderA>
struct SandwichSource {
  const typename E::St* x;
  const typename E::St* residual;
  StoredWeights<E, S, kOrderA> inner_weights;  // nullptr where absent
  Normalizer<NK, E, kOrderA> inner;
  ONNXNORM_INLINE V Inner(V xv, V s, V b) const {
    if (inner_weights.scale != nullptr) {
      return inner_weights.bias != nullptr ? inner.template Apply<true, true>(xv, s, b)
                                           : inner.template Apply<true, false>(xv, s, b);
    }
    return inner_weights.bias != nullptr ? inner.template Apply<false, true>(xv, s, b)
                                         : inner.template Apply<false, false>(xv, s, b);
  }
  ONNXNORM_INLINE V Load(int64_t i) const {
    const V s = inner_weights.scale != nullptr ? inner_weights.Scale(i) : Isa::Zero();
    const V b = inner_weights.bias != nullptr ? inner_weights.Bias(i) : Isa::Zero();
    const V h = Isa::Round(E{}, Inner(Isa::Load(E{}, x + i), s, b));
    return Isa::Round(E{}, Isa::Add(h, Isa::Load(E{}, residual + i)));
  }
  ONNXNORM_INLINE V LoadN(int64_t i, int rem) const {
    const V s = inner_weights.scale != nullptr ? inner_weights.ScaleN(i, rem) : Isa::Zero();
    const V b = inner_weights.bias != nullptr ? inner_weights.BiasN(i, rem) : Isa::Zero();
    const V h = Isa::Round(E{}, Inner(Isa::LoadN(E{}, x + i, rem), s, b));
    return Isa::Round(E{}, Isa::Add(h, Isa::LoadN(E{}, residual + i, rem)));
  }
};

// A source that also writes each Z it gives, in float32 to a row buffer (E = F32) or in X's type
// to Sum (ordinary stores), for the last pass to read back from cache.
template <class E, class Src>
struct StoringSource {
  Src src;
  typename E::St* out;
  ONNXNORM_INLINE V Load(int64_t i) const {
    const V z = src.Load(i);
    Isa::Store(E{}, out + i, z);
    return z;
  }
  ONNXNORM_INLINE V LoadN(int64_t i, int rem) const {
    const V z = src.LoadN(i, rem);
    Isa::StoreN(E{}, out + i, z, rem);
    return z;
  }
};

// ---------------------------------------------------------------------------------------------
// The gate of GatedRMSNorm: its activation, SiLU g * sigmoid(g) or sigmoid(g), in float32 from
// float32(g), written once over the vector operations so that every instruction set computes it
// with the same operations in the same order (no approximate reciprocal). Unlike the norms, it
// uses fused multiply-adds (Isa::MulAdd, rounded once on every instruction set: the FMA
// instructions, and std::fma in the portable code): they make it about a fifth faster, and the
// activation is the bulk of a gated row's time (docs/benchmarks.md).
//
// sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) for g < 0, with e = exp(-|g|) in (0, 1]:
// never an overflow, and full relative precision for large negative g. exp(x), x <= 0: x = n ln2
// + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2 split in two: n * kLn2Hi is exact for
// |n| < 2^13), e^r = 1 + r + r^2 q(r) with q of degree 3 (coefficients fitted to the relative
// error of e^r on that interval: below 1.2e-7), in Horner's form, scaled by 2^(n + 64) and then
// 2^-64 so that results below float32's normal range round once into its subnormals; below -104,
// e^x rounds to 0. Against float64 over 5.8 million float32 arguments (uniform and log-spaced,
// |g| up to 95): sigmoid within 3.5 ulp, SiLU within 4.2 ulp, each rounded to float32; the kernel
// tests hold the kernels to it (custom_ops/tests/kernel_tests.cc). For g < -87.3 the sigmoid is
// a float32 subnormal (a multiple of 2^-149, as the exact value rounds) and SiLU is g times it.
// NaN gives NaN; sigmoid(+-Inf) = 1 and 0, SiLU(+Inf) = +Inf and SiLU(-Inf) = NaN (-Inf * 0),
// as numpy computes them. About 20 vector operations and a division per vector.
constexpr float kLog2E = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693115234375f;         // ln 2 in 11 significant bits
constexpr float kLn2Lo = 3.19461832987144561e-5f;  // ln 2 - kLn2Hi
constexpr float kExpQ[4] = {4.999914169e-01f, 1.666688770e-01f, 4.189877585e-02f, 8.333788253e-03f};

// e^-|x| (NaN stays NaN).
ONNXNORM_INLINE V ExpNegAbs(V x) {
  // (Max gives its second operand where either is NaN: NaN stays)
  x = Isa::Max(Isa::Set1(-104.f), Isa::NegAbs(x));
  const V magic = Isa::Set1(12582912.f);  // 1.5 * 2^23: adding it rounds to a whole number
  const V t = Isa::MulAdd(x, Isa::Set1(kLog2E), magic);
  const V n = Isa::Sub(t, magic);
  V r = Isa::MulAdd(n, Isa::Set1(-kLn2Hi), x);
  r = Isa::MulAdd(n, Isa::Set1(-kLn2Lo), r);
  const V one = Isa::Set1(1.f);
  V p = Isa::MulAdd(Isa::Set1(kExpQ[3]), r, Isa::Set1(kExpQ[2]));
  p = Isa::MulAdd(p, r, Isa::Set1(kExpQ[1]));
  p = Isa::MulAdd(p, r, Isa::Set1(kExpQ[0]));
  p = Isa::MulAdd(p, r, one);
  p = Isa::MulAdd(p, r, one);
  static_assert(kPow2Offset == 64, "the scale below undoes Pow2's offset");
  return Isa::Mul(Isa::Mul(p, Isa::Pow2(t)), Isa::Set1(0x1p-64f));
}

ONNXNORM_INLINE V Sigmoid(V g) {
  const V one = Isa::Set1(1.f);
  const V e = ExpNegAbs(g);
  return Isa::Div(Isa::SelectNegative(g, e, one), Isa::Add(one, e));
}

// The activation of a gate vector: SiLU (silu) or sigmoid (the sigmoid times 1, exactly itself).
ONNXNORM_INLINE V Activation(V g, bool silu) { return Isa::Mul(Sigmoid(g), silu ? g : Isa::Set1(1.f)); }

// GatedRMSNorm's gate before the norm: Z = float32(X) * act(Gate), in float32 and not rounded.
// (Lanes past a row's end read 0 for both: Z = 0 there.)
template <class E>
struct GatedSource {
  const typename E::St* x;
  const typename E::St* gate;
  bool silu;
  ONNXNORM_INLINE V Load(int64_t i) const {
    return Isa::Mul(Isa::Load(E{}, x + i), Activation(Isa::Load(E{}, gate + i), silu));
  }
  ONNXNORM_INLINE V LoadN(int64_t i, int rem) const {
    return Isa::Mul(Isa::LoadN(E{}, x + i, rem), Activation(Isa::LoadN(E{}, gate + i, rem), silu));
  }
};

// What the last pass does to each Y value before Y's store rounds it: nothing, or GatedRMSNorm's
// gate after the norm, Y * act(Gate).
struct NoEpilogue {
  ONNXNORM_INLINE V Apply(int64_t, V y) const { return y; }
  ONNXNORM_INLINE V ApplyN(int64_t, int, V y) const { return y; }
};

template <class E>
struct GateEpilogue {
  const typename E::St* gate;
  bool silu;
  ONNXNORM_INLINE V Apply(int64_t i, V y) const { return Isa::Mul(y, Activation(Isa::Load(E{}, gate + i), silu)); }
  ONNXNORM_INLINE V ApplyN(int64_t i, int rem, V y) const {
    return Isa::Mul(y, Activation(Isa::LoadN(E{}, gate + i, rem), silu));
  }
};

// Where a row's gate acts (a template parameter of the row loops): no gate, after the norm
// (norm_before_gate = 1) or before it (0).
enum class Gate { kNone, kAfter, kBefore };

// The accumulators of a row sum: kLanes / W vectors (2 or 4), as named variables so that they
// stay in registers, added to one vector by folding them in halves (accumulator k + accumulator
// k + K/2), which is lane j + lane j + kLanes/2 across them.
constexpr int kLanes = 32;
constexpr int K = kLanes / W;
static_assert(K == 2 || K == 4, "two or four accumulators");

struct Accumulators {
  V a0 = Isa::Zero(), a1 = Isa::Zero(), a2 = Isa::Zero(), a3 = Isa::Zero();
  // Adds v into accumulator k (a constant after inlining).
  ONNXNORM_INLINE void Add(int k, V v) {
    if (k == 0) a0 = Isa::Add(a0, v);
    if (k == 1) a1 = Isa::Add(a1, v);
    if (K == 4 && k == 2) a2 = Isa::Add(a2, v);
    if (K == 4 && k == 3) a3 = Isa::Add(a3, v);
  }
  ONNXNORM_INLINE float Sum() const {
    if (K == 4) return Isa::HSum(Isa::Add(Isa::Add(a0, a2), Isa::Add(a1, a3)));
    return Isa::HSum(Isa::Add(a0, a1));
  }
};

// Sum over the row of term(z): element j of each block of kLanes into lane j of accumulator
// j / W; the masked tail adds zeros in its other lanes.
template <class Src, class Term>
ONNXNORM_INLINE float RowSum(const Src& src, int64_t n, Term term, Accumulators* acc) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    acc->Add(0, term(src.Load(i)));
    acc->Add(1, term(src.Load(i + W)));
    if (K == 4) {
      acc->Add(2, term(src.Load(i + 2 * W)));
      acc->Add(3, term(src.Load(i + 3 * W)));
    }
  }
  for (int k = 0; k < K && i < n; ++k) {
    if (i + W <= n) {
      acc->Add(k, term(src.Load(i)));
      i += W;
    } else {
      const int rem = static_cast<int>(n - i);
      acc->Add(k, Isa::MaskN(term(src.LoadN(i, rem)), rem));
      i = n;
    }
  }
  return acc->Sum();
}

// Sum over the row of z * z.
// (The passes copy their source and constants into locals: through a reference, the compiler would
// reload every vector constant after each store, as a store of floats might change it.)
template <class Src>
inline float SumOfSquares(const Src& source, int64_t n) {
  const Src src = source;
  Accumulators acc;
  return RowSum(src, n, [](V z) { return Isa::Mul(z, z); }, &acc);
}

// Sums of D and D^2 over the row, D = (z - hi) - lo (kLo), or D = z - hi.
template <bool kLo, class Src>
inline void CentredSums(const Src& source, int64_t n, float hi, float lo, float* sum_d, float* sum_dd) {
  const Src src = source;
  const V vh = Isa::Set1(hi), vl = Isa::Set1(lo);
  auto centre = [&](V z) { return kLo ? Isa::Sub(Isa::Sub(z, vh), vl) : Isa::Sub(z, vh); };
  Accumulators d, q;
  auto both = [&](int k, V a) {
    d.Add(k, a);
    q.Add(k, Isa::Mul(a, a));
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    both(0, centre(src.Load(i)));
    both(1, centre(src.Load(i + W)));
    if (K == 4) {
      both(2, centre(src.Load(i + 2 * W)));
      both(3, centre(src.Load(i + 3 * W)));
    }
  }
  for (int k = 0; k < K && i < n; ++k) {
    if (i + W <= n) {
      both(k, centre(src.Load(i)));
      i += W;
    } else {
      const int rem = static_cast<int>(n - i);
      both(k, Isa::MaskN(centre(src.LoadN(i, rem)), rem));
      i = n;
    }
  }
  *sum_d = d.Sum();
  *sum_dd = q.Sum();
}

template <NormKind NK, class Src>
inline Stats RowStats(const Src& src, const RowParams& p) {
  Stats st;
  if (NK == NormKind::kLayer) {
    // One pass of shifted sums around the mean of the row's first 8 values (close to the row's
    // mean, so z - shift is exact for rows with a large mean and the sums do not cancel), and a
    // second pass around the mean it gives only when the shift turned out far from the mean
    // (E[d^2] > 4 var: at most two of the row's digits lost to cancellation), or for NaN/Inf.
    // (z - shift is z - shift - 0 exactly, so the first pass leaves the 0 out.)
    const int first = p.n < 8 ? static_cast<int>(p.n) : 8;
    float head[W];
    // (masked: a Sandwich source's lanes past the row hold the inner norm of 0, not 0; in
    // float16 that overflowed to Inf and made rows narrower than 8 NaN)
    Isa::Store(F32{}, head, Isa::MaskN(src.LoadN(0, first), first));
    const float head_sum = ((head[0] + head[4]) + (head[2] + head[6])) + ((head[1] + head[5]) + (head[3] + head[7]));
    const float shift = head_sum / static_cast<float>(first);
    float sum_d = 0.f, sum_dd = 0.f;
    CentredSums<false>(src, p.n, shift, 0.f, &sum_d, &sum_dd);
    double mean_d = static_cast<double>(sum_d) * p.inv_n;
    double mean_dd = static_cast<double>(sum_dd) * p.inv_n;
    double var = mean_dd - mean_d * mean_d;
    double mean = static_cast<double>(shift) + mean_d;
    float h = static_cast<float>(mean);
    float l = static_cast<float>(mean - static_cast<double>(h));
    if (!(mean_dd <= 4.0 * var)) {
      CentredSums<true>(src, p.n, h, l, &sum_d, &sum_dd);
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
// reaches a 64-byte boundary at the same element as Y. And, per row of a call that prefetches,
// the inputs of the next row (nullptr: none), which the last pass prefetches into L2 while it
// computes and writes, a line for every line of this row it passes: the next row's first pass
// then reads from L2 instead of waiting for memory after this row's writes (on large calls that
// wait otherwise adds to the compute time instead of overlapping it).
struct OutputPlan {
  bool stream_y = false;
  bool stream_sum = false;
  bool prefetch = false;
  const char* next[2] = {nullptr, nullptr};
};

// Calls that move at least this many bytes, in rows of at least kPrefetchRowBytes, prefetch the
// next row. Smaller calls come from the cache, where the prefetches can only cost (no gain on
// 1x128x4096 calls, 2-8 MiB, that the benchmarks can tell from their noise), and short rows
// (the Q/K norms' 128 values) would pay one set of them per few lines.
constexpr int64_t kPrefetchMinBytes = int64_t{16} << 20;
constexpr int64_t kPrefetchRowBytes = 2048;

ONNXNORM_INLINE void PrefetchL2(const char* p) {
#if defined(__GNUC__)
  __builtin_prefetch(p, 0, 2);
#else
  (void)p;
#endif
}

// Prefetches the next row's line at the same byte offset as element i of this row, once per line.
template <class T>
ONNXNORM_INLINE void PrefetchNext(const OutputPlan& plan, int64_t i) {
  const int64_t byte = i * static_cast<int64_t>(sizeof(T));
  if (byte % 64 >= W * static_cast<int64_t>(sizeof(T))) return;  // a vector of this line did it
  if (plan.next[0] != nullptr) PrefetchL2(plan.next[0] + byte);
  if (plan.next[1] != nullptr) PrefetchL2(plan.next[1] + byte);
}

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

// The pass over a row that writes Y (in YE's type: X's, or float32 for the mixed form, which then
// leaves out the last rounding to X's type) and Z to sum (when not null) from the statistics;
// the epilogue ep acts on each Y value before its store.
template <bool kScale, bool kBias, class E, class YE, class Nz, class Wt, class Src, class Ep>
void FinishRow(const Src& source, const Nz& normalizer, const Wt& weights, typename YE::St* y, typename E::St* sum,
               int64_t n, const OutputPlan& plan, const Ep& epilogue) {
  const Src src = source;
  const Nz nz = normalizer;
  const Wt wt = weights;
  const Ep ep = epilogue;
  const V zero = Isa::Zero();
  auto partial = [&](int64_t i, int rem) {
    const V zv = src.LoadN(i, rem);
    if (sum != nullptr) Isa::StoreN(E{}, sum + i, zv, rem);
    const V sv = kScale ? wt.ScaleN(i, rem) : zero;
    const V bv = kBias ? wt.BiasN(i, rem) : zero;
    Isa::StoreN(YE{}, y + i, ep.ApplyN(i, rem, nz.template Apply<kScale, kBias>(zv, sv, bv)), rem);
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
  const int64_t full_end = i + (n - i) / W * W;
  if constexpr (Isa::kHasStream) {
    if (plan.stream_y) {
      for (; i < full_end; i += W) {
        PrefetchNext<typename E::St>(plan, i);
        const V zv = src.Load(i);
        if (sum != nullptr) {
          if (plan.stream_sum) {
            Isa::Stream(E{}, sum + i, zv);
          } else {
            Isa::Store(E{}, sum + i, zv);
          }
        }
        const V sv = kScale ? wt.Scale(i) : zero;
        const V bv = kBias ? wt.Bias(i) : zero;
        Isa::Stream(YE{}, y + i, ep.Apply(i, nz.template Apply<kScale, kBias>(zv, sv, bv)));
      }
      if (i < n) partial(i, static_cast<int>(n - i));
      return;
    }
  }
  for (; i < full_end; i += W) {
    PrefetchNext<typename E::St>(plan, i);
    const V zv = src.Load(i);
    if (sum != nullptr) Isa::Store(E{}, sum + i, zv);
    const V sv = kScale ? wt.Scale(i) : zero;
    const V bv = kBias ? wt.Bias(i) : zero;
    Isa::Store(YE{}, y + i, ep.Apply(i, nz.template Apply<kScale, kBias>(zv, sv, bv)));
  }
  if (i < n) partial(i, static_cast<int>(n - i));
}

// One normalized row: the statistics from stats_src, then Y = Norm(Z) * (Scale + offset) + Bias
// (and Sum = Z when sum is not null) from finish_src, each Y value through the epilogue ep.
// kMayBias: false for the ops without a Bias (has_bias is then false; its code is left out).
template <NormKind NK, class E, class YE, bool kOrderA, bool kMayBias = true, class Wt, class Src, class FinishSrc,
          class Ep = NoEpilogue>
inline void NormRowFrom(const Src& stats_src, const FinishSrc& finish_src, const Wt& weights, bool has_scale,
                        bool has_bias, typename YE::St* y, typename E::St* sum, const RowParams& p,
                        const OutputPlan& plan, const Ep& ep = Ep{}) {
  const Normalizer<NK, E, kOrderA> nz(RowStats<NK>(stats_src, p), p.offset);
  if constexpr (kMayBias) {
    if (has_bias) {
      if (has_scale) {
        FinishRow<true, true, E, YE>(finish_src, nz, weights, y, sum, p.n, plan, ep);
      } else {
        FinishRow<false, true, E, YE>(finish_src, nz, weights, y, sum, p.n, plan, ep);
      }
      return;
    }
  }
  if (has_scale) {
    FinishRow<true, false, E, YE>(finish_src, nz, weights, y, sum, p.n, plan, ep);
  } else {
    FinishRow<false, false, E, YE>(finish_src, nz, weights, y, sum, p.n, plan, ep);
  }
}

// One row of a residual op, whose Z is computed from several inputs (Skip, Sandwich) once, by
// the statistics pass: into the float32 row buffer z_buffer when the call has one (RowsInOrder
// decides), and the last pass writes Sum and Y from it; else into Sum with ordinary stores, or,
// without Sum (rows wider than kZBufferCols), into Y, and the last pass reads it back from there
// (each element of Y read before it is written).
template <NormKind NK, class E, bool kOrderA, class Wt, class Src>
inline void ResidualRow(const Src& src, float* z_buffer, const Wt& weights, bool has_scale, bool has_bias,
                        typename E::St* y, typename E::St* sum, const RowParams& p, const OutputPlan& plan) {
  if (z_buffer != nullptr) {
    NormRowFrom<NK, E, E, kOrderA>(StoringSource<F32, Src>{src, z_buffer}, PlainSource<F32>{z_buffer}, weights,
                                   has_scale, has_bias, y, sum, p, plan);
  } else {
    typename E::St* z = sum != nullptr ? sum : y;
    NormRowFrom<NK, E, E, kOrderA>(StoringSource<E, Src>{src, z}, PlainSource<E>{z}, weights, has_scale, has_bias, y,
                                   static_cast<typename E::St*>(nullptr), p, plan);
  }
}

// Row r's row of a weight with `rows` rows (row r uses row r % rows), stepping through the rows
// without a division per row; nullptr throughout when the weight is absent.
template <class T>
class WeightRows {
 public:
  WeightRows(const void* weight, int64_t rows, int64_t n, int64_t first_row)
      : base_(static_cast<const T*>(weight)),
        rows_(rows > 1 ? rows : 1),
        n_(n),
        row_(rows > 1 ? first_row % rows : 0) {}
  const T* Get() const { return base_ == nullptr ? nullptr : base_ + row_ * n_; }
  bool Shared() const { return rows_ == 1; }
  void Next() {
    if (++row_ == rows_) row_ = 0;
  }

 private:
  const T* base_;
  int64_t rows_, n_, row_;
};

#if defined(__GNUC__)
#define ONNXNORM_NOINLINE __attribute__((noinline))
#else
#define ONNXNORM_NOINLINE
#endif

// Rows [row_begin, row_end) of a call. prepared_scale / prepared_bias: the weights prepared for
// every row (nullptr: as stored); z_buffer: a float32 row buffer for a residual op's Z or a gated
// norm's Z (gate before the norm) (nullptr: none).
template <NormKind NK, ResidualKind RK, class E, class S, class YE, bool kOrderA, Gate kGate>
void RowsLoop(const NormArgs& a, int64_t row_begin, int64_t row_end, const RowParams& p, const OutputPlan& plan,
              const float* prepared_scale, const float* prepared_bias, float* z_buffer) {
  using T = typename E::St;
  using WT = typename S::St;
  using YT = typename YE::St;
  static_assert(std::is_same<E, YE>::value || RK == ResidualKind::kNone, "a residual op's Y is of X's type");
  static_assert(kGate == Gate::kNone || (RK == ResidualKind::kNone && std::is_same<E, YE>::value),
                "a gated norm has no residual, and its Y is of X's type");
  const int64_t n = p.n;
  const T* x = static_cast<const T*>(a.x);
  YT* y = static_cast<YT*>(a.y);
  const T* residual = static_cast<const T*>(a.residual);
  T* sum = static_cast<T*>(a.sum);
  WeightRows<WT> scale(a.scale, a.scale_rows, n, row_begin), bias(a.bias, a.bias_rows, n, row_begin);
  WeightRows<WT> xbias(a.xbias, a.xbias_rows, n, row_begin);
  WeightRows<WT> inner_scale(a.inner_scale, a.inner_scale_rows, n, row_begin);
  WeightRows<WT> inner_bias(a.inner_bias, a.inner_bias_rows, n, row_begin);
  const bool has_scale = a.scale != nullptr, has_bias = a.bias != nullptr;
  const WeightPrep<E, S, kOrderA> prep(p.offset);
  const V alpha = Isa::Set1(a.alpha);
  const T* gate = static_cast<const T*>(a.gate);
  const bool silu = a.activation == 0;
  // (the ops without a Bias: GatedRMSNorm and L2Norm)
  constexpr bool kMayBias = kGate == Gate::kNone && NK != NormKind::kL2;

  OutputPlan row_plan = plan;  // with the next row's inputs
  // One row of X (or Z), with its weights prepared or as stored: the statistics from src, the
  // last pass from finish_src (the ops without a residual), each Y value through ep.
  auto row = [&](const auto& src, const auto& finish_src, YT* yr, T* sr, const auto& ep) {
    auto with = [&](const auto& weights) {
      if constexpr (RK != ResidualKind::kNone) {
        ResidualRow<NK, E, kOrderA>(src, z_buffer, weights, has_scale, has_bias, yr, sr, p, row_plan);
      } else {
        NormRowFrom<NK, E, YE, kOrderA, kMayBias>(src, finish_src, weights, has_scale, has_bias, yr, sr, p, row_plan,
                                                  ep);
      }
    };
    if (prepared_scale != nullptr) {
      with(PreparedWeights{prepared_scale, prepared_bias});
    } else {
      with(StoredWeights<E, S, kOrderA>{scale.Get(), bias.Get(), prep});
    }
  };

  for (int64_t r = row_begin; r < row_end; ++r) {
    const T* xr = x + r * n;
    YT* yr = y + r * n;
    T* sr = sum != nullptr ? sum + r * n : nullptr;
    if (plan.prefetch && r + 1 < row_end) {
      row_plan.next[0] = reinterpret_cast<const char*>(xr + n);
      if (RK != ResidualKind::kNone) row_plan.next[1] = reinterpret_cast<const char*>(residual + (r + 1) * n);
      if (kGate != Gate::kNone) row_plan.next[1] = reinterpret_cast<const char*>(gate + (r + 1) * n);
    } else {
      row_plan.next[0] = row_plan.next[1] = nullptr;
    }
    if constexpr (kGate == Gate::kAfter) {
      const PlainSource<E> src{xr};
      row(src, src, yr, nullptr, GateEpilogue<E>{gate + r * n, silu});
    } else if constexpr (kGate == Gate::kBefore) {
      // Z computed once into the row buffer by the statistics pass, or again by the last pass
      const GatedSource<E> src{xr, gate + r * n, silu};
      if (z_buffer != nullptr) {
        row(StoringSource<F32, GatedSource<E>>{src, z_buffer}, PlainSource<F32>{z_buffer}, yr, nullptr, NoEpilogue{});
      } else {
        row(src, src, yr, nullptr, NoEpilogue{});
      }
    } else if constexpr (RK == ResidualKind::kNone) {
      const PlainSource<E> src{xr};
      row(src, src, yr, nullptr, NoEpilogue{});
    } else if constexpr (RK == ResidualKind::kSkip) {
      const SkipSource<E, S> src{xr, residual + r * n, xbias.Get(), alpha, a.alpha != 1.f};
      row(src, src, yr, sr, NoEpilogue{});
      xbias.Next();
    } else {
      const Stats inner = RowStats<NK>(PlainSource<E>{xr}, p);
      const SandwichSource<NK, E, S, kOrderA> src{
          xr, residual + r * n, StoredWeights<E, S, kOrderA>{inner_scale.Get(), inner_bias.Get(), prep},
          Normalizer<NK, E, kOrderA>(inner, p.offset)};
      row(src, src, yr, sr, NoEpilogue{});
      inner_scale.Next();
      inner_bias.Next();
    }
    scale.Next();
    bias.Next();
  }
}

// RowsLoop with the row buffers on the stack (a function of its own, so that calls without them
// do not reserve them).
template <NormKind NK, ResidualKind RK, class E, class S, class YE, bool kOrderA, Gate kGate>
ONNXNORM_NOINLINE void RowsBuffered(const NormArgs& a, int64_t row_begin, int64_t row_end, const RowParams& p,
                                    const OutputPlan& plan, bool prepare, bool buffer_z) {
  constexpr bool kZ = RK != ResidualKind::kNone || kGate == Gate::kBefore;
  alignas(64) float prepared[2][kBufferCols];
  alignas(64) float z_row[kZ ? kZBufferCols : 1];
  if (prepare) {
    PrepareWeights<E, S, kOrderA>(static_cast<const typename S::St*>(a.scale),
                                  static_cast<const typename S::St*>(a.bias), p.n, p.offset, prepared[0], prepared[1]);
  }
  RowsLoop<NK, RK, E, S, YE, kOrderA, kGate>(a, row_begin, row_end, p, plan, prepare ? prepared[0] : nullptr,
                                             prepare ? prepared[1] : nullptr, kZ && buffer_z ? z_row : nullptr);
}

template <NormKind NK, ResidualKind RK, class E, class S, class YE, bool kOrderA, Gate kGate = Gate::kNone>
void RowsInOrder(const NormArgs& a, int64_t row_begin, int64_t row_end) {
  using T = typename YE::St;  // Y's: the plan below is Y's
  const int64_t n = a.cols;
  RowParams p;
  p.n = n;
  // (L2Norm: the sum of squares itself)
  p.inv_n = NK == NormKind::kL2 ? 1.0 : 1.0 / static_cast<double>(n);
  p.epsilon = static_cast<double>(a.epsilon);
  p.offset = a.scale_offset;
  const auto y = reinterpret_cast<uintptr_t>(a.y);

  OutputPlan plan;
  const int64_t tensors = RK == ResidualKind::kNone ? (kGate == Gate::kNone ? 2 : 3) : (a.sum != nullptr ? 4 : 3);
  const int64_t row_bytes = n * static_cast<int64_t>(sizeof(T));
  const bool whole_lines = row_bytes % 64 == 0 && y % 64 == 0;
  plan.stream_y = Isa::kHasStream && a.rows * row_bytes * tensors >= StreamMinBytes() && y % sizeof(T) == 0 &&
                  (row_bytes >= kStreamRowBytes || whole_lines);
  plan.stream_sum = plan.stream_y && a.sum != nullptr && (reinterpret_cast<uintptr_t>(a.sum) - y) % 64 == 0;
  plan.prefetch = a.rows * row_bytes * tensors >= kPrefetchMinBytes && row_bytes >= kPrefetchRowBytes;

  // The stack buffers: a residual op's Z when Sum is streamed or not wanted, a gated norm's Z when
  // the gate comes before the norm (rows of at most kZBufferCols), and the weights prepared once
  // when every row of a range of several rows of at most kBufferCols shares them.
  const bool shared = (a.scale == nullptr || a.scale_rows <= 1) && (a.bias == nullptr || a.bias_rows <= 1);
  const bool prepare =
      n <= kBufferCols && row_end - row_begin >= kPrepareRows && shared && (a.scale != nullptr || a.bias != nullptr);
  const bool buffer_z = n <= kZBufferCols &&
                        ((RK != ResidualKind::kNone && (a.sum == nullptr || plan.stream_y)) || kGate == Gate::kBefore);
  if (prepare || buffer_z) {
    RowsBuffered<NK, RK, E, S, YE, kOrderA, kGate>(a, row_begin, row_end, p, plan, prepare, buffer_z);
    if (plan.stream_y) Isa::Fence();  // the streamed stores are visible before the pool reports done
    return;
  }
  RowsLoop<NK, RK, E, S, YE, kOrderA, kGate>(a, row_begin, row_end, p, plan, nullptr, nullptr, nullptr);
  if (plan.stream_y) Isa::Fence();
}

// RowsInOrder in the call's rounding order (float32 takes order B, where the two agree).
template <NormKind NK, ResidualKind RK, class E, class S, class YE, Gate kGate>
void RowsOrdered(const NormArgs& a, int64_t row_begin, int64_t row_end) {
  if constexpr (!std::is_same<E, F32>::value) {
    if (a.cast_before_scale) {
      RowsInOrder<NK, RK, E, S, YE, true, kGate>(a, row_begin, row_end);
      return;
    }
  }
  RowsInOrder<NK, RK, E, S, YE, false, kGate>(a, row_begin, row_end);
}

// The kernel of op kind (NK, RK) for X of E, weights of S and Y of YE (E, or F32 for the mixed
// form of the ops without a residual). The RMS kernels without a residual whose Y is of X's type
// are GatedRMSNorm's too: with NormArgs::gate, the gate acts after or before the norm.
template <NormKind NK, ResidualKind RK, class E, class S, class YE = E>
void Rows(const NormArgs& a, int64_t row_begin, int64_t row_end) {
  if (row_begin >= row_end || a.cols <= 0) return;
  if constexpr (NK == NormKind::kRms && RK == ResidualKind::kNone && std::is_same<E, YE>::value) {
    if (a.gate != nullptr) {
      if (a.norm_before_gate) {
        RowsOrdered<NK, RK, E, S, YE, Gate::kAfter>(a, row_begin, row_end);
      } else {
        RowsOrdered<NK, RK, E, S, YE, Gate::kBefore>(a, row_begin, row_end);
      }
      return;
    }
  }
  RowsOrdered<NK, RK, E, S, YE, Gate::kNone>(a, row_begin, row_end);
}

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm

// Tests of the CPU row kernels through their C++ API (onnxnorm/kernels.h), without ONNX Runtime:
//
//   onnxnorm_kernel_tests --op RMSNorm     every type pair, shape, optional input, attribute,
//                                          rounding order, Sum on/off, per-head weights, odd
//                                          widths, misaligned and streamed (large) tensors, rows
//                                          split as threads split them, NaN/Inf: each against a
//                                          scalar float64 reference written here, and every
//                                          instruction set this CPU has against the others, byte
//                                          for byte
//   onnxnorm_kernel_tests --op GatedRMSNorm
//                                          the same, and the gate: absent, after the norm and
//                                          before it, SiLU and sigmoid, groups as the glue passes
//                                          them (rows of group_size values, a Scale of the group
//                                          or of the whole extent), NaN/Inf and large gates, and
//                                          the activation itself against float64 within a bound
//                                          in units in the last place (L2Norm: --op L2Norm)
//   onnxnorm_kernel_tests --op RMSNormQuantizeLinear
//                                          a quantized op: its Y_float bit for bit the float op's
//                                          Y (held to the reference above), its Y quantized from
//                                          it as QuantizeLinear / DynamicQuantizeLinear do
//                                          (written here; float8 e4m3fn Y too), on every
//                                          instruction set and row split byte for byte
//   onnxnorm_kernel_tests --conversions    the float16 / bfloat16 conversions of the portable
//                                          kernels and the float32 -> float8 e4m3fn conversion
//                                          (onnxnorm/float8.h) against references written here
//   onnxnorm_kernel_tests                  all of it
//
// Exits 0 when everything passes, 1 otherwise (ctest runs one process per op, see CMakeLists.txt).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../cpu/cpu_internal.h"  // the conversions under test (--conversions)
#include "onnxnorm/float8.h"      // likewise
#include "onnxnorm/kernels.h"

namespace {

using onnxnorm::ElemType;
using onnxnorm::NormArgs;
using onnxnorm::NormKind;
using onnxnorm::NormRowsFn;
using onnxnorm::OpSpec;
using onnxnorm::ResidualKind;
using onnxnorm::TypeSet;
namespace cpu = onnxnorm::cpu;

int g_failures = 0;
int g_checks = 0;

void Fail(const std::string& what) {
  if (g_failures < 20) std::printf("FAIL: %s\n", what.c_str());
  ++g_failures;
}

// ---------------------------------------------------------------------------------------------
// Element types, written independently of the library: values are doubles, rounding is to
// nearest even in the type's own value set.

size_t SizeOf(ElemType t) {
  switch (t) {
    case ElemType::kFloat32: return 4;
    case ElemType::kFloat16:
    case ElemType::kBFloat16: return 2;
    case ElemType::kUInt8:
    case ElemType::kInt8:
    case ElemType::kFloat8E4M3FN: return 1;
  }
  return 0;
}

const char* NameOf(ElemType t) { return onnxnorm::kElemTypeNames[static_cast<int>(t)]; }

struct Format {
  int mantissa_bits;
  int exponent_bits;
};

Format FormatOf(ElemType t) {
  return t == ElemType::kFloat16 ? Format{10, 5} : t == ElemType::kBFloat16 ? Format{7, 8} : Format{23, 8};
}

uint64_t BitsOfDouble(double v) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  return u;
}

double DoubleOfBits(uint64_t u) {
  double v;
  std::memcpy(&v, &u, 8);
  return v;
}

// v rounded to nearest even in t's value set (Inf beyond its largest finite value; NaN stays).
double RoundTo(ElemType t, double v) {
  if (t == ElemType::kFloat32) return static_cast<float>(v);
  if (std::isnan(v) || std::isinf(v) || v == 0.0) return v;
  const Format f = FormatOf(t);
  const int bias = (1 << (f.exponent_bits - 1)) - 1;
  const int emin = 1 - bias;
  const double a = std::fabs(v);
  int e = static_cast<int>((BitsOfDouble(a) >> 52) & 0x7ff) - 1023;  // a is a normal double here
  if (e < emin) e = emin;
  // Adding 1.5 * 2^(e - mantissa_bits + 52) leaves a rounded to a multiple of 2^(e - mantissa_bits)
  // (nearest even, the default rounding), as the addition keeps only that many bits.
  const double magic = DoubleOfBits(static_cast<uint64_t>(e - f.mantissa_bits + 52 + 1023) << 52) * 1.5;
  double r = (a + magic) - magic;
  const double largest = std::ldexp(2.0 - std::ldexp(1.0, -f.mantissa_bits), bias);
  if (r > largest) r = INFINITY;
  return std::copysign(r, v);
}

// The bits of a value of t's value set (as RoundTo gives).
uint32_t Encode(ElemType t, double v) {
  if (t == ElemType::kFloat32) {
    const float f = static_cast<float>(v);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  }
  const Format f = FormatOf(t);
  const int bias = (1 << (f.exponent_bits - 1)) - 1;
  const uint32_t sign = std::signbit(v) ? 1u << (f.mantissa_bits + f.exponent_bits) : 0u;
  const uint32_t all_ones = (1u << f.exponent_bits) - 1;
  if (std::isnan(v)) return sign | (all_ones << f.mantissa_bits) | (1u << (f.mantissa_bits - 1));
  if (std::isinf(v)) return sign | (all_ones << f.mantissa_bits);
  const double a = std::fabs(v);
  if (a < std::ldexp(1.0, 1 - bias)) {
    return sign | static_cast<uint32_t>(std::ldexp(a, bias - 1 + f.mantissa_bits));
  }
  const uint64_t bits = BitsOfDouble(a);
  const int e = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  const auto mantissa = static_cast<uint32_t>((bits >> (52 - f.mantissa_bits)) & ((1u << f.mantissa_bits) - 1));
  return sign | (static_cast<uint32_t>(e + bias) << f.mantissa_bits) | mantissa;
}

double DecodeSlow(ElemType t, uint32_t bits) {
  const Format fm = FormatOf(t);
  const int bias = (1 << (fm.exponent_bits - 1)) - 1;
  const uint32_t mantissa = bits & ((1u << fm.mantissa_bits) - 1);
  const uint32_t exponent = (bits >> fm.mantissa_bits) & ((1u << fm.exponent_bits) - 1);
  const bool negative = (bits >> (fm.mantissa_bits + fm.exponent_bits)) & 1u;
  double a;
  if (exponent == (1u << fm.exponent_bits) - 1) {
    a = mantissa ? NAN : INFINITY;
  } else if (exponent == 0) {
    a = std::ldexp(static_cast<double>(mantissa), 1 - bias - fm.mantissa_bits);
  } else {
    a = std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa), -fm.mantissa_bits),
                   static_cast<int>(exponent) - bias);
  }
  return negative ? -a : a;
}

double Decode(ElemType t, uint32_t bits) {
  if (t == ElemType::kFloat32) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  // every 16-bit value, decoded once
  static const std::vector<double> tables[2] = {[] {
                                                  std::vector<double> v(65536);
                                                  for (uint32_t b = 0; b < 65536; ++b)
                                                    v[b] = DecodeSlow(ElemType::kFloat16, b);
                                                  return v;
                                                }(),
                                                [] {
                                                  std::vector<double> v(65536);
                                                  for (uint32_t b = 0; b < 65536; ++b)
                                                    v[b] = DecodeSlow(ElemType::kBFloat16, b);
                                                  return v;
                                                }()};
  return tables[t == ElemType::kFloat16 ? 0 : 1][bits & 0xffffu];
}

// A tensor of one element type, starting `offset` bytes past a 64-byte boundary.
class Tensor {
 public:
  Tensor() = default;
  Tensor(ElemType t, size_t count, size_t offset) : type_(t), count_(count), offset_(offset) {
    storage_.assign(count * SizeOf(t) + offset + 128, 0xAB);
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    start_ = static_cast<size_t>((64 - base % 64) % 64) + offset;
  }
  ElemType type() const { return type_; }
  size_t count() const { return count_; }
  void* data() { return storage_.data() + start_; }
  const void* data() const { return storage_.data() + start_; }
  size_t bytes() const { return count_ * SizeOf(type_); }
  uint32_t Bits(size_t i) const {
    if (SizeOf(type_) == 4) {
      uint32_t u;
      std::memcpy(&u, static_cast<const char*>(data()) + 4 * i, 4);
      return u;
    }
    uint16_t h;
    std::memcpy(&h, static_cast<const char*>(data()) + 2 * i, 2);
    return h;
  }
  double Get(size_t i) const { return Decode(type_, Bits(i)); }
  void Set(size_t i, double v) {
    const uint32_t bits = Encode(type_, RoundTo(type_, v));
    if (SizeOf(type_) == 4) {
      std::memcpy(static_cast<char*>(data()) + 4 * i, &bits, 4);
    } else {
      const auto h = static_cast<uint16_t>(bits);
      std::memcpy(static_cast<char*>(data()) + 2 * i, &h, 2);
    }
  }
  void Fill(uint8_t byte) { std::memset(data(), byte, bytes()); }
  bool SameBytes(const Tensor& other) const {
    return bytes() == other.bytes() && std::memcmp(data(), other.data(), bytes()) == 0;
  }
  // Whether nothing was written in the 64 bytes on either side of the tensor.
  bool GuardsIntact() const {
    for (size_t i = 0; i < start_; ++i) {
      if (storage_[i] != 0xAB) return false;
    }
    for (size_t i = start_ + bytes(); i < storage_.size(); ++i) {
      if (storage_[i] != 0xAB) return false;
    }
    return true;
  }

 private:
  ElemType type_ = ElemType::kFloat32;
  size_t count_ = 0;
  size_t offset_ = 0;
  size_t start_ = 0;
  std::vector<uint8_t> storage_;
};

// ---------------------------------------------------------------------------------------------
// One call of a kernel: inputs, attributes, and the reference.

enum WeightSlot { kScale, kBias, kXBias, kInnerScale, kInnerBias, kSlots };
const char* const kSlotNames[kSlots] = {"Scale", "Bias", "XBias", "InnerScale", "InnerBias"};

bool OpHasInput(const OpSpec& op, const char* name) {
  for (const auto& p : op.inputs) {
    if (std::strcmp(p.name, name) == 0) return true;
  }
  return false;
}

struct Case {
  std::string label;
  const OpSpec* op = nullptr;
  ElemType t = ElemType::kFloat32, s = ElemType::kFloat32;
  bool mixed = false;  // Y float32 for a 16-bit X (the op's TypeSet with u != t)
  int64_t rows = 1, cols = 1;
  bool present[kSlots] = {};
  int64_t weight_rows = 1;  // rows of every present weight (row r uses row r % weight_rows)
  float epsilon = 1e-5f, offset = 0.f, alpha = 1.f;
  int order_a = 0;
  bool with_sum = true;
  size_t misalign = 0;      // bytes past a 64-byte boundary, for X, Residual and Y
  size_t sum_misalign = 0;  // and for Sum
  double mean = 0.0, spread = 1.0;
  bool outliers = false;      // the first values of each row far from its mean
  bool specials = false;      // NaN and Inf among the inputs
  bool wide_weights = false;  // weights whose products overflow or underflow the 16-bit types
  // GatedRMSNorm: the gate absent (kNoGate), after the norm or before it; its activation (0 SiLU,
  // 1 sigmoid); the spread of its values, and NaN, Inf and large values among them
  int gate = 0;
  int activation = 0;
  double gate_spread = 2.0;
  bool gate_specials = false;
};

enum GateKind { kNoGate = 0, kGateAfter = 1, kGateBefore = 2 };
const char* const kGateNames[] = {"none", "after", "before"};

ElemType YType(const Case& c) { return c.mixed ? ElemType::kFloat32 : c.t; }

struct Inputs {
  Tensor x, residual, gate;
  Tensor weights[kSlots];
};

Inputs MakeInputs(const Case& c, std::mt19937_64& rng) {
  Inputs in;
  const size_t count = static_cast<size_t>(c.rows * c.cols);
  std::normal_distribution<double> normal(0.0, 1.0);
  in.x = Tensor(c.t, count, c.misalign);
  for (size_t i = 0; i < count; ++i) {
    double v = c.mean + c.spread * normal(rng);
    if (c.outliers && i % static_cast<size_t>(c.cols) < 20) v = c.mean + 1000.0;
    in.x.Set(i, v);
  }
  if (c.specials && count >= 8) {
    in.x.Set(0, NAN);
    in.x.Set(count / 2, INFINITY);
    in.x.Set(count - 1, -INFINITY);
  }
  if (c.op->residual != ResidualKind::kNone) {
    in.residual = Tensor(c.t, count, c.misalign);
    for (size_t i = 0; i < count; ++i) in.residual.Set(i, normal(rng));
  }
  if (c.gate != kNoGate) {
    in.gate = Tensor(c.t, count, c.misalign + 4);
    for (size_t i = 0; i < count; ++i) in.gate.Set(i, c.gate_spread * normal(rng));
    if (c.gate_specials) {
      // NaN, +-Inf, and values where exp(-|g|) leaves float32's normal range or rounds to 0
      const double specials[] = {NAN, INFINITY, -INFINITY, 88.0, -88.0, 95.0, -95.0, 110.0, -110.0, -1e4, 1e4};
      size_t k = 0;
      for (size_t i = 3; i < count; i += 7) in.gate.Set(i, specials[k++ % (sizeof(specials) / sizeof(specials[0]))]);
    }
  }
  // (float16: past both ends of its range; bfloat16: into float32's subnormals, which the AVX-512
  // bfloat16 instruction does not round itself)
  std::uniform_real_distribution<double> exponent(c.t == ElemType::kBFloat16 ? -150.0 : -24.0, 17.0);
  for (int w = 0; w < kSlots; ++w) {
    if (!c.present[w]) continue;
    const size_t n = static_cast<size_t>(c.weight_rows * c.cols);
    in.weights[w] = Tensor(c.s, n, 4 * static_cast<size_t>(w));
    const bool scale = w == kScale || w == kInnerScale;
    for (size_t i = 0; i < n; ++i) {
      double v = (scale ? 1.0 : 0.0) + 0.3 * normal(rng);
      if (c.wide_weights && scale) v = std::exp2(exponent(rng)) * (i % 2 ? 1.0 : -1.0);
      in.weights[w].Set(i, v);
    }
  }
  return in;
}

// The reference: float64 arithmetic, rounded to X's type where the op's definition rounds
// (docs/norms.md; onnxnorm/ops/reference.py computes the same).
struct Expected {
  std::vector<double> y, sum;
};

double WeightAt(const Inputs& in, const Case& c, int slot, int64_t r, int64_t j, bool* present) {
  *present = c.present[slot];
  if (!*present) return 0.0;
  return in.weights[slot].Get(static_cast<size_t>((r % c.weight_rows) * c.cols + j));
}

// The gate's activation of float32 value g in float64: SiLU (0) or sigmoid (1).
double ActivationOf(double g, int activation) {
  const double sigmoid = 1.0 / (1.0 + std::exp(-g));
  return activation == 0 ? g * sigmoid : sigmoid;
}

// Norm(z) * (scale + offset) + bias of one row, rounded to X's type, or (yt float32, the mixed
// form) with its last rounding to float32 instead; with `gate` (GatedRMSNorm, the gate after the
// norm), each value times it before that last rounding (order A: the value rounded to X's type
// first).
void NormRowReference(const Case& c, const Inputs& in, int scale_slot, int bias_slot, int64_t r,
                      const std::vector<double>& z, double* out, ElemType yt, const double* gate = nullptr) {
  const int64_t n = c.cols;
  double mean = 0.0;
  if (c.op->norm == NormKind::kLayer) {
    for (double v : z) mean += v;
    mean /= static_cast<double>(n);
  }
  double var = 0.0;
  for (double v : z) var += (v - mean) * (v - mean);
  if (c.op->norm != NormKind::kL2) var /= static_cast<double>(n);  // (L2Norm: the sum itself)
  const double inv = 1.0 / std::sqrt(var + static_cast<double>(c.epsilon));
  const bool order_a = c.order_a && c.t != ElemType::kFloat32;
  for (int64_t j = 0; j < n; ++j) {
    const double normalized = (z[static_cast<size_t>(j)] - mean) * inv;
    bool has_scale = false, has_bias = false;
    const double scale = WeightAt(in, c, scale_slot, r, j, &has_scale);
    const double bias = bias_slot >= 0 ? WeightAt(in, c, bias_slot, r, j, &has_bias) : 0.0;
    double y;
    if (order_a) {
      double s = has_scale ? RoundTo(c.t, scale) : 1.0;
      if (c.offset != 0.f) s = RoundTo(c.t, s + RoundTo(c.t, c.offset));
      y = RoundTo(c.t, RoundTo(c.t, normalized) * s);
      if (has_bias) y = RoundTo(yt, y + RoundTo(c.t, bias));
      if (gate != nullptr) y = RoundTo(yt, y * gate[j]);
    } else {
      y = normalized * ((has_scale ? scale : 1.0) + static_cast<double>(c.offset));
      if (has_bias) y += bias;
      if (gate != nullptr) y *= gate[j];
      y = RoundTo(yt, y);
    }
    out[j] = y;
  }
}

Expected Reference(const Case& c, const Inputs& in) {
  const int64_t n = c.cols;
  Expected e;
  e.y.resize(static_cast<size_t>(c.rows * n));
  if (c.op->residual != ResidualKind::kNone) e.sum.resize(e.y.size());
  std::vector<double> z(static_cast<size_t>(n)), inner(static_cast<size_t>(n)), act(static_cast<size_t>(n));
  for (int64_t r = 0; r < c.rows; ++r) {
    const size_t base = static_cast<size_t>(r * n);
    for (int64_t j = 0; j < n; ++j) z[static_cast<size_t>(j)] = in.x.Get(base + static_cast<size_t>(j));
    if (c.gate != kNoGate) {
      for (int64_t j = 0; j < n; ++j) {
        act[static_cast<size_t>(j)] = ActivationOf(in.gate.Get(base + static_cast<size_t>(j)), c.activation);
      }
    }
    if (c.gate == kGateBefore) {  // Z = X * act(Gate) in float32, not rounded to X's type
      for (int64_t j = 0; j < n; ++j) {
        z[static_cast<size_t>(j)] =
            RoundTo(ElemType::kFloat32, z[static_cast<size_t>(j)] * act[static_cast<size_t>(j)]);
      }
    }
    if (c.op->residual == ResidualKind::kSkip) {
      for (int64_t j = 0; j < n; ++j) {
        bool has = false;
        const double xbias = WeightAt(in, c, kXBias, r, j, &has);
        const double total = static_cast<double>(c.alpha) * in.residual.Get(base + static_cast<size_t>(j)) +
                             z[static_cast<size_t>(j)] + xbias;
        z[static_cast<size_t>(j)] = RoundTo(c.t, total);
      }
    } else if (c.op->residual == ResidualKind::kSandwich) {
      NormRowReference(c, in, kInnerScale, kInnerBias, r, z, inner.data(), c.t);
      for (int64_t j = 0; j < n; ++j) {
        z[static_cast<size_t>(j)] =
            RoundTo(c.t, in.residual.Get(base + static_cast<size_t>(j)) + inner[static_cast<size_t>(j)]);
      }
    }
    if (!e.sum.empty()) std::copy(z.begin(), z.end(), e.sum.begin() + static_cast<std::ptrdiff_t>(base));
    NormRowReference(c, in, kScale, kBias, r, z, e.y.data() + base, YType(c),
                     c.gate == kGateAfter ? act.data() : nullptr);
  }
  return e;
}

// The per-type tolerance of the Python tests (onnxnorm.ops.reference.tolerance).
void Tolerance(ElemType t, double* rtol, double* atol) {
  *rtol = *atol = t == ElemType::kFloat16 ? 2e-3 : t == ElemType::kBFloat16 ? 1.6e-2 : 1e-5;
}

bool Close(double got, double want, double rtol, double atol) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

struct Outputs {
  Tensor y, sum;
};

// The kernel arguments of case `c` for op `op` on inputs `in`: Y into `y` (none: nullptr), and
// Sum into a new `*sum` filled with a marker when the case wants it.
NormArgs ArgsFor(const OpSpec& op, const Case& c, const Inputs& in, void* y, Tensor* sum) {
  NormArgs a;
  a.op = op.id;
  a.x_type = c.t;
  a.weight_type = c.s;
  a.y_type = YType(c);
  a.cast_before_scale = c.order_a;
  a.rows = c.rows;
  a.cols = c.cols;
  a.x = in.x.data();
  a.y = y;
  if (op.residual != ResidualKind::kNone) {
    a.residual = in.residual.data();
    if (c.with_sum) {
      *sum = Tensor(c.t, static_cast<size_t>(c.rows * c.cols), c.sum_misalign);
      sum->Fill(0xCD);
      a.sum = sum->data();
    }
  }
  const void* NormArgs::* data[kSlots] = {&NormArgs::scale, &NormArgs::bias, &NormArgs::xbias, &NormArgs::inner_scale,
                                          &NormArgs::inner_bias};
  int64_t NormArgs::* rows[kSlots] = {&NormArgs::scale_rows, &NormArgs::bias_rows, &NormArgs::xbias_rows,
                                      &NormArgs::inner_scale_rows, &NormArgs::inner_bias_rows};
  for (int w = 0; w < kSlots; ++w) {
    if (!c.present[w]) continue;
    a.*data[w] = in.weights[w].data();
    a.*rows[w] = c.weight_rows;
  }
  a.epsilon = c.epsilon;
  a.scale_offset = c.offset;
  a.alpha = c.alpha;
  if (c.gate != kNoGate) {
    a.gate = in.gate.data();
    a.activation = c.activation;
    a.norm_before_gate = c.gate == kGateAfter ? 1 : 0;
  }
  return a;
}

Outputs Run(NormRowsFn fn, const Case& c, const Inputs& in, int splits) {
  const size_t count = static_cast<size_t>(c.rows * c.cols);
  Outputs out;
  out.y = Tensor(YType(c), count, c.misalign);
  out.y.Fill(0xCD);
  NormArgs a = ArgsFor(*c.op, c, in, out.y.data(), &out.sum);
  // the rows in `splits` ranges of different sizes, as a thread pool may hand them out
  int64_t begin = 0;
  for (int k = 1; k <= splits; ++k) {
    const int64_t end = k == splits ? c.rows : c.rows * k * k / (splits * splits);
    fn(a, begin, end);
    begin = end > begin ? end : begin;
  }
  return out;
}

std::string Describe(const Case& c, const char* isa) {
  std::string s = std::string(c.op->name) + " " + NameOf(c.t) + "/" + NameOf(c.s) + (c.mixed ? "->float32 " : " ") +
                  std::to_string(c.rows) + "x" + std::to_string(c.cols) + " [" + c.label + "] inputs:";
  for (int w = 0; w < kSlots; ++w) {
    if (c.present[w]) s += std::string(" ") + kSlotNames[w];
  }
  s += " order_a=" + std::to_string(c.order_a) + " sum=" + std::to_string(c.with_sum) + " isa=" + isa;
  if (c.gate != kNoGate) {
    s += std::string(" gate=") + kGateNames[c.gate] + (c.activation == 0 ? " silu" : " sigmoid");
  }
  if (c.weight_rows > 1) s += " weight_rows=" + std::to_string(c.weight_rows);
  return s;
}

// Checks an output against the reference; the first mismatch is reported.
void CheckOutput(const char* name, const Tensor& got, const std::vector<double>& want, const Case& c, const char* isa) {
  ++g_checks;
  double rtol, atol;
  // a float32 Y of a 16-bit X in order B is rounded to float32 only
  Tolerance(c.mixed && !c.order_a && std::string(name) == "Y" ? ElemType::kFloat32 : c.t, &rtol, &atol);
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got.Get(i);
    if (!Close(g, want[i], rtol, atol)) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), ": %s[%zu] = %.9g, want %.9g", name, i, g, want[i]);
      Fail(Describe(c, isa) + buf);
      return;
    }
  }
  if (!got.GuardsIntact()) Fail(Describe(c, isa) + ": wrote outside " + name);
}

// Runs one case on every instruction set: each against the reference, and all of them (and the
// rows split as threads split them) byte for byte against the first.
void CheckCase(const Case& c, std::mt19937_64& rng) {
  const Inputs in = MakeInputs(c, rng);
  const Expected want = Reference(c, in);
  Outputs first;
  const char* first_isa = nullptr;
  for (int level = 0; level <= static_cast<int>(cpu::SupportedIsa()); ++level) {
    const auto isa = static_cast<cpu::Isa>(level);
    const char* isa_name = cpu::IsaName(isa);
    NormRowsFn fn = cpu::GetNormRowsFor(isa, c.op->norm, c.op->residual, c.t, c.s, YType(c));
    if (fn == nullptr) {
      Fail(Describe(c, isa_name) + ": no kernel");
      continue;
    }
    for (int splits : {1, 3}) {
      if (splits > 1 && c.rows < 3) continue;
      Outputs out = Run(fn, c, in, splits);
      if (first_isa == nullptr) {
        CheckOutput("Y", out.y, want.y, c, isa_name);
        if (c.with_sum && !want.sum.empty()) CheckOutput("Sum", out.sum, want.sum, c, isa_name);
        first = std::move(out);
        first_isa = isa_name;
        continue;
      }
      ++g_checks;
      const bool same = out.y.SameBytes(first.y) && (out.sum.count() == 0 || out.sum.SameBytes(first.sum));
      if (!same) {
        // NaN payloads may differ; anything else must not
        bool only_nan = c.specials || c.gate_specials;
        for (size_t i = 0; only_nan && i < want.y.size(); ++i) {
          const double a = out.y.Get(i), b = first.y.Get(i);
          only_nan = (std::isnan(a) && std::isnan(b)) || out.y.Bits(i) == first.y.Bits(i);
        }
        if (!only_nan || out.sum.count() != 0) {
          size_t i = 0;
          while (i < want.y.size() && out.y.Bits(i) == first.y.Bits(i)) ++i;
          char buf[200];
          std::snprintf(buf, sizeof(buf), ": differs from %s%s (first at Y[%zu]: %.9g vs %.9g)", first_isa,
                        splits > 1 ? " when the rows are split" : "", i, i < want.y.size() ? out.y.Get(i) : 0.0,
                        i < want.y.size() ? first.y.Get(i) : 0.0);
          Fail(Describe(c, isa_name) + buf);
        }
      }
      if (!out.y.GuardsIntact() || (out.sum.count() != 0 && !out.sum.GuardsIntact())) {
        Fail(Describe(c, isa_name) + ": wrote outside an output");
      }
    }
  }
}

// The weights an op has, by slot.
void PresentAll(const OpSpec& op, bool present[kSlots], bool value) {
  for (int w = 0; w < kSlots; ++w) present[w] = value && OpHasInput(op, kSlotNames[w]);
}

// GatedRMSNorm's activation alone: rows of one value 1 with epsilon 0 normalize to exactly 1, so
// Y (float32, no Scale, the gate after the norm) is act(Gate) as the kernels compute it. Held to
// float64 within a bound in units in the last place of float32 (norm_rows.h states the accuracy),
// every instruction set giving the same bits.
int TestActivation(const OpSpec& op) {
  const int failures_before = g_failures;
  std::vector<double> gates;
  std::mt19937_64 rng(0xac7);
  std::uniform_real_distribution<double> uniform(-95.0, 95.0);
  for (int i = 0; i < 400000; ++i) gates.push_back(uniform(rng));
  for (int i = 0; i <= 40000; ++i) {  // log-spaced magnitudes 1e-8 .. 100, both signs
    const double v = std::pow(10.0, -8.0 + 10.0 * i / 40000.0);
    gates.push_back(v);
    gates.push_back(-v);
  }
  for (double v : {0.0, -0.0, 1e-30, -1e-30, 87.0, -87.0, 87.5, -87.5, 103.0, -103.0, 104.5, -104.5, 1e4, -1e4, 3.4e38,
                   -3.4e38, static_cast<double>(INFINITY), -static_cast<double>(INFINITY)}) {
    gates.push_back(v);
  }
  for (int activation : {0, 1}) {
    Case c;
    c.label = "activation";
    c.op = &op;
    c.rows = static_cast<int64_t>(gates.size());
    c.cols = 1;
    c.epsilon = 0.f;
    c.gate = kGateAfter;
    c.activation = activation;
    Inputs in;
    in.x = Tensor(ElemType::kFloat32, gates.size(), 0);
    in.gate = Tensor(ElemType::kFloat32, gates.size(), 0);
    for (size_t i = 0; i < gates.size(); ++i) {
      in.x.Set(i, 1.0);
      in.gate.Set(i, gates[i]);
    }
    double worst = 0.0, worst_at = 0.0;
    Outputs first;
    for (int level = 0; level <= static_cast<int>(cpu::SupportedIsa()); ++level) {
      const auto isa = static_cast<cpu::Isa>(level);
      NormRowsFn fn = cpu::GetNormRowsFor(isa, op.norm, op.residual, c.t, c.s, c.t);
      Outputs out = Run(fn, c, in, 1);
      ++g_checks;
      if (level > 0) {
        if (!out.y.SameBytes(first.y)) Fail(Describe(c, cpu::IsaName(isa)) + ": differs from the portable kernels");
        continue;
      }
      for (size_t i = 0; i < gates.size(); ++i) {
        const double g = in.gate.Get(i), got = out.y.Get(i), want = ActivationOf(g, activation);
        if (std::isnan(want) || std::isinf(want) || std::isnan(got) || std::isinf(got)) {
          if (!((std::isnan(want) && std::isnan(got)) || got == want)) {
            Fail(Describe(c, "portable") + ": act(" + std::to_string(g) + ") = " + std::to_string(got));
          }
          continue;
        }
        // a unit in the last place of float32 at want (at least the smallest subnormal's); where
        // the sigmoid is below float32's normal range (g < -87.3), SiLU is g times a subnormal,
        // whose rounding error (half of 2^-149) g multiplies: that in units of 2^-149
        int e = 0;
        std::frexp(want, &e);
        double ulp = std::ldexp(1.0, std::max(e - 24, -149));
        if (activation == 0 && ActivationOf(g, 1) < 0x1p-126) ulp = std::max(ulp, std::fabs(g) * 0x1p-149);
        const double err = std::fabs(got - want) / ulp;
        if (err > worst) {
          worst = err;
          worst_at = g;
        }
      }
      first = std::move(out);
    }
    // norm_rows.h: sigmoid within 3.6, SiLU within 4.6 units in the last place
    const double bound = activation == 0 ? 5.0 : 4.0;
    if (worst > bound) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "%s: %.2f units in the last place at %.9g (bound %.1f)",
                    activation == 0 ? "SiLU" : "sigmoid", worst, worst_at, bound);
      Fail(buf);
    }
    std::printf("  %-7s of %zu float32 gates: within %.2f units in the last place of float64's (bound %.1f)\n",
                activation == 0 ? "SiLU" : "sigmoid", gates.size(), worst, bound);
  }
  return g_failures == failures_before ? 0 : 1;
}

int TestOp(const OpSpec& op) {
  const int failures_before = g_failures, checks_before = g_checks;
  std::mt19937_64 rng(0x5eed + static_cast<int>(op.id));
  const bool gated = OpHasInput(op, "Gate");
  if (gated) TestActivation(op);
  const bool rms = op.norm == NormKind::kRms;
  const bool skip = op.residual == ResidualKind::kSkip;
  const bool residual = op.residual != ResidualKind::kNone;
  const int64_t widths[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 37, 63, 64, 65, 100, 127, 128, 130, 257, 1000, 4096};
  int cases = 0;
  for (const TypeSet& pair : op.types) {
    // every width, all weights present, both rounding orders, a different misalignment each
    int k = 0;
    for (int64_t cols : widths) {
      Case c;
      c.label = "width";
      c.op = &op;
      c.t = pair.t;
      c.s = pair.s;
      c.mixed = pair.u != pair.t;
      c.rows = cols >= 1000 ? 3 : 5;
      c.cols = cols;
      PresentAll(op, c.present, true);
      c.order_a = k % 2;
      c.misalign = static_cast<size_t>(k % 4) * 12;
      c.sum_misalign = static_cast<size_t>(k % 3) * 4;
      c.epsilon = k % 3 == 0 ? 1e-3f : 1e-5f;
      c.with_sum = k % 5 != 4;
      if (rms && k % 4 == 1) c.offset = 1.f;
      if (skip && k % 3 == 1) c.alpha = 0.5f;
      if (gated) {
        c.gate = k % 3;
        c.activation = (k / 3) % 2;
      }
      CheckCase(c, rng);
      ++cases;
      ++k;
    }
    // a residual op without Sum keeps Z in a float32 row buffer up to its width, and in Y above
    // it: both sides of that width
    for (int64_t cols : {int64_t{5000}, int64_t{16400}}) {
      if (!residual) break;
      Case c;
      c.label = "wide, no Sum";
      c.op = &op;
      c.t = pair.t;
      c.s = pair.s;
      c.mixed = pair.u != pair.t;
      c.rows = 2;
      c.cols = cols;
      PresentAll(op, c.present, true);
      c.order_a = cols > 10000;
      c.with_sum = false;
      CheckCase(c, rng);
      ++cases;
    }
    // every subset of the optional weights, with and without Sum, in both orders, per-head weights
    // (the gated op: each with every gate and activation)
    int subset_count = 1 << kSlots;
    for (int subset = 0; subset < subset_count; ++subset) {
      Case c;
      c.label = "inputs";
      c.op = &op;
      c.t = pair.t;
      c.s = pair.s;
      c.mixed = pair.u != pair.t;
      c.rows = 6;
      c.cols = 96 + subset;
      bool valid = true;
      for (int w = 0; w < kSlots; ++w) {
        c.present[w] = (subset >> w) & 1;
        if (c.present[w] && !OpHasInput(op, kSlotNames[w])) valid = false;
      }
      if (!valid) continue;
      for (int g = 0; g < (gated ? 6 : 1); ++g) {
        c.gate = g % 3;
        c.activation = g / 3;
        for (int variant = 0; variant < 4; ++variant) {
          c.order_a = variant & 1;
          c.with_sum = residual && (variant & 2);
          c.weight_rows = variant == 3 ? 3 : 1;  // row r uses weight row r % 3
          c.offset = rms && variant == 2 ? 1.f : 0.f;
          c.alpha = skip && variant == 1 ? 2.f : 1.f;
          c.misalign = static_cast<size_t>(variant) * 4;
          CheckCase(c, rng);
          ++cases;
        }
      }
    }
    // the gated op's groups as the glue passes them (rows of group_size values; a Scale of one
    // group shared by all, or of the whole extent as extent / group_size weight rows), gates of
    // a wide spread, and rows on both sides of the Z buffer's width (the gate before the norm)
    if (gated) {
      struct Group {
        const char* label;
        int64_t rows, cols, weight_rows;
        int gate, activation;
        double spread;
      };
      const Group groups[] = {
          {"Mamba2: 2 x 4096 in 8 groups, the gate first", 16, 512, 8, kGateBefore, 0, 2.0},
          {"Qwen3-Next: 3 x 16 heads of 128, Scale [128]", 48, 128, 1, kGateAfter, 0, 2.0},
          {"Kimi: sigmoid gate, Scale of 4 groups", 12, 64, 4, kGateAfter, 1, 2.0},
          {"large gates before", 5, 300, 1, kGateBefore, 0, 40.0},
          {"large gates after", 5, 300, 1, kGateAfter, 1, 40.0},
          {"wide, Z buffered", 2, 5000, 1, kGateBefore, 0, 2.0},
          {"wider than the Z buffer", 2, 16400, 1, kGateBefore, 1, 2.0},
      };
      for (const Group& group : groups) {
        for (int order : {0, 1}) {
          Case c;
          c.label = group.label;
          c.op = &op;
          c.t = pair.t;
          c.s = pair.s;
          c.rows = group.rows;
          c.cols = group.cols;
          c.weight_rows = group.weight_rows;
          PresentAll(op, c.present, true);
          c.order_a = order;
          c.gate = group.gate;
          c.activation = group.activation;
          c.gate_spread = group.spread;
          c.offset = order ? 0.f : 1.f;
          CheckCase(c, rng);
          ++cases;
        }
      }
    }
    // weights spanning the 16-bit types' range: outputs that overflow to Inf (float16) and
    // underflow to subnormals, through every instruction set's conversions
    if (pair.t != ElemType::kFloat32) {
      Case c;
      c.label = "wide weights";
      c.op = &op;
      c.t = pair.t;
      c.s = pair.s;
      c.mixed = pair.u != pair.t;
      c.rows = 4;
      c.cols = 300;
      PresentAll(op, c.present, true);
      c.present[kBias] = c.present[kInnerBias] = c.present[kXBias] = false;
      c.wide_weights = true;
      for (int order : {0, 1}) {
        c.order_a = order;
        if (gated) c.gate = order ? kGateAfter : kGateBefore;
        CheckCase(c, rng);
        ++cases;
      }
    }
    // NaN and Inf in X
    {
      Case c;
      c.label = "NaN/Inf";
      c.op = &op;
      c.t = pair.t;
      c.s = pair.s;
      c.mixed = pair.u != pair.t;
      c.rows = 4;
      c.cols = 40;
      PresentAll(op, c.present, true);
      c.specials = true;
      CheckCase(c, rng);
      ++cases;
      // (and in the gate: NaN, Inf, values past float32's exp range, each way round)
      for (int g = 0; gated && g < 4; ++g) {
        c.gate = g % 2 ? kGateAfter : kGateBefore;
        c.activation = g / 2;
        c.gate_specials = true;
        c.specials = g % 2 == 0;
        CheckCase(c, rng);
        ++cases;
      }
    }
    // LayerNorm's statistics: a large mean with a small spread, and first values far from the mean
    if (!rms) {
      Case c;
      c.label = "large mean";
      c.op = &op;
      c.t = pair.t;
      c.s = pair.s;
      c.mixed = pair.u != pair.t;
      c.rows = 8;
      c.cols = 4096;
      c.mean = pair.t == ElemType::kFloat32 ? 1e4 : 100.0;
      c.spread = pair.t == ElemType::kFloat32 ? 1e-2 : 1.0;
      c.present[kScale] = true;
      CheckCase(c, rng);
      c.label = "outliers first";
      c.rows = 6;
      c.cols = 300;
      c.mean = 0.0;
      c.spread = 1.0;
      c.outliers = true;
      CheckCase(c, rng);
      cases += 2;
    }
  }
  // Calls that stream their outputs (the threshold lowered to 1 MiB for them): misaligned, with Sum
  // on a different alignment than Y, aligned, short rows that each start on a 64-byte boundary,
  // and rows wider than a residual op's Z buffer (Z kept in Sum or Y; in float32 only, the fewest
  // rows over the threshold: "wide, no Sum" above covers the 16-bit types); each also split into
  // row ranges as the thread pool does. And a call just below the threshold, which does not
  // stream, for the same bits.
  cpu::SetStreamMinBytes(int64_t{1} << 20);
  for (ElemType t : {ElemType::kFloat32, ElemType::kFloat16}) {
    for (int variant = 0; variant < 5; ++variant) {
      if (variant == 4 && t != ElemType::kFloat32) break;
      Case c;
      c.op = &op;
      c.t = c.s = t;
      c.label = variant == 0   ? "streamed"
                : variant == 1 ? "streamed, aligned"
                : variant == 2 ? "streamed, short aligned rows"
                : variant == 3 ? "below the streaming threshold"
                               : "streamed, rows wider than the Z buffer";
      c.cols = variant == 2 ? 128 : variant == 4 ? 16400 : 4096 + 24;
      const int64_t bytes_per_row = c.cols * static_cast<int64_t>(SizeOf(t)) * (residual || gated ? 3 : 2);
      c.rows = (int64_t{1} << 20) / bytes_per_row + (variant == 3 ? -1 : 2);
      PresentAll(op, c.present, true);
      c.misalign = variant == 0 || variant == 3 ? 20 : 0;
      c.sum_misalign = variant == 0 ? 36 : 0;
      c.with_sum = true;
      c.order_a = t != ElemType::kFloat32;
      if (gated) c.gate = variant % 2 ? kGateBefore : kGateAfter;
      CheckCase(c, rng);
      ++cases;
      if (residual) {  // and without Sum
        c.with_sum = false;
        CheckCase(c, rng);
        ++cases;
      }
    }
  }
  cpu::SetStreamMinBytes(cpu::kStreamMinBytes);
  std::printf("%-18s %4d cases, %5d checks against the reference and across instruction sets: %s\n", op.name, cases,
              g_checks - checks_before, g_failures == failures_before ? "ok" : "FAILED");
  return g_failures == failures_before ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// The quantized ops. Their Y_float must be the float op's Y bit for bit (the same instruction
// set's GetNormRowsFor kernel, which TestOp holds to the reference), and their Y that value
// quantized as written here; every instruction set and row split gives the same bytes.

// float8 e4m3fn bits of float32 t as QuantizeLinear (saturate = 1) converts it, written without
// the library's bit arithmetic: NaN stays NaN (0x7F, with t's sign), |t| >= 448 gives +-448
// (0x7E), else t rounded to nearest even among the e4m3fn values, in double arithmetic: in t's
// binade [2^e, 2^(e+1)) (e >= -6; below, the subnormals' spacing) the values are the multiples
// of 2^(e-3), so t / 2^(e-3) (exact: a power of two) rounded half to even by nearbyint counts them.
uint32_t Float8E4M3FNRef(float t) {
  const uint32_t sign = std::signbit(t) ? 0x80u : 0u;
  if (std::isnan(t)) return sign | 0x7Fu;
  const double a = std::fabs(static_cast<double>(t));
  if (a >= 448.0) return sign | 0x7Eu;
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  const int exponent = std::max(e - 1, -6);
  const double unit = std::ldexp(1.0, exponent - 3);
  const double r = std::nearbyint(a / unit) * unit;  // < 448 or 448 itself
  if (r < std::ldexp(1.0, -6)) return sign | static_cast<uint32_t>(r / std::ldexp(1.0, -9));  // k * 2^-9
  std::frexp(r, &e);  // r = (1 + m / 8) * 2^(e-1)
  const auto m = static_cast<uint32_t>((r / std::ldexp(1.0, e - 1) - 1.0) * 8.0);
  return sign | (static_cast<uint32_t>(e - 1 + 7) << 3) | m;
}

// QuantizeLinear of a float32 value as ONNX Runtime computes it: v / scale in float32, NaN to
// the minimum, rounded half to even, plus the zero point, saturated. float8 e4m3fn: the bits of
// v / scale converted (Float8E4M3FNRef); the zero point is not used.
int32_t QuantizeRef(float v, float scale, int32_t zero_point, ElemType q) {
  if (q == ElemType::kFloat8E4M3FN) return static_cast<int32_t>(Float8E4M3FNRef(v / scale));
  const double lo = q == ElemType::kInt8 ? -128.0 : 0.0, hi = q == ElemType::kInt8 ? 127.0 : 255.0;
  const float t = v / scale;
  if (std::isnan(t)) return static_cast<int32_t>(lo);
  const double r = std::nearbyint(static_cast<double>(t)) + zero_point;
  return static_cast<int32_t>(std::min(hi, std::max(lo, r)));
}

// DynamicQuantizeLinear's scale and zero point (uint8) for these values, as ONNX Runtime
// computes them: the range (NaN left out) widened to hold 0, scale (hi - lo) / 255 in float32
// (1 for [0, 0]), zero point round(clamp(0 - lo / scale, 0, 255)), 255 where that is NaN.
void DynamicRef(const std::vector<float>& values, float* scale, int32_t* zero_point) {
  float lo = 0.f, hi = 0.f;
  for (float v : values) {
    if (std::isnan(v)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  *scale = hi == lo ? 1.f : (hi - lo) / 255.f;
  const float initial = 0.f - lo / *scale;
  *zero_point =
      std::isnan(initial) ? 255 : static_cast<int32_t>(std::nearbyint(std::min(255.f, std::max(0.f, initial))));
}

struct QuantOutputs {
  Tensor q, y_float, sum;
  float scale = 0.f;
  int32_t zero_point = 0;
};

// One quantized call on one instruction set: the static pass, or the dynamic range pass, the
// scale and zero point, and the quantize pass; each over the rows in `splits` ranges.
QuantOutputs RunQuant(cpu::Isa isa, const OpSpec& op, const Case& c, ElemType qt, const Inputs& in, float scale,
                      int32_t zero_point, bool with_float, int splits) {
  const size_t count = static_cast<size_t>(c.rows * c.cols);
  QuantOutputs out;
  out.q = Tensor(qt, count, c.misalign);
  out.q.Fill(0xCD);
  if (with_float) {
    out.y_float = Tensor(c.t, count, c.misalign);
    out.y_float.Fill(0xCD);
  }
  NormArgs a = ArgsFor(op, c, in, with_float ? out.y_float.data() : nullptr, &out.sum);
  cpu::QuantArgs qa;
  qa.q_type = qt;
  qa.q = out.q.data();
  qa.scale = scale;
  qa.zero_point = zero_point;
  auto split = [&](cpu::QuantRowsFn fn) {
    int64_t begin = 0;
    for (int k = 1; k <= splits; ++k) {
      const int64_t end = k == splits ? c.rows : c.rows * k * k / (splits * splits);
      fn(a, qa, begin, end);
      begin = end > begin ? end : begin;
    }
  };
  const bool dynamic = op.quantize == onnxnorm::QuantizeKind::kDynamic;
  cpu::QuantRowsFn fn = cpu::GetQuantRowsFor(
      isa, op.norm, op.residual, dynamic ? cpu::QuantPass::kQuantize : cpu::QuantPass::kStatic, c.t, c.s, qt);
  if (fn == nullptr) {
    Fail(std::string(op.name) + ": no quantized kernel");
    return out;
  }
  std::vector<float> scratch;  // the rows' statistics and ranges between the two passes
  if (dynamic) {
    scratch.assign(static_cast<size_t>(c.rows * cpu::kQuantScratchFloats), NAN);
    qa.row_scratch = scratch.data();
    split(cpu::GetQuantRowsFor(isa, op.norm, op.residual, cpu::QuantPass::kRange, c.t, c.s, qt));
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t r = 0; r < c.rows; ++r) {
      lo = std::min(lo, scratch[static_cast<size_t>(r * cpu::kQuantScratchFloats + 3)]);
      hi = std::max(hi, scratch[static_cast<size_t>(r * cpu::kQuantScratchFloats + 4)]);
    }
    cpu::DynamicQuantParams(lo, hi, &qa.scale, &qa.zero_point);
    out.scale = qa.scale;
    out.zero_point = qa.zero_point;
  }
  split(fn);
  return out;
}

int32_t QuantAt(const Tensor& q, size_t i) {
  const auto* p = static_cast<const uint8_t*>(q.data()) + i;
  return q.type() == ElemType::kInt8 ? static_cast<int32_t>(static_cast<int8_t>(*p)) : static_cast<int32_t>(*p);
}

// One case of a quantized op on every instruction set.
void CheckQuantCase(const OpSpec& op, const OpSpec& float_op, const Case& c, ElemType qt, float scale,
                    int32_t zero_point, std::mt19937_64& rng) {
  const Inputs in = MakeInputs(c, rng);
  const bool dynamic = op.quantize == onnxnorm::QuantizeKind::kDynamic;
  const size_t count = static_cast<size_t>(c.rows * c.cols);
  QuantOutputs first;
  const char* first_isa = nullptr;
  for (int level = 0; level <= static_cast<int>(cpu::SupportedIsa()); ++level) {
    const auto isa = static_cast<cpu::Isa>(level);
    const char* isa_name = cpu::IsaName(isa);
    const std::string what = Describe(c, isa_name) + " " + op.name + "/" + NameOf(qt);
    // the float op's Y on this instruction set
    Case fc = c;
    fc.op = &float_op;
    const Outputs want = Run(cpu::GetNormRowsFor(isa, float_op.norm, float_op.residual, c.t, c.s, c.t), fc, in, 1);
    std::vector<float> y_values(count);
    for (size_t i = 0; i < count; ++i) y_values[i] = static_cast<float>(want.y.Get(i));
    float want_scale = scale;
    int32_t want_zero_point = zero_point;
    if (dynamic) DynamicRef(y_values, &want_scale, &want_zero_point);
    for (int splits : {1, 3}) {
      if (splits > 1 && c.rows < 3) continue;
      for (bool with_float : {true, false}) {
        QuantOutputs out = RunQuant(isa, op, c, qt, in, scale, zero_point, with_float, splits);
        ++g_checks;
        if (dynamic && (out.scale != want_scale || out.zero_point != want_zero_point)) {
          char buf[160];
          std::snprintf(buf, sizeof(buf), ": scale %.9g zero point %d, want %.9g and %d", out.scale, out.zero_point,
                        want_scale, want_zero_point);
          Fail(what + buf);
        }
        for (size_t i = 0; i < count; ++i) {
          const int32_t w = QuantizeRef(y_values[i], want_scale, want_zero_point, qt);
          if (QuantAt(out.q, i) != w) {
            char buf[160];
            std::snprintf(buf, sizeof(buf), ": Y[%zu] = %d, want %d (Y_float %.9g)", i, QuantAt(out.q, i), w,
                          static_cast<double>(y_values[i]));
            Fail(what + buf);
            break;
          }
        }
        if (with_float) {
          for (size_t i = 0; i < count; ++i) {
            const double g = out.y_float.Get(i), f = want.y.Get(i);
            if (!(g == f || (std::isnan(g) && std::isnan(f)))) {
              Fail(what + ": Y_float[" + std::to_string(i) + "] is not the float op's Y");
              break;
            }
          }
        }
        if (c.with_sum && out.sum.count() != 0 && !out.sum.SameBytes(want.sum))
          Fail(what + ": Sum is not the float op's");
        if (!out.q.GuardsIntact() || (with_float && !out.y_float.GuardsIntact()) ||
            (out.sum.count() != 0 && !out.sum.GuardsIntact())) {
          Fail(what + ": wrote outside an output");
        }
        if (first_isa == nullptr) {
          first = std::move(out);
          first_isa = isa_name;
        } else if (!out.q.SameBytes(first.q)) {
          Fail(what + ": Y differs from " + first_isa);
        }
      }
    }
  }
}

int TestQuantOp(const OpSpec& op) {
  const int failures_before = g_failures, checks_before = g_checks;
  std::mt19937_64 rng(0x9a17 + static_cast<int>(op.id));
  const OpSpec* float_op = nullptr;
  for (const OpSpec& candidate : onnxnorm::kOps) {
    if (candidate.quantize == onnxnorm::QuantizeKind::kNone && candidate.norm == op.norm &&
        candidate.residual == op.residual) {
      float_op = &candidate;
    }
  }
  const bool rms = op.norm == NormKind::kRms;
  const bool skip = op.residual == ResidualKind::kSkip;
  const int64_t widths[] = {1, 7, 16, 33, 100, 257, 1000, 4099};
  int cases = 0;
  for (const auto& pair : onnxnorm::kTypePairs) {
    for (ElemType qt : op.quant_types) {
      int k = 0;
      for (int64_t cols : widths) {
        Case c;
        c.label = "width";
        c.op = &op;
        c.t = pair.t;
        c.s = pair.s;
        c.rows = cols >= 1000 ? 3 : 5;
        c.cols = cols;
        PresentAll(op, c.present, k % 3 != 2);
        if (k % 3 == 1) c.present[kBias] = false;
        c.order_a = k % 2;
        c.misalign = static_cast<size_t>(k % 4) * 12;
        c.with_sum = skip && k % 2 == 0;
        if (rms && k % 4 == 1) c.offset = 1.f;
        if (skip && k % 3 == 1) c.alpha = 0.5f;
        // a scale that saturates the largest values (float8: beyond 448), zero points inside the
        // range (float8: any value; it is not used)
        const bool float8 = qt == ElemType::kFloat8E4M3FN;
        const float scale = k % 2 ? (float8 ? 0.004f : 0.02f) : 0.0137f;
        const int32_t zero_point = qt == ElemType::kInt8 ? (k % 3) * 5 - 5 : 100 + 20 * (k % 3);
        CheckQuantCase(op, *float_op, c, qt, scale, zero_point, rng);
        ++cases;
        ++k;
      }
      // NaN and Inf in X (rows of NaN), per-head weights
      Case c;
      c.label = "NaN/Inf, per-head weights";
      c.op = &op;
      c.t = pair.t;
      c.s = pair.s;
      c.rows = 6;
      c.cols = 40;
      c.weight_rows = 3;
      PresentAll(op, c.present, true);
      c.specials = true;
      CheckQuantCase(op, *float_op, c, qt, 0.05f, qt == ElemType::kInt8 ? 3 : 7, rng);
      ++cases;
      // constant rows: LayerNorm without Bias is 0 everywhere (DynamicQuantizeLinear's scale 1)
      if (!rms && !skip) {
        c.label = "constant rows";
        c.weight_rows = 1;
        c.specials = false;
        c.spread = 0.0;
        c.mean = 3.0;
        c.present[kBias] = false;
        CheckQuantCase(op, *float_op, c, qt, 0.05f, 0, rng);
        ++cases;
      }
    }
  }
  std::printf("%-34s %4d cases, %5d checks against the float op and across instruction sets: %s\n", op.name, cases,
              g_checks - checks_before, g_failures == failures_before ? "ok" : "FAILED");
  return g_failures == failures_before ? 0 : 1;
}

// The float32 -> float8 e4m3fn conversion (onnxnorm/float8.h, the CPU and CUDA kernels') of
// the float32 with bits `bits` against Float8E4M3FNRef.
bool CheckFloat8(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  const uint32_t got = onnxnorm::float8::FloatToE4M3FN(f), want = Float8E4M3FNRef(f);
  if (got == want) return true;
  char buf[120];
  std::snprintf(buf, sizeof(buf), "float32 %08x (%.9g) -> float8e4m3fn: %02x, want %02x", bits, static_cast<double>(f),
                got, want);
  Fail(buf);
  return false;
}

// Values at the float8 conversion's edges with their bits, worked out by hand (e4m3fn: sign,
// 4 exponent bits of bias 7, 3 mantissa bits; S.1111.111 is NaN; below 2^-6, k * 2^-9 is code k).
struct Float8Edge {
  float value;
  uint32_t bits;
  const char* why;
};
const Float8Edge kFloat8Edges[] = {
    {0.0f, 0x00, "+0"},
    {-0.0f, 0x80, "-0 keeps its sign"},
    {448.0f, 0x7E, "448 = 1.75 * 2^8: exponent 8 + 7 = 1111, mantissa 110"},
    {-448.0f, 0xFE, "-448"},
    {449.0f, 0x7E, "above 448: saturated"},
    {464.0f, 0x7E, "the tie of 448 and 480 (which would be 0x7F, NaN): saturated to 448"},
    {465.0f, 0x7E, "saturated"},
    {1e4f, 0x7E, "saturated"},
    {-1e4f, 0xFE, "saturated, negative"},
    {INFINITY, 0x7E, "+Inf saturates to 448"},
    {-INFINITY, 0xFE, "-Inf saturates to -448"},
    {NAN, 0x7F, "NaN: S.1111.111"},
    {-NAN, 0xFF, "NaN keeps its sign"},
    {0x1p-10f, 0x00, "half of 2^-9, the smallest subnormal: the tie of 0 and 2^-9 goes to 0 (even)"},
    {0x1p-10f * 1.0001f, 0x01, "just above that tie: 2^-9"},
    {1.5f * 0x1p-9f, 0x02, "the tie of 1 and 2 units of 2^-9: 2"},
    {2.5f * 0x1p-9f, 0x02, "the tie of 2 and 3 units: 2"},
    {7.5f * 0x1p-9f, 0x08, "the tie of 7 and 8 units: 8 units = 2^-6, 0.0001.000"},
    {0x1p-6f, 0x08, "2^-6, the smallest normal: exponent -6 + 7 = 0001, mantissa 000"},
    {1.0f, 0x38, "1.0: exponent 0111"},
    {1.0625f, 0x38, "the tie of 1.0 (mantissa 000) and 1.125 (001): 1.0"},
    {1.1875f, 0x3A, "the tie of 1.125 (001) and 1.25 (010): 1.25"},
    {240.0f, 0x77, "1.875 * 2^7: exponent 1110, mantissa 111"},
    {-1e-30f, 0x80, "a tiny negative rounds to -0"},
};

// The conversions of cpu_internal.h (portable kernels; the vector ones are held to the same bits
// by the cross-instruction-set checks) against Encode(RoundTo(...)), and float8.h's against
// Float8E4M3FNRef and the edges above.
int TestConversions() {
  const int failures_before = g_failures;
  int checks = 0;
  for (const Float8Edge& edge : kFloat8Edges) {
    const uint32_t got = onnxnorm::float8::FloatToE4M3FN(edge.value);
    const uint32_t ref = Float8E4M3FNRef(edge.value);
    checks += 2;
    if (got != edge.bits || ref != edge.bits) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), "float8e4m3fn of %.9g: %02x (the reference %02x), want %02x: %s",
                    static_cast<double>(edge.value), got, ref, edge.bits, edge.why);
      Fail(buf);
    }
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    // every float16 value (as float32) to float8: every float8 value, its neighbours and ties
    ++checks;
    CheckFloat8(cpu::HalfBitsToFloatBits(h));
    const double want = Decode(ElemType::kFloat16, h);
    const float got = cpu::HalfToFloat(static_cast<uint16_t>(h));
    ++checks;
    if (!(got == want || (std::isnan(got) && std::isnan(want)))) Fail("float16 -> float32 of " + std::to_string(h));
    const double want_b = Decode(ElemType::kBFloat16, h);
    const float got_b = cpu::BFloat16ToFloat(static_cast<uint16_t>(h));
    ++checks;
    if (!(got_b == want_b || (std::isnan(got_b) && std::isnan(want_b)))) {
      Fail("bfloat16 -> float32 of " + std::to_string(h));
    }
  }
  // float32 -> float16 / bfloat16 / float8 e4m3fn: every exponent with mantissas at and around
  // the rounding points, both signs, and random values
  std::vector<uint32_t> samples;
  const uint32_t mantissas[] = {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu, 0x2000u, 0x3000u, 0x7fffu, 0x8000u, 0x8001u,
                                0x18000u, 0x17fffu, 0x7fffffu, 0x400000u, 0x401000u,
                                // float8's rounding points (20 bits dropped): ties and their neighbours
                                0x7ffffu, 0x80000u, 0x80001u, 0x17ffffu, 0x180000u, 0x180001u, 0x680000u};
  for (uint32_t e = 0; e < 256; ++e) {
    for (uint32_t m : mantissas) {
      samples.push_back((e << 23) | m);
      samples.push_back(0x80000000u | (e << 23) | m);
    }
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000000; ++i) samples.push_back(static_cast<uint32_t>(rng()));
  for (uint32_t bits : samples) {
    float f;
    std::memcpy(&f, &bits, 4);
    ++checks;
    CheckFloat8(bits);
    for (ElemType t : {ElemType::kFloat16, ElemType::kBFloat16}) {
      uint32_t want;
      if (std::isnan(f)) {
        // a quiet NaN with the top of the payload, sign kept
        const Format fm = FormatOf(t);
        const uint32_t top = (bits & 0x7fffffu) >> (23 - fm.mantissa_bits);
        want = ((bits >> 31) << (fm.mantissa_bits + fm.exponent_bits)) |
               (((1u << fm.exponent_bits) - 1) << fm.mantissa_bits) | (1u << (fm.mantissa_bits - 1)) | top;
      } else {
        want = Encode(t, RoundTo(t, f));
      }
      const uint32_t got = t == ElemType::kFloat16 ? cpu::FloatToHalf(f) : cpu::FloatToBFloat16(f);
      ++checks;
      if (got != want) {
        char buf[120];
        std::snprintf(buf, sizeof(buf), "float32 %08x -> %s: %04x, want %04x", bits, NameOf(t), got, want);
        Fail(buf);
      }
    }
  }
  g_checks += checks;
  std::printf("%-18s %d values: %s\n", "conversions", checks, g_failures == failures_before ? "ok" : "FAILED");
  return g_failures == failures_before ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string only_op;
  bool conversions = false, all = argc == 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--op" && i + 1 < argc) {
      only_op = argv[++i];
    } else if (arg == "--conversions") {
      conversions = true;
    } else {
      std::printf("usage: %s [--op NAME] [--conversions]\n", argv[0]);
      return 2;
    }
  }
  std::printf("instruction sets on this CPU:");
  for (int level = 0; level <= static_cast<int>(cpu::SupportedIsa()); ++level) {
    std::printf(" %s", cpu::IsaName(static_cast<cpu::Isa>(level)));
  }
  std::printf("\n");
  int status = 0;
  if (all || conversions) status |= TestConversions();
  bool found = only_op.empty();
  for (const OpSpec& op : onnxnorm::kOps) {
    // (the rotary ops' kernels are tested through ONNX Runtime: tests/kernels/test_rotary_kernels.py)
    bool rotary = false;
    for (const auto& p : op.inputs) rotary = rotary || p.type == onnxnorm::TypeVar::kA;
    if (rotary) {
      found = found || only_op == op.name;
      continue;
    }
    if (all || only_op == op.name) {
      status |= op.quantize == onnxnorm::QuantizeKind::kNone ? TestOp(op) : TestQuantOp(op);
      found = true;
    }
  }
  if (!found) {
    std::printf("unknown op %s\n", only_op.c_str());
    return 2;
  }
  // a weight type that is neither X's nor float32 has no kernel
  if (cpu::GetNormRows(NormKind::kRms, ResidualKind::kNone, ElemType::kFloat16, ElemType::kBFloat16,
                       ElemType::kFloat16) != nullptr) {
    Fail("a kernel for float16 X with bfloat16 weights");
    status = 1;
  }
  // a float32 Y of a 16-bit X: only with float32 weights, and only where Y is not the residual's type
  if (cpu::GetNormRows(NormKind::kRms, ResidualKind::kSkip, ElemType::kFloat16, ElemType::kFloat32,
                       ElemType::kFloat32) != nullptr ||
      cpu::GetNormRows(NormKind::kLayer, ResidualKind::kNone, ElemType::kBFloat16, ElemType::kBFloat16,
                       ElemType::kFloat32) != nullptr ||
      cpu::GetNormRows(NormKind::kLayer, ResidualKind::kNone, ElemType::kBFloat16, ElemType::kFloat32,
                       ElemType::kFloat16) != nullptr) {
    Fail("a kernel for a float32 Y outside the ops' type sets");
    status = 1;
  }
  // L2Norm: no residual, no weights of another type than X's, Y of X's type
  if (cpu::GetNormRows(NormKind::kL2, ResidualKind::kNone, ElemType::kFloat16, ElemType::kFloat32,
                       ElemType::kFloat16) != nullptr ||
      cpu::GetNormRows(NormKind::kL2, ResidualKind::kNone, ElemType::kBFloat16, ElemType::kBFloat16,
                       ElemType::kFloat32) != nullptr ||
      cpu::GetNormRows(NormKind::kL2, ResidualKind::kSkip, ElemType::kFloat32, ElemType::kFloat32,
                       ElemType::kFloat32) != nullptr) {
    Fail("an L2Norm kernel outside its type sets");
    status = 1;
  }
  std::printf("%s\n", status == 0 ? "all passed" : "FAILED");
  return status;
}

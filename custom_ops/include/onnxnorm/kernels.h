// onnxnorm kernel API: plain C++ (pointers, sizes, a params struct), no ONNX Runtime types.
//
// The ORT glue (custom_ops/ort/) resolves shapes and attributes into a NormArgs, looks up a row
// kernel once per node, and calls it on row ranges, possibly from several threads at once.
// Benchmarks and tests may call the same kernels directly, without onnxruntime.
//
// Data layout: X, Y (and Residual, Sum) are row-major [rows, cols]; the statistics of row r are
// taken over its cols values. Scale and Bias are [scale_rows, cols] and [bias_rows, cols]: row r uses row
// (r % scale_rows) of Scale, which covers both the usual case (one row shared by every row of X,
// scale_rows = 1) and weights that span more dimensions than the statistics (Cohere's per-head
// Q/K norm: X [B, S, H, D] normalized over D with Scale [H, D] gives scale_rows = H).
#pragma once

#include <cstdint>

namespace onnxnorm {

// Which statistics: root mean square (RMSNorm) or mean and population variance (LayerNorm).
enum class NormKind : int32_t {
  kRMS = 0,
  kLayer = 1,
};

// What comes before the norm:
//   kNone:     Z = X
//   kSkip:     Z = round(alpha * Residual + X (+ XBias))
//   kSandwich: Z = round(Residual + Norm(X; InnerScale, InnerBias))   (the inner norm rounded first)
// where round() is a rounding to X's type; Y = Norm(Z; Scale, Bias) and Sum = Z.
enum class ResidualKind : int32_t {
  kNone = 0,
  kSkip = 1,
  kSandwich = 2,
};

// Element type of a tensor a kernel reads or writes.
enum class ElemType : int32_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
};

// Everything one normalization node needs; the pointers are not owned.
struct NormArgs {
  const void* x = nullptr;      // [rows, cols], x_type
  const void* scale = nullptr;  // [scale_rows, cols], scale_type; nullptr: absent (Scale = 1)
  const void* bias = nullptr;   // [bias_rows, cols], bias_type; nullptr: absent (Bias = 0)
  void* y = nullptr;            // [rows, cols], x_type

  ElemType x_type = ElemType::kFloat32;
  ElemType scale_type = ElemType::kFloat32;
  ElemType bias_type = ElemType::kFloat32;

  int64_t rows = 0;
  int64_t cols = 0;        // > 0 whenever rows > 0
  int64_t scale_rows = 1;  // >= 1
  int64_t bias_rows = 1;   // >= 1

  float epsilon = 1e-5f;     // added to the mean square (RMSNorm) or the variance (LayerNorm)
  float scale_offset = 0.f;  // RMSNorm: Y = normalized * (Scale + scale_offset) + Bias
  // Rounding order for 16-bit X (see DESIGN.md section 3): false = order B (multiply in float32,
  // round once), true = order A (round the normalized value, then scale in X's type). No effect
  // for float32.
  bool cast_before_scale = false;

  // Residual ops (ResidualKind kSkip / kSandwich); ignored by the plain norms.
  const void* residual = nullptr;  // [rows, cols], x_type; required by the residual ops
  void* sum = nullptr;             // [rows, cols], x_type; nullptr: Sum not wanted
  const void* xbias = nullptr;        // kSkip: [xbias_rows, cols]; nullptr: absent
  const void* inner_scale = nullptr;  // kSandwich: [inner_scale_rows, cols]; nullptr: absent
  const void* inner_bias = nullptr;   // kSandwich: [inner_bias_rows, cols]; nullptr: absent
  ElemType xbias_type = ElemType::kFloat32;
  ElemType inner_scale_type = ElemType::kFloat32;
  ElemType inner_bias_type = ElemType::kFloat32;
  int64_t xbias_rows = 1;
  int64_t inner_scale_rows = 1;
  int64_t inner_bias_rows = 1;
  float alpha = 1.f;  // kSkip: Z = alpha * Residual + X (+ XBias)
  // The sandwich's inner norm uses epsilon, scale_offset and cast_before_scale too.
};

// Normalizes rows [row_begin, row_end) of args. Must be safe to call concurrently on disjoint
// row ranges of the same args. Never throws; never allocates.
using NormRowsFn = void (*)(const NormArgs& args, int64_t row_begin, int64_t row_end);

namespace cpu {

// The row kernel of one op for these element types on this CPU (the best instruction set it has,
// unless the environment variable ONNXNORM_CPU_ISA = portable | avx2 | avx512 asks for a lesser
// one), or nullptr when the combination is not implemented. Every weight present in NormArgs
// (scale, bias, xbias, inner_scale, inner_bias) must be of weight_type, which is x_type or
// kFloat32. The kernel reads X, Residual and the weights, writes Y and (when not null) Sum; Y may
// not overlap the inputs. Statistics are float32 (per-row scalars in float64); LayerNorm sums
// D and D^2 with D = X - shift, the shift being near the row's mean (the mean of its first
// vector), and takes a second pass around the mean when that shift proves far from it, so rows
// with a large mean and a small spread stay accurate (never E[x^2] - E[x]^2 on raw values).
// Row-wise parallel calls are the caller's business; no heap allocation.
NormRowsFn GetNormRows(NormKind norm, ResidualKind residual, ElemType x_type, ElemType weight_type);

// The instruction set GetNormRows chooses on this CPU: "avx512", "avx2" or "portable".
const char* ActiveIsa();

// The RMSNorm row kernel for these element types on this CPU (the best instruction set it has),
// or nullptr when that combination is not implemented. For an absent Scale or Bias pass x_type;
// a present Scale and Bias must have the same type. Same as GetNormRows(kRMS, kNone, x_type, w)
// with w the one of scale_type, bias_type that differs from x_type (else x_type).
// Statistics are always accumulated in float32 (or wider).
NormRowsFn GetRMSNormRows(ElemType x_type, ElemType scale_type, ElemType bias_type);

}  // namespace cpu
}  // namespace onnxnorm

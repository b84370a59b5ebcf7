// NormArgs: everything one normalization call needs. The one argument struct from the ORT glue
// (custom_ops/ort/) and from Python (ctypes) to the CPU row kernels, the CUDA launcher and the
// CUDA kernels.
//
// Data layout: X, Y (and Residual, Sum, Gate) are row-major [rows, cols]; the statistics of row r are
// taken over its cols values. A weight (Scale, Bias, XBias, InnerScale, InnerBias) is
// [<name>_rows, cols]: row r of X uses its row (r % <name>_rows), which covers both the usual case
// (one row shared by every row of X, <name>_rows = 1) and weights that span more dimensions than
// the statistics (Cohere's per-head Q/K norm: X [B, S, H, D] normalized over D with Scale [H, D]
// gives scale_rows = H).
//
// What comes before the norm (the op's ResidualKind):
//   kNone:     Z = X
//   kSkip:     Z = round(alpha * Residual + X (+ XBias))
//   kSandwich: Z = round(Residual + Norm(X; InnerScale, InnerBias))   (the inner norm rounded first)
// where round() rounds to X's type; Y = Norm(Z; Scale, Bias) and Sum = Z. The sandwich's inner
// norm uses epsilon, scale_offset and cast_before_scale too.
//
// Fixed-size fields in a standard layout, so that a C or ctypes mirror can describe it: both
// libraries export its layout (onnxnorm_args_layout) and the tests hold the Python mirror
// (onnxnorm/bench/cuda.py) to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "onnxnorm/ops_generated.h"

namespace onnxnorm {

struct NormArgs {
  OpId op = OpId::kLayerNorm;
  ElemType x_type = ElemType::kFloat32;       // of X, Residual, Sum, and of Y but where y_type says
  ElemType weight_type = ElemType::kFloat32;  // of every present weight: x_type or kFloat32
  // Of Y: x_type; or kFloat32 for a 16-bit x_type with kFloat32 weights in the ops whose Y is of
  // type U (LayerNorm, RMSNorm): Y is then the value before its last rounding to x_type.
  ElemType y_type = ElemType::kFloat32;
  // Rounding order for 16-bit X (docs/norms.md): 0 = order B (scale in float32, round once),
  // 1 = order A (round the normalized value, then scale in X's type). No effect for float32.
  int32_t cast_before_scale = static_cast<int32_t>(attr_default::kCastBeforeScale);

  int64_t rows = 0;
  int64_t cols = 0;  // > 0 whenever rows > 0

  const void* x = nullptr;            // [rows, cols]
  const void* residual = nullptr;     // [rows, cols]: required by the residual ops, else nullptr
  const void* scale = nullptr;        // nullptr: absent (Scale = 1)
  const void* bias = nullptr;         // nullptr: absent (Bias = 0)
  const void* xbias = nullptr;        // skip ops; nullptr: absent
  const void* inner_scale = nullptr;  // sandwich ops; nullptr: absent
  const void* inner_bias = nullptr;   // sandwich ops; nullptr: absent
  void* y = nullptr;                  // [rows, cols]; may not overlap the inputs
  void* sum = nullptr;                // [rows, cols], residual ops; nullptr: Sum not wanted

  int64_t scale_rows = 1;  // >= 1 for each present weight
  int64_t bias_rows = 1;
  int64_t xbias_rows = 1;
  int64_t inner_scale_rows = 1;
  int64_t inner_bias_rows = 1;

  float epsilon = attr_default::kEpsilon;           // added to the mean square or the variance
  float scale_offset = attr_default::kScaleOffset;  // RMS ops: Y = normalized * (Scale + offset) + Bias
  float alpha = attr_default::kAlpha;               // skip ops: Z = alpha * Residual + X (+ XBias)

  // GatedRMSNorm (docs/ops.md): the gate, [rows, cols] of x_type like X (nullptr: absent), its
  // activation (0 = SiLU, 1 = sigmoid, in float32) and where it acts: 1 = Y = Norm(X) * act(gate),
  // 0 = Y = Norm(float32(X) * act(gate)) (the product not rounded). The op's groups are rows: a
  // caller with group_size G passes rows * (extent / G) rows of G cols, and a Scale of the whole
  // extent as extent / G weight rows.
  const void* gate = nullptr;
  int32_t activation = static_cast<int32_t>(attr_default::kActivation);
  int32_t norm_before_gate = static_cast<int32_t>(attr_default::kNormBeforeGate);
};

static_assert(std::is_standard_layout<NormArgs>::value && std::is_trivially_copyable<NormArgs>::value,
              "NormArgs is described field by field to C and Python: keep it a plain struct");

// Every field with its offset and size; a field missing here shows as a size mismatch in the
// tests.
struct NormArgsField {
  const char* name;
  size_t offset;
  size_t size;
};

#define ONNXNORM_ARGS_FIELD(f) \
  NormArgsField { #f, offsetof(NormArgs, f), sizeof(NormArgs::f) }
inline constexpr NormArgsField kNormArgsFields[] = {
    ONNXNORM_ARGS_FIELD(op),
    ONNXNORM_ARGS_FIELD(x_type),
    ONNXNORM_ARGS_FIELD(weight_type),
    ONNXNORM_ARGS_FIELD(y_type),
    ONNXNORM_ARGS_FIELD(cast_before_scale),
    ONNXNORM_ARGS_FIELD(rows),
    ONNXNORM_ARGS_FIELD(cols),
    ONNXNORM_ARGS_FIELD(x),
    ONNXNORM_ARGS_FIELD(residual),
    ONNXNORM_ARGS_FIELD(scale),
    ONNXNORM_ARGS_FIELD(bias),
    ONNXNORM_ARGS_FIELD(xbias),
    ONNXNORM_ARGS_FIELD(inner_scale),
    ONNXNORM_ARGS_FIELD(inner_bias),
    ONNXNORM_ARGS_FIELD(y),
    ONNXNORM_ARGS_FIELD(sum),
    ONNXNORM_ARGS_FIELD(scale_rows),
    ONNXNORM_ARGS_FIELD(bias_rows),
    ONNXNORM_ARGS_FIELD(xbias_rows),
    ONNXNORM_ARGS_FIELD(inner_scale_rows),
    ONNXNORM_ARGS_FIELD(inner_bias_rows),
    ONNXNORM_ARGS_FIELD(epsilon),
    ONNXNORM_ARGS_FIELD(scale_offset),
    ONNXNORM_ARGS_FIELD(alpha),
    ONNXNORM_ARGS_FIELD(gate),
    ONNXNORM_ARGS_FIELD(activation),
    ONNXNORM_ARGS_FIELD(norm_before_gate),
};
#undef ONNXNORM_ARGS_FIELD

// {"size": 160, "fields": [["op", 0, 4], ...]}: what onnxnorm_args_layout returns. Both
// libraries built from one tree give the same text, which the CPU library checks before it uses
// the CUDA launcher.
inline const char* NormArgsLayoutJson() {
  static const std::string json = [] {
    std::string out = "{\"size\":" + std::to_string(sizeof(NormArgs)) + ",\"fields\":[";
    bool first = true;
    for (const NormArgsField& f : kNormArgsFields) {
      out += first ? "[\"" : ",[\"";
      first = false;
      out += f.name;
      out += "\"," + std::to_string(f.offset) + "," + std::to_string(f.size) + "]";
    }
    return out + "]}";
  }();
  return json.c_str();
}

}  // namespace onnxnorm

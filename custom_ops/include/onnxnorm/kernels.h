// onnxnorm kernel API: plain C++ (pointers, sizes, a params struct), no ONNX Runtime types.
//
// The ORT glue (custom_ops/ort/) resolves shapes and attributes into a NormArgs, looks up a row
// kernel once per node, and calls it on row ranges, possibly from several threads at once.
// Benchmarks and tests may call the same kernels directly, without onnxruntime.
//
// Data layout: X and Y are row-major [rows, cols]; the statistics of row r are taken over its cols
// values. Scale and Bias are [scale_rows, cols] and [bias_rows, cols]: row r uses row
// (r % scale_rows) of Scale, which covers both the usual case (one row shared by every row of X,
// scale_rows = 1) and weights that span more dimensions than the statistics (Cohere's per-head
// Q/K norm: X [B, S, H, D] normalized over D with Scale [H, D] gives scale_rows = H).
#pragma once

#include <cstdint>

namespace onnxnorm {

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
};

// Normalizes rows [row_begin, row_end) of args. Must be safe to call concurrently on disjoint
// row ranges of the same args. Never throws; never allocates.
using NormRowsFn = void (*)(const NormArgs& args, int64_t row_begin, int64_t row_end);

namespace cpu {

// The RMSNorm row kernel for these element types on this CPU (the best instruction set it has),
// or nullptr when that combination is not implemented. For an absent Scale or Bias pass x_type.
// Statistics are always accumulated in float32 (or wider).
NormRowsFn GetRMSNormRows(ElemType x_type, ElemType scale_type, ElemType bias_type);

}  // namespace cpu
}  // namespace onnxnorm

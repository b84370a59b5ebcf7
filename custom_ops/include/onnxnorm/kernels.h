// The CPU row kernels of libonnxnorm_ops.so: plain C++ over NormArgs (onnxnorm/norm_args.h), no
// ONNX Runtime types. Internal to the library, which exports only its ORT entry point and a few
// facts (custom_ops/onnxnorm_ops.map); the ORT glue (custom_ops/ort/) resolves shapes and
// attributes into a NormArgs, looks up a row kernel once per node, and calls it on row ranges,
// possibly from several threads at once.
#pragma once

#include <cstdint>

#include "onnxnorm/norm_args.h"

namespace onnxnorm {

// Normalizes rows [row_begin, row_end) of args. Must be safe to call concurrently on disjoint
// row ranges of the same args. Never throws; never allocates.
using NormRowsFn = void (*)(const NormArgs& args, int64_t row_begin, int64_t row_end);

namespace cpu {

// The row kernel of one op for these element types on this CPU (the best instruction set it has,
// unless the environment variable ONNXNORM_CPU_ISA = portable | avx2 asks for a lesser one), or
// nullptr when the combination is not implemented. Every weight present in NormArgs must be of
// weight_type, which is x_type or kFloat32 (args.x_type and args.weight_type are not read: the
// kernel is typed). The kernel reads X, Residual and the weights, writes Y and (when not null)
// Sum. Statistics are float32 (per-row scalars in float64); LayerNorm sums D and D^2 with
// D = X - shift, the shift being near the row's mean (the mean of its first vector), and takes a
// second pass around the mean when that shift proves far from it, so rows with a large mean and
// a small spread stay accurate (never E[x^2] - E[x]^2 on raw values). No heap allocation.
NormRowsFn GetNormRows(NormKind norm, ResidualKind residual, ElemType x_type, ElemType weight_type);

// The instruction set GetNormRows chooses on this CPU: "avx512", "avx2" or "portable" (the
// library exports it as onnxnorm_active_isa).
const char* ActiveIsa();

}  // namespace cpu
}  // namespace onnxnorm

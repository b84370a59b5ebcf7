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

// The instruction sets the row kernels are written for, in increasing order. Every one gives the
// same bits for the same inputs.
enum class Isa : int32_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// The row kernel of one op for these element types on this CPU (the best instruction set it has,
// unless the environment variable ONNXNORM_CPU_ISA = portable | avx2 asks for a lesser one), or
// nullptr when the combination is not implemented. Every weight present in NormArgs must be of
// weight_type, which is x_type or kFloat32 (args.x_type and args.weight_type are not read: the
// kernel is typed). The kernel reads X, Residual and the weights, writes Y and (when not null)
// Sum. Statistics are float32 (per-row scalars in float64); LayerNorm sums D and D^2 with
// D = X - shift, the shift being near the row's mean (the mean of its first 8 values), and takes
// a second pass around the mean when that shift proves far from it, so rows with a large mean and
// a small spread stay accurate (never E[x^2] - E[x]^2 on raw values). No heap allocation.
NormRowsFn GetNormRows(NormKind norm, ResidualKind residual, ElemType x_type, ElemType weight_type);

// The instruction set GetNormRows chooses on this CPU: "avx512", "avx2" or "portable" (the
// library exports it as onnxnorm_active_isa).
const char* ActiveIsa();

// The best instruction set this build has kernels for and this CPU (and operating system) can
// run, whatever ONNXNORM_CPU_ISA says.
Isa SupportedIsa();

// "portable", "avx2" or "avx512".
const char* IsaName(Isa isa);

// Calls of fewer elements (rows * cols) than this are small: see GetNormRowsForSmallCalls.
inline constexpr int64_t kSmallCallElements = 64 * 1024;

// The kernel for small calls: GetNormRows's, except that where that is the AVX-512 kernel of a
// float32 or float16 X, the AVX2 one. After a stretch of other code (a framework's work between
// two calls), a core runs its first 512-bit instructions slowly while it powers the upper half of
// its vector units up, which costs a single-token call more than the wider vectors save there;
// bfloat16, converted in integer instructions, saves more (docs/benchmarks.md measures both).
// Gives the same bits as GetNormRows.
NormRowsFn GetNormRowsForSmallCalls(NormKind norm, ResidualKind residual, ElemType x_type, ElemType weight_type);

// Calls that move at least StreamMinBytes() (inputs read and outputs written; kStreamMinBytes
// unless changed) write their outputs with non-temporal stores where the instruction set has
// them, when their rows are at least kStreamMinRowBytes long or each starts on a 64-byte boundary
// (custom_ops/cpu/norm_rows.h).
inline constexpr int64_t kStreamMinBytes = int64_t{48} << 20;
inline constexpr int64_t kStreamMinRowBytes = 2048;
int64_t StreamMinBytes();
// Sets StreamMinBytes() for the whole process: for tests, which stream small tensors with it.
void SetStreamMinBytes(int64_t bytes);

// GetNormRows for one instruction set (for tests and comparisons): nullptr also when isa is above
// SupportedIsa().
NormRowsFn GetNormRowsFor(Isa isa, NormKind norm, ResidualKind residual, ElemType x_type, ElemType weight_type);

}  // namespace cpu
}  // namespace onnxnorm

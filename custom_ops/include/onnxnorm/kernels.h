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
// same bits for the same inputs. kAvx512Bf16 is AVX-512 with its bfloat16 conversion instruction
// (AVX512_BF16), which only the kernels of a bfloat16 X use; the others are kAvx512's.
enum class Isa : int32_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

// The row kernel of one op for these element types on this CPU (the best instruction set it has,
// unless the environment variable ONNXNORM_CPU_ISA = portable | avx2 | avx512 asks for a lesser one), or
// nullptr when the combination is not implemented. Every weight present in NormArgs must be of
// weight_type, which is x_type or kFloat32; Y is of y_type, which is x_type, or kFloat32 for a
// 16-bit x_type with kFloat32 weights and no residual (args.x_type, args.weight_type and
// args.y_type are not read: the kernel is typed). The kernel reads X, Residual and the weights, writes Y and (when not
// null) Sum. NormKind::kL2 (L2Norm) has kernels without a residual, with weight_type and y_type x_type, and takes no
// weights: the sum of the squares stands for the mean square. The kRms kernels without a residual and with Y of X's
// type are also GatedRMSNorm's: they read NormArgs::gate (when not null), activation and norm_before_gate (the
// caller turns the op's groups into rows, norm_args.h). Statistics are float32 (per-row scalars in float64); LayerNorm
// sums D and D^2 with D = X - shift, the shift being near the row's mean (the mean of its first 8 values), and takes a
// second pass around the mean when that shift proves far from it, so rows with a large mean and a small spread stay
// accurate (never E[x^2] - E[x]^2 on raw values). No heap allocation.
NormRowsFn GetNormRows(NormKind norm, ResidualKind residual, ElemType x_type, ElemType weight_type, ElemType y_type);

// The instruction set GetNormRows chooses on this CPU: "avx512_bf16", "avx512", "avx2" or
// "portable" (the library exports it as onnxnorm_active_isa).
const char* ActiveIsa();

// The best instruction set this build has kernels for and this CPU (and operating system) can
// run, whatever ONNXNORM_CPU_ISA says.
Isa SupportedIsa();

// "portable", "avx2", "avx512" or "avx512_bf16".
const char* IsaName(Isa isa);

// Calls of fewer elements (rows * cols) than this are small: see GetNormRowsForSmallCalls.
inline constexpr int64_t kSmallCallElements = 64 * 1024;

// The kernel for small calls: GetNormRows's, except that where that is the AVX-512 kernel of a
// float32 or float16 X, the AVX2 one. After a stretch of other code (a framework's work between
// two calls), a core runs its first 512-bit instructions slowly while it powers the upper half of
// its vector units up, which costs a single-token call more than the wider vectors save there;
// bfloat16, converted in integer instructions, saves more (docs/benchmarks.md measures both).
// Gives the same bits as GetNormRows.
NormRowsFn GetNormRowsForSmallCalls(NormKind norm, ResidualKind residual, ElemType x_type, ElemType weight_type,
                                    ElemType y_type);

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
NormRowsFn GetNormRowsFor(Isa isa, NormKind norm, ResidualKind residual, ElemType x_type, ElemType weight_type,
                          ElemType y_type);

// ---------------------------------------------------------------------------------------------
// The quantized ops (QuantizeKind::kStatic / kDynamic): the norm's Y, rounded to X's type, then
// quantized per tensor as ONNX Runtime's QuantizeLinear quantizes a float32 value: v / scale in
// float32, NaN to the type's minimum, clamped, rounded half to even, plus the zero point; for
// float8 e4m3fn (static only), v / scale converted by onnxnorm/float8.h: saturated to +-448,
// rounded half to even, NaN kept, the zero point unused (custom_ops/cpu/quant_rows.h). Every
// instruction set gives the same bits.
//
// Static: one pass (kStatic) over the rows. Dynamic (uint8): a first pass (kRange) takes each
// row's statistics and the range of its Y, into QuantArgs::row_scratch; the caller combines the
// rows' ranges (DynamicQuantParams) and a second pass (kQuantize) quantizes each row from the
// statistics kept. NormArgs::y is the float Y (Y_float; nullptr: not wanted), written by kStatic
// and kQuantize; NormArgs::sum is Sum, written by kStatic and kRange (kQuantize reads it back).
// Both passes of a call take the same NormArgs.
enum class QuantPass : int32_t { kStatic = 0, kRange = 1, kQuantize = 2 };

// Floats of row_scratch per row: the row's statistics (3), then the min and max of its Y (NaN
// left out; +Inf and -Inf when the row has no other value).
inline constexpr int64_t kQuantScratchFloats = 8;

struct QuantArgs {
  ElemType q_type = ElemType::kUInt8;  // of q: kUInt8, kInt8 or kFloat8E4M3FN (static only)
  void* q = nullptr;                   // [rows, cols]: the quantized Y (kStatic, kQuantize)
  float scale = 1.f;                   // Y_scale in float32
  int32_t zero_point = 0;              // within q_type's range (not used for kFloat8E4M3FN)
  float* row_scratch = nullptr;        // [rows, kQuantScratchFloats] (kRange writes, kQuantize reads)
};

// Processes rows [row_begin, row_end); safe to call concurrently on disjoint row ranges. Never
// throws; never allocates.
using QuantRowsFn = void (*)(const NormArgs& args, const QuantArgs& quant, int64_t row_begin, int64_t row_end);

// The row kernel of a quantized op's pass, as GetNormRows chooses the instruction set; nullptr
// when the combination is not implemented (a Sandwich norm; kRange / kQuantize with q other than
// kUInt8).
QuantRowsFn GetQuantRows(NormKind norm, ResidualKind residual, QuantPass pass, ElemType x_type, ElemType weight_type,
                         ElemType q_type);
QuantRowsFn GetQuantRowsFor(Isa isa, NormKind norm, ResidualKind residual, QuantPass pass, ElemType x_type,
                            ElemType weight_type, ElemType q_type);

// DynamicQuantizeLinear's (uint8) scale and zero point for the range [lo, hi] of a tensor's
// values (NaN left out), as ONNX Runtime computes them: the range widened to hold 0, scale
// (hi - lo) / 255 in float32 or 1 when hi == lo, zero point 0 - lo / scale clamped to [0, 255]
// (255 when NaN) and rounded half to even.
void DynamicQuantParams(float lo, float hi, float* scale, int32_t* zero_point);

// The value of a scalar of a float type (X's) as float32: exact.
float ScalarToFloat(ElemType type, const void* value);

}  // namespace cpu
}  // namespace onnxnorm

// Portable row kernels: plain C++ over fixed-width blocks of 8 floats that the compiler maps onto
// whatever vector unit the target has (SSE2, NEON, ...). Used on CPUs without AVX2 + FMA + F16C,
// and on non-x86 machines. float16 and bfloat16 are converted a block at a time with the
// branch-free integer conversions of cpu_internal.h, which vectorize like the arithmetic. The
// results are bit for bit those of the AVX2 and AVX-512 kernels (norm_rows.h).
#include "isa_portable.h"

#include "norm_table.h"

namespace onnxnorm {
namespace cpu {

NormRowsFn GetNormRowsPortable(NormKind norm, ResidualKind residual, ElemType x, ElemType w, ElemType y) {
  return PickKernel(norm, residual, x, w, y);
}

}  // namespace cpu
}  // namespace onnxnorm

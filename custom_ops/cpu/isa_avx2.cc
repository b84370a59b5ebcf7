// AVX2 + FMA + F16C row kernels (this file alone is compiled with -mavx2 -mfma -mf16c; dispatch.cc
// calls it only on CPUs that have them).
#include "isa_avx2.h"

#if defined(ONNXNORM_X86_KERNELS)
#include "norm_table.h"

namespace onnxnorm {
namespace cpu {

NormRowsFn GetNormRowsAvx2(NormKind norm, ResidualKind residual, ElemType x, ElemType w, ElemType y) {
  return PickKernel(norm, residual, x, w, y);
}

}  // namespace cpu
}  // namespace onnxnorm
#endif  // ONNXNORM_X86_KERNELS

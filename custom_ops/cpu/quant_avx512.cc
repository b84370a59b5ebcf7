// The quantized ops' row kernels (quant_rows.h) on the vectors of isa_avx512.h (this file is compiled
// with the instruction-set flags of isa_avx512.cc; dispatch.cc calls it only on CPUs that have them).
#include "isa_avx512.h"

#if defined(ONNXNORM_X86_KERNELS)
#include "quant_rows.h"

namespace onnxnorm {
namespace cpu {

QuantRowsFn GetQuantRowsAvx512(NormKind norm, ResidualKind residual, QuantPass pass, ElemType x, ElemType w,
                               ElemType q) {
  return PickQuantKernel(norm, residual, pass, x, w, q);
}

}  // namespace cpu
}  // namespace onnxnorm
#endif  // ONNXNORM_X86_KERNELS

// The quantized ops' row kernels (quant_rows.h) on the vectors of isa_portable.h.
#include "isa_portable.h"
#include "quant_rows.h"

namespace onnxnorm {
namespace cpu {

QuantRowsFn GetQuantRowsPortable(NormKind norm, ResidualKind residual, QuantPass pass, ElemType x, ElemType w,
                                 ElemType q) {
  return PickQuantKernel(norm, residual, pass, x, w, q);
}

}  // namespace cpu
}  // namespace onnxnorm

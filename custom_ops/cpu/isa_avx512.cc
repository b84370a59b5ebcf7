// AVX-512 (F, BW, VL) row kernels (this file alone is compiled with -mavx512f -mavx512bw
// -mavx512vl; dispatch.cc calls it only on CPUs and operating systems that have them). Row tails
// use masked loads and stores, so odd widths cost one masked vector.
#include "isa_avx512.h"

#if defined(ONNXNORM_X86_KERNELS)
#include "norm_table.h"

namespace onnxnorm {
namespace cpu {

NormRowsFn GetNormRowsAvx512(NormKind norm, ResidualKind residual, ElemType x, ElemType w, ElemType y) {
  return PickKernel(norm, residual, x, w, y);
}

}  // namespace cpu
}  // namespace onnxnorm
#endif  // ONNXNORM_X86_KERNELS

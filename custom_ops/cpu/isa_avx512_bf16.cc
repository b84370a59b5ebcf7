// The AVX-512 row kernels of a bfloat16 X on CPUs with AVX512_BF16 (this file alone is compiled
// with the flags of isa_avx512.cc and -mavx512bf16 -mavx512dq; dispatch.cc calls it only on CPUs
// and operating systems that have them): the vectors of isa_avx512.h, whose bfloat16 stores then
// round with vcvtneps2bf16. The same bits as the other instruction sets.
#define ONNXNORM_AVX512_BF16 1
#define ONNXNORM_ONLY_BFLOAT16 1
#include "isa_avx512.h"

#if defined(ONNXNORM_X86_KERNELS)
#include "norm_table.h"

namespace onnxnorm {
namespace cpu {

NormRowsFn GetNormRowsAvx512Bf16(NormKind norm, ResidualKind residual, ElemType x, ElemType w, ElemType y) {
  return PickKernel(norm, residual, x, w, y);
}

}  // namespace cpu
}  // namespace onnxnorm
#endif  // ONNXNORM_X86_KERNELS

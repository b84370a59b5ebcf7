// The rotary ops' AVX-512 row kernels of a bfloat16 T on CPUs with AVX512_BF16 (this file alone
// is compiled with the flags of isa_avx512_bf16.cc): the vectors of isa_avx512.h, whose bfloat16
// stores round with vcvtneps2bf16. The same bits as the other instruction sets.
#define ONNXNORM_AVX512_BF16 1
#define ONNXNORM_ONLY_BFLOAT16 1

#include "isa_avx512.h"
#include "rotary_units.h"

#if defined(ONNXNORM_X86_KERNELS)
#include "rotary_rows.h"

namespace onnxnorm {
namespace cpu {

RotaryRowsFn GetRotaryRowsAvx512Bf16(NormKind norm, ElemType x, ElemType w, ElemType a) {
  return PickRotary(norm, x, w, a);
}

}  // namespace cpu
}  // namespace onnxnorm
#endif  // ONNXNORM_X86_KERNELS

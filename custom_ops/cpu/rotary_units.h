// The entry points of the rotary ops' instruction-set units (rotary_<set>.cc), which
// rotary_dispatch.cc chooses from; nullptr when the combination is not implemented.
#pragma once

#include "onnxnorm/rotary_kernels.h"

namespace onnxnorm {
namespace cpu {

RotaryRowsFn GetRotaryRowsPortable(NormKind norm, ElemType x, ElemType w, ElemType a);
#if defined(ONNXNORM_X86_KERNELS)
RotaryRowsFn GetRotaryRowsAvx2(NormKind norm, ElemType x, ElemType w, ElemType a);
RotaryRowsFn GetRotaryRowsAvx512(NormKind norm, ElemType x, ElemType w, ElemType a);
RotaryRowsFn GetRotaryRowsAvx512Bf16(NormKind norm, ElemType x, ElemType w, ElemType a);  // bfloat16 T only
// float16 T only; nullptr where the compiler had no AVX512-FP16
RotaryRowsFn GetRotaryRowsAvx512Fp16(NormKind norm, ElemType x, ElemType w, ElemType a);
#endif

}  // namespace cpu
}  // namespace onnxnorm

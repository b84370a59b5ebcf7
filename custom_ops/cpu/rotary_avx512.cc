// The rotary ops' AVX-512 (F, BW, VL) row kernels (this file alone is compiled with the flags of
// isa_avx512.cc; dispatch calls it only on CPUs and operating systems that have them).
#include "isa_avx512.h"
#include "rotary_units.h"

#if defined(ONNXNORM_X86_KERNELS)
#include "rotary_rows.h"

namespace onnxnorm {
namespace cpu {

RotaryRowsFn GetRotaryRowsAvx512(NormKind norm, ElemType x, ElemType w, ElemType a) {
  return PickRotary(norm, x, w, a);
}

}  // namespace cpu
}  // namespace onnxnorm
#endif  // ONNXNORM_X86_KERNELS

// The rotary ops' AVX2 + FMA + F16C row kernels (this file alone is compiled with -mavx2 -mfma
// -mf16c, as isa_avx2.cc; dispatch calls it only on CPUs that have them).
#include "isa_avx2.h"
#include "rotary_units.h"

#if defined(ONNXNORM_X86_KERNELS)
#include "rotary_rows.h"

namespace onnxnorm {
namespace cpu {

RotaryRowsFn GetRotaryRowsAvx2(NormKind norm, ElemType x, ElemType w, ElemType a) { return PickRotary(norm, x, w, a); }

}  // namespace cpu
}  // namespace onnxnorm
#endif  // ONNXNORM_X86_KERNELS

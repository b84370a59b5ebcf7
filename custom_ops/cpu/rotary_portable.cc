// The rotary ops' row kernels in portable C++ (the vectors of isa_portable.h): used on CPUs
// without AVX2 + FMA + F16C, and on other architectures. The same bits as the other instruction
// sets (rotary_rows.h).
#include "isa_portable.h"
#include "rotary_rows.h"
#include "rotary_units.h"

namespace onnxnorm {
namespace cpu {

RotaryRowsFn GetRotaryRowsPortable(NormKind norm, ElemType x, ElemType w, ElemType a) {
  return PickRotary(norm, x, w, a);
}

}  // namespace cpu
}  // namespace onnxnorm

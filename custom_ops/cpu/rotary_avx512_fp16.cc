// The rotary ops' AVX-512 row kernels of a float16 T on CPUs with AVX512-FP16 (this file alone is
// compiled with -mavx512fp16, where the compiler has it): the vectors of isa_avx512.h, and the
// rotation of half-split heads with rotary_in_t = 1 in half-precision arithmetic
// (rotary_rows.h, ONNXNORM_NATIVE_HALF), which rounds each product and sum to float16 in one
// instruction instead of a conversion there and back. The same bits as the other instruction
// sets; dispatch calls it only where HasAvx512Fp16().
#define ONNXNORM_ONLY_FLOAT16 1

#include "isa_avx512.h"
#include "rotary_units.h"

#if defined(ONNXNORM_X86_KERNELS)
#if defined(__AVX512FP16__)
#define ONNXNORM_NATIVE_HALF 1
#include "rotary_rows.h"

namespace onnxnorm {
namespace cpu {

RotaryRowsFn GetRotaryRowsAvx512Fp16(NormKind norm, ElemType x, ElemType w, ElemType a) {
  return PickRotary(norm, x, w, a);
}

}  // namespace cpu
}  // namespace onnxnorm
#else
namespace onnxnorm {
namespace cpu {

// (a compiler without AVX512-FP16: the AVX-512 kernels serve float16)
RotaryRowsFn GetRotaryRowsAvx512Fp16(NormKind, ElemType, ElemType, ElemType) { return nullptr; }

}  // namespace cpu
}  // namespace onnxnorm
#endif  // __AVX512FP16__
#endif  // ONNXNORM_X86_KERNELS

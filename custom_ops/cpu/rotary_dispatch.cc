// Chooses the rotary ops' row kernels: the instruction set the norm kernels run on
// (dispatch.cc: cpuid, lowered by ONNXNORM_CPU_ISA), and for small calls the one
// GetNormRowsForSmallCalls takes.
#include <cstring>

#include "cpu_internal.h"
#include "onnxnorm/rotary_kernels.h"
#include "rotary_units.h"

namespace onnxnorm {
namespace cpu {
namespace {

// The instruction set of the norm kernels on this CPU (ActiveIsa names it).
Isa Chosen() {
  static const Isa isa = [] {
    const char* active = ActiveIsa();
    for (Isa candidate : {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2}) {
      if (std::strcmp(IsaName(candidate), active) == 0) return candidate;
    }
    return Isa::kPortable;
  }();
  return isa;
}

}  // namespace

RotaryRowsFn GetRotaryRowsFor(Isa isa, NormKind norm, ElemType x_type, ElemType weight_type, ElemType angle_type) {
  if (static_cast<int>(isa) > static_cast<int>(SupportedIsa())) return nullptr;
  switch (isa) {
#if defined(ONNXNORM_X86_KERNELS)
    case Isa::kAvx512Bf16:
      if (x_type == ElemType::kBFloat16) return GetRotaryRowsAvx512Bf16(norm, x_type, weight_type, angle_type);
      // (the float16 kernels in half-precision arithmetic where the CPU has it: the same bits)
      if (x_type == ElemType::kFloat16 && HasAvx512Fp16()) {
        if (RotaryRowsFn fn = GetRotaryRowsAvx512Fp16(norm, x_type, weight_type, angle_type)) return fn;
      }
      return GetRotaryRowsAvx512(norm, x_type, weight_type, angle_type);
    case Isa::kAvx512: return GetRotaryRowsAvx512(norm, x_type, weight_type, angle_type);
    case Isa::kAvx2: return GetRotaryRowsAvx2(norm, x_type, weight_type, angle_type);
#endif
    default: return GetRotaryRowsPortable(norm, x_type, weight_type, angle_type);
  }
}

RotaryRowsFn GetRotaryRows(NormKind norm, ElemType x_type, ElemType weight_type, ElemType angle_type) {
  return GetRotaryRowsFor(Chosen(), norm, x_type, weight_type, angle_type);
}

RotaryRowsFn GetRotaryRowsForSmallCalls(NormKind norm, ElemType x_type, ElemType weight_type, ElemType angle_type) {
  // 16-bit rows stay on AVX-512 as well: they round to T at every step of the rotation, and the
  // 16-lane conversions gain more than the 512-bit warm-up costs (float16, 8 tokens of 40 heads:
  // 29 us against 32 us on AVX2, one thread)
  const bool wide = x_type != ElemType::kFloat32;
  const Isa isa = Chosen() >= Isa::kAvx512 && !wide ? Isa::kAvx2 : Chosen();
  return GetRotaryRowsFor(isa, norm, x_type, weight_type, angle_type);
}

}  // namespace cpu
}  // namespace onnxnorm

// The norm row kernels by norm kind, residual kind and type pair: the entry point of each norm
// instruction-set unit (isa_portable.cc, isa_avx2.cc, isa_avx512.cc, isa_avx512_bf16.cc), which
// includes this header after its isa_<set>.h; a unit that defines ONNXNORM_ONLY_BFLOAT16 holds
// the kernels of a bfloat16 X only. The quantized units include norm_rows.h alone: taking the
// address of every norm kernel here would make them instantiate (and, unoptimized, compile) all
// of them too.
#pragma once

#include "norm_rows.h"

namespace onnxnorm {
namespace cpu {
namespace {

// X of a 16-bit type E with weights of S: Y of X's type, or (the ops without a residual, float32
// weights) float32.
template <NormKind NK, ResidualKind RK, class E, class S>
NormRowsFn PickY(ElemType y) {
  if (y != ElemType::kFloat32) return &Rows<NK, RK, E, S>;
  if constexpr (RK == ResidualKind::kNone && std::is_same<S, F32>::value) return &Rows<NK, RK, E, S, F32>;
  return nullptr;
}

template <NormKind NK, ResidualKind RK>
NormRowsFn PickTypes(ElemType x, ElemType w, ElemType y) {
  if (y != x && y != ElemType::kFloat32) return nullptr;
  switch (x) {
#if !defined(ONNXNORM_ONLY_BFLOAT16)
    case ElemType::kFloat32: return w == ElemType::kFloat32 ? &Rows<NK, RK, F32, F32> : nullptr;
    case ElemType::kFloat16:
      return w == ElemType::kFloat16   ? PickY<NK, RK, F16, F16>(y)
             : w == ElemType::kFloat32 ? PickY<NK, RK, F16, F32>(y)
                                       : nullptr;
#endif
    case ElemType::kBFloat16:
      return w == ElemType::kBFloat16  ? PickY<NK, RK, BF16, BF16>(y)
             : w == ElemType::kFloat32 ? PickY<NK, RK, BF16, F32>(y)
                                       : nullptr;
  }
  return nullptr;
}

template <NormKind NK>
NormRowsFn PickResidual(ResidualKind residual, ElemType x, ElemType w, ElemType y) {
  switch (residual) {
    case ResidualKind::kNone: return PickTypes<NK, ResidualKind::kNone>(x, w, y);
    case ResidualKind::kSkip: return PickTypes<NK, ResidualKind::kSkip>(x, w, y);
    case ResidualKind::kSandwich: return PickTypes<NK, ResidualKind::kSandwich>(x, w, y);
  }
  return nullptr;
}

// L2Norm: no residual, no weights (their type is X's), Y of X's type.
inline NormRowsFn PickL2(ResidualKind residual, ElemType x, ElemType w, ElemType y) {
  if (residual != ResidualKind::kNone || w != x || y != x) return nullptr;
  switch (x) {
#if !defined(ONNXNORM_ONLY_BFLOAT16)
    case ElemType::kFloat32: return &Rows<NormKind::kL2, ResidualKind::kNone, F32, F32>;
    case ElemType::kFloat16: return &Rows<NormKind::kL2, ResidualKind::kNone, F16, F16>;
#endif
    case ElemType::kBFloat16: return &Rows<NormKind::kL2, ResidualKind::kNone, BF16, BF16>;
    default: return nullptr;
  }
}

inline NormRowsFn PickKernel(NormKind norm, ResidualKind residual, ElemType x, ElemType w, ElemType y) {
  switch (norm) {
    case NormKind::kRms: return PickResidual<NormKind::kRms>(residual, x, w, y);
    case NormKind::kLayer: return PickResidual<NormKind::kLayer>(residual, x, w, y);
    case NormKind::kL2: return PickL2(residual, x, w, y);
  }
  return nullptr;
}

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm

// The floor loops of rotary_floor.h, on the vectors of isa_avx512.h with its bfloat16 conversion
// instructions, rounding and storing pairs of vectors by the kernels' RoundBoth and StoreBoth
// (norm_rows.h) (this file is compiled with the flags of custom_ops/cpu/isa_avx512_bf16.cc and
// -ffp-contract=off, as the kernels are).
#define ONNXNORM_AVX512_BF16 1

#include "isa_avx512.h"
#include "norm_rows.h"
#include "rotary_floor.h"

#if defined(ONNXNORM_X86_KERNELS)
// (in the kernels' namespace, where Isa names the vectors' struct and not the enumeration of
// onnxnorm/kernels.h)
namespace onnxnorm {
namespace cpu {
namespace {

using bench::RotaryFloorArgs;

template <class E, bool kContract>
void Heads(const RotaryFloorArgs& f, int64_t begin, int64_t end) {
  using St = typename E::St;
  const St* x = static_cast<const St*>(f.x);
  St* y = static_cast<St*>(f.y);
  const St* cos = static_cast<const St*>(f.cos);
  const St* sin = static_cast<const St*>(f.sin);
  const int64_t half = f.head_size / 2;
  const V inv = Isa::Set1(f.inv_rms);
  for (int64_t h = begin; h < end; ++h) {
    const St* xh = x + h * f.head_size;
    St* yh = y + h * f.head_size;
    const St* c = cos + h / f.heads_per_token * half;
    const St* s = sin + h / f.heads_per_token * half;
    for (int64_t j = 0; j < half; j += Isa::W) {
      V a = Isa::Mul(Isa::Load(E{}, xh + j), inv), b = Isa::Mul(Isa::Load(E{}, xh + j + half), inv);
      if (kContract) RoundBoth<E>(&a, &b);
      a = Isa::Mul(a, Isa::Load(F32{}, f.weight + j));
      b = Isa::Mul(b, Isa::Load(F32{}, f.weight + j + half));
      const V ca = Isa::Load(E{}, c + j), sa = Isa::Load(E{}, s + j);
      if (kContract) {
        RoundBoth<E>(&a, &b);
        V pa = Isa::Mul(a, ca), pb = Isa::Mul(b, sa), qa = Isa::Mul(b, ca), qb = Isa::Mul(a, sa);
        RoundBoth<E>(&pa, &pb);
        RoundBoth<E>(&qa, &qb);
        StoreBoth<E>(yh + j, Isa::Sub(pa, pb), yh + j + half, Isa::Add(qa, qb));
      } else {
        StoreBoth<E>(yh + j, Isa::Sub(Isa::Mul(a, ca), Isa::Mul(b, sa)), yh + j + half,
                     Isa::Add(Isa::Mul(b, ca), Isa::Mul(a, sa)));
      }
    }
  }
}

template <class E>
void HeadsOf(bool contract, const RotaryFloorArgs& a, int64_t begin, int64_t end) {
  if (contract) {
    Heads<E, true>(a, begin, end);
  } else {
    Heads<E, false>(a, begin, end);
  }
}

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm
#endif  // ONNXNORM_X86_KERNELS

namespace onnxnorm {
namespace bench {

void RotaryFloorHeads(ElemType t, bool contract, const RotaryFloorArgs& a, int64_t begin, int64_t end) {
#if defined(ONNXNORM_X86_KERNELS)
  switch (t) {
    case ElemType::kFloat32: return cpu::HeadsOf<cpu::F32>(contract, a, begin, end);
    case ElemType::kFloat16: return cpu::HeadsOf<cpu::F16>(contract, a, begin, end);
    case ElemType::kBFloat16: return cpu::HeadsOf<cpu::BF16>(contract, a, begin, end);
    default: return;
  }
#else
  (void)t, (void)contract, (void)a, (void)begin, (void)end;
#endif
}

bool RotaryFloorCpuHasHalfPrecision() {
#if defined(ONNXNORM_X86_KERNELS)
  return cpu::HasAvx512Fp16();
#else
  return false;
#endif
}

}  // namespace bench
}  // namespace onnxnorm

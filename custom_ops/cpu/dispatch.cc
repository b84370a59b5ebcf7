// Chooses the row kernels' instruction set once per process, from what the CPU and the operating
// system support (cpuid / xgetbv), optionally lowered by the environment variable
// ONNXNORM_CPU_ISA (portable | avx2 | avx512) for testing and comparisons.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "cpu_internal.h"

#if defined(ONNXNORM_X86_KERNELS)
#include <cpuid.h>
#endif

namespace onnxnorm {
namespace cpu {
namespace {

Isa Detected() {
#if defined(ONNXNORM_X86_KERNELS)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return Isa::kPortable;
  const bool fma = (ecx >> 12) & 1u, osxsave = (ecx >> 27) & 1u, avx = (ecx >> 28) & 1u, f16c = (ecx >> 29) & 1u;
  if (!(fma && osxsave && avx && f16c)) return Isa::kPortable;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x6u) != 0x6u) return Isa::kPortable;  // the OS saves XMM and YMM state
  if (__get_cpuid_max(0, nullptr) < 7) return Isa::kPortable;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const unsigned leaf7_subleaves = eax;  // the highest subleaf of leaf 7
  const bool avx2 = (ebx >> 5) & 1u;
  if (!avx2) return Isa::kPortable;
  const bool avx512 = ((ebx >> 16) & 1u) && ((ebx >> 30) & 1u) && ((ebx >> 31) & 1u);  // F, BW, VL
  const bool dq = (ebx >> 17) & 1u;
  const bool os_zmm = (xcr0_lo & 0xe0u) == 0xe0u;  // opmask, ZMM_Hi256, Hi16_ZMM state
  if (!(avx512 && os_zmm)) return Isa::kAvx2;
  if (leaf7_subleaves < 1) return Isa::kAvx512;
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  const bool bf16 = (eax >> 5) & 1u;  // AVX512_BF16
  return bf16 && dq ? Isa::kAvx512Bf16 : Isa::kAvx512;
#else
  return Isa::kPortable;
#endif
}

Isa Chosen() {
  static const Isa isa = [] {
    Isa best = SupportedIsa();
    const char* wanted = std::getenv("ONNXNORM_CPU_ISA");
    if (wanted != nullptr) {
      Isa asked = best;
      if (std::strcmp(wanted, "portable") == 0) asked = Isa::kPortable;
      if (std::strcmp(wanted, "avx2") == 0) asked = Isa::kAvx2;
      if (std::strcmp(wanted, "avx512") == 0) asked = Isa::kAvx512;
      if (static_cast<int>(asked) < static_cast<int>(best)) best = asked;
    }
    return best;
  }();
  return isa;
}

std::atomic<int64_t> g_stream_min_bytes{kStreamMinBytes};

}  // namespace

int64_t StreamMinBytes() { return g_stream_min_bytes.load(std::memory_order_relaxed); }

void SetStreamMinBytes(int64_t bytes) { g_stream_min_bytes.store(bytes, std::memory_order_relaxed); }

#if defined(ONNXNORM_X86_KERNELS)
bool HasAvx512Fp16() {
  static const bool has = [] {
    if (static_cast<int>(SupportedIsa()) < static_cast<int>(Isa::kAvx512)) return false;  // (ZMM state saved)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    return ((edx >> 23) & 1u) != 0;  // AVX512_FP16
  }();
  return has;
}
#endif

Isa SupportedIsa() {
  static const Isa isa = Detected();
  return isa;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Bf16: return "avx512_bf16";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kPortable: break;
  }
  return "portable";
}

NormRowsFn GetNormRowsFor(Isa isa, NormKind norm, ResidualKind residual, ElemType x_type, ElemType weight_type,
                          ElemType y_type) {
  if (weight_type != x_type && weight_type != ElemType::kFloat32) return nullptr;
  if (static_cast<int>(isa) > static_cast<int>(SupportedIsa())) return nullptr;
  switch (isa) {
#if defined(ONNXNORM_X86_KERNELS)
    case Isa::kAvx512Bf16:
      if (x_type == ElemType::kBFloat16) return GetNormRowsAvx512Bf16(norm, residual, x_type, weight_type, y_type);
      return GetNormRowsAvx512(norm, residual, x_type, weight_type, y_type);
    case Isa::kAvx512: return GetNormRowsAvx512(norm, residual, x_type, weight_type, y_type);
    case Isa::kAvx2: return GetNormRowsAvx2(norm, residual, x_type, weight_type, y_type);
#endif
    default: return GetNormRowsPortable(norm, residual, x_type, weight_type, y_type);
  }
}

NormRowsFn GetNormRows(NormKind norm, ResidualKind residual, ElemType x_type, ElemType weight_type, ElemType y_type) {
  return GetNormRowsFor(Chosen(), norm, residual, x_type, weight_type, y_type);
}

NormRowsFn GetNormRowsForSmallCalls(NormKind norm, ResidualKind residual, ElemType x_type, ElemType weight_type,
                                    ElemType y_type) {
  // bfloat16 stays on AVX-512: without a conversion instruction in AVX2, its 8-lane kernels take
  // 0.4-1.7 us longer per 4096-wide row than the 16-lane ones, more than the 512-bit warm-up costs
  const bool wide = x_type == ElemType::kBFloat16;
  const Isa isa = Chosen() >= Isa::kAvx512 && !wide ? Isa::kAvx2 : Chosen();
  return GetNormRowsFor(isa, norm, residual, x_type, weight_type, y_type);
}

const char* ActiveIsa() { return IsaName(Chosen()); }

QuantRowsFn GetQuantRowsFor(Isa isa, NormKind norm, ResidualKind residual, QuantPass pass, ElemType x_type,
                            ElemType weight_type, ElemType q_type) {
  if (weight_type != x_type && weight_type != ElemType::kFloat32) return nullptr;
  if (static_cast<int>(isa) > static_cast<int>(SupportedIsa())) return nullptr;
  switch (isa) {
#if defined(ONNXNORM_X86_KERNELS)
    case Isa::kAvx512Bf16:  // (the quantized ops' kernels have no use for the bfloat16 instruction)
    case Isa::kAvx512: return GetQuantRowsAvx512(norm, residual, pass, x_type, weight_type, q_type);
    case Isa::kAvx2: return GetQuantRowsAvx2(norm, residual, pass, x_type, weight_type, q_type);
#endif
    default: return GetQuantRowsPortable(norm, residual, pass, x_type, weight_type, q_type);
  }
}

QuantRowsFn GetQuantRows(NormKind norm, ResidualKind residual, QuantPass pass, ElemType x_type, ElemType weight_type,
                         ElemType q_type) {
  return GetQuantRowsFor(Chosen(), norm, residual, pass, x_type, weight_type, q_type);
}

void DynamicQuantParams(float lo, float hi, float* scale, int32_t* zero_point) {
  // (std::min / std::max as ONNX Runtime writes them: a NaN operand in second place gives the first)
  lo = std::min(lo, 0.0f);
  hi = std::max(hi, 0.0f);
  const float s = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  const float initial = 0.0f - lo / s;
  const float clamped = std::max(0.0f, std::min(255.0f, initial));  // NaN: 255
  *scale = s;
  *zero_point = static_cast<int32_t>(std::nearbyint(clamped));
}

float ScalarToFloat(ElemType type, const void* value) {
  uint16_t bits = 0;
  switch (type) {
    case ElemType::kFloat32: {
      float f;
      std::memcpy(&f, value, sizeof(f));
      return f;
    }
    case ElemType::kFloat16: std::memcpy(&bits, value, sizeof(bits)); return HalfToFloat(bits);
    case ElemType::kBFloat16: std::memcpy(&bits, value, sizeof(bits)); return BFloat16ToFloat(bits);
    default: return NAN;
  }
}

}  // namespace cpu
}  // namespace onnxnorm

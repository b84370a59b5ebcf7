// Portable row kernels: plain C++ over fixed-width blocks of 8 floats that the compiler can map
// onto whatever vector unit the target has (SSE2, NEON, ...). Used on CPUs without AVX2 + FMA +
// F16C, and on non-x86 machines.
#include "cpu_internal.h"

namespace onnxnorm {
namespace cpu {
namespace {

struct Isa {
  static constexpr int W = 8;
  struct V {
    float v[W];
  };
  static V Zero() { return Set1(0.f); }
  static V Set1(float f) {
    V r;
    for (int k = 0; k < W; ++k) r.v[k] = f;
    return r;
  }
  static V Add(V a, V b) {
    for (int k = 0; k < W; ++k) a.v[k] += b.v[k];
    return a;
  }
  static V Sub(V a, V b) {
    for (int k = 0; k < W; ++k) a.v[k] -= b.v[k];
    return a;
  }
  static V Mul(V a, V b) {
    for (int k = 0; k < W; ++k) a.v[k] *= b.v[k];
    return a;
  }
  static V Fma(V a, V b, V c) {
    for (int k = 0; k < W; ++k) c.v[k] += a.v[k] * b.v[k];
    return c;
  }
  static float HSum(V a) {
    return ((a.v[0] + a.v[4]) + (a.v[1] + a.v[5])) + ((a.v[2] + a.v[6]) + (a.v[3] + a.v[7]));
  }
  static V MaskN(V a, int n) {
    for (int k = n; k < W; ++k) a.v[k] = 0.f;
    return a;
  }
  template <class E>
  static V Load(E e, const typename E::St* p) {
    V r;
    for (int k = 0; k < W; ++k) r.v[k] = ToFloat(e, p[k]);
    return r;
  }
  template <class E>
  static V LoadN(E e, const typename E::St* p, int n) {
    V r = Zero();
    for (int k = 0; k < n; ++k) r.v[k] = ToFloat(e, p[k]);
    return r;
  }
  template <class E>
  static void Store(E e, typename E::St* p, V a) {
    for (int k = 0; k < W; ++k) p[k] = FromFloat(e, a.v[k]);
  }
  template <class E>
  static void StoreN(E e, typename E::St* p, V a, int n) {
    for (int k = 0; k < n; ++k) p[k] = FromFloat(e, a.v[k]);
  }
  static constexpr bool kHasStream = false;
  template <class E>
  static void Stream(E e, typename E::St* p, V a) {
    Store(e, p, a);
  }
  static void Fence() {}
  static V Round(F32, V a) { return a; }
  template <class E>
  static V Round(E, V a) {
    for (int k = 0; k < W; ++k) a.v[k] = RoundScalar<E>(a.v[k]);
    return a;
  }
};

}  // namespace
}  // namespace cpu
}  // namespace onnxnorm

#include "norm_rows.h"

namespace onnxnorm {
namespace cpu {

NormRowsFn GetNormRowsPortable(NormKind norm, ResidualKind residual, ElemType x, ElemType w) {
  return PickKernel(norm, residual, x, w);
}

}  // namespace cpu
}  // namespace onnxnorm

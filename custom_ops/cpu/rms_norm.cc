// RMSNorm CPU kernels: Y = X / sqrt(mean(X^2) + epsilon) * (Scale + scale_offset) + Bias, per row.
//
// Portable C++ for now; the loops are written so that the compiler can vectorize them (several
// independent partial sums, no branches inside a row). Explicit SIMD variants (AVX2, AVX-512,
// NEON) will be chosen at run time in GetRMSNormRows.
#include <cmath>
#include <cstdint>

#include "onnxnorm/kernels.h"

namespace onnxnorm {
namespace cpu {
namespace {

// Sum of x[i]^2 in float32 over eight interleaved partial sums: short dependency chains that fit
// one or two vector registers, and a rounding error that grows with n/8 rather than n.
inline float SumOfSquares(const float* x, int64_t n) {
  constexpr int kLanes = 8;
  float acc[kLanes] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * x[i + j];
  }
  float tail = 0.f;
  for (; i < n; ++i) tail += x[i] * x[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

template <bool kHasScale, bool kHasBias>
void RMSNormRowsF32Impl(const NormArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t n = a.cols;
  const float* x = static_cast<const float*>(a.x);
  const float* scale = static_cast<const float*>(a.scale);
  const float* bias = static_cast<const float*>(a.bias);
  float* y = static_cast<float*>(a.y);
  const double inv_n = 1.0 / static_cast<double>(n);
  const double eps = static_cast<double>(a.epsilon);
  const float offset = a.scale_offset;
  // An absent Scale is 1, so the factor is 1 + scale_offset for every element.
  const float constant_factor = 1.f + offset;

  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    // The per-row scalar work is done in double: it costs nothing next to the row, and the mean
    // square then carries only the rounding of the float32 sum.
    const double mean_square = static_cast<double>(SumOfSquares(xr, n)) * inv_n;
    const float inv_rms = static_cast<float>(1.0 / std::sqrt(mean_square + eps));

    const float* sr = nullptr;
    const float* br = nullptr;
    if (kHasScale) sr = scale + (a.scale_rows > 1 ? (r % a.scale_rows) * n : 0);
    if (kHasBias) br = bias + (a.bias_rows > 1 ? (r % a.bias_rows) * n : 0);

    for (int64_t i = 0; i < n; ++i) {
      float v = xr[i] * inv_rms;
      if (kHasScale) {
        v *= sr[i] + offset;
      } else {
        v *= constant_factor;
      }
      if (kHasBias) v += br[i];
      yr[i] = v;
    }
  }
}

void RMSNormRowsF32(const NormArgs& a, int64_t row_begin, int64_t row_end) {
  if (row_begin >= row_end || a.cols <= 0) return;
  if (a.scale != nullptr) {
    if (a.bias != nullptr) {
      RMSNormRowsF32Impl<true, true>(a, row_begin, row_end);
    } else {
      RMSNormRowsF32Impl<true, false>(a, row_begin, row_end);
    }
  } else {
    if (a.bias != nullptr) {
      RMSNormRowsF32Impl<false, true>(a, row_begin, row_end);
    } else {
      RMSNormRowsF32Impl<false, false>(a, row_begin, row_end);
    }
  }
}

}  // namespace

NormRowsFn GetRMSNormRows(ElemType x_type, ElemType scale_type, ElemType bias_type) {
  if (x_type == ElemType::kFloat32 && scale_type == ElemType::kFloat32 &&
      bias_type == ElemType::kFloat32) {
    return &RMSNormRowsF32;
  }
  return nullptr;
}

}  // namespace cpu
}  // namespace onnxnorm

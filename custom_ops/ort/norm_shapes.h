// Shape rules shared by the normalization ops: the normalized axis, the [rows, cols] view of X,
// and how Scale / Bias (and later XBias) broadcast onto X.
#pragma once

#include <cstdint>

#include "onnxruntime_c_api.h"
#include "ort_util.h"

namespace onnxnorm {
namespace ort {

// X viewed as [rows, cols]: rows = prod(X.shape[:axis]), cols = prod(X.shape[axis:]).
struct NormGeometry {
  int64_t axis = 0;  // in [0, rank)
  int64_t rows = 0;
  int64_t cols = 0;
};

// Checks X's rank and the axis attribute, and computes the [rows, cols] view. A zero-length
// normalized part (cols == 0) with rows > 0 is an error; rows == 0 is an empty X, which is fine.
OrtStatus* ResolveNormGeometry(const OrtApi& api, const char* op, const Dims& x_dims, int64_t axis, NormGeometry* out);

// Checks that a weight input (Scale, Bias) fits X: after dropping leading 1s (down to the
// normalized rank), its shape must equal the trailing k >= rank - axis dimensions of X. It may
// thus span more dimensions than the statistics (per-head weights). Sets *weight_rows to the
// number of distinct [cols] rows it holds: row r of X uses weight row r % *weight_rows.
OrtStatus* ResolveWeightRows(const OrtApi& api, const char* op, const char* name, const Dims& weight_dims,
                             const Dims& x_dims, const NormGeometry& geometry, int64_t* weight_rows);

}  // namespace ort
}  // namespace onnxnorm

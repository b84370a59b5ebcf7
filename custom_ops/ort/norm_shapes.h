// Shape rules shared by the normalization ops: the normalized axis, the [rows, cols] view of X,
// how Scale / Bias (and XBias, InnerScale, InnerBias) broadcast onto X, and GatedRMSNorm's groups
// and Gate. One code for both execution providers: the kernel (norm_op.cc) resolves a call with
// these into the NormArgs that the CPU row kernels and the CUDA launcher take alike.
#pragma once

#include <cstdint>

#include "onnxruntime_c_api.h"
#include "ort_util.h"

namespace onnxnorm {
namespace ort {

// X viewed as [rows, cols]: rows = prod(X.shape[:axis]), cols = prod(X.shape[axis:]); after
// ResolveGroups, rows of one group each.
struct NormGeometry {
  int64_t axis = 0;  // in [0, rank)
  int64_t rows = 0;
  int64_t cols = 0;
  // GatedRMSNorm: the groups each row of X was split into (ResolveGroups); 1 for the other ops.
  int64_t groups = 1;
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

// GatedRMSNorm's attribute group_size (0: the whole normalized extent is one group) against X of
// shape x_dims, after ResolveNormGeometry: it must divide the extent (geometry->cols). Turns the
// groups into rows, as the kernels take them (onnxnorm/norm_args.h): each row of X becomes
// extent / group_size rows of group_size values (geometry->groups of them).
OrtStatus* ResolveGroups(const OrtApi& api, const char* op, const Dims& x_dims, int64_t group_size,
                         NormGeometry* geometry);

// GatedRMSNorm's Scale, after ResolveGroups: with group_size > 0, of shape [group_size] (leading
// 1s ignored: one group's weight, shared by every group; *weight_rows = 1) or a suffix of X's
// shape covering exactly the normalized dimensions (*weight_rows = geometry.groups: grouped row
// r uses weight row r % groups, the weights of its group); with group_size 0, as
// ResolveWeightRows (per-head weights too).
OrtStatus* ResolveGroupedWeightRows(const OrtApi& api, const char* op, const char* name, const Dims& weight_dims,
                                    const Dims& x_dims, const NormGeometry& geometry, int64_t group_size,
                                    int64_t* weight_rows);

// GatedRMSNorm's Gate: X's shape (its type is checked with the other inputs').
OrtStatus* CheckSameShape(const OrtApi& api, const char* op, const char* name, const Dims& dims, const Dims& x_dims);

}  // namespace ort
}  // namespace onnxnorm

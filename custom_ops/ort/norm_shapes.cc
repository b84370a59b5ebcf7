#include "norm_shapes.h"

#include <string>

namespace onnxnorm {
namespace ort {

OrtStatus* ResolveNormGeometry(const OrtApi& api, const char* op, const Dims& x_dims, int64_t axis, NormGeometry* out) {
  const int64_t rank = static_cast<int64_t>(x_dims.rank());
  if (rank == 0) {
    return MakeError(api, ORT_INVALID_ARGUMENT, op, "X must have rank >= 1, got a scalar (shape [])");
  }
  if (axis < -rank || axis >= rank) {
    return MakeError(api, ORT_INVALID_ARGUMENT, op,
                     "axis " + std::to_string(axis) + " is out of range [" + std::to_string(-rank) + ", " +
                         std::to_string(rank) + ") for X of shape " + FormatShape(x_dims));
  }
  if (axis < 0) axis += rank;

  int64_t rows = 1;
  int64_t cols = 1;
  bool ok = true;
  const size_t first_normalized = static_cast<size_t>(axis);
  for (size_t i = 0; i < x_dims.rank(); ++i) {
    int64_t& product = i < first_normalized ? rows : cols;
    ok = ok && CheckedMul(product, x_dims[i], &product);
  }
  if (!ok) {
    // Only possible for an empty X whose other dimensions are absurdly large.
    return MakeError(api, ORT_INVALID_ARGUMENT, op, "X of shape " + FormatShape(x_dims) + " is too large");
  }
  if (cols == 0 && rows > 0) {
    return MakeError(api, ORT_INVALID_ARGUMENT, op,
                     "the normalized dimensions X.shape[" + std::to_string(axis) + ":] of X of shape " +
                         FormatShape(x_dims) + " hold no elements: statistics over an empty set are undefined");
  }
  out->axis = axis;
  out->rows = rows;
  out->cols = cols;
  return nullptr;
}

OrtStatus* ResolveWeightRows(const OrtApi& api, const char* op, const char* name, const Dims& weight_dims,
                             const Dims& x_dims, const NormGeometry& geometry, int64_t* weight_rows) {
  const size_t rank = x_dims.rank();
  const size_t norm_rank = rank - static_cast<size_t>(geometry.axis);
  const size_t weight_rank = weight_dims.rank();

  // Drop leading 1s, but never below the normalized rank.
  size_t first = 0;
  while (weight_rank - first > norm_rank && weight_dims[first] == 1) ++first;
  const size_t k = weight_rank - first;

  bool fits = k >= norm_rank && k <= rank;
  for (size_t i = 0; fits && i < k; ++i) fits = weight_dims[first + i] == x_dims[rank - k + i];
  if (!fits) {
    return MakeError(api, ORT_INVALID_ARGUMENT, op,
                     std::string(name) + " of shape " + FormatShape(weight_dims) + " does not fit X of shape " +
                         FormatShape(x_dims) + " normalized from axis " + std::to_string(geometry.axis) +
                         ": it must equal a suffix of X's shape that covers X.shape[" + std::to_string(geometry.axis) +
                         ":] (leading 1s are ignored)");
  }

  // The dimensions it spans beyond the normalized ones index its rows.
  // (When X is empty this product may be 0 or overflow; no row is computed then.)
  int64_t rows = 1;
  bool ok = true;
  for (size_t i = rank - k; i < static_cast<size_t>(geometry.axis); ++i) ok = ok && CheckedMul(rows, x_dims[i], &rows);
  *weight_rows = (ok && rows > 0) ? rows : 1;
  return nullptr;
}

OrtStatus* ResolveGroups(const OrtApi& api, const char* op, const Dims& x_dims, int64_t group_size,
                         NormGeometry* geometry) {
  const int64_t extent = geometry->cols;
  geometry->groups = 1;
  if (group_size == 0 || extent == 0) return nullptr;  // one group (or an empty X)
  if (group_size < 0 || extent % group_size != 0) {
    return MakeError(api, ORT_INVALID_ARGUMENT, op,
                     "group_size " + std::to_string(group_size) + " does not divide the normalized extent " +
                         std::to_string(extent) + " of X of shape " + FormatShape(x_dims) + " from axis " +
                         std::to_string(geometry->axis));
  }
  geometry->groups = extent / group_size;
  geometry->rows *= geometry->groups;  // (rows * extent elements exist: no overflow)
  geometry->cols = group_size;
  return nullptr;
}

OrtStatus* ResolveGroupedWeightRows(const OrtApi& api, const char* op, const char* name, const Dims& weight_dims,
                                    const Dims& x_dims, const NormGeometry& geometry, int64_t group_size,
                                    int64_t* weight_rows) {
  if (group_size <= 0) return ResolveWeightRows(api, op, name, weight_dims, x_dims, geometry, weight_rows);
  // [group_size], leading 1s ignored: one group's weight
  size_t first = 0;
  while (first + 1 < weight_dims.rank() && weight_dims[first] == 1) ++first;
  if (weight_dims.rank() - first == 1 && weight_dims[first] == group_size) {
    *weight_rows = 1;
    return nullptr;
  }
  // else a suffix of X's shape covering exactly the normalized dimensions
  int64_t rows = 1;
  if (OrtStatus* s = ResolveWeightRows(api, op, name, weight_dims, x_dims, geometry, &rows)) return s;
  bool exact = true;
  const size_t norm_rank = x_dims.rank() - static_cast<size_t>(geometry.axis);
  for (size_t i = 0; i + norm_rank < weight_dims.rank(); ++i) exact = exact && weight_dims[i] == 1;
  if (!exact) {
    Dims normalized;
    normalized.Borrow(x_dims.data() + geometry.axis, norm_rank);
    return MakeError(api, ORT_INVALID_ARGUMENT, op,
                     "with group_size " + std::to_string(group_size) + ", " + name + " must be of shape [" +
                         std::to_string(group_size) + "] or cover exactly the normalized dimensions " +
                         FormatShape(normalized) + " of X of shape " + FormatShape(x_dims) + ", got " +
                         FormatShape(weight_dims));
  }
  *weight_rows = geometry.groups;
  return nullptr;
}

OrtStatus* CheckSameShape(const OrtApi& api, const char* op, const char* name, const Dims& dims, const Dims& x_dims) {
  bool same = dims.rank() == x_dims.rank();
  for (size_t d = 0; same && d < x_dims.rank(); ++d) same = dims[d] == x_dims[d];
  if (same) return nullptr;
  return MakeError(
      api, ORT_INVALID_ARGUMENT, op,
      std::string(name) + " of shape " + FormatShape(dims) + " must have the shape of X, " + FormatShape(x_dims));
}

}  // namespace ort
}  // namespace onnxnorm

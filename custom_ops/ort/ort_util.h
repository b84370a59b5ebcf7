// Small helpers over ORT's C API for the op glue: error statuses, tensor shapes, attributes.
// Nothing here throws; failures come back as OrtStatus* (nullptr = success).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "onnxnorm/ops_generated.h"
#include "onnxruntime_c_api.h"
#include "op_table.h"

namespace onnxnorm {
namespace ort {

// "onnxnorm::<op>: <message>" as an OrtStatus.
OrtStatus* MakeError(const OrtApi& api, OrtErrorCode code, const char* op, const std::string& message);

// Releases an OrtStatus on scope exit unless taken.
class StatusHolder {
 public:
  StatusHolder(const OrtApi& api, OrtStatus* status) : api_(api), status_(status) {}
  ~StatusHolder() {
    if (status_ != nullptr) api_.ReleaseStatus(status_);
  }
  StatusHolder(const StatusHolder&) = delete;
  StatusHolder& operator=(const StatusHolder&) = delete;
  bool ok() const { return status_ == nullptr; }
  OrtStatus* release() {
    OrtStatus* s = status_;
    status_ = nullptr;
    return s;
  }

 private:
  const OrtApi& api_;
  OrtStatus* status_;
};

// Tensor dimensions: ORT's own shape array of a tensor, lent for the duration of a call, or a
// copy without a heap allocation up to kInline dimensions.
class Dims {
 public:
  static constexpr size_t kInline = 8;
  Dims() = default;
  Dims(const Dims&) = delete;
  Dims& operator=(const Dims&) = delete;
  // Sets the rank of an owned copy; the values are then written through mutable_data(). False if
  // out of memory.
  bool Resize(size_t rank);
  // Refers to dims[0, rank), owned by someone else, instead.
  void Borrow(const int64_t* dims, size_t rank) {
    borrowed_ = dims;
    rank_ = rank;
  }
  size_t rank() const { return rank_; }
  int64_t* mutable_data() { return heap_ ? heap_.get() : inline_; }
  const int64_t* data() const { return borrowed_ != nullptr ? borrowed_ : heap_ ? heap_.get() : inline_; }
  int64_t operator[](size_t i) const { return data()[i]; }

 private:
  int64_t inline_[kInline] = {};
  std::unique_ptr<int64_t[]> heap_;
  const int64_t* borrowed_ = nullptr;
  size_t rank_ = 0;
};

// "[2,3,8]"
std::string FormatShape(const int64_t* dims, size_t rank);
inline std::string FormatShape(const Dims& dims) { return FormatShape(dims.data(), dims.rank()); }

// A tensor input of the kernel context (read-only view).
struct InputTensor {
  bool present = false;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  Dims dims;
  const void* data = nullptr;
};

// Reads input `index` of the `count` inputs the context has (KernelContext_GetInputCount); an
// omitted optional input (or one past the node's inputs) gives present == false. Its dims are
// ORT's own where the runtime lends them (see EnableShapeReferences), valid during the call.
OrtStatus* GetInput(const OrtApi& api, OrtKernelContext* context, size_t index, size_t count, InputTensor* out);

// Called once at registration. ONNX Runtime 1.24 added OrtApi::GetTensorElementTypeAndShapeDataReference,
// which reads a tensor's element type and shape without allocating; GetTensorTypeAndShape, the
// only way before it, allocates and frees an info object for every input of every call. Where the
// runtime has it (and it answers a test tensor as GetTensorTypeAndShape does), GetInput uses it.
void EnableShapeReferences(const OrtApiBase& base, const OrtApi& api);

// Reads an attribute of the node, or its default when the node does not set it. A value of the
// wrong kind (a float for an int attribute, ...) or one that fails spec.check is an error
// ("attribute <name> must be <requirement>, got <value>", as the catalogue words it).
OrtStatus* GetAttribute(const OrtApi& api, const OrtKernelInfo* info, const char* op, const AttrSpec& spec,
                        int64_t* out);
OrtStatus* GetAttribute(const OrtApi& api, const OrtKernelInfo* info, const char* op, const AttrSpec& spec, float* out);

// a * b for non-negative values; false on overflow.
inline bool CheckedMul(int64_t a, int64_t b, int64_t* out) {
  if (a < 0 || b < 0 || (a != 0 && b > INT64_MAX / a)) return false;
  *out = a * b;
  return true;
}

}  // namespace ort
}  // namespace onnxnorm

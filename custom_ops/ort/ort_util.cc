#include "ort_util.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <type_traits>

namespace onnxnorm {
namespace ort {

OrtStatus* MakeError(const OrtApi& api, OrtErrorCode code, const char* op, const std::string& message) {
  std::string text = "onnxnorm::";
  text += op;
  text += ": ";
  text += message;
  return api.CreateStatus(code, text.c_str());
}

bool Dims::Resize(size_t rank) {
  if (rank > kInline) {
    heap_.reset(new (std::nothrow) int64_t[rank]);
    if (!heap_) return false;
  } else {
    heap_.reset();
  }
  rank_ = rank;
  return true;
}

std::string FormatShape(const int64_t* dims, size_t rank) {
  std::string out = "[";
  for (size_t i = 0; i < rank; ++i) {
    if (i) out += ',';
    out += std::to_string(dims[i]);
  }
  out += ']';
  return out;
}

namespace {

using ShapeReferenceFn = OrtStatus*(ORT_API_CALL*)(const OrtValue* value, ONNXTensorElementDataType* type,
                                                   const int64_t** dims, size_t* rank);
std::atomic<ShapeReferenceFn> g_shape_reference{nullptr};

// OrtApi::GetTensorElementTypeAndShapeDataReference of ONNX Runtime 1.24 and newer, or nullptr.
ShapeReferenceFn LookUpShapeReference(const OrtApiBase& base, const OrtApi& api) {
#if ORT_API_VERSION >= 24
  (void)base;
  return api.GetTensorElementTypeAndShapeDataReference;
#else
  // Built against older headers: the function is taken from the runtime's table by its place.
  // OrtApi only ever grows at its end, so the entry of a function never moves; this one is entry
  // 414 (byte offset 3312 on 64-bit platforms), the last that ONNX Runtime 1.24 added.
  (void)api;
  constexpr size_t kEntry = 414;
  const OrtApi* api24 = base.GetApi(24);
  if (api24 == nullptr) return nullptr;
  static_assert(sizeof(ShapeReferenceFn) == sizeof(void*), "function pointers the size of data pointers");
  ShapeReferenceFn fn = nullptr;
  std::memcpy(&fn, reinterpret_cast<const unsigned char*>(api24) + kEntry * sizeof(void*), sizeof(fn));
  return fn;
#endif
}

// Type and shape the allocating way.
OrtStatus* TypeAndShape(const OrtApi& api, const OrtValue* value, ONNXTensorElementDataType* type, Dims* dims) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* s = api.GetTensorTypeAndShape(value, &info)) return s;
  OrtStatus* status = api.GetTensorElementType(info, type);
  size_t rank = 0;
  if (status == nullptr) status = api.GetDimensionsCount(info, &rank);
  if (status == nullptr && !dims->Resize(rank)) status = api.CreateStatus(ORT_FAIL, "onnxnorm: out of memory");
  if (status == nullptr) status = api.GetDimensions(info, dims->mutable_data(), rank);
  api.ReleaseTensorTypeAndShapeInfo(info);
  return status;
}

}  // namespace

void EnableShapeReferences(const OrtApiBase& base, const OrtApi& api) {
  ShapeReferenceFn fn = LookUpShapeReference(base, api);
  if (fn == nullptr) return;
  // Asks it about a small tensor, and uses it only if it answers as GetTensorTypeAndShape does.
  OrtMemoryInfo* memory = nullptr;
  if (OrtStatus* s = api.CreateCpuMemoryInfo(OrtDeviceAllocator, OrtMemTypeDefault, &memory)) {
    api.ReleaseStatus(s);
    return;
  }
  float values[6] = {};
  const int64_t shape[3] = {1, 2, 3};
  OrtValue* value = nullptr;
  OrtStatus* status = api.CreateTensorWithDataAsOrtValue(memory, values, sizeof(values), shape, 3,
                                                         ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value);
  bool same = false;
  if (status == nullptr) {
    ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, slow_type = type;
    const int64_t* dims = nullptr;
    size_t rank = 0;
    Dims slow;
    status = fn(value, &type, &dims, &rank);
    if (status == nullptr) status = TypeAndShape(api, value, &slow_type, &slow);
    same = status == nullptr && type == slow_type && type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && dims != nullptr &&
           rank == slow.rank() && rank == 3 && std::memcmp(dims, slow.data(), sizeof(shape)) == 0 &&
           std::memcmp(dims, shape, sizeof(shape)) == 0;
  }
  if (status != nullptr) api.ReleaseStatus(status);
  if (value != nullptr) api.ReleaseValue(value);
  api.ReleaseMemoryInfo(memory);
  if (same) g_shape_reference.store(fn);
}

OrtStatus* GetInput(const OrtApi& api, OrtKernelContext* context, size_t index, size_t count, InputTensor* out) {
  out->present = false;
  if (index >= count) return nullptr;
  const OrtValue* value = nullptr;
  if (OrtStatus* s = api.KernelContext_GetInput(context, index, &value)) return s;
  if (value == nullptr) return nullptr;

  if (ShapeReferenceFn fn = g_shape_reference.load(std::memory_order_relaxed)) {
    const int64_t* dims = nullptr;
    size_t rank = 0;
    if (OrtStatus* s = fn(value, &out->type, &dims, &rank)) return s;
    out->dims.Borrow(dims, rank);
  } else {
    if (OrtStatus* s = TypeAndShape(api, value, &out->type, &out->dims)) return s;
  }

  // The C API hands out input data through a non-const OrtValue; it is only read here.
  void* data = nullptr;
  if (OrtStatus* s = api.GetTensorMutableData(const_cast<OrtValue*>(value), &data)) return s;
  out->data = data;
  out->present = true;
  return nullptr;
}

namespace {

// A float attribute value for messages: "1e-05", "-1", "nan", "inf".
std::string FormatFloat(float value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", static_cast<double>(value));
  return text;
}

// True when the node sets attribute `name` with a value of another kind than `kind` (a float for
// an int, a string, a list), so that a wrong type is reported rather than replaced by the default.
bool HasAttributeOfOtherKind(const OrtApi& api, const OrtKernelInfo* info, const char* name, AttrKind kind) {
  if (kind != AttrKind::kFloat) {
    float f = 0.f;
    StatusHolder s(api, api.KernelInfoGetAttribute_float(info, name, &f));
    if (s.ok()) return true;
  }
  if (kind != AttrKind::kInt) {
    int64_t i = 0;
    StatusHolder s(api, api.KernelInfoGetAttribute_int64(info, name, &i));
    if (s.ok()) return true;
  }
  size_t size = 0;
  {
    StatusHolder s(api, api.KernelInfoGetAttribute_string(info, name, nullptr, &size));
    if (s.ok()) return true;
  }
  {
    StatusHolder s(api, api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &size));
    if (s.ok()) return true;
  }
  StatusHolder s(api, api.KernelInfoGetAttributeArray_float(info, name, nullptr, &size));
  return s.ok();
}

// Whether value passes check (the catalogue's CHECKS, by name).
static_assert(kAttrCheckCount == 6, "a new check in onnxnorm/ops/catalogue.py needs its rule here");
bool Holds(AttrCheck check, double value) {
  switch (check) {
    case AttrCheck::kNone: return true;
    case AttrCheck::kFinite: return std::isfinite(value);
    case AttrCheck::kFiniteNonNegative: return std::isfinite(value) && value >= 0.0;
    case AttrCheck::kZeroOrOne: return value == 0.0 || value == 1.0;
    case AttrCheck::kZeroOneOrTwo: return value == 0.0 || value == 1.0 || value == 2.0;
    // (an int attribute's value is whole; its kind is checked apart)
    case AttrCheck::kNonNegativeInt: return std::isfinite(value) && value >= 0.0 && value == std::floor(value);
  }
  return false;
}

OrtStatus* Violation(const OrtApi& api, const char* op, const AttrSpec& spec, const std::string& value) {
  return MakeError(api, ORT_INVALID_ARGUMENT, op,
                   std::string("attribute ") + spec.name + " must be " +
                       kAttrCheckRequirements[static_cast<int>(spec.check)] + ", got " + value);
}

OrtStatus* WrongKind(const OrtApi& api, const char* op, const AttrSpec& spec) {
  return MakeError(api, ORT_INVALID_ARGUMENT, op,
                   std::string("attribute ") + spec.name + " must be " +
                       (spec.kind == AttrKind::kInt ? "an int" : "a float") + " (AttributeProto type " +
                       (spec.kind == AttrKind::kInt ? "INT" : "FLOAT") + ")");
}

OrtStatus* ReadAttribute(const OrtApi& api, const OrtKernelInfo* info, const char* name, int64_t* value) {
  return api.KernelInfoGetAttribute_int64(info, name, value);
}
OrtStatus* ReadAttribute(const OrtApi& api, const OrtKernelInfo* info, const char* name, float* value) {
  return api.KernelInfoGetAttribute_float(info, name, value);
}
std::string FormatValue(int64_t value) { return std::to_string(value); }
std::string FormatValue(float value) { return FormatFloat(value); }

// GetAttribute for an int (V = int64_t) or float (V = float) attribute.
template <typename V>
OrtStatus* GetAttributeOfKind(const OrtApi& api, const OrtKernelInfo* info, const char* op, const AttrSpec& spec,
                              V* out) {
  constexpr AttrKind kind = std::is_same<V, float>::value ? AttrKind::kFloat : AttrKind::kInt;
  const V fallback = kind == AttrKind::kFloat ? static_cast<V>(spec.float_default) : static_cast<V>(spec.int_default);
  V value = fallback;
  {
    StatusHolder s(api, ReadAttribute(api, info, spec.name, &value));
    if (!s.ok()) {
      if (HasAttributeOfOtherKind(api, info, spec.name, kind)) return WrongKind(api, op, spec);
      value = fallback;
    }
  }
  if (!Holds(spec.check, static_cast<double>(value))) return Violation(api, op, spec, FormatValue(value));
  *out = value;
  return nullptr;
}

}  // namespace

OrtStatus* GetAttribute(const OrtApi& api, const OrtKernelInfo* info, const char* op, const AttrSpec& spec,
                        int64_t* out) {
  return GetAttributeOfKind(api, info, op, spec, out);
}

OrtStatus* GetAttribute(const OrtApi& api, const OrtKernelInfo* info, const char* op, const AttrSpec& spec,
                        float* out) {
  return GetAttributeOfKind(api, info, op, spec, out);
}

}  // namespace ort
}  // namespace onnxnorm

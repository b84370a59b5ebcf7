// The one place where the library's ops are named: op specs (names of inputs, outputs and
// attributes, defaults) and the registration table (one line per op, element type and execution
// provider). The custom-op objects, the domain and the JSON manifest are all built from here.
//
// These names are onnxnorm's public contract (DESIGN.md section 3) and must match the Python
// catalogue (onnxnorm/ops/catalogue.py); the manifest lets the Python tests check that.
#pragma once

#include <cstddef>
#include <cstdint>

#include "onnxruntime_c_api.h"

namespace onnxnorm {
namespace ort {

// A read-only view of a constant array (C++17 has no std::span).
template <typename T>
struct Span {
  const T* ptr = nullptr;
  size_t count = 0;
  constexpr const T* begin() const { return ptr; }
  constexpr const T* end() const { return ptr + count; }
  constexpr size_t size() const { return count; }
  constexpr const T& operator[](size_t i) const { return ptr[i]; }
};

template <typename T, size_t N>
constexpr Span<T> MakeSpan(const T (&array)[N]) {
  return Span<T>{array, N};
}

inline constexpr const char* kDomain = "onnxnorm";
inline constexpr int kDomainVersion = 1;

enum class AttrKind { kInt, kFloat };

enum class AttrCheck {
  kNone,
  kFinite,             // float: not NaN or infinite
  kFiniteNonNegative,  // float: finite and >= 0
  kZeroOrOne,          // int: 0 or 1
};

struct AttrSpec {
  const char* name;
  AttrKind kind;
  int64_t int_default;
  float float_default;
  AttrCheck check;
};

// Which type an input or output has: the node's data type (X, Residual, Y, Sum) or the weight
// type (Scale, Bias: X's type or float32).
enum class TypeVar { kT, kS };

struct ParamSpec {
  const char* name;
  TypeVar type;
  bool optional;
};

struct OpSpec {
  const char* name;
  int since_version;
  Span<ParamSpec> inputs;
  Span<ParamSpec> outputs;
  Span<AttrSpec> attributes;
};

// Attributes, defined once and shared by the ops that take them.
inline constexpr AttrSpec kAttrAxis{"axis", AttrKind::kInt, -1, 0.f, AttrCheck::kNone};
inline constexpr AttrSpec kAttrEpsilon{"epsilon", AttrKind::kFloat, 0, 1e-5f,
                                       AttrCheck::kFiniteNonNegative};
inline constexpr AttrSpec kAttrCastBeforeScale{"cast_before_scale", AttrKind::kInt, 0, 0.f,
                                               AttrCheck::kZeroOrOne};
inline constexpr AttrSpec kAttrScaleOffset{"scale_offset", AttrKind::kFloat, 0, 0.f,
                                           AttrCheck::kFinite};

// RMSNorm(X, Scale?, Bias?) -> Y
inline constexpr ParamSpec kRMSNormInputs[] = {
    {"X", TypeVar::kT, false},
    {"Scale", TypeVar::kS, true},
    {"Bias", TypeVar::kS, true},
};
inline constexpr ParamSpec kRMSNormOutputs[] = {
    {"Y", TypeVar::kT, false},
};
inline constexpr AttrSpec kRMSNormAttributes[] = {
    kAttrAxis,
    kAttrEpsilon,
    kAttrCastBeforeScale,
    kAttrScaleOffset,
};
inline constexpr OpSpec kRMSNormSpec{"RMSNorm", 1, MakeSpan(kRMSNormInputs),
                                     MakeSpan(kRMSNormOutputs), MakeSpan(kRMSNormAttributes)};

// Every op spec of the library, in manifest order.
inline constexpr const OpSpec* kOpSpecs[] = {
    &kRMSNormSpec,
};

// A kernel instance (one per node). Compute must not throw: errors are returned as OrtStatus.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual OrtStatus* Compute(OrtKernelContext* context) noexcept = 0;
};

struct KernelEntry;

// Creates the kernel of one node: reads and checks its attributes. Must not throw.
using KernelFactory = OrtStatus* (*)(const OrtApi& api, const OrtKernelInfo* info,
                                     const KernelEntry& entry, Kernel** out);

// One line of the registration table: an op for one combination of element types on one
// execution provider.
struct KernelEntry {
  const OpSpec* spec;
  ONNXTensorElementDataType t;  // type of the TypeVar::kT inputs and outputs
  ONNXTensorElementDataType s;  // type of the TypeVar::kS inputs
  const char* execution_provider;  // nullptr: the CPU execution provider
  KernelFactory create;
};

// Kernel factories, one per op (custom_ops/ort/<op>_op.cc).
OrtStatus* CreateRMSNormKernel(const OrtApi& api, const OrtKernelInfo* info,
                               const KernelEntry& entry, Kernel** out);

// The registration table.
Span<KernelEntry> KernelTable();

// {"domain": ..., "version": ..., "ops": [...]} built from kOpSpecs and KernelTable().
// The string lives as long as the library.
const char* ManifestJson();

// "float32", "float16", "bfloat16", ... for messages and the manifest.
const char* TypeName(ONNXTensorElementDataType type);

}  // namespace ort
}  // namespace onnxnorm

// The one place where the library's ops are named: op specs (names of inputs, outputs and
// attributes, defaults) and the registration table (one line per op, element type and execution
// provider). The custom-op objects, the domain and the JSON manifest are all built from here.
//
// These names are onnxnorm's public contract (DESIGN.md section 3) and must match the Python
// catalogue (onnxnorm/ops/catalogue.py); the manifest lets the Python tests check that.
#pragma once

#include <cstddef>
#include <cstdint>

#include "onnxnorm/kernels.h"
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
  NormKind norm;          // the statistics
  ResidualKind residual;  // what comes before the norm (input order follows from it)
};

// Attributes, defined once and shared by the ops that take them.
inline constexpr AttrSpec kAttrAxis{"axis", AttrKind::kInt, -1, 0.f, AttrCheck::kNone};
inline constexpr AttrSpec kAttrEpsilon{"epsilon", AttrKind::kFloat, 0, 1e-5f,
                                       AttrCheck::kFiniteNonNegative};
inline constexpr AttrSpec kAttrCastBeforeScale{"cast_before_scale", AttrKind::kInt, 0, 0.f,
                                               AttrCheck::kZeroOrOne};
inline constexpr AttrSpec kAttrScaleOffset{"scale_offset", AttrKind::kFloat, 0, 0.f,
                                           AttrCheck::kFinite};

inline constexpr AttrSpec kAttrAlpha{"alpha", AttrKind::kFloat, 0, 1.f, AttrCheck::kFinite};

// Inputs and outputs. Plain norms: (X, Scale?, Bias?) -> Y. Skip norms: (X, Residual, Scale?,
// Bias?, XBias?) -> (Y, Sum?). Sandwich norms: (X, Residual, InnerScale?, InnerBias?, Scale?,
// Bias?) -> (Y, Sum?).
inline constexpr ParamSpec kPlainInputs[] = {
    {"X", TypeVar::kT, false},
    {"Scale", TypeVar::kS, true},
    {"Bias", TypeVar::kS, true},
};
inline constexpr ParamSpec kSkipInputs[] = {
    {"X", TypeVar::kT, false},     {"Residual", TypeVar::kT, false}, {"Scale", TypeVar::kS, true},
    {"Bias", TypeVar::kS, true},   {"XBias", TypeVar::kS, true},
};
inline constexpr ParamSpec kSandwichInputs[] = {
    {"X", TypeVar::kT, false},          {"Residual", TypeVar::kT, false}, {"InnerScale", TypeVar::kS, true},
    {"InnerBias", TypeVar::kS, true},   {"Scale", TypeVar::kS, true},     {"Bias", TypeVar::kS, true},
};
inline constexpr ParamSpec kPlainOutputs[] = {
    {"Y", TypeVar::kT, false},
};
inline constexpr ParamSpec kResidualOutputs[] = {
    {"Y", TypeVar::kT, false},
    {"Sum", TypeVar::kT, true},
};

inline constexpr AttrSpec kLayerAttributes[] = {kAttrAxis, kAttrEpsilon, kAttrCastBeforeScale};
inline constexpr AttrSpec kRMSAttributes[] = {kAttrAxis, kAttrEpsilon, kAttrCastBeforeScale, kAttrScaleOffset};
inline constexpr AttrSpec kSkipLayerAttributes[] = {kAttrAxis, kAttrEpsilon, kAttrCastBeforeScale, kAttrAlpha};
inline constexpr AttrSpec kSkipRMSAttributes[] = {kAttrAxis, kAttrEpsilon, kAttrCastBeforeScale, kAttrScaleOffset,
                                                  kAttrAlpha};

inline constexpr OpSpec kLayerNormSpec{"LayerNorm",        1, MakeSpan(kPlainInputs), MakeSpan(kPlainOutputs),
                                       MakeSpan(kLayerAttributes), NormKind::kLayer, ResidualKind::kNone};
inline constexpr OpSpec kRMSNormSpec{"RMSNorm",          1, MakeSpan(kPlainInputs), MakeSpan(kPlainOutputs),
                                     MakeSpan(kRMSAttributes), NormKind::kRMS, ResidualKind::kNone};
inline constexpr OpSpec kSkipLayerNormSpec{"SkipLayerNorm", 1, MakeSpan(kSkipInputs), MakeSpan(kResidualOutputs),
                                           MakeSpan(kSkipLayerAttributes), NormKind::kLayer, ResidualKind::kSkip};
inline constexpr OpSpec kSkipRMSNormSpec{"SkipRMSNorm", 1, MakeSpan(kSkipInputs), MakeSpan(kResidualOutputs),
                                         MakeSpan(kSkipRMSAttributes), NormKind::kRMS, ResidualKind::kSkip};
inline constexpr OpSpec kSandwichLayerNormSpec{"SandwichLayerNorm", 1, MakeSpan(kSandwichInputs),
                                               MakeSpan(kResidualOutputs), MakeSpan(kLayerAttributes),
                                               NormKind::kLayer, ResidualKind::kSandwich};
inline constexpr OpSpec kSandwichRMSNormSpec{"SandwichRMSNorm", 1, MakeSpan(kSandwichInputs),
                                             MakeSpan(kResidualOutputs), MakeSpan(kRMSAttributes),
                                             NormKind::kRMS, ResidualKind::kSandwich};

// Every op spec of the library, in manifest order.
inline constexpr const OpSpec* kOpSpecs[] = {
    &kLayerNormSpec,    &kRMSNormSpec,         &kSkipLayerNormSpec,
    &kSkipRMSNormSpec,  &kSandwichLayerNormSpec, &kSandwichRMSNormSpec,
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

// The kernel factory of every op (custom_ops/ort/norm_op.cc): the op's shape comes from
// entry.spec (norm and residual kinds, inputs), the element types from entry.t and entry.s.
OrtStatus* CreateNormKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry, Kernel** out);

// The registration table.
Span<KernelEntry> KernelTable();

// {"domain": ..., "version": ..., "ops": [...]} built from kOpSpecs and KernelTable().
// The string lives as long as the library.
const char* ManifestJson();

// "float32", "float16", "bfloat16", ... for messages and the manifest.
const char* TypeName(ONNXTensorElementDataType type);

}  // namespace ort
}  // namespace onnxnorm

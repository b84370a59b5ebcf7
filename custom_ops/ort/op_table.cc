#include "op_table.h"

#include <array>
#include <cstdio>
#include <exception>
#include <string>

#include "ort_util.h"

namespace onnxnorm {
namespace ort {

OrtStatus* Kernel::Compute(OrtKernelContext* context) noexcept {
  const char* what = "unknown error";
  try {
    return Run(context);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  try {
    return MakeError(api_, ORT_FAIL, op_, std::string("internal error: ") + what);
  } catch (...) {
    return api_.CreateStatus(ORT_FAIL, "onnxnorm: internal error");
  }
}

namespace {

constexpr Provider kProviders[] = {Provider::kCpu, Provider::kCuda};

// The quantized types an op's rows span: its TypeVar::kQ types, or one placeholder.
constexpr size_t QuantRows(const OpSpec& spec) { return spec.quant_types.size() > 0 ? spec.quant_types.size() : 1; }

// The angle types (TypeVar::kA) a rotary op's rows span for X of type t: t, and float32 where t
// is not float32; one placeholder (t) for the other ops.
constexpr size_t AngleRows(const OpSpec& spec, ElemType t) { return IsRotary(spec) && t != ElemType::kFloat32 ? 2 : 1; }
constexpr ElemType AngleType(ElemType t, size_t i) { return i == 0 ? t : ElemType::kFloat32; }

// Whether the (T, S) of the op's type set i comes earlier in its list: all the U of one (T, S) are
// one row of the table.
constexpr bool Repeats(const OpSpec& spec, size_t i) {
  for (size_t j = 0; j < i; ++j) {
    if (spec.types[j].t == spec.types[i].t && spec.types[j].s == spec.types[i].s) return true;
  }
  return false;
}

// Whether the (T, S) of the op's type set i has more than one U: its row takes Y's type from the
// node (ONNX Runtime infers a custom op's output type from the first row whose inputs match, so
// two rows differing in Y's type alone would give every such node the first row's type).
constexpr bool YFromNode(const OpSpec& spec, size_t i) {
  for (size_t j = 0; j < spec.types.size(); ++j) {
    const TypeSet& a = spec.types[i];
    const TypeSet& b = spec.types[j];
    if (a.t == b.t && a.s == b.s && a.u != b.u) return true;
  }
  return false;
}

constexpr size_t CountKernels() {
  size_t count = 0;
  for (const OpSpec& spec : kOps) {
    for (size_t i = 0; i < spec.types.size(); ++i) {
      if (!Repeats(spec, i)) count += QuantRows(spec) * AngleRows(spec, spec.types[i].t);
    }
  }
  return count * (sizeof(kProviders) / sizeof(kProviders[0]));
}
constexpr size_t kKernelCount = CountKernels();

bool HasTypeVar(const OpSpec& spec, TypeVar var) {
  for (const ParamSpec& p : spec.outputs) {
    if (p.type == var) return true;
  }
  return false;
}

// The factory of an op's kernels on a provider.
constexpr KernelFactory FactoryOf(const OpSpec& spec, Provider provider) {
  if (IsRotary(spec)) return provider == Provider::kCpu ? &CreateRotaryCpuKernel : &CreateRotaryCudaKernel;
  return provider == Provider::kCpu ? &CreateCpuKernel : &CreateCudaKernel;
}

// Each op for every (T, S) (and Q; and A, for the rotary ops) its schema allows on both
// providers, with its U or, where a (T, S) has several, Y's type read from the node. Once the
// library is registered ORT never falls back to the function body, so no combination may be
// missing.
constexpr std::array<KernelEntry, kKernelCount> BuildTable() {
  std::array<KernelEntry, kKernelCount> table{};
  size_t i = 0;
  for (const OpSpec& spec : kOps) {
    for (Provider provider : kProviders) {
      for (size_t k = 0; k < spec.types.size(); ++k) {
        if (Repeats(spec, k)) continue;
        const TypeSet& types = spec.types[k];
        for (size_t q = 0; q < QuantRows(spec); ++q) {
          const ElemType q_type = spec.quant_types.size() > 0 ? spec.quant_types[q] : ElemType::kUInt8;
          for (size_t a = 0; a < AngleRows(spec, types.t); ++a) {
            table[i++] = KernelEntry{&spec,
                                     types.t,
                                     types.s,
                                     types.u,
                                     q_type,
                                     AngleType(types.t, a),
                                     YFromNode(spec, k),
                                     provider,
                                     FactoryOf(spec, provider)};
          }
        }
      }
    }
  }
  return table;
}

constexpr std::array<KernelEntry, kKernelCount> kKernels = BuildTable();

void AppendJsonString(std::string& out, const char* text) {
  out += '"';
  for (const char* p = text; *p != '\0'; ++p) {
    const char c = *p;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[(c >> 4) & 0xf];
      out += kHex[c & 0xf];
    } else {
      out += c;
    }
  }
  out += '"';
}

// [item, item, ...] with append(out, item) writing each.
template <typename Items, typename Append>
void AppendJsonList(std::string& out, const Items& items, Append append) {
  out += '[';
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += ',';
    first = false;
    append(out, item);
  }
  out += ']';
}

void AppendParam(std::string& out, const ParamSpec& p) {
  out += "{\"name\":";
  AppendJsonString(out, p.name);
  out += ",\"type\":";
  AppendJsonString(out, kTypeVarNames[static_cast<int>(p.type)]);
  out += p.optional ? ",\"optional\":true}" : ",\"optional\":false}";
}

void AppendAttribute(std::string& out, const AttrSpec& a) {
  out += "{\"name\":";
  AppendJsonString(out, a.name);
  out += ",\"kind\":";
  AppendJsonString(out, kAttrKindNames[static_cast<int>(a.kind)]);
  out += ",\"default\":";
  if (a.kind == AttrKind::kInt) {
    out += std::to_string(a.int_default);
  } else {
    char text[32];
    std::snprintf(text, sizeof(text), "%.9g", static_cast<double>(a.float_default));
    out += text;
  }
  out += ",\"check\":";
  AppendJsonString(out, kAttrCheckNames[static_cast<int>(a.check)]);
  out += '}';
}

std::string BuildManifest() {
  std::string out;
  out += "{\"domain\":";
  AppendJsonString(out, kDomain);
  out += ",\"version\":" + std::to_string(kDomainVersion);
  out += ",\"ort_api_version\":" + std::to_string(ORT_API_VERSION);
  out += ",\"elem_types\":";
  AppendJsonList(out, Span<const char*>{kElemTypeNames, kElemTypeCount},
                 [](std::string& o, const char* name) { AppendJsonString(o, name); });
  out += ",\"quant_types\":";
  AppendJsonList(out, Span<const char*>{kElemTypeNames + kElemTypeCount, kQuantTypeCount},
                 [](std::string& o, const char* name) { AppendJsonString(o, name); });
  out += ",\"ops\":";
  AppendJsonList(out, kOps, [](std::string& o, const OpSpec& spec) {
    o += "{\"name\":";
    AppendJsonString(o, spec.name);
    o += ",\"id\":" + std::to_string(static_cast<int>(spec.id));
    o += ",\"since_version\":" + std::to_string(spec.since_version);
    o += ",\"norm\":";
    AppendJsonString(o, kNormKindNames[static_cast<int>(spec.norm)]);
    o += ",\"residual\":";
    AppendJsonString(o, kResidualKindNames[static_cast<int>(spec.residual)]);
    o += ",\"inputs\":";
    AppendJsonList(o, spec.inputs, AppendParam);
    o += ",\"outputs\":";
    AppendJsonList(o, spec.outputs, AppendParam);
    o += ",\"attributes\":";
    AppendJsonList(o, spec.attributes, AppendAttribute);
    o += ",\"quantize\":";
    AppendJsonString(o, kQuantizeKindNames[static_cast<int>(spec.quantize)]);
    o += ",\"quant_types\":";
    AppendJsonList(o, spec.quant_types,
                   [](std::string& o2, ElemType q) { AppendJsonString(o2, kElemTypeNames[static_cast<int>(q)]); });
    // [provider, T, S] (and U for the ops with a Y of type U, Q for the quantized ops, A for the
    // rotary ops) of every kernel for this op: each row of the table, once per U it takes
    o += ",\"kernels\":[";
    bool first = true;
    for (const KernelEntry& e : kKernels) {
      if (e.spec != &spec) continue;
      for (const TypeSet& types : spec.types) {
        if (types.t != e.t || types.s != e.s || (!e.y_from_node && types.u != e.u)) continue;
        o += first ? "[" : ",[";
        first = false;
        AppendJsonString(o, ProviderName(e.provider));
        o += ',';
        AppendJsonString(o, kElemTypeNames[static_cast<int>(e.t)]);
        o += ',';
        AppendJsonString(o, kElemTypeNames[static_cast<int>(e.s)]);
        if (HasTypeVar(spec, TypeVar::kU)) {
          o += ',';
          AppendJsonString(o, kElemTypeNames[static_cast<int>(types.u)]);
        }
        if (spec.quantize != QuantizeKind::kNone) {
          o += ',';
          AppendJsonString(o, kElemTypeNames[static_cast<int>(e.q)]);
        }
        if (IsRotary(spec)) {
          o += ',';
          AppendJsonString(o, kElemTypeNames[static_cast<int>(e.a)]);
        }
        o += ']';
      }
    }
    o += "]}";
  });
  out += '}';
  return out;
}

}  // namespace

Span<KernelEntry> KernelTable() { return Span<KernelEntry>{kKernels.data(), kKernels.size()}; }

const char* ProviderName(Provider provider) {
  return provider == Provider::kCuda ? "CUDAExecutionProvider" : "CPUExecutionProvider";
}

const char* ManifestJson() {
  static const std::string manifest = BuildManifest();
  return manifest.c_str();
}

const char* TypeName(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN: return "float8e4m3fn";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return "int16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return "uint16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return "uint32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return "uint64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING: return "string";
    default: return "an unsupported type";
  }
}

ONNXTensorElementDataType OnnxType(ElemType type) {
  switch (type) {
    case ElemType::kFloat32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case ElemType::kFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case ElemType::kBFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    case ElemType::kUInt8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    case ElemType::kInt8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    case ElemType::kFloat8E4M3FN: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT8E4M3FN;
  }
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

bool ToElemType(ONNXTensorElementDataType type, ElemType* out) {
  for (int i = 0; i < kElemTypeCount; ++i) {
    if (OnnxType(static_cast<ElemType>(i)) == type) {
      *out = static_cast<ElemType>(i);
      return true;
    }
  }
  return false;
}

}  // namespace ort
}  // namespace onnxnorm

#include "op_table.h"

#include <array>
#include <cstdio>
#include <string>

namespace onnxnorm {
namespace ort {
namespace {

constexpr Provider kProviders[] = {Provider::kCpu, Provider::kCuda};

// The quantized types an op's rows span: its TypeVar::kQ types, or one placeholder.
constexpr size_t QuantRows(const OpSpec& spec) { return spec.quant_types.size() > 0 ? spec.quant_types.size() : 1; }

constexpr size_t CountKernels() {
  size_t count = 0;
  for (const OpSpec& spec : kOps) {
    count += (sizeof(kProviders) / sizeof(kProviders[0])) * kTypePairCount * QuantRows(spec);
  }
  return count;
}
constexpr size_t kKernelCount = CountKernels();

// Each op for every (T, S) (and Q) its schema allows on both providers. Once the
// library is registered ORT never falls back to the function body, so no combination may be
// missing.
constexpr std::array<KernelEntry, kKernelCount> BuildTable() {
  std::array<KernelEntry, kKernelCount> table{};
  size_t i = 0;
  for (const OpSpec& spec : kOps) {
    for (Provider provider : kProviders) {
      for (const TypePair& pair : kTypePairs) {
        for (size_t q = 0; q < QuantRows(spec); ++q) {
          const ElemType q_type = spec.quant_types.size() > 0 ? spec.quant_types[q] : ElemType::kUInt8;
          table[i++] = KernelEntry{&spec,  pair.t,   pair.s,
                                   q_type, provider, provider == Provider::kCpu ? &CreateCpuKernel : &CreateCudaKernel};
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
    // [provider, T, S] (and Q for the quantized ops) of every row of the table for this op
    o += ",\"kernels\":[";
    bool first = true;
    for (const KernelEntry& e : kKernels) {
      if (e.spec != &spec) continue;
      o += first ? "[" : ",[";
      first = false;
      AppendJsonString(o, ProviderName(e.provider));
      o += ',';
      AppendJsonString(o, kElemTypeNames[static_cast<int>(e.t)]);
      o += ',';
      AppendJsonString(o, kElemTypeNames[static_cast<int>(e.s)]);
      if (spec.quantize != QuantizeKind::kNone) {
        o += ',';
        AppendJsonString(o, kElemTypeNames[static_cast<int>(e.q)]);
      }
      o += ']';
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

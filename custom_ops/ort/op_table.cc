#include "op_table.h"

#include <string>

namespace onnxnorm {
namespace ort {
namespace {

constexpr ONNXTensorElementDataType kF32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
constexpr ONNXTensorElementDataType kF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
constexpr ONNXTensorElementDataType kBF16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;

// Each op for every (T, S) its schema allows: T in {float32, float16, bfloat16}, S = T or float32.
// Once the library is registered ORT never falls back to the function body, so no combination
// may be missing (DESIGN.md section 6).
#define ONNXNORM_ALL_TYPES(spec)                                                    \
  {&spec, kF32, kF32, nullptr, &CreateNormKernel}, {&spec, kF16, kF16, nullptr, &CreateNormKernel}, \
      {&spec, kF16, kF32, nullptr, &CreateNormKernel}, {&spec, kBF16, kBF16, nullptr, &CreateNormKernel}, \
      {&spec, kBF16, kF32, nullptr, &CreateNormKernel}

// The registration table: adding an op or an element type is one line here (plus its kernel).
// Ops sharing a name must have the same inputs and outputs; ORT merges their type constraints.
constexpr KernelEntry kKernels[] = {
    ONNXNORM_ALL_TYPES(kLayerNormSpec),         ONNXNORM_ALL_TYPES(kRMSNormSpec),
    ONNXNORM_ALL_TYPES(kSkipLayerNormSpec),     ONNXNORM_ALL_TYPES(kSkipRMSNormSpec),
    ONNXNORM_ALL_TYPES(kSandwichLayerNormSpec), ONNXNORM_ALL_TYPES(kSandwichRMSNormSpec),
};
#undef ONNXNORM_ALL_TYPES

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

template <typename Items, typename NameOf>
void AppendJsonNames(std::string& out, const Items& items, NameOf name_of) {
  out += '[';
  bool first = true;
  for (const auto& item : items) {
    const char* name = name_of(item);
    if (name == nullptr) continue;
    if (!first) out += ',';
    first = false;
    AppendJsonString(out, name);
  }
  out += ']';
}

std::string BuildManifest() {
  std::string out;
  out += "{\"domain\":";
  AppendJsonString(out, kDomain);
  out += ",\"version\":" + std::to_string(kDomainVersion);
  out += ",\"ort_api_version\":" + std::to_string(ORT_API_VERSION);
  out += ",\"ops\":[";
  bool first_op = true;
  for (const OpSpec* spec : kOpSpecs) {
    if (!first_op) out += ',';
    first_op = false;
    out += "{\"name\":";
    AppendJsonString(out, spec->name);
    out += ",\"since_version\":" + std::to_string(spec->since_version);
    out += ",\"inputs\":";
    AppendJsonNames(out, spec->inputs, [](const ParamSpec& p) { return p.name; });
    out += ",\"optional_inputs\":";
    AppendJsonNames(out, spec->inputs,
                    [](const ParamSpec& p) { return p.optional ? p.name : nullptr; });
    out += ",\"outputs\":";
    AppendJsonNames(out, spec->outputs, [](const ParamSpec& p) { return p.name; });
    out += ",\"attributes\":";
    AppendJsonNames(out, spec->attributes, [](const AttrSpec& a) { return a.name; });
    // Element types of X (TypeVar::kT) with a kernel, each once, in table order.
    out += ",\"types\":[";
    bool first_type = true;
    const auto table = KernelTable();
    for (size_t i = 0; i < table.size(); ++i) {
      if (table[i].spec != spec) continue;
      bool seen = false;
      for (size_t j = 0; j < i; ++j) seen = seen || (table[j].spec == spec && table[j].t == table[i].t);
      if (seen) continue;
      if (!first_type) out += ',';
      first_type = false;
      AppendJsonString(out, TypeName(table[i].t));
    }
    out += "]}";
  }
  out += "]}";
  return out;
}

}  // namespace

Span<KernelEntry> KernelTable() { return MakeSpan(kKernels); }

const char* ManifestJson() {
  static const std::string manifest = BuildManifest();
  return manifest.c_str();
}

const char* TypeName(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
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

}  // namespace ort
}  // namespace onnxnorm

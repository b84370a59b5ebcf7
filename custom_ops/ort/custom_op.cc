#include "custom_op.h"

#include <atomic>
#include <mutex>
#include <new>
#include <string>

#include "op_table.h"
#include "ort_util.h"

namespace onnxnorm {
namespace ort {
namespace {

static_assert(ORT_API_VERSION >= 21, "onnxnorm is built against ONNX Runtime headers 1.21 or newer");

#if defined(ONNXNORM_TEST_CUDA_ROWS_ON_CPU)
// A build for tests on machines without a GPU (tests/cuda/test_cuda.py): the CUDA lines claim the CPU
// execution provider instead of the CPU lines, so that a CPU session runs the CUDA glue and the
// launcher of a host-emulated CUDA library. Never set in the package build.
constexpr bool kCudaRowsOnCpu = true;
#else
constexpr bool kCudaRowsOnCpu = false;
#endif

// Whether a line of the table goes into the domain.
bool Registered(const KernelEntry& e, bool with_cuda) {
  if (e.provider == Provider::kCuda) return with_cuda;
  return !kCudaRowsOnCpu;
}

std::atomic<const OrtApi*> g_api{nullptr};

// One OrtCustomOp per registration-table line; every callback reads the line.
struct TableOp : OrtCustomOp {
  TableOp(const KernelEntry& e, bool shape_inference);
  const KernelEntry* entry;
  // Y of any type (the row's kernels take their node's: KernelEntry::y_from_node), which the
  // output shape inference then types from the attribute y_float32. Without that inference
  // (ONNX Runtime before 1.24) ORT would type such a Y from nothing, so the row keeps Y = T there
  // and a float32 Y (the mixed form) runs as the function body only.
  bool y_open;
};

const KernelEntry& EntryOf(const OrtCustomOp* op) { return *static_cast<const TableOp*>(op)->entry; }

ONNXTensorElementDataType TypeOf(const OrtCustomOp* op, const ParamSpec& p) {
  const KernelEntry& e = EntryOf(op);
  switch (p.type) {
    case TypeVar::kT: return OnnxType(e.t);
    case TypeVar::kS: return OnnxType(e.s);
    case TypeVar::kU:
      return static_cast<const TableOp*>(op)->y_open ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED : OnnxType(e.u);
    case TypeVar::kQ: return OnnxType(e.q);
    case TypeVar::kF: return OnnxType(ElemType::kFloat32);
    case TypeVar::kI: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    case TypeVar::kA: return OnnxType(e.a);
  }
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

OrtCustomOpInputOutputCharacteristic CharacteristicOf(const ParamSpec& p) {
  return p.optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}

OrtStatus* ORT_API_CALL CreateKernelV2(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                       void** kernel) {
  const KernelEntry& entry = EntryOf(op);
  *kernel = nullptr;
  try {
    Kernel* k = nullptr;
    OrtStatus* status = entry.create(*api, info, entry, &k);
    if (status == nullptr) *kernel = k;
    return status;
  } catch (...) {
    // Factories report errors as statuses; this is only reached on std::bad_alloc and the like.
    return api->CreateStatus(ORT_FAIL, "onnxnorm: cannot create the kernel (out of memory?)");
  }
}

OrtStatus* ORT_API_CALL KernelComputeV2(void* kernel, OrtKernelContext* context) {
  return static_cast<Kernel*>(kernel)->Compute(context);
}

void ORT_API_CALL KernelDestroy(void* kernel) { delete static_cast<Kernel*>(kernel); }

const char* ORT_API_CALL GetName(const OrtCustomOp* op) { return EntryOf(op).spec->name; }

// nullptr: the CPU execution provider.
const char* ORT_API_CALL GetExecutionProviderType(const OrtCustomOp* op) {
  const bool cuda = EntryOf(op).provider == Provider::kCuda && !kCudaRowsOnCpu;
  return cuda ? ProviderName(Provider::kCuda) : nullptr;
}

size_t ORT_API_CALL GetInputTypeCount(const OrtCustomOp* op) { return EntryOf(op).spec->inputs.size(); }

size_t ORT_API_CALL GetOutputTypeCount(const OrtCustomOp* op) { return EntryOf(op).spec->outputs.size(); }

ONNXTensorElementDataType ORT_API_CALL GetInputType(const OrtCustomOp* op, size_t i) {
  const KernelEntry& e = EntryOf(op);
  return i < e.spec->inputs.size() ? TypeOf(op, e.spec->inputs[i]) : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

ONNXTensorElementDataType ORT_API_CALL GetOutputType(const OrtCustomOp* op, size_t i) {
  const KernelEntry& e = EntryOf(op);
  return i < e.spec->outputs.size() ? TypeOf(op, e.spec->outputs[i]) : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

OrtCustomOpInputOutputCharacteristic ORT_API_CALL GetInputCharacteristic(const OrtCustomOp* op, size_t i) {
  const KernelEntry& e = EntryOf(op);
  return i < e.spec->inputs.size() ? CharacteristicOf(e.spec->inputs[i]) : INPUT_OUTPUT_REQUIRED;
}

OrtCustomOpInputOutputCharacteristic ORT_API_CALL GetOutputCharacteristic(const OrtCustomOp* op, size_t i) {
  const KernelEntry& e = EntryOf(op);
  return i < e.spec->outputs.size() ? CharacteristicOf(e.spec->outputs[i]) : INPUT_OUTPUT_REQUIRED;
}

OrtMemType ORT_API_CALL GetInputMemoryType(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }

// No variadic inputs or outputs; ORT only asks when one is declared.
int ORT_API_CALL GetVariadicMinArity(const OrtCustomOp*) { return 1; }
int ORT_API_CALL GetVariadicHomogeneity(const OrtCustomOp*) { return 1; }

int ORT_API_CALL GetStartVersion(const OrtCustomOp* op) { return EntryOf(op).spec->since_version; }

// The node's int attribute `name` (fallback where absent or unreadable).
int64_t IntAttribute(const OrtApi& api, OrtShapeInferContext* context, const char* name, int64_t fallback) {
  const OrtOpAttr* attr = nullptr;
  if (OrtStatus* s = api.ShapeInferContext_GetAttribute(context, name, &attr)) {
    api.ReleaseStatus(s);
    return fallback;
  }
  int64_t value = 0;
  size_t size = 0;
  if (attr == nullptr) return fallback;
  if (OrtStatus* s = api.ReadOpAttr(attr, ORT_OP_ATTR_INT, &value, sizeof(value), &size)) {
    api.ReleaseStatus(s);
    return fallback;
  }
  return value;
}

// The node's attribute y_float32 (0 where absent or unreadable).
int64_t YFloat32(const OrtApi& api, OrtShapeInferContext* context) {
  return IntAttribute(api, context, "y_float32", 0);
}

// Sets output `index` to a tensor of `type` with these dims (value >= 0, else the name). A dim
// ONNX Runtime knows neither by value nor by name comes out of GetDimensions as -1 with an empty
// name, and would go back in as the value -1 (a Reshape after it then infers negative dims): each
// such dim is given a name of its own, which says as little about it.
void SetOutput(const OrtApi& api, OrtShapeInferContext* context, size_t index, ONNXTensorElementDataType type,
               const int64_t* dims, const char* const* names, size_t rank) {
  static std::atomic<uint64_t> unnamed{0};
  std::string made[16];
  const char* out_names[16];
  if (rank > 16) return;
  for (size_t i = 0; i < rank; ++i) {
    out_names[i] = names[i];
    if (dims[i] < 0 && (names[i] == nullptr || names[i][0] == '\0')) {
      made[i] = "onnxnorm_unk__" + std::to_string(unnamed.fetch_add(1, std::memory_order_relaxed));
      out_names[i] = made[i].c_str();
    }
  }
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* s = api.CreateTensorTypeAndShapeInfo(&info)) {
    api.ReleaseStatus(s);
    return;
  }
  OrtStatus* s = api.SetTensorElementType(info, type);
  if (s == nullptr) s = api.SetDimensions(info, dims, rank);
  if (s == nullptr) s = api.SetSymbolicDimensions(info, out_names, rank);
  if (s == nullptr) s = api.ShapeInferContext_SetOutputTypeShape(context, index, info);
  if (s != nullptr) api.ReleaseStatus(s);
  api.ReleaseTensorTypeAndShapeInfo(info);
}

// The type, dims and dim names of an input (false where they cannot be read, or rank > 16).
bool ReadShape(const OrtApi& api, const OrtTensorTypeAndShapeInfo* info, size_t rank, ONNXTensorElementDataType* type,
               int64_t* dims, const char** names) {
  OrtStatus* s = rank <= 16 ? nullptr : api.CreateStatus(ORT_FAIL, "rank");
  if (s == nullptr) s = api.GetDimensions(info, dims, rank);
  if (s == nullptr) s = api.GetSymbolicDimensions(info, names, rank);
  if (s == nullptr) s = api.GetTensorElementType(info, type);
  if (s == nullptr) return true;
  api.ReleaseStatus(s);
  return false;
}

// A rotary op's QOut (output 0) with layout 2: [batch, heads, seq, head_size] of Q's type, from
// Q of shape [batch, seq, heads, head_size] or [batch, seq, heads * head_size] (head_size > 0);
// nothing where that shape cannot be told (the kernel reports a bad shape).
void SetTransposedQOut(const OrtApi& api, OrtShapeInferContext* context, const OrtTensorTypeAndShapeInfo* q_info,
                       size_t rank) {
  if (rank != 3 && rank != 4) return;
  int64_t dims[4];
  const char* names[4];
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  if (!ReadShape(api, q_info, rank, &type, dims, names)) return;
  int64_t out[4] = {dims[0], rank == 4 ? dims[2] : -1, dims[1], rank == 4 ? dims[3] : -1};
  const char* out_names[4] = {names[0], rank == 4 ? names[2] : "", names[1], rank == 4 ? names[3] : ""};
  if (rank == 3) {
    const int64_t head_size = IntAttribute(api, context, "head_size", attr_default::kHeadSize);
    if (head_size <= 0 || (dims[2] >= 0 && dims[2] % head_size != 0)) return;
    out[1] = dims[2] >= 0 ? dims[2] / head_size : -1;
    out[3] = head_size;
  }
  SetOutput(api, context, 0, type, out, out_names, 4);
}

// Shape inference at model load. Any failure here only means less shape information, never an
// error.
OrtStatus* ORT_API_CALL InferOutputShape(const OrtCustomOp* op, OrtShapeInferContext* context) {
  const OrtApi* api = g_api.load();
  if (api == nullptr) return nullptr;
  // A quantized op's Y has its own type (ORT's types from the kernel rows stand)
  if (EntryOf(op).spec->quantize != QuantizeKind::kNone) return nullptr;
  size_t inputs = 0;
  if (OrtStatus* s = api->ShapeInferContext_GetInputCount(context, &inputs)) {
    api->ReleaseStatus(s);
    return nullptr;
  }
  if (inputs == 0) return nullptr;
  OrtTensorTypeAndShapeInfo* x_info = nullptr;  // owned by the context
  if (OrtStatus* s = api->ShapeInferContext_GetInputTypeShape(context, 0, &x_info)) {
    api->ReleaseStatus(s);
    return nullptr;
  }
  size_t rank = 0;
  if (OrtStatus* s = api->GetDimensionsCount(x_info, &rank)) {
    api->ReleaseStatus(s);
    return nullptr;
  }
  if (rank == 0) return nullptr;  // unknown rank (or a scalar X, which Compute rejects)
  const KernelEntry& entry = EntryOf(op);
  // A rotary op's QOut: Q's type and shape, but transposed with layout 2 (KOut is left alone, as
  // Sum below)
  if (IsRotary(*entry.spec) && IntAttribute(*api, context, "layout", attr_default::kLayout) == 2) {
    SetTransposedQOut(*api, context, x_info, rank);
    return nullptr;
  }
  // Y (output 0) has X's shape and type, or float32 for the ops whose Y is of type U where the
  // node says so (attribute y_float32: the mixed form). The optional Sum is left alone: the
  // context cannot tell whether the node has it, and ONNX Runtime 1.24 to 1.27 do not check the
  // index (setting output 1 of a node without Sum aborts the process there).
  const bool float32_y =
      entry.spec->outputs.size() > 0 && entry.spec->outputs[0].type == TypeVar::kU && YFloat32(*api, context) == 1;
  int64_t dims[16];
  const char* names[16];
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  if (!ReadShape(*api, x_info, rank, &type, dims, names)) {
    // (rank > 16: X's type and shape as they are)
    if (float32_y) return nullptr;
    if (OrtStatus* s = api->ShapeInferContext_SetOutputTypeShape(context, 0, x_info)) api->ReleaseStatus(s);
    return nullptr;
  }
  if (float32_y) type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  SetOutput(*api, context, 0, type, dims, names, rank);
  return nullptr;
}

TableOp::TableOp(const KernelEntry& e, bool shape_inference)
    : OrtCustomOp{}, entry(&e), y_open(e.y_from_node && shape_inference) {
  version = ORT_API_VERSION;
  CreateKernel = nullptr;  // CreateKernelV2 / KernelComputeV2 report errors as statuses instead
  GetName = &ort::GetName;
  GetExecutionProviderType = &ort::GetExecutionProviderType;
  GetInputType = &ort::GetInputType;
  GetInputTypeCount = &ort::GetInputTypeCount;
  GetOutputType = &ort::GetOutputType;
  GetOutputTypeCount = &ort::GetOutputTypeCount;
  KernelCompute = nullptr;
  KernelDestroy = &ort::KernelDestroy;
  GetInputCharacteristic = &ort::GetInputCharacteristic;
  GetOutputCharacteristic = &ort::GetOutputCharacteristic;
  GetInputMemoryType = &ort::GetInputMemoryType;
  GetVariadicInputMinArity = &GetVariadicMinArity;
  GetVariadicInputHomogeneity = &GetVariadicHomogeneity;
  GetVariadicOutputMinArity = &GetVariadicMinArity;
  GetVariadicOutputHomogeneity = &GetVariadicHomogeneity;
  CreateKernelV2 = &ort::CreateKernelV2;
  KernelComputeV2 = &ort::KernelComputeV2;
  InferOutputShapeFn = shape_inference ? &InferOutputShape : nullptr;
  GetStartVersion = &ort::GetStartVersion;
  GetEndVersion = nullptr;  // open-ended
}

}  // namespace

void SetRegisteredApi(const OrtApi* api) { g_api.store(api); }

bool RuntimeAtLeast(const char* version, int major, int minor) {
  if (version == nullptr) return false;
  int parts[2] = {0, 0};
  const char* p = version;
  for (int& part : parts) {
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9' && part < 100000) part = part * 10 + (*p++ - '0');
    if (*p == '.') ++p;
  }
  return parts[0] > major || (parts[0] == major && parts[1] >= minor);
}

OrtStatus* GetCustomOpDomain(const OrtApi& api, bool shape_inference, bool with_cuda, OrtCustomOpDomain** out) {
  static std::mutex mutex;
  static OrtCustomOpDomain* domain = nullptr;  // never released (see custom_op.h)
  static TableOp* ops = nullptr;               // likewise
  std::lock_guard<std::mutex> lock(mutex);
  *out = nullptr;
  if (domain != nullptr) {
    *out = domain;
    return nullptr;
  }

  const Span<KernelEntry> table = KernelTable();
  if (ops == nullptr) {
    // Constructed in place so that every object keeps its address for the life of the process.
    void* memory = ::operator new(sizeof(TableOp) * table.size(), std::nothrow);
    if (memory == nullptr) return api.CreateStatus(ORT_FAIL, "onnxnorm: out of memory");
    auto* built = static_cast<TableOp*>(memory);
    for (size_t i = 0; i < table.size(); ++i) new (&built[i]) TableOp(table[i], shape_inference);
    ops = built;
  }

  OrtCustomOpDomain* created = nullptr;
  if (OrtStatus* s = api.CreateCustomOpDomain(kDomain, &created)) return s;
  for (size_t i = 0; i < table.size(); ++i) {
    if (!Registered(table[i], with_cuda)) continue;
    if (OrtStatus* s = api.CustomOpDomain_Add(created, &ops[i])) {
      api.ReleaseCustomOpDomain(created);
      return s;
    }
  }
  domain = created;
  *out = domain;
  return nullptr;
}

}  // namespace ort
}  // namespace onnxnorm

// ORT glue of the CUDA kernels: custom ops for the CUDAExecutionProvider, and the library's
// RegisterCustomOps.
//
// One session can hold only one custom-op domain named "onnxnorm" (ORT fails with "Domain already
// set in registry" otherwise), and a node the domain claims must have a kernel on whichever
// provider it lands on. So this library does not make a domain of its own: RegisterCustomOps
// loads the CPU library (libonnxnorm_ops.so next to this one, or $ONNXNORM_LIBRARY), lets it
// register its domain with the CPU kernels, and adds the CUDA kernels to that same domain on the
// way (it hands the CPU library a copy of ORT's API table whose AddCustomOpDomain first adds
// them). Register this library instead of the CPU one: sessions then get both.
//
// Shape and attribute rules are those of the CPU glue (custom_ops/ort/norm_shapes.cc) and of
// onnxnorm/ops/reference.py: axis in [-rank, rank); cols > 0 unless X is empty; each weight a
// suffix of X's shape covering the normalized dimensions (leading 1s ignored; it may span more
// dimensions: row r of X uses weight row r % weight_rows); Residual of X's type and shape.
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "launch.h"
#include "onnxruntime_c_api.h"

#define ONNXNORM_EXPORT __attribute__((visibility("default")))

namespace onnxnorm {
namespace cuda_ort {
namespace {

static_assert(ORT_API_VERSION >= 17, "onnxnorm needs ONNX Runtime headers 1.17 or newer");

constexpr const char* kCudaProvider = "CUDAExecutionProvider";
constexpr const char* kCpuLibraryName = "libonnxnorm_ops.so";

// ---------------------------------------------------------------------------------------------
// Op specs (names as in onnxnorm/ops/catalogue.py; tests/test_cuda.py compares them)
// ---------------------------------------------------------------------------------------------
enum class Var { kT, kS };
struct Param {
  const char* name;
  Var type;
  bool optional;
};
struct OpSpec {
  const char* name;
  int op;  // ONNXNORM_CUDA_<OP>
  bool rms;
  int residual;  // 0 none, 1 skip, 2 sandwich
  std::vector<Param> inputs;
  std::vector<Param> outputs;
};

const std::vector<OpSpec>& Specs() {
  static const std::vector<OpSpec> specs = [] {
    const Param x{"X", Var::kT, false}, scale{"Scale", Var::kS, true}, bias{"Bias", Var::kS, true},
        residual{"Residual", Var::kT, false}, xbias{"XBias", Var::kS, true},
        inner_scale{"InnerScale", Var::kS, true}, inner_bias{"InnerBias", Var::kS, true}, y{"Y", Var::kT, false},
        sum{"Sum", Var::kT, true};
    std::vector<OpSpec> out;
    out.push_back({"LayerNorm", ONNXNORM_CUDA_LAYER_NORM, false, 0, {x, scale, bias}, {y}});
    out.push_back({"RMSNorm", ONNXNORM_CUDA_RMS_NORM, true, 0, {x, scale, bias}, {y}});
    out.push_back({"SkipLayerNorm", ONNXNORM_CUDA_SKIP_LAYER_NORM, false, 1, {x, residual, scale, bias, xbias}, {y, sum}});
    out.push_back({"SkipRMSNorm", ONNXNORM_CUDA_SKIP_RMS_NORM, true, 1, {x, residual, scale, bias, xbias}, {y, sum}});
    out.push_back({"SandwichLayerNorm", ONNXNORM_CUDA_SANDWICH_LAYER_NORM, false, 2,
                   {x, residual, inner_scale, inner_bias, scale, bias}, {y, sum}});
    out.push_back({"SandwichRMSNorm", ONNXNORM_CUDA_SANDWICH_RMS_NORM, true, 2,
                   {x, residual, inner_scale, inner_bias, scale, bias}, {y, sum}});
    return out;
  }();
  return specs;
}

const char* TypeName(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    default: return "an unsupported type";
  }
}

int32_t CudaType(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return ONNXNORM_CUDA_FLOAT16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return ONNXNORM_CUDA_BFLOAT16;
    default: return ONNXNORM_CUDA_FLOAT32;
  }
}

OrtStatus* Error(const OrtApi& api, OrtErrorCode code, const OpSpec& spec, const std::string& message) {
  return api.CreateStatus(code, ("onnxnorm::" + std::string(spec.name) + " (CUDA): " + message).c_str());
}

std::string Shape(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? "," : "") + std::to_string(dims[i]);
  return out + "]";
}

// ---------------------------------------------------------------------------------------------
// The kernel of one node
// ---------------------------------------------------------------------------------------------
struct Input {
  bool present = false;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> dims;
  const void* data = nullptr;
};

OrtStatus* ReadInput(const OrtApi& api, OrtKernelContext* context, size_t index, Input* out) {
  size_t count = 0;
  if (OrtStatus* s = api.KernelContext_GetInputCount(context, &count)) return s;
  if (index >= count) return nullptr;
  const OrtValue* value = nullptr;
  if (OrtStatus* s = api.KernelContext_GetInput(context, index, &value)) return s;
  if (value == nullptr) return nullptr;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* s = api.GetTensorTypeAndShape(value, &info)) return s;
  size_t rank = 0;
  OrtStatus* s = api.GetTensorElementType(info, &out->type);
  if (s == nullptr) s = api.GetDimensionsCount(info, &rank);
  if (s == nullptr) {
    out->dims.assign(rank, 0);
    s = api.GetDimensions(info, out->dims.data(), rank);
  }
  api.ReleaseTensorTypeAndShapeInfo(info);
  if (s != nullptr) return s;
  void* data = nullptr;
  if (OrtStatus* st = api.GetTensorMutableData(const_cast<OrtValue*>(value), &data)) return st;
  out->data = data;
  out->present = true;
  return nullptr;
}

// Attribute `name` or its default; a value of another kind is an error, as in the CPU glue.
OrtStatus* ReadInt(const OrtApi& api, const OrtKernelInfo* info, const OpSpec& spec, const char* name,
                   int64_t fallback, int64_t* out) {
  *out = fallback;
  OrtStatus* s = api.KernelInfoGetAttribute_int64(info, name, out);
  if (s == nullptr) return nullptr;
  api.ReleaseStatus(s);
  *out = fallback;
  float f = 0.f;
  if (OrtStatus* t = api.KernelInfoGetAttribute_float(info, name, &f)) {
    api.ReleaseStatus(t);
    return nullptr;
  }
  return Error(api, ORT_INVALID_ARGUMENT, spec, std::string("attribute ") + name + " must be an int");
}

OrtStatus* ReadFloat(const OrtApi& api, const OrtKernelInfo* info, const OpSpec& spec, const char* name,
                     float fallback, float* out) {
  *out = fallback;
  OrtStatus* s = api.KernelInfoGetAttribute_float(info, name, out);
  if (s == nullptr) return nullptr;
  api.ReleaseStatus(s);
  *out = fallback;
  int64_t i = 0;
  if (OrtStatus* t = api.KernelInfoGetAttribute_int64(info, name, &i)) {
    api.ReleaseStatus(t);
    return nullptr;
  }
  return Error(api, ORT_INVALID_ARGUMENT, spec, std::string("attribute ") + name + " must be a float");
}

class CudaKernel {
 public:
  CudaKernel(const OrtApi& api, const OpSpec& spec, ONNXTensorElementDataType t, ONNXTensorElementDataType s)
      : api_(api), spec_(spec), t_(t), s_(s) {}

  OrtStatus* Init(const OrtKernelInfo* info) {
    int64_t order = 0;
    if (OrtStatus* s = ReadInt(api_, info, spec_, "axis", -1, &axis_)) return s;
    if (OrtStatus* s = ReadFloat(api_, info, spec_, "epsilon", 1e-5f, &epsilon_)) return s;
    if (OrtStatus* s = ReadInt(api_, info, spec_, "cast_before_scale", 0, &order)) return s;
    if (spec_.rms) {
      if (OrtStatus* s = ReadFloat(api_, info, spec_, "scale_offset", 0.f, &scale_offset_)) return s;
    }
    if (spec_.residual == 1) {
      if (OrtStatus* s = ReadFloat(api_, info, spec_, "alpha", 1.f, &alpha_)) return s;
    }
    if (!(std::isfinite(epsilon_) && epsilon_ >= 0.f)) {
      return Error(api_, ORT_INVALID_ARGUMENT, spec_, "attribute epsilon must be a finite number >= 0, got " +
                                                          std::to_string(epsilon_));
    }
    if (!std::isfinite(scale_offset_)) return Error(api_, ORT_INVALID_ARGUMENT, spec_, "attribute scale_offset must be finite");
    if (!std::isfinite(alpha_)) return Error(api_, ORT_INVALID_ARGUMENT, spec_, "attribute alpha must be finite");
    if (order != 0 && order != 1) {
      return Error(api_, ORT_INVALID_ARGUMENT, spec_, "attribute cast_before_scale must be 0 or 1, got " +
                                                          std::to_string(order));
    }
    cast_before_scale_ = static_cast<int32_t>(order);
    return nullptr;
  }

  OrtStatus* Compute(OrtKernelContext* context) noexcept {
    try {
      return ComputeImpl(context);
    } catch (const std::exception& e) {
      return Error(api_, ORT_FAIL, spec_, std::string("internal error: ") + e.what());
    } catch (...) {
      return api_.CreateStatus(ORT_FAIL, "onnxnorm (CUDA): internal error");
    }
  }

 private:
  // Weight rows of a weight input: its shape after leading 1s must be a suffix of X's shape
  // covering X.shape[axis:].
  OrtStatus* WeightRows(const char* name, const Input& w, const std::vector<int64_t>& x, int64_t axis,
                        int64_t* rows) const {
    if (w.type != s_) {
      return Error(api_, ORT_INVALID_ARGUMENT, spec_, std::string(name) + " must be " + TypeName(s_) + ", got " +
                                                          TypeName(w.type));
    }
    const size_t rank = x.size(), norm_rank = rank - static_cast<size_t>(axis);
    size_t first = 0;
    while (w.dims.size() - first > norm_rank && w.dims[first] == 1) ++first;
    const size_t k = w.dims.size() - first;
    bool fits = k >= norm_rank && k <= rank;
    for (size_t i = 0; fits && i < k; ++i) fits = w.dims[first + i] == x[rank - k + i];
    if (!fits) {
      return Error(api_, ORT_INVALID_ARGUMENT, spec_,
                   std::string(name) + " of shape " + Shape(w.dims) + " does not fit X of shape " + Shape(x) +
                       " normalized from axis " + std::to_string(axis) +
                       ": it must equal a suffix of X's shape that covers X.shape[" + std::to_string(axis) +
                       ":] (leading 1s are ignored)");
    }
    int64_t r = 1;
    for (size_t i = rank - k; i < static_cast<size_t>(axis); ++i) r *= x[i];
    *rows = r > 0 ? r : 1;
    return nullptr;
  }

  OrtStatus* ComputeImpl(OrtKernelContext* context) {
    const size_t n_inputs = spec_.inputs.size();
    Input in[6];
    for (size_t i = 0; i < n_inputs; ++i) {
      if (OrtStatus* s = ReadInput(api_, context, i, &in[i])) return s;
    }
    const Input& x = in[0];
    if (!x.present) return Error(api_, ORT_INVALID_ARGUMENT, spec_, "input X is required");
    if (x.type != t_) {
      return Error(api_, ORT_INVALID_ARGUMENT, spec_, std::string("X must be ") + TypeName(t_) + ", got " + TypeName(x.type));
    }
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    if (rank == 0) return Error(api_, ORT_INVALID_ARGUMENT, spec_, "X must have rank >= 1, got a scalar (shape [])");
    if (axis_ < -rank || axis_ >= rank) {
      return Error(api_, ORT_INVALID_ARGUMENT, spec_,
                   "axis " + std::to_string(axis_) + " is out of range [" + std::to_string(-rank) + ", " +
                       std::to_string(rank) + ") for X of shape " + Shape(x.dims));
    }
    const int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    int64_t rows = 1, cols = 1;
    for (int64_t i = 0; i < rank; ++i) (i < axis ? rows : cols) *= x.dims[i];
    if (cols == 0 && rows > 0) {
      return Error(api_, ORT_INVALID_ARGUMENT, spec_,
                   "the normalized dimensions X.shape[" + std::to_string(axis) + ":] of X of shape " + Shape(x.dims) +
                       " hold no elements: statistics over an empty set are undefined");
    }

    OnnxNormCudaArgs args;
    onnxnorm_cuda_default_args(&args, spec_.op);
    args.x_type = CudaType(t_);
    args.weight_type = CudaType(s_);
    args.cast_before_scale = cast_before_scale_;
    args.rows = rows;
    args.cols = cols;
    args.x = x.data;
    args.epsilon = epsilon_;
    args.scale_offset = spec_.rms ? scale_offset_ : 0.f;
    args.alpha = spec_.residual == 1 ? alpha_ : 1.f;

    for (size_t i = 1; i < n_inputs; ++i) {
      const Param& p = spec_.inputs[i];
      const Input& v = in[i];
      const std::string name = p.name;
      if (!v.present) {
        if (!p.optional) return Error(api_, ORT_INVALID_ARGUMENT, spec_, "input " + name + " is required");
        continue;
      }
      if (name == "Residual") {
        if (v.type != t_ || v.dims != x.dims) {
          return Error(api_, ORT_INVALID_ARGUMENT, spec_,
                       std::string("Residual must have X's type and shape (") + TypeName(t_) + Shape(x.dims) +
                           "), got " + TypeName(v.type) + Shape(v.dims));
        }
        args.residual = v.data;
        continue;
      }
      int64_t wrows = 1;
      if (OrtStatus* s = WeightRows(p.name, v, x.dims, axis, &wrows)) return s;
      if (name == "Scale") args.scale = v.data, args.scale_rows = wrows;
      else if (name == "Bias") args.bias = v.data, args.bias_rows = wrows;
      else if (name == "InnerScale") args.inner_scale = v.data, args.inner_scale_rows = wrows;
      else if (name == "InnerBias") args.inner_bias = v.data, args.inner_bias_rows = wrows;
      else if (name == "XBias") args.xbias = v.data, args.xbias_rows = wrows;
    }

    size_t n_outputs = 0;
    if (OrtStatus* s = api_.KernelContext_GetOutputCount(context, &n_outputs)) return s;
    OrtValue* y = nullptr;
    if (OrtStatus* s = api_.KernelContext_GetOutput(context, 0, x.dims.data(), x.dims.size(), &y)) return s;
    OrtValue* sum = nullptr;
    if (spec_.residual != 0 && n_outputs > 1) {
      // an omitted optional output (absent, or named "") gives no value
      if (OrtStatus* s = api_.KernelContext_GetOutput(context, 1, x.dims.data(), x.dims.size(), &sum)) return s;
    }
    if (rows == 0) return nullptr;  // empty X: empty outputs, nothing to launch
    void* y_data = nullptr;
    if (OrtStatus* s = api_.GetTensorMutableData(y, &y_data)) return s;
    args.y = y_data;
    if (sum != nullptr) {
      void* sum_data = nullptr;
      if (OrtStatus* s = api_.GetTensorMutableData(sum, &sum_data)) return s;
      args.sum = sum_data;
    }

    void* stream = nullptr;
    if (OrtStatus* s = api_.KernelContext_GetGPUComputeStream(context, &stream)) return s;
    char message[512];
    const int rc = onnxnorm_cuda_launch(&args, stream, message, sizeof(message));
    if (rc != ONNXNORM_CUDA_OK) {
      return api_.CreateStatus(rc == ONNXNORM_CUDA_INVALID_ARGUMENT ? ORT_INVALID_ARGUMENT : ORT_FAIL, message);
    }
    return nullptr;
  }

  const OrtApi& api_;
  const OpSpec& spec_;
  ONNXTensorElementDataType t_, s_;
  int64_t axis_ = -1;
  float epsilon_ = 1e-5f;
  float scale_offset_ = 0.f;
  float alpha_ = 1.f;
  int32_t cast_before_scale_ = 0;
};

// ---------------------------------------------------------------------------------------------
// OrtCustomOp objects: one per (op, T, S); created once, never freed (ORT needs them to outlive
// every session)
// ---------------------------------------------------------------------------------------------
struct CudaOp : OrtCustomOp {
  const OpSpec* spec;
  ONNXTensorElementDataType t, s;
};

const CudaOp& Self(const OrtCustomOp* op) { return *static_cast<const CudaOp*>(op); }

ONNXTensorElementDataType TypeOf(const CudaOp& op, const Param& p) { return p.type == Var::kT ? op.t : op.s; }

OrtStatus* ORT_API_CALL CreateKernelV2(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                       void** kernel) {
  *kernel = nullptr;
  const CudaOp& self = Self(op);
  auto* k = new (std::nothrow) CudaKernel(*api, *self.spec, self.t, self.s);
  if (k == nullptr) return api->CreateStatus(ORT_FAIL, "onnxnorm (CUDA): out of memory");
  OrtStatus* status = nullptr;
  try {
    status = k->Init(info);
  } catch (...) {
    status = api->CreateStatus(ORT_FAIL, "onnxnorm (CUDA): cannot create the kernel");
  }
  if (status != nullptr) {
    delete k;
    return status;
  }
  *kernel = k;
  return nullptr;
}

OrtStatus* ORT_API_CALL ComputeV2(void* kernel, OrtKernelContext* context) {
  return static_cast<CudaKernel*>(kernel)->Compute(context);
}

void ORT_API_CALL Destroy(void* kernel) { delete static_cast<CudaKernel*>(kernel); }

const char* ORT_API_CALL GetName(const OrtCustomOp* op) { return Self(op).spec->name; }
const char* ORT_API_CALL GetProvider(const OrtCustomOp*) { return kCudaProvider; }
size_t ORT_API_CALL InputCount(const OrtCustomOp* op) { return Self(op).spec->inputs.size(); }
size_t ORT_API_CALL OutputCount(const OrtCustomOp* op) { return Self(op).spec->outputs.size(); }

ONNXTensorElementDataType ORT_API_CALL InputType(const OrtCustomOp* op, size_t i) {
  const CudaOp& o = Self(op);
  return i < o.spec->inputs.size() ? TypeOf(o, o.spec->inputs[i]) : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}
ONNXTensorElementDataType ORT_API_CALL OutputType(const OrtCustomOp* op, size_t i) {
  const CudaOp& o = Self(op);
  return i < o.spec->outputs.size() ? TypeOf(o, o.spec->outputs[i]) : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL InputChar(const OrtCustomOp* op, size_t i) {
  const CudaOp& o = Self(op);
  return i < o.spec->inputs.size() && o.spec->inputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL OutputChar(const OrtCustomOp* op, size_t i) {
  const CudaOp& o = Self(op);
  return i < o.spec->outputs.size() && o.spec->outputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
OrtMemType ORT_API_CALL InputMemory(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL VariadicMin(const OrtCustomOp*) { return 1; }
int ORT_API_CALL VariadicHomogeneity(const OrtCustomOp*) { return 1; }
int ORT_API_CALL StartVersion(const OrtCustomOp*) { return 1; }

std::vector<CudaOp>* BuildOps() {
  const ONNXTensorElementDataType f32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, f16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
                                  bf16 = ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
  const ONNXTensorElementDataType pairs[][2] = {{f32, f32}, {f16, f16}, {f16, f32}, {bf16, bf16}, {bf16, f32}};
  auto* ops = new std::vector<CudaOp>();
  ops->reserve(Specs().size() * 5);
  for (const OpSpec& spec : Specs()) {
    for (const auto& pair : pairs) {
      CudaOp op{};
      op.version = ORT_API_VERSION;
      op.GetName = &GetName;
      op.GetExecutionProviderType = &GetProvider;
      op.GetInputType = &InputType;
      op.GetInputTypeCount = &InputCount;
      op.GetOutputType = &OutputType;
      op.GetOutputTypeCount = &OutputCount;
      op.KernelDestroy = &Destroy;
      op.GetInputCharacteristic = &InputChar;
      op.GetOutputCharacteristic = &OutputChar;
      op.GetInputMemoryType = &InputMemory;
      op.GetVariadicInputMinArity = &VariadicMin;
      op.GetVariadicInputHomogeneity = &VariadicHomogeneity;
      op.GetVariadicOutputMinArity = &VariadicMin;
      op.GetVariadicOutputHomogeneity = &VariadicHomogeneity;
      op.CreateKernelV2 = &CreateKernelV2;
      op.KernelComputeV2 = &ComputeV2;
      op.InferOutputShapeFn = nullptr;
      op.GetStartVersion = &StartVersion;
      op.GetEndVersion = nullptr;
      op.spec = &spec;
      op.t = pair[0];
      op.s = pair[1];
      ops->push_back(op);
    }
  }
  return ops;
}

// ---------------------------------------------------------------------------------------------
// Registration through the CPU library
// ---------------------------------------------------------------------------------------------
std::mutex g_mutex;
const OrtApiBase* g_real_base = nullptr;
const OrtApi* g_real_api = nullptr;
OrtApi g_wrapped_api;                              // the real table with AddCustomOpDomain hooked
std::vector<OrtCustomOpDomain*> g_domains_with_cuda;  // domains our ops were added to
bool g_hook_called = false;

OrtStatus* ORT_API_CALL HookedAddCustomOpDomain(OrtSessionOptions* options, OrtCustomOpDomain* domain) NO_EXCEPTION {
  g_hook_called = true;
  bool seen = false;
  for (OrtCustomOpDomain* d : g_domains_with_cuda) seen = seen || d == domain;
  if (!seen) {
    static std::vector<CudaOp>* ops = BuildOps();  // never freed
    for (CudaOp& op : *ops) {
      if (OrtStatus* s = g_real_api->CustomOpDomain_Add(domain, &op)) return s;
    }
    g_domains_with_cuda.push_back(domain);
  }
  return g_real_api->AddCustomOpDomain(options, domain);
}

const OrtApi* ORT_API_CALL WrappedGetApi(uint32_t version) NO_EXCEPTION {
  return version == ORT_API_VERSION ? &g_wrapped_api : g_real_base->GetApi(version);
}

const char* ORT_API_CALL WrappedGetVersionString() NO_EXCEPTION { return g_real_base->GetVersionString(); }

OrtApiBase g_wrapped_base = {&WrappedGetApi, &WrappedGetVersionString};

std::string ThisLibraryFolder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&HookedAddCustomOpDomain), &info) == 0 || info.dli_fname == nullptr) return ".";
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Keeps this library loaded for the life of the process: its op objects sit in the CPU
// library's domain, which outlives any one session options.
void PinSelf() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&HookedAddCustomOpDomain), &info) != 0 && info.dli_fname != nullptr) {
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NODELETE);
  }
}

using RegisterFn = OrtStatus*(ORT_API_CALL*)(OrtSessionOptions*, const OrtApiBase*);

}  // namespace
}  // namespace cuda_ort
}  // namespace onnxnorm

using namespace onnxnorm::cuda_ort;

extern "C" ONNXNORM_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                     const OrtApiBase* api_base) {
  if (api_base == nullptr) return nullptr;
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    const OrtApi* api1 = api_base->GetApi(1);
    return api1 == nullptr ? nullptr
                           : api1->CreateStatus(ORT_FAIL,
                                                "onnxnorm (CUDA): this ONNX Runtime is older than the headers the "
                                                "onnxnorm CUDA library was built with");
  }
  try {
    std::lock_guard<std::mutex> lock(g_mutex);
    PinSelf();
    const char* override_path = std::getenv("ONNXNORM_LIBRARY");
    const std::string cpu_path = (override_path != nullptr && *override_path != '\0')
                                     ? std::string(override_path)
                                     : ThisLibraryFolder() + "/" + kCpuLibraryName;
    void* handle = dlopen(cpu_path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (handle == nullptr) {
      const char* why = dlerror();
      return api->CreateStatus(ORT_FAIL, ("onnxnorm (CUDA): cannot load the onnxnorm CPU library " + cpu_path + " (" +
                                          (why ? why : "unknown error") +
                                          "); it must sit next to the CUDA library or be named by ONNXNORM_LIBRARY")
                                             .c_str());
    }
    auto cpu_register = reinterpret_cast<RegisterFn>(dlsym(handle, "RegisterCustomOps"));
    if (cpu_register == nullptr) {
      return api->CreateStatus(ORT_FAIL, ("onnxnorm (CUDA): " + cpu_path + " has no RegisterCustomOps").c_str());
    }
    g_real_base = api_base;
    g_real_api = api;
    g_wrapped_api = *api;
    g_wrapped_api.AddCustomOpDomain = &HookedAddCustomOpDomain;
    g_hook_called = false;
    if (OrtStatus* s = cpu_register(options, &g_wrapped_base)) return s;
    if (!g_hook_called) {
      return api->CreateStatus(ORT_FAIL, ("onnxnorm (CUDA): the CPU library " + cpu_path +
                                          " registered no domain through this library's API table (built against "
                                          "other ONNX Runtime headers?); the CUDA kernels are not registered")
                                             .c_str());
    }
    return nullptr;
  } catch (...) {
    return api->CreateStatus(ORT_FAIL, "onnxnorm (CUDA): registration failed (out of memory?)");
  }
}

// {"domain": "onnxnorm", "provider": "CUDAExecutionProvider", "ops": [{"name", "inputs",
// "optional_inputs", "outputs", "types"}]}: the CUDA op table, for tests.
extern "C" ONNXNORM_EXPORT const char* onnxnorm_cuda_op_manifest(void) {
  static const std::string manifest = [] {
    std::string out = "{\"domain\":\"onnxnorm\",\"provider\":\"CUDAExecutionProvider\",\"ops\":[";
    bool first = true;
    for (const OpSpec& spec : Specs()) {
      out += first ? "" : ",";
      first = false;
      out += "{\"name\":\"" + std::string(spec.name) + "\",\"inputs\":[";
      std::string optional;
      for (size_t i = 0; i < spec.inputs.size(); ++i) {
        out += (i ? ",\"" : "\"") + std::string(spec.inputs[i].name) + "\"";
        if (spec.inputs[i].optional) optional += (optional.empty() ? "\"" : ",\"") + std::string(spec.inputs[i].name) + "\"";
      }
      out += "],\"optional_inputs\":[" + optional + "],\"outputs\":[";
      for (size_t i = 0; i < spec.outputs.size(); ++i) out += (i ? ",\"" : "\"") + std::string(spec.outputs[i].name) + "\"";
      out += "],\"attributes\":[\"axis\",\"epsilon\",\"cast_before_scale\"";
      if (spec.rms) out += ",\"scale_offset\"";
      if (spec.residual == 1) out += ",\"alpha\"";
      out += "],\"types\":[\"float32\",\"float16\",\"bfloat16\"]}";
    }
    return out + "]}";
  }();
  return manifest.c_str();
}

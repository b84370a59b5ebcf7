// The kernel of every onnxnorm node on either execution provider: attributes, input checks and
// shapes, outputs, one NormArgs; then the CPU row kernels on ORT's thread pool, or the CUDA
// launcher on ORT's compute stream. The op's spec (the generated op table) says which inputs and
// attributes it has.
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "cuda_library.h"
#include "norm_shapes.h"
#include "onnxnorm/cuda_launch.h"
#include "onnxnorm/kernels.h"
#include "op_table.h"
#include "ort_util.h"
#include "parallel.h"

namespace onnxnorm {
namespace ort {
namespace {

// The NormArgs fields of each weight input, by the input's name.
struct WeightField {
  const char* name;
  const void* NormArgs::* data;
  int64_t NormArgs::* rows;
};
constexpr WeightField kWeightFields[] = {
    {"Scale", &NormArgs::scale, &NormArgs::scale_rows},
    {"Bias", &NormArgs::bias, &NormArgs::bias_rows},
    {"XBias", &NormArgs::xbias, &NormArgs::xbias_rows},
    {"InnerScale", &NormArgs::inner_scale, &NormArgs::inner_scale_rows},
    {"InnerBias", &NormArgs::inner_bias, &NormArgs::inner_bias_rows},
};

constexpr size_t kMaxInputs = 8;

class NormKernel final : public Kernel {
 public:
  NormKernel(const OrtApi& api, const KernelEntry& entry) : Kernel(api, entry.spec->name), api_(api), entry_(entry) {}
  ~NormKernel() override {
    if (allocator_ != nullptr) api_.ReleaseAllocator(allocator_);
  }

  // Reads the attributes into the kernel's NormArgs template and maps the inputs onto its fields.
  OrtStatus* Init(const OrtKernelInfo* info) {
    const OpSpec& spec = *entry_.spec;
    const char* op = spec.name;
    base_.op = spec.id;
    base_.x_type = entry_.t;
    base_.weight_type = entry_.s;
    base_.y_type = entry_.u;
    if (entry_.y_from_node) {
      if (OrtStatus* s = ReadYType(info)) return s;
    }
    for (const AttrSpec& attr : spec.attributes) {
      OrtStatus* s = nullptr;
      if (std::strcmp(attr.name, "axis") == 0) {
        s = GetAttribute(api_, info, op, attr, &axis_);
      } else if (std::strcmp(attr.name, "epsilon") == 0) {
        s = GetAttribute(api_, info, op, attr, &base_.epsilon);
      } else if (std::strcmp(attr.name, "scale_offset") == 0) {
        s = GetAttribute(api_, info, op, attr, &base_.scale_offset);
      } else if (std::strcmp(attr.name, "alpha") == 0) {
        s = GetAttribute(api_, info, op, attr, &base_.alpha);
      } else if (std::strcmp(attr.name, "y_float32") == 0) {
        s = GetAttribute(api_, info, op, attr, &y_float32_);
      } else if (std::strcmp(attr.name, "cast_before_scale") == 0) {
        int64_t value = 0;
        s = GetAttribute(api_, info, op, attr, &value);
        base_.cast_before_scale = static_cast<int32_t>(value);
      } else if (std::strcmp(attr.name, "group_size") == 0) {
        s = GetAttribute(api_, info, op, attr, &group_size_);
        grouped_ = true;
      } else if (std::strcmp(attr.name, "activation") == 0) {
        int64_t value = 0;
        s = GetAttribute(api_, info, op, attr, &value);
        base_.activation = static_cast<int32_t>(value);
      } else if (std::strcmp(attr.name, "norm_before_gate") == 0) {
        int64_t value = 0;
        s = GetAttribute(api_, info, op, attr, &value);
        base_.norm_before_gate = static_cast<int32_t>(value);
      } else {
        return MakeError(api_, ORT_FAIL, op, std::string("the kernel does not know attribute ") + attr.name);
      }
      if (s != nullptr) return s;
    }
    // the attribute y_float32 says what the node's Y is: float32 for a 16-bit X (the mixed form)
    const bool float32_y = base_.y_type == ElemType::kFloat32 && entry_.t != ElemType::kFloat32;
    if ((y_float32_ == 1) != float32_y) {
      return MakeError(api_, ORT_INVALID_ARGUMENT, op,
                       std::string("attribute y_float32 is ") + std::to_string(y_float32_) + " but Y is " +
                           kElemTypeNames[static_cast<int>(base_.y_type)] + " and X " +
                           kElemTypeNames[static_cast<int>(entry_.t)] +
                           " (y_float32 = 1: a float32 Y of a float16 or bfloat16 X with float32 weights)");
    }
    if (spec.inputs.size() > kMaxInputs) return MakeError(api_, ORT_FAIL, op, "too many inputs");
    for (size_t i = 1; i < spec.inputs.size(); ++i) {
      const char* name = spec.inputs[i].name;
      if (std::strcmp(name, "Residual") == 0) {
        residual_slot_ = static_cast<int>(i);
        continue;
      }
      if (std::strcmp(name, "Gate") == 0) {
        gate_slot_ = static_cast<int>(i);
        continue;
      }
      if (std::strcmp(name, "Y_scale") == 0) {
        y_scale_slot_ = static_cast<int>(i);
        continue;
      }
      if (std::strcmp(name, "Y_zero_point") == 0) {
        y_zero_point_slot_ = static_cast<int>(i);
        continue;
      }
      weights_[i] = nullptr;
      for (const WeightField& w : kWeightFields) {
        if (std::strcmp(w.name, name) == 0) weights_[i] = &w;
      }
      if (weights_[i] == nullptr)
        return MakeError(api_, ORT_FAIL, op, std::string("the kernel does not know input ") + name);
    }
    return nullptr;
  }

  // Y's type: the row's, or the node's where the row takes either (KernelEntry::y_from_node).
  ElemType YType() const { return base_.y_type; }

  void UseCpu(NormRowsFn rows, NormRowsFn small_call_rows) {
    cpu_rows_ = rows;
    cpu_small_call_rows_ = small_call_rows;
  }
  // The CUDA launchers; allocator: the provider's, for a dynamic quantized op's scratch (owned
  // by the kernel from here; nullptr for the other ops).
  // The element type of the node's Y, which must be X's or, for float32 weights, float32.
  OrtStatus* ReadYType(const OrtKernelInfo* info) {
    const char* op = entry_.spec->name;
    OrtTypeInfo* type_info = nullptr;
    if (OrtStatus* s = api_.KernelInfo_GetOutputTypeInfo(info, 0, &type_info)) return s;
    const OrtTensorTypeAndShapeInfo* tensor = nullptr;  // owned by type_info
    ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    OrtStatus* s = api_.CastTypeInfoToTensorInfo(type_info, &tensor);
    if (s == nullptr && tensor != nullptr) s = api_.GetTensorElementType(tensor, &type);
    api_.ReleaseTypeInfo(type_info);
    if (s != nullptr) return s;
    if (type == OnnxType(entry_.t)) {
      base_.y_type = entry_.t;
    } else if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && entry_.s == ElemType::kFloat32) {
      base_.y_type = ElemType::kFloat32;
    } else {
      return MakeError(api_, ORT_INVALID_ARGUMENT, op,
                       std::string("Y must be of X's type ") + kElemTypeNames[static_cast<int>(entry_.t)] +
                           " or float32, got " + TypeName(type));
    }
    return nullptr;
  }

  void UseCuda(CudaLaunchFn launch, CudaLaunchQuantizedFn quantized, OrtAllocator* allocator) {
    cuda_launch_ = launch;
    cuda_launch_quantized_ = quantized;
    allocator_ = allocator;
  }
  // A quantized op: its static pass, or its dynamic range and quantize passes.
  void UseQuant(cpu::QuantRowsFn rows, cpu::QuantRowsFn range) {
    quant_rows_ = rows;
    quant_range_ = range;
  }

 private:
  OrtStatus* CheckType(const char* name, const InputTensor& t, ElemType expected) const {
    if (t.type == OnnxType(expected)) return nullptr;
    return MakeError(
        api_, ORT_INVALID_ARGUMENT, entry_.spec->name,
        std::string(name) + " must be " + kElemTypeNames[static_cast<int>(expected)] + ", got " + TypeName(t.type));
  }

  OrtStatus* Run(OrtKernelContext* context) override {
    const OpSpec& spec = *entry_.spec;
    const char* op = spec.name;
    size_t input_count = 0;
    if (OrtStatus* s = api_.KernelContext_GetInputCount(context, &input_count)) return s;
    InputTensor x;
    if (OrtStatus* s = GetInput(api_, context, 0, input_count, &x)) return s;
    if (!x.present) return MakeError(api_, ORT_INVALID_ARGUMENT, op, "input X is required");
    if (OrtStatus* s = CheckType("X", x, entry_.t)) return s;

    NormGeometry geometry;
    if (OrtStatus* s = ResolveNormGeometry(api_, op, x.dims, axis_, &geometry)) return s;
    // GatedRMSNorm's groups become rows (its weights and gate follow them)
    if (grouped_) {
      if (OrtStatus* s = ResolveGroups(api_, op, x.dims, group_size_, &geometry)) return s;
    }

    NormArgs args = base_;
    args.x = x.data;
    args.rows = geometry.rows;
    args.cols = geometry.cols;
    cpu::QuantArgs quant;
    quant.q_type = entry_.q;
    const void* y_scale_data = nullptr;  // the static quantizer's inputs, as given (device memory on CUDA)
    const void* y_zero_point_data = nullptr;

    for (size_t i = 1; i < spec.inputs.size(); ++i) {
      const char* name = spec.inputs[i].name;
      InputTensor input;
      if (OrtStatus* s = GetInput(api_, context, i, input_count, &input)) return s;
      if (!input.present) {
        if (!spec.inputs[i].optional) {
          return MakeError(api_, ORT_INVALID_ARGUMENT, op, std::string("input ") + name + " is required");
        }
        continue;
      }
      if (static_cast<int>(i) == y_scale_slot_ || static_cast<int>(i) == y_zero_point_slot_) {
        const bool is_scale = static_cast<int>(i) == y_scale_slot_;
        if (OrtStatus* s = CheckType(name, input, is_scale ? entry_.t : entry_.q)) return s;
        if (input.dims.rank() > 1 || (input.dims.rank() == 1 && input.dims[0] != 1)) {
          return MakeError(api_, ORT_INVALID_ARGUMENT, op,
                           std::string(name) + " of shape " + FormatShape(input.dims) +
                               " must be a scalar or a one-element 1-D tensor (per-tensor quantization)");
        }
        (is_scale ? y_scale_data : y_zero_point_data) = input.data;
        if (cuda_launch_quantized_ != nullptr) continue;  // read by the CUDA kernels
        if (is_scale) {
          quant.scale = cpu::ScalarToFloat(entry_.t, input.data);
        } else if (entry_.q == ElemType::kInt8) {
          quant.zero_point = *static_cast<const int8_t*>(input.data);
        } else if (entry_.q == ElemType::kUInt8) {
          quant.zero_point = *static_cast<const uint8_t*>(input.data);
        }  // (float8e4m3fn: the zero point gives Y's type only; its value is not used)
        continue;
      }
      if (static_cast<int>(i) == residual_slot_ || static_cast<int>(i) == gate_slot_) {
        if (OrtStatus* s = CheckType(name, input, entry_.t)) return s;
        if (OrtStatus* s = CheckSameShape(api_, op, name, input.dims, x.dims)) return s;
        (static_cast<int>(i) == residual_slot_ ? args.residual : args.gate) = input.data;
        continue;
      }
      const WeightField& field = *weights_[i];
      if (OrtStatus* s = CheckType(name, input, entry_.s)) return s;
      OrtStatus* status =
          grouped_
              ? ResolveGroupedWeightRows(api_, op, name, input.dims, x.dims, geometry, group_size_, &(args.*field.rows))
              : ResolveWeightRows(api_, op, name, input.dims, x.dims, geometry, &(args.*field.rows));
      if (status != nullptr) return status;
      args.*field.data = input.data;
    }

    if (spec.quantize != QuantizeKind::kNone) {
      return ComputeQuantized(context, args, x.dims, quant, y_scale_data, y_zero_point_data);
    }

    OrtValue* y = nullptr;
    if (OrtStatus* s = api_.KernelContext_GetOutput(context, 0, x.dims.data(), x.dims.rank(), &y)) return s;
    OrtValue* sum = nullptr;
    if (spec.outputs.size() > 1) {
      size_t outputs = 0;
      if (OrtStatus* s = api_.KernelContext_GetOutputCount(context, &outputs)) return s;
      // An omitted optional output (absent, or named "") gives no value.
      if (outputs > 1) {
        if (OrtStatus* s = api_.KernelContext_GetOutput(context, 1, x.dims.data(), x.dims.rank(), &sum)) return s;
      }
    }
    if (geometry.rows == 0) return nullptr;  // empty X: empty outputs
    void* data = nullptr;
    if (OrtStatus* s = api_.GetTensorMutableData(y, &data)) return s;
    args.y = data;
    if (sum != nullptr) {
      if (OrtStatus* s = api_.GetTensorMutableData(sum, &data)) return s;
      args.sum = data;
    }

    if (cpu_rows_ != nullptr) {
      // rows * cols is the element count of a tensor that exists, so it does not overflow
      const bool small = args.rows * args.cols < cpu::kSmallCallElements;
      RunRows(api_, context, small ? cpu_small_call_rows_ : cpu_rows_, args);
      return nullptr;
    }
    void* stream = nullptr;
    if (OrtStatus* s = api_.KernelContext_GetGPUComputeStream(context, &stream)) return s;
    char message[512] = "";
    const int rc = cuda_launch_(&args, stream, message, sizeof(message));
    if (rc == ONNXNORM_CUDA_OK) return nullptr;
    return api_.CreateStatus(rc == ONNXNORM_CUDA_INVALID_ARGUMENT ? ORT_INVALID_ARGUMENT : ORT_FAIL, message);
  }

  // The data of output `name` of the op (created with dims), or nullptr when the node leaves it out.
  OrtStatus* Output(OrtKernelContext* context, size_t outputs, const char* name, const int64_t* dims, size_t rank,
                    void** data) {
    *data = nullptr;
    const OpSpec& spec = *entry_.spec;
    for (size_t k = 0; k < spec.outputs.size() && k < outputs; ++k) {
      if (std::strcmp(spec.outputs[k].name, name) != 0) continue;
      OrtValue* value = nullptr;
      if (OrtStatus* s = api_.KernelContext_GetOutput(context, k, dims, rank, &value)) return s;
      if (value == nullptr) return nullptr;  // an omitted optional output
      return api_.GetTensorMutableData(value, data);
    }
    return nullptr;
  }

  // A quantized op, its inputs read into args and quant: the outputs, then the static pass, or
  // the dynamic range pass, the scale and zero point, and the quantize pass.
  OrtStatus* ComputeQuantized(OrtKernelContext* context, NormArgs& args, const Dims& dims, cpu::QuantArgs quant,
                              const void* y_scale_in, const void* y_zero_point_in) {
    const bool dynamic = entry_.spec->quantize == QuantizeKind::kDynamic;
    size_t outputs = 0;
    if (OrtStatus* s = api_.KernelContext_GetOutputCount(context, &outputs)) return s;
    void *q = nullptr, *y_float = nullptr, *sum = nullptr, *scale = nullptr, *zero_point = nullptr;
    if (OrtStatus* s = Output(context, outputs, "Y", dims.data(), dims.rank(), &q)) return s;
    if (OrtStatus* s = Output(context, outputs, "Y_float", dims.data(), dims.rank(), &y_float)) return s;
    if (OrtStatus* s = Output(context, outputs, "Sum", dims.data(), dims.rank(), &sum)) return s;
    if (dynamic) {
      if (OrtStatus* s = Output(context, outputs, "Y_scale", nullptr, 0, &scale)) return s;
      if (OrtStatus* s = Output(context, outputs, "Y_zero_point", nullptr, 0, &zero_point)) return s;
    }
    args.y = args.rows > 0 ? y_float : nullptr;
    args.sum = args.rows > 0 ? sum : nullptr;
    quant.q = q;
    if (cuda_launch_quantized_ != nullptr) {
      CudaQuantArgs cuda_quant;
      cuda_quant.q_type = entry_.q;
      cuda_quant.q = q;
      cuda_quant.y_scale = dynamic ? scale : const_cast<void*>(y_scale_in);
      cuda_quant.y_zero_point = dynamic ? zero_point : const_cast<void*>(y_zero_point_in);
      return LaunchQuantizedCuda(context, args, cuda_quant);
    }
    if (!dynamic) {
      if (args.rows > 0) RunQuantRows(api_, context, quant_rows_, args, quant);
      return nullptr;
    }
    float lo = INFINITY, hi = -INFINITY;
    std::unique_ptr<float[]> scratch;
    if (args.rows > 0) {
      // (the one allocation of a call: the rows' statistics and ranges between the two passes)
      scratch.reset(new (std::nothrow) float[static_cast<size_t>(args.rows * cpu::kQuantScratchFloats)]);
      if (!scratch) return MakeError(api_, ORT_FAIL, entry_.spec->name, "out of memory");
      quant.row_scratch = scratch.get();
      RunQuantRows(api_, context, quant_range_, args, quant);
      for (int64_t r = 0; r < args.rows; ++r) {
        const float* row = scratch.get() + r * cpu::kQuantScratchFloats;
        lo = row[3] < lo ? row[3] : lo;
        hi = row[4] > hi ? row[4] : hi;
      }
    }
    cpu::DynamicQuantParams(lo, hi, &quant.scale, &quant.zero_point);
    if (scale != nullptr) *static_cast<float*>(scale) = quant.scale;
    if (zero_point != nullptr) *static_cast<uint8_t*>(zero_point) = static_cast<uint8_t>(quant.zero_point);
    if (args.rows > 0) RunQuantRows(api_, context, quant_rows_, args, quant);
    return nullptr;
  }

  // The CUDA launch of a quantized op. A dynamic op's scratch (two floats per row) comes from the
  // provider's allocator (on the CUDA provider, ORT's device arena) and goes back to it once the
  // launches are queued: ORT's kernels use their scratch so, the next kernel that gets the memory
  // running after these on the compute stream.
  OrtStatus* LaunchQuantizedCuda(OrtKernelContext* context, const NormArgs& args, CudaQuantArgs quant) {
    void* stream = nullptr;
    if (OrtStatus* s = api_.KernelContext_GetGPUComputeStream(context, &stream)) return s;
    const bool dynamic = entry_.spec->quantize == QuantizeKind::kDynamic;
    if (dynamic && args.rows > 0) {
      const size_t bytes = static_cast<size_t>(args.rows) * kCudaQuantScratchBytesPerRow;
      quant.scratch = allocator_ != nullptr ? allocator_->Alloc(allocator_, bytes) : nullptr;
      if (quant.scratch == nullptr) {
        return MakeError(api_, ORT_FAIL, entry_.spec->name,
                         "cannot allocate " + std::to_string(bytes) + " bytes of scratch");
      }
    }
    char message[512] = "";
    const int rc = cuda_launch_quantized_(&args, &quant, stream, message, sizeof(message));
    if (quant.scratch != nullptr) allocator_->Free(allocator_, quant.scratch);
    if (rc == ONNXNORM_CUDA_OK) return nullptr;
    return api_.CreateStatus(rc == ONNXNORM_CUDA_INVALID_ARGUMENT ? ORT_INVALID_ARGUMENT : ORT_FAIL, message);
  }

  const OrtApi& api_;
  const KernelEntry& entry_;
  NormArgs base_;  // op, types and attributes; the rest is filled per call
  int64_t axis_ = attr_default::kAxis;
  int64_t y_float32_ = attr_default::kYFloat32;
  int residual_slot_ = -1;
  int gate_slot_ = -1;        // GatedRMSNorm's Gate
  bool grouped_ = false;      // the op has groups (attribute group_size: GatedRMSNorm)
  int64_t group_size_ = attr_default::kGroupSize;
  int y_scale_slot_ = -1;       // the quantized ops' QuantizeLinear inputs
  int y_zero_point_slot_ = -1;
  cpu::QuantRowsFn quant_rows_ = nullptr;   // static pass, or dynamic quantize pass
  cpu::QuantRowsFn quant_range_ = nullptr;  // dynamic range pass
  const WeightField* weights_[kMaxInputs] = {};  // by input index
  NormRowsFn cpu_rows_ = nullptr;
  NormRowsFn cpu_small_call_rows_ = nullptr;  // the same bits, for calls below cpu::kSmallCallElements
  CudaLaunchFn cuda_launch_ = nullptr;
  CudaLaunchQuantizedFn cuda_launch_quantized_ = nullptr;
  OrtAllocator* allocator_ = nullptr;  // a dynamic quantized op's on CUDA: for its scratch
};

// A new kernel for entry with its attributes read, or nullptr and the error in *status.
NormKernel* NewKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry, OrtStatus** status) {
  auto* kernel = new (std::nothrow) NormKernel(api, entry);
  if (kernel == nullptr) {
    *status = api.CreateStatus(ORT_FAIL, "onnxnorm: out of memory");
    return nullptr;
  }
  if ((*status = kernel->Init(info)) != nullptr) {
    delete kernel;
    return nullptr;
  }
  return kernel;
}

}  // namespace

OrtStatus* CreateCpuKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry, Kernel** out) {
  *out = nullptr;
  OrtStatus* status = nullptr;
  NormKernel* kernel = NewKernel(api, info, entry, &status);
  if (kernel == nullptr) return status;
  const OpSpec& spec = *entry.spec;
  if (spec.quantize != QuantizeKind::kNone) {
    const bool dynamic = spec.quantize == QuantizeKind::kDynamic;
    cpu::QuantRowsFn rows =
        cpu::GetQuantRows(spec.norm, spec.residual, dynamic ? cpu::QuantPass::kQuantize : cpu::QuantPass::kStatic,
                          entry.t, entry.s, entry.q);
    cpu::QuantRowsFn range =
        dynamic ? cpu::GetQuantRows(spec.norm, spec.residual, cpu::QuantPass::kRange, entry.t, entry.s, entry.q)
                : nullptr;
    if (rows == nullptr || (dynamic && range == nullptr)) {
      delete kernel;
      return MakeError(api, ORT_FAIL, spec.name,
                       std::string("no CPU kernel for X of type ") + kElemTypeNames[static_cast<int>(entry.t)] +
                           " with weights of type " + kElemTypeNames[static_cast<int>(entry.s)] + " and Y of type " +
                           kElemTypeNames[static_cast<int>(entry.q)]);
    }
    kernel->UseQuant(rows, range);
    *out = kernel;
    return nullptr;
  }
  NormRowsFn rows = cpu::GetNormRows(entry.spec->norm, entry.spec->residual, entry.t, entry.s, kernel->YType());
  // (GatedRMSNorm's small calls keep the widest vectors: its gate's activation costs more per
  // element in 8 lanes than a 512-bit warm-up, as bfloat16's conversions do; kernels.h)
  bool gated = false;
  for (const ParamSpec& p : spec.inputs) gated = gated || std::strcmp(p.name, "Gate") == 0;
  NormRowsFn small_call_rows =
      gated ? rows
            : cpu::GetNormRowsForSmallCalls(entry.spec->norm, entry.spec->residual, entry.t, entry.s, kernel->YType());
  if (rows == nullptr || small_call_rows == nullptr) {
    const ElemType y_type = kernel->YType();
    delete kernel;
    return MakeError(api, ORT_FAIL, entry.spec->name,
                     std::string("no CPU kernel for X of type ") + kElemTypeNames[static_cast<int>(entry.t)] +
                         " with weights of type " + kElemTypeNames[static_cast<int>(entry.s)] + " and Y of type " +
                         kElemTypeNames[static_cast<int>(y_type)]);
  }
  kernel->UseCpu(rows, small_call_rows);
  *out = kernel;
  return nullptr;
}

OrtStatus* CreateCudaKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry, Kernel** out) {
  *out = nullptr;
  OrtStatus* status = nullptr;
  NormKernel* kernel = NewKernel(api, info, entry, &status);
  if (kernel == nullptr) return status;
  std::string error;
  const CudaLaunchers* launchers = LoadCudaLaunchers(&error);
  if (launchers == nullptr) {
    delete kernel;
    return MakeError(api, ORT_FAIL, entry.spec->name, error);
  }
  OrtAllocator* allocator = nullptr;
  if (entry.spec->quantize == QuantizeKind::kDynamic) {
    if (OrtStatus* s = api.KernelInfoGetAllocator(info, OrtMemTypeDefault, &allocator)) {
      delete kernel;
      return s;
    }
  }
  kernel->UseCuda(launchers->launch,
                  entry.spec->quantize != QuantizeKind::kNone ? launchers->launch_quantized : nullptr, allocator);
  *out = kernel;
  return nullptr;
}

}  // namespace ort
}  // namespace onnxnorm

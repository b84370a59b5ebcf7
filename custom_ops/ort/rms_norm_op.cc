// ORT glue of RMSNorm(X, Scale?, Bias?) -> Y: attributes, input checks, output, dispatch.
#include <exception>
#include <new>
#include <string>

#include "norm_shapes.h"
#include "onnxnorm/kernels.h"
#include "op_table.h"
#include "ort_util.h"
#include "parallel.h"

namespace onnxnorm {
namespace ort {
namespace {

class RMSNormKernel final : public Kernel {
 public:
  RMSNormKernel(const OrtApi& api, const KernelEntry& entry) : api_(api), entry_(entry) {}

  OrtStatus* Init(const OrtKernelInfo* info) {
    const char* op = entry_.spec->name;
    int64_t cast_before_scale = 0;
    if (OrtStatus* s = GetAttribute(api_, info, op, kAttrAxis, &axis_)) return s;
    if (OrtStatus* s = GetAttribute(api_, info, op, kAttrEpsilon, &epsilon_)) return s;
    if (OrtStatus* s = GetAttribute(api_, info, op, kAttrScaleOffset, &scale_offset_)) return s;
    if (OrtStatus* s = GetAttribute(api_, info, op, kAttrCastBeforeScale, &cast_before_scale)) return s;
    cast_before_scale_ = cast_before_scale != 0;

    if (!ToElemType(entry_.t, &x_type_) || !ToElemType(entry_.s, &weight_type_) ||
        (rows_fn_ = cpu::GetRMSNormRows(x_type_, weight_type_, weight_type_)) == nullptr) {
      return MakeError(api_, ORT_FAIL, op,
                       std::string("no CPU kernel for X of type ") + TypeName(entry_.t) + " with Scale/Bias of type " +
                           TypeName(entry_.s));
    }
    return nullptr;
  }

  OrtStatus* Compute(OrtKernelContext* context) noexcept override {
    try {
      return ComputeImpl(context);
    } catch (const std::exception& e) {
      return Fail(e.what());
    } catch (...) {
      return Fail("unknown error");
    }
  }

 private:
  OrtStatus* Fail(const char* what) noexcept {
    try {
      return MakeError(api_, ORT_FAIL, entry_.spec->name, std::string("internal error: ") + what);
    } catch (...) {
      return api_.CreateStatus(ORT_FAIL, "onnxnorm::RMSNorm: internal error");
    }
  }

  OrtStatus* CheckType(const char* name, const InputTensor& t, ONNXTensorElementDataType expected) const {
    if (t.type == expected) return nullptr;
    return MakeError(api_, ORT_INVALID_ARGUMENT, entry_.spec->name,
                     std::string(name) + " must be " + TypeName(expected) + ", got " + TypeName(t.type));
  }

  OrtStatus* ComputeImpl(OrtKernelContext* context) {
    const char* op = entry_.spec->name;
    InputTensor x, scale, bias;
    if (OrtStatus* s = GetInput(api_, context, 0, &x)) return s;
    if (OrtStatus* s = GetInput(api_, context, 1, &scale)) return s;
    if (OrtStatus* s = GetInput(api_, context, 2, &bias)) return s;
    if (!x.present) return MakeError(api_, ORT_INVALID_ARGUMENT, op, "input X is required");
    if (OrtStatus* s = CheckType("X", x, entry_.t)) return s;

    NormGeometry geometry;
    if (OrtStatus* s = ResolveNormGeometry(api_, op, x.dims, axis_, &geometry)) return s;

    NormArgs args;
    args.x = x.data;
    args.x_type = x_type_;
    args.rows = geometry.rows;
    args.cols = geometry.cols;
    args.epsilon = epsilon_;
    args.scale_offset = scale_offset_;
    args.cast_before_scale = cast_before_scale_;
    if (scale.present) {
      if (OrtStatus* s = CheckType("Scale", scale, entry_.s)) return s;
      if (OrtStatus* s = ResolveWeightRows(api_, op, "Scale", scale.dims, x.dims, geometry, &args.scale_rows)) {
        return s;
      }
      args.scale = scale.data;
      args.scale_type = weight_type_;
    }
    if (bias.present) {
      if (OrtStatus* s = CheckType("Bias", bias, entry_.s)) return s;
      if (OrtStatus* s = ResolveWeightRows(api_, op, "Bias", bias.dims, x.dims, geometry, &args.bias_rows)) {
        return s;
      }
      args.bias = bias.data;
      args.bias_type = weight_type_;
    }

    OrtValue* y = nullptr;
    if (OrtStatus* s = api_.KernelContext_GetOutput(context, 0, x.dims.data(), x.dims.rank(), &y)) return s;
    if (geometry.rows == 0) return nullptr;  // empty X: empty Y
    void* y_data = nullptr;
    if (OrtStatus* s = api_.GetTensorMutableData(y, &y_data)) return s;
    args.y = y_data;

    RunRows(api_, context, rows_fn_, args);
    return nullptr;
  }

  const OrtApi& api_;
  const KernelEntry& entry_;
  int64_t axis_ = -1;
  float epsilon_ = 1e-5f;
  float scale_offset_ = 0.f;
  bool cast_before_scale_ = false;
  ElemType x_type_ = ElemType::kFloat32;
  ElemType weight_type_ = ElemType::kFloat32;
  NormRowsFn rows_fn_ = nullptr;
};

}  // namespace

OrtStatus* CreateRMSNormKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry,
                               Kernel** out) {
  *out = nullptr;
  auto* kernel = new (std::nothrow) RMSNormKernel(api, entry);
  if (kernel == nullptr) return api.CreateStatus(ORT_FAIL, "onnxnorm::RMSNorm: out of memory");
  if (OrtStatus* s = kernel->Init(info)) {
    delete kernel;
    return s;
  }
  *out = kernel;
  return nullptr;
}

}  // namespace ort
}  // namespace onnxnorm

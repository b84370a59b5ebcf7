// ORT glue of every onnxnorm op: attributes, input checks, outputs, dispatch to the row kernels.
// One kernel class serves all ops; the op's spec (op_table.h) says which inputs it has.
#include <cstring>
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

// Positions of the inputs of each op family (-1: the op has no such input).
struct InputSlots {
  int residual = -1, scale = 1, bias = 2, xbias = -1, inner_scale = -1, inner_bias = -1;
};

InputSlots SlotsOf(ResidualKind residual) {
  InputSlots s;
  if (residual == ResidualKind::kSkip) {
    s.residual = 1, s.scale = 2, s.bias = 3, s.xbias = 4;
  } else if (residual == ResidualKind::kSandwich) {
    s.residual = 1, s.inner_scale = 2, s.inner_bias = 3, s.scale = 4, s.bias = 5;
  }
  return s;
}

class NormKernel final : public Kernel {
 public:
  NormKernel(const OrtApi& api, const KernelEntry& entry)
      : api_(api), entry_(entry), slots_(SlotsOf(entry.spec->residual)) {}

  OrtStatus* Init(const OrtKernelInfo* info) {
    const char* op = entry_.spec->name;
    for (const AttrSpec& attr : entry_.spec->attributes) {
      OrtStatus* s = nullptr;
      if (std::strcmp(attr.name, "axis") == 0) {
        s = GetAttribute(api_, info, op, attr, &axis_);
      } else if (std::strcmp(attr.name, "epsilon") == 0) {
        s = GetAttribute(api_, info, op, attr, &epsilon_);
      } else if (std::strcmp(attr.name, "scale_offset") == 0) {
        s = GetAttribute(api_, info, op, attr, &scale_offset_);
      } else if (std::strcmp(attr.name, "alpha") == 0) {
        s = GetAttribute(api_, info, op, attr, &alpha_);
      } else if (std::strcmp(attr.name, "cast_before_scale") == 0) {
        int64_t value = 0;
        s = GetAttribute(api_, info, op, attr, &value);
        cast_before_scale_ = value != 0;
      }
      if (s != nullptr) return s;
    }
    if (!ToElemType(entry_.t, &x_type_) || !ToElemType(entry_.s, &weight_type_) ||
        (rows_fn_ = cpu::GetNormRows(entry_.spec->norm, entry_.spec->residual, x_type_, weight_type_)) == nullptr) {
      return MakeError(api_, ORT_FAIL, op,
                       std::string("no CPU kernel for X of type ") + TypeName(entry_.t) + " with weights of type " +
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
      return api_.CreateStatus(ORT_FAIL, "onnxnorm: internal error");
    }
  }

  OrtStatus* CheckType(const char* name, const InputTensor& t, ONNXTensorElementDataType expected) const {
    if (t.type == expected) return nullptr;
    return MakeError(api_, ORT_INVALID_ARGUMENT, entry_.spec->name,
                     std::string(name) + " must be " + TypeName(expected) + ", got " + TypeName(t.type));
  }

  // Reads optional weight input `slot` (if the op has it) into *data / *rows.
  OrtStatus* Weight(OrtKernelContext* context, int slot, const char* name, const InputTensor& x,
                    const NormGeometry& geometry, const void** data, ElemType* type, int64_t* rows) const {
    if (slot < 0) return nullptr;
    InputTensor w;
    if (OrtStatus* s = GetInput(api_, context, static_cast<size_t>(slot), &w)) return s;
    if (!w.present) return nullptr;
    if (OrtStatus* s = CheckType(name, w, entry_.s)) return s;
    if (OrtStatus* s = ResolveWeightRows(api_, entry_.spec->name, name, w.dims, x.dims, geometry, rows)) return s;
    *data = w.data;
    *type = weight_type_;
    return nullptr;
  }

  OrtStatus* ComputeImpl(OrtKernelContext* context) {
    const char* op = entry_.spec->name;
    InputTensor x;
    if (OrtStatus* s = GetInput(api_, context, 0, &x)) return s;
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
    args.alpha = alpha_;
    args.scale_type = args.bias_type = args.xbias_type = weight_type_;
    args.inner_scale_type = args.inner_bias_type = weight_type_;

    const bool has_residual = slots_.residual >= 0;
    if (has_residual) {
      InputTensor residual;
      if (OrtStatus* s = GetInput(api_, context, static_cast<size_t>(slots_.residual), &residual)) return s;
      if (!residual.present) return MakeError(api_, ORT_INVALID_ARGUMENT, op, "input Residual is required");
      if (OrtStatus* s = CheckType("Residual", residual, entry_.t)) return s;
      bool same = residual.dims.rank() == x.dims.rank();
      for (size_t i = 0; same && i < x.dims.rank(); ++i) same = residual.dims[i] == x.dims[i];
      if (!same) {
        return MakeError(api_, ORT_INVALID_ARGUMENT, op,
                         "Residual of shape " + FormatShape(residual.dims) + " must have the shape of X, " +
                             FormatShape(x.dims));
      }
      args.residual = residual.data;
    }
    if (OrtStatus* s = Weight(context, slots_.scale, "Scale", x, geometry, &args.scale, &args.scale_type,
                              &args.scale_rows)) {
      return s;
    }
    if (OrtStatus* s = Weight(context, slots_.bias, "Bias", x, geometry, &args.bias, &args.bias_type,
                              &args.bias_rows)) {
      return s;
    }
    if (OrtStatus* s = Weight(context, slots_.xbias, "XBias", x, geometry, &args.xbias, &args.xbias_type,
                              &args.xbias_rows)) {
      return s;
    }
    if (OrtStatus* s = Weight(context, slots_.inner_scale, "InnerScale", x, geometry, &args.inner_scale,
                              &args.inner_scale_type, &args.inner_scale_rows)) {
      return s;
    }
    if (OrtStatus* s = Weight(context, slots_.inner_bias, "InnerBias", x, geometry, &args.inner_bias,
                              &args.inner_bias_type, &args.inner_bias_rows)) {
      return s;
    }

    OrtValue* y = nullptr;
    if (OrtStatus* s = api_.KernelContext_GetOutput(context, 0, x.dims.data(), x.dims.rank(), &y)) return s;
    OrtValue* sum = nullptr;
    if (has_residual) {
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

    RunRows(api_, context, rows_fn_, args);
    return nullptr;
  }

  const OrtApi& api_;
  const KernelEntry& entry_;
  const InputSlots slots_;
  int64_t axis_ = -1;
  float epsilon_ = 1e-5f;
  float scale_offset_ = 0.f;
  float alpha_ = 1.f;
  bool cast_before_scale_ = false;
  ElemType x_type_ = ElemType::kFloat32;
  ElemType weight_type_ = ElemType::kFloat32;
  NormRowsFn rows_fn_ = nullptr;
};

}  // namespace

OrtStatus* CreateNormKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry, Kernel** out) {
  *out = nullptr;
  auto* kernel = new (std::nothrow) NormKernel(api, entry);
  if (kernel == nullptr) return api.CreateStatus(ORT_FAIL, "onnxnorm: out of memory");
  if (OrtStatus* s = kernel->Init(info)) {
    delete kernel;
    return s;
  }
  *out = kernel;
  return nullptr;
}

}  // namespace ort
}  // namespace onnxnorm

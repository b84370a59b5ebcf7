// The C launcher of libonnxnorm_cuda_ops.so (onnxnorm/cuda_launch.h): argument checks, the
// choice of kernel, the launch, and its error.
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "norm_kernels.cuh"
#include "onnxnorm/cuda_launch.h"
#include "rotary_kernels.cuh"

namespace onnxnorm {
namespace cuda {
namespace {

const char* TypeName(ElemType type) {
  const int i = static_cast<int>(type);
  return i >= 0 && i < kElemTypeCount ? kElemTypeNames[i] : "an unknown type";
}

size_t TypeSize(ElemType type) { return type == ElemType::kFloat32 ? 4 : 2; }

void Write(char* out, size_t len, const char* format, ...) {
  if (out == nullptr || len == 0) return;
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(out, len, format, ap);
  va_end(ap);
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

bool AnyWeight(const NormArgs& a) { return a.scale || a.bias || a.inner_scale || a.inner_bias || a.xbias; }

constexpr bool SameName(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

// Whether op has an input / an attribute of this name.
constexpr bool HasInput(const OpSpec& op, const char* name) {
  for (const ParamSpec& p : op.inputs) {
    if (SameName(p.name, name)) return true;
  }
  return false;
}
constexpr bool HasAttribute(const OpSpec& op, const char* name) {
  for (const AttrSpec& attr : op.attributes) {
    if (SameName(attr.name, name)) return true;
  }
  return false;
}

// The kernel for args (and q, a quantized op's quantized Y): an index into kRegsConfigs, or -1 for
// the general kernel. The register kernels store a vector's quantized values at once: q must be
// aligned to a vector's element count (4 or 8 bytes).
int ChooseConfig(const NormArgs& a, const void* q = nullptr) {
  const int64_t ve = 16 / static_cast<int64_t>(TypeSize(a.x_type));
  bool vectorizable = a.cols % ve == 0 && reinterpret_cast<uintptr_t>(q) % static_cast<uintptr_t>(ve) == 0;
  const void* arrays[] = {a.x, a.residual, a.scale, a.bias, a.inner_scale, a.inner_bias, a.xbias, a.gate, a.y, a.sum};
  for (const void* p : arrays) vectorizable = vectorizable && Aligned16(p);  // nullptr is aligned
  if (!vectorizable) return -1;
  for (int i = 0; i < kNumRegsConfigs; ++i) {
    const RegsConfig& c = kRegsConfigs[i];
    if (static_cast<int64_t>(c.tpr) * c.vecs * ve >= a.cols) return i;
  }
  return -1;
}

void KernelName(const NormArgs& a, int config, char* out, size_t len) {
  char plan[48];
  if (config < 0) {
    std::snprintf(plan, sizeof(plan), "general:block%d", kStreamBlock);
  } else {
    const RegsConfig& c = kRegsConfigs[config];
    if (c.tpr == c.block) {
      std::snprintf(plan, sizeof(plan), "regs:block%dx%d", c.block, c.vecs);
    } else {
      std::snprintf(plan, sizeof(plan), "regs:%s%dx%d", c.tpr == 32 ? "warp" : "subwarp", c.tpr, c.vecs);
    }
  }
  Write(out, len, "%s<%s,%s%s>/%s", kOps[static_cast<int>(a.op)].name, TypeName(a.x_type),
        TypeName(AnyWeight(a) ? a.weight_type : a.x_type), a.y_type != a.x_type ? ",float32" : "", plan);
}

// True when args are fine, else false with the problem written into err. The ORT glue has
// checked shapes and attributes already; this guards direct callers (ctypes).
bool Check(const NormArgs* args, char* err, size_t len) {
  char scratch[8];  // when the caller gives no buffer, only the code matters
  if (err == nullptr || len == 0) {
    err = scratch;
    len = sizeof(scratch);
  }
  if (args == nullptr) return Write(err, len, "onnxnorm CUDA: args is NULL"), false;
  const NormArgs& a = *args;
  if (static_cast<int>(a.op) < 0 || static_cast<int>(a.op) >= kOpCount) {
    return Write(err, len, "onnxnorm CUDA: unknown op %d", static_cast<int>(a.op)), false;
  }
  const OpSpec& op = kOps[static_cast<int>(a.op)];
  const char* n = op.name;
  if (HasInput(op, "Cos")) {
    return Write(err, len, "onnxnorm::%s is a rotary op: launch it with onnxnorm_cuda_launch_rotary", n), false;
  }
  if (static_cast<int>(a.x_type) < 0 || static_cast<int>(a.x_type) >= kElemTypeCount) {
    return Write(err, len, "onnxnorm::%s: X must be float32, float16 or bfloat16 (type code %d)", n,
                 static_cast<int>(a.x_type)),
           false;
  }
  if (AnyWeight(a) && a.weight_type != a.x_type && a.weight_type != ElemType::kFloat32) {
    return Write(err, len, "onnxnorm::%s: the weights must be of X's type %s or float32, got %s", n, TypeName(a.x_type),
                 TypeName(a.weight_type)),
           false;
  }
  if (a.y_type != a.x_type) {
    // the mixed form: a float32 Y of a 16-bit X with float32 weights, in the ops whose Y is of type U
    const bool has_u = op.outputs.size() > 0 && op.outputs[0].type == TypeVar::kU;
    const bool w32 = !AnyWeight(a) || a.weight_type == ElemType::kFloat32;
    if (a.y_type != ElemType::kFloat32 || !has_u || !w32) {
      return Write(err, len, "onnxnorm::%s: Y must be of X's type %s%s (got type code %d)", n, TypeName(a.x_type),
                   has_u ? ", or float32 with float32 weights" : "", static_cast<int>(a.y_type)),
             false;
    }
  }
  if (a.rows < 0) return Write(err, len, "onnxnorm::%s: rows must be >= 0, got %lld", n, (long long)a.rows), false;
  if (a.rows > 0 && a.cols <= 0) {
    return Write(err, len, "onnxnorm::%s: the normalized dimensions hold no elements (cols %lld)", n,
                 (long long)a.cols),
           false;
  }
  if (a.cols < 0) return Write(err, len, "onnxnorm::%s: cols must be >= 0, got %lld", n, (long long)a.cols), false;
  if (a.rows > 0 && a.cols > INT64_MAX / a.rows) {
    return Write(err, len, "onnxnorm::%s: rows x cols overflows", n), false;
  }
  // (a quantized op's Y is CudaQuantArgs::q; NormArgs::y is its optional Y_float)
  if (a.rows > 0 && (a.x == nullptr || (a.y == nullptr && op.quantize == QuantizeKind::kNone))) {
    return Write(err, len, "onnxnorm::%s: X and Y are required", n), false;
  }
  if (op.residual == kNone) {
    if (a.residual || a.sum || a.inner_scale || a.inner_bias || a.xbias) {
      return Write(err, len, "onnxnorm::%s takes no Residual, Sum, InnerScale, InnerBias or XBias", n), false;
    }
  } else {
    if (a.rows > 0 && a.residual == nullptr) return Write(err, len, "onnxnorm::%s: Residual is required", n), false;
  }
  if (op.residual != kSandwich && (a.inner_scale || a.inner_bias)) {
    return Write(err, len, "onnxnorm::%s takes no InnerScale or InnerBias", n), false;
  }
  if (op.residual != kSkip && a.xbias) return Write(err, len, "onnxnorm::%s takes no XBias", n), false;
  // (L2Norm has no weights, GatedRMSNorm no Bias; only GatedRMSNorm has a Gate)
  if (a.scale && !HasInput(op, "Scale")) return Write(err, len, "onnxnorm::%s takes no Scale", n), false;
  if (a.bias && !HasInput(op, "Bias")) return Write(err, len, "onnxnorm::%s takes no Bias", n), false;
  if (a.gate && !HasInput(op, "Gate")) return Write(err, len, "onnxnorm::%s takes no Gate", n), false;
  struct {
    const char* name;
    const void* ptr;
    int64_t rows;
  } weights[] = {{"Scale", a.scale, a.scale_rows},
                 {"Bias", a.bias, a.bias_rows},
                 {"InnerScale", a.inner_scale, a.inner_scale_rows},
                 {"InnerBias", a.inner_bias, a.inner_bias_rows},
                 {"XBias", a.xbias, a.xbias_rows}};
  for (const auto& w : weights) {
    if (w.ptr != nullptr && w.rows < 1) {
      return Write(err, len, "onnxnorm::%s: %s rows must be >= 1, got %lld", n, w.name, (long long)w.rows), false;
    }
  }
  if (!(std::isfinite(a.epsilon) && a.epsilon >= 0.f)) {
    return Write(err, len, "onnxnorm::%s: epsilon must be a finite number >= 0, got %g", n, (double)a.epsilon), false;
  }
  if (!std::isfinite(a.scale_offset) || (!HasAttribute(op, "scale_offset") && a.scale_offset != 0.f)) {
    return Write(err, len, "onnxnorm::%s: scale_offset must be finite (and 0 for ops without it), got %g", n,
                 (double)a.scale_offset),
           false;
  }
  if (!std::isfinite(a.alpha) || (op.residual != kSkip && a.alpha != 1.f)) {
    return Write(err, len, "onnxnorm::%s: alpha must be finite (and 1 for ops without it), got %g", n, (double)a.alpha),
           false;
  }
  if (a.cast_before_scale != 0 && a.cast_before_scale != 1) {
    return Write(err, len, "onnxnorm::%s: cast_before_scale must be 0 or 1, got %d", n, a.cast_before_scale), false;
  }
  // (no effect without a Gate, but never out of range)
  if (a.activation != 0 && a.activation != 1) {
    return Write(err, len, "onnxnorm::%s: activation must be 0 (SiLU) or 1 (sigmoid), got %d", n, a.activation), false;
  }
  if (a.norm_before_gate != 0 && a.norm_before_gate != 1) {
    return Write(err, len, "onnxnorm::%s: norm_before_gate must be 0 or 1, got %d", n, a.norm_before_gate), false;
  }
  return true;
}

// True when a quantized op's quantizer arguments are fine (args passed Check), else false with the
// problem written into err.
bool CheckQuant(const NormArgs& a, const CudaQuantArgs* quant, char* err, size_t len) {
  const OpSpec& op = kOps[static_cast<int>(a.op)];
  const char* n = op.name;
  if (op.quantize == QuantizeKind::kNone) {
    return Write(err, len, "onnxnorm::%s is not a quantized op: launch it with onnxnorm_cuda_launch", n), false;
  }
  if (quant == nullptr) return Write(err, len, "onnxnorm::%s: quant is NULL", n), false;
  const bool dynamic = op.quantize == QuantizeKind::kDynamic;
  bool known = false;
  for (ElemType t : op.quant_types) known = known || t == quant->q_type;
  if (!known) {
    // the op's quantized types, as "uint8, int8 or float8e4m3fn" (dynamic ops: "uint8")
    char types[128] = "";
    size_t used = 0;
    for (size_t i = 0; i < op.quant_types.size() && used < sizeof(types); ++i) {
      const char* joint = i == 0 ? "" : i + 1 == op.quant_types.size() ? " or " : ", ";
      const int w = std::snprintf(types + used, sizeof(types) - used, "%s%s", joint,
                                  kElemTypeNames[static_cast<int>(op.quant_types[i])]);
      used += w > 0 ? static_cast<size_t>(w) : 0;
    }
    return Write(err, len, "onnxnorm::%s: the quantized type must be %s, got type code %d", n, types,
                 static_cast<int>(quant->q_type)),
           false;
  }
  if (a.rows > 0 && quant->q == nullptr) return Write(err, len, "onnxnorm::%s: the quantized Y is required", n), false;
  if (!dynamic) {
    if (a.rows > 0 && quant->y_scale == nullptr) return Write(err, len, "onnxnorm::%s: Y_scale is required", n), false;
    return true;
  }
  if (quant->y_scale == nullptr || quant->y_zero_point == nullptr) {
    return Write(err, len, "onnxnorm::%s: the Y_scale and Y_zero_point outputs are required", n), false;
  }
  if (a.rows > 0 && (quant->scratch == nullptr || reinterpret_cast<uintptr_t>(quant->scratch) % 4 != 0)) {
    return Write(err, len, "onnxnorm::%s: scratch of %zu bytes, 4-byte aligned, is required", n,
                 static_cast<size_t>(a.rows) * kCudaQuantScratchBytesPerRow),
           false;
  }
  return true;
}

// LaunchQuantOp<norm, residual> of the quantized op with id I or a later one.
template <int I = 0>
cudaError_t DispatchQuant(const NormArgs& a, const QuantKernelArgs& qa, QuantMode mode, int config,
                          cudaStream_t stream) {
  if constexpr (I == kOpCount) {
    return cudaErrorInvalidValue;
  } else {
    if constexpr (kOps[I].quantize != QuantizeKind::kNone) {
      if (static_cast<int>(a.op) == I)
        return LaunchQuantOp<kOps[I].norm, kOps[I].residual>(a, qa, mode, config, stream);
    }
    return DispatchQuant<I + 1>(a, qa, mode, config, stream);
  }
}

// LaunchOp<norm, residual> of the op with id I or a later one; with its gate where the op has a
// Gate and the call gives one (GatedRMSNorm: without a Gate it is its norm's kernel).
template <int I = 0>
cudaError_t Dispatch(const NormArgs& a, int config, cudaStream_t stream) {
  if constexpr (I == kOpCount) {
    return cudaErrorInvalidValue;
  } else {
    if constexpr (HasInput(kOps[I], "Cos")) {
      // (a rotary op: onnxnorm_cuda_launch_rotary's, refused by Check)
    } else if (static_cast<int>(a.op) == I) {
      if constexpr (HasInput(kOps[I], "Gate")) {
        if (a.gate != nullptr) {
          return a.norm_before_gate != 0
                     ? LaunchOp<kOps[I].norm, kOps[I].residual, GateMode::kAfterNorm>(a, config, stream)
                     : LaunchOp<kOps[I].norm, kOps[I].residual, GateMode::kBeforeNorm>(a, config, stream);
        }
      }
      return LaunchOp<kOps[I].norm, kOps[I].residual>(a, config, stream);
    }
    return Dispatch<I + 1>(a, config, stream);
  }
}

#define ONNXNORM_STR2(x) #x
#define ONNXNORM_STR(x) ONNXNORM_STR2(x)
#ifndef ONNXNORM_CUDA_ARCHS
#define ONNXNORM_CUDA_ARCHS unknown
#endif

// A launcher's return code for the launch status of the kernel configuration config, the
// failure written to err (when given) naming the op, the kernel and the CUDA error.
int LaunchResult(const NormArgs& a, int config, cudaError_t status, char* err, size_t err_len) {
  if (status == cudaSuccess) return ONNXNORM_CUDA_OK;
  char name[128];
  KernelName(a, config, name, sizeof(name));
  Write(err, err_len, "onnxnorm::%s: CUDA kernel %s (%lld rows x %lld cols) failed to launch: %s (%s)",
        onnxnorm::kOps[static_cast<int>(a.op)].name, name, (long long)a.rows, (long long)a.cols,
        cudaGetErrorString(status), cudaGetErrorName(status));
  return ONNXNORM_CUDA_LAUNCH_FAILED;
}

// ---------------------------------------------------------------------------------------------
// The rotary ops
// ---------------------------------------------------------------------------------------------
// The rotary op of a norm kind (RMSNormRotary, LayerNormRotary, L2NormRotary), or nullptr.
const OpSpec* RotaryOp(NormKind norm) {
  for (const OpSpec& op : kOps) {
    if (HasInput(op, "Cos") && op.norm == norm) return &op;
  }
  return nullptr;
}

bool FloatType(ElemType t) { return t == ElemType::kFloat32 || t == ElemType::kFloat16 || t == ElemType::kBFloat16; }

bool AnyRotaryWeight(const RotaryArgs& a) { return a.q.scale || a.q.bias || a.k.scale || a.k.bias; }

// The values of the call's widest row (Q's or K's).
int64_t RotaryWidth(const RotaryArgs& a) {
  const int64_t q = a.q.x != nullptr ? RotaryRowWidth(a, a.q) : 0;
  const int64_t k = a.k.x != nullptr ? RotaryRowWidth(a, a.k) : 0;
  return q > k ? q : k;
}

// True when a rotary call's arguments are fine, else false with the problem written into err
// (worded as the CPU kernel's ORT errors where both check the same thing). The ORT glue has
// checked shapes and attributes already; this guards direct callers (ctypes).
bool CheckRotary(const RotaryArgs* args, const CudaRotaryArgs* call, char* err, size_t len) {
  char scratch[8];
  if (err == nullptr || len == 0) {
    err = scratch;
    len = sizeof(scratch);
  }
  if (args == nullptr || call == nullptr) return Write(err, len, "onnxnorm CUDA: args or call is NULL"), false;
  const RotaryArgs& a = *args;
  const CudaRotaryArgs& c = *call;
  const OpSpec* op = RotaryOp(a.norm);
  if (op == nullptr) return Write(err, len, "onnxnorm CUDA: unknown norm kind %d", static_cast<int>(a.norm)), false;
  const char* n = op->name;
  if (!FloatType(c.q_type)) {
    return Write(err, len, "onnxnorm::%s: Q must be float32, float16 or bfloat16 (type code %d)", n,
                 static_cast<int>(c.q_type)),
           false;
  }
  if (a.norm == NormKind::kL2 && AnyRotaryWeight(a)) {
    return Write(err, len, "onnxnorm::%s takes no QScale, KScale, QBias or KBias", n), false;
  }
  if (a.norm == NormKind::kRms && (a.q.bias || a.k.bias)) {
    return Write(err, len, "onnxnorm::%s takes no QBias or KBias", n), false;
  }
  if (AnyRotaryWeight(a) && c.weight_type != c.q_type && c.weight_type != ElemType::kFloat32) {
    return Write(err, len, "onnxnorm::%s: the norm weights must be of Q's type %s or float32, got %s", n,
                 TypeName(c.q_type), TypeName(c.weight_type)),
           false;
  }
  if (c.angle_type != c.q_type && c.angle_type != ElemType::kFloat32) {
    return Write(err, len, "onnxnorm::%s: Cos and Sin must be of Q's type %s or float32, got %s", n, TypeName(c.q_type),
                 TypeName(c.angle_type)),
           false;
  }
  const struct {
    const char* name;
    int32_t value;
  } flags[] = {{"cast_before_scale", a.cast_before_scale},
               {"per_head", a.per_head},
               {"interleaved", a.interleaved},
               {"rotary_first", a.rotary_first},
               {"rotary_in_t", a.rotary_in_t}};
  for (const auto& f : flags) {
    if (f.value != 0 && f.value != 1) {
      return Write(err, len, "onnxnorm::%s: %s must be 0 or 1, got %d", n, f.name, f.value), false;
    }
  }
  if (a.layout < 0 || a.layout > 2) {
    return Write(err, len, "onnxnorm::%s: layout must be 0, 1 or 2, got %d", n, a.layout), false;
  }
  if (a.per_head == 0 && a.layout == 1) {
    return Write(err, len, "onnxnorm::%s: per_head = 0 normalizes a token's heads together: layout 0 or 2", n), false;
  }
  if (!(std::isfinite(a.epsilon) && a.epsilon >= 0.f)) {
    return Write(err, len, "onnxnorm::%s: epsilon must be a finite number >= 0, got %g", n, (double)a.epsilon), false;
  }
  if (!std::isfinite(a.scale_offset) || (a.norm != NormKind::kRms && a.scale_offset != 0.f)) {
    return Write(err, len, "onnxnorm::%s: scale_offset must be finite (and 0 for ops without it), got %g", n,
                 (double)a.scale_offset),
           false;
  }
  const struct {
    const char* name;
    int64_t value;
  } sizes[] = {{"batch", a.batch},       {"seq", a.seq},           {"head_size", a.head_size},
               {"Q's heads", a.q.heads}, {"K's heads", a.k.heads}, {"angle_rows", c.angle_rows}};
  for (const auto& s : sizes) {
    if (s.value < 0)
      return Write(err, len, "onnxnorm::%s: %s must be >= 0, got %lld", n, s.name, (long long)s.value), false;
  }
  if (a.rotary_dim < 0 || a.rotary_dim % 2 != 0 || a.rotary_dim > a.head_size) {
    return Write(err, len, "onnxnorm::%s: rotary_dim must be even and at most head_size %lld, got %lld", n,
                 (long long)a.head_size, (long long)a.rotary_dim),
           false;
  }
  if (a.angle_width != a.rotary_dim / 2 && a.angle_width != a.rotary_dim) {
    return Write(err, len,
                 "onnxnorm::%s: Cos's last dim must be rotary_dim / 2 = %lld (one angle per pair) or rotary_dim = "
                 "%lld (one per value), got %lld",
                 n, (long long)(a.rotary_dim / 2), (long long)a.rotary_dim, (long long)a.angle_width),
           false;
  }
  // (products of sizes of tensors that exist do not overflow: the ORT glue's are; a direct
  // caller's are bounded here)
  const int64_t kMax = int64_t{1} << 30;
  if (a.batch > kMax || a.seq > kMax || a.head_size > kMax || a.q.heads > kMax || a.k.heads > kMax ||
      (a.batch > 0 && a.seq > kMax / a.batch) || (a.batch * a.seq > 0 && a.q.heads > kMax / (a.batch * a.seq)) ||
      (a.batch * a.seq > 0 && a.k.heads > kMax / (a.batch * a.seq))) {
    return Write(err, len, "onnxnorm::%s: the sizes overflow", n), false;
  }
  // nothing to compute (empty tensors may have no data pointer): nothing else is read
  if (a.batch * a.seq * (a.q.heads + a.k.heads) * a.head_size == 0) return true;
  if (a.q.x == nullptr || a.q.y == nullptr) return Write(err, len, "onnxnorm::%s: input Q is required", n), false;
  if (a.k.y != nullptr && a.k.x == nullptr) return Write(err, len, "onnxnorm::%s: output KOut needs input K", n), false;
  if (a.k.x != nullptr && a.k.y == nullptr) {
    return Write(err, len, "onnxnorm::%s: input K needs output KOut (leave both out for Q alone)", n), false;
  }
  if (RotaryWidth(a) > INT32_MAX || a.head_size > INT32_MAX / 2) {
    return Write(err, len, "onnxnorm::%s: rows of %lld values are wider than the CUDA kernels take (2^31 - 1)", n,
                 (long long)RotaryWidth(a)),
           false;
  }
  if (a.cos == nullptr || a.sin == nullptr) {
    return Write(err, len, "onnxnorm::%s: input %s is required", n, a.cos == nullptr ? "Cos" : "Sin"), false;
  }
  const struct {
    const char* name;
    const void* ptr;
    int64_t rows;
    int64_t heads;
  } weights[] = {{"QScale", a.q.scale, a.q.scale_rows, a.q.heads},
                 {"QBias", a.q.bias, a.q.bias_rows, a.q.heads},
                 {"KScale", a.k.scale, a.k.scale_rows, a.k.heads},
                 {"KBias", a.k.bias, a.k.bias_rows, a.k.heads}};
  for (const auto& w : weights) {
    if (w.ptr != nullptr && w.rows != 1 && w.rows != w.heads) {
      return Write(err, len,
                   "onnxnorm::%s: %s must hold head_size = %lld values or heads * head_size = %lld (it has %lld rows)",
                   n, w.name, (long long)a.head_size, (long long)(w.heads * a.head_size), (long long)w.rows),
             false;
    }
  }
  if (a.position_ids == nullptr) {
    if ((a.cache_batch != 1 && a.cache_batch != a.batch) || c.angle_rows < a.cache_batch * a.seq) {
      return Write(err, len,
                   "onnxnorm::%s: without PositionIds, Cos is per token, [batch or 1, seq, C] with batch %lld and seq "
                   "%lld, got cache_batch %lld and %lld rows",
                   n, (long long)a.batch, (long long)a.seq, (long long)a.cache_batch, (long long)c.angle_rows),
             false;
    }
  }
  if (reinterpret_cast<uintptr_t>(c.position_error) % 4 != 0) {
    return Write(err, len, "onnxnorm::%s: position_error must be 4-byte aligned", n), false;
  }
  return true;
}

// The kernel for a rotary call: an index into kRotaryConfigs, or -1 for the general kernel.
int ChooseRotaryConfig(const RotaryArgs& a) {
  const int64_t d = a.head_size;
  const int64_t per_head = a.rotary_dim / 2 + (d - a.rotary_dim + 1) / 2;
  const int64_t slots = (RotaryWidth(a) / (d > 0 ? d : 1)) * per_head;
  for (int i = 0; i < kNumRotaryConfigs; ++i) {
    const RotaryConfig& c = kRotaryConfigs[i];
    if (static_cast<int64_t>(c.tpr) * c.slots >= slots) return i;
  }
  return -1;
}

void RotaryKernelName(const RotaryArgs& a, const CudaRotaryArgs& c, int config, char* out, size_t len) {
  char plan[48];
  if (config < 0) {
    std::snprintf(plan, sizeof(plan), "general:block%d", kRotaryStreamBlock);
  } else {
    const RotaryConfig& r = kRotaryConfigs[config];
    if (r.tpr == r.block) {
      std::snprintf(plan, sizeof(plan), "regs:block%dx%d", r.block, r.slots);
    } else {
      std::snprintf(plan, sizeof(plan), "regs:%s%dx%d", r.tpr == 32 ? "warp" : "subwarp", r.tpr, r.slots);
    }
  }
  const bool w = a.norm != NormKind::kL2 && AnyRotaryWeight(a);
  Write(out, len, "%s<%s,%s,%s>/%s", RotaryOp(a.norm)->name, TypeName(c.q_type), TypeName(w ? c.weight_type : c.q_type),
        TypeName(c.angle_type), plan);
}

cudaError_t DispatchRotary(const RotaryKernelArgs& p, const CudaRotaryArgs& c, int config, cudaStream_t stream) {
  switch (p.a.norm) {
    case NormKind::kRms: return LaunchRotaryOp<kRms>(p, c.q_type, c.weight_type, c.angle_type, config, stream);
    case NormKind::kLayer: return LaunchRotaryOp<kLayer>(p, c.q_type, c.weight_type, c.angle_type, config, stream);
    case NormKind::kL2: return LaunchRotaryOp<kL2>(p, c.q_type, c.weight_type, c.angle_type, config, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace cuda
}  // namespace onnxnorm

using onnxnorm::NormArgs;
using namespace onnxnorm::cuda;

extern "C" int onnxnorm_cuda_kernel_name(const NormArgs* args, char* name, size_t name_len) {
  if (!Check(args, name, name_len)) return ONNXNORM_CUDA_INVALID_ARGUMENT;
  KernelName(*args, ChooseConfig(*args), name, name_len);
  return ONNXNORM_CUDA_OK;
}

extern "C" int onnxnorm_cuda_launch(const NormArgs* args, void* stream, char* err, size_t err_len) {
  if (!Check(args, err, err_len)) return ONNXNORM_CUDA_INVALID_ARGUMENT;
  if (err != nullptr && err_len > 0) err[0] = '\0';
  const NormArgs& a = *args;
  if (onnxnorm::kOps[static_cast<int>(a.op)].quantize != onnxnorm::QuantizeKind::kNone) {
    Write(err, err_len, "onnxnorm::%s is a quantized op: launch it with onnxnorm_cuda_launch_quantized",
          onnxnorm::kOps[static_cast<int>(a.op)].name);
    return ONNXNORM_CUDA_INVALID_ARGUMENT;
  }
  if (a.rows == 0) return ONNXNORM_CUDA_OK;
  const int config = ChooseConfig(a);
  const cudaError_t status = Dispatch(a, config, static_cast<cudaStream_t>(stream));
  return LaunchResult(a, config, status, err, err_len);
}

extern "C" size_t onnxnorm_cuda_quant_scratch_bytes(const NormArgs* args) {
  if (args == nullptr || static_cast<int>(args->op) < 0 || static_cast<int>(args->op) >= onnxnorm::kOpCount) return 0;
  if (onnxnorm::kOps[static_cast<int>(args->op)].quantize != onnxnorm::QuantizeKind::kDynamic) return 0;
  return args->rows > 0 ? static_cast<size_t>(args->rows) * onnxnorm::kCudaQuantScratchBytesPerRow : 0;
}

extern "C" int onnxnorm_cuda_launch_quantized(const NormArgs* args, const onnxnorm::CudaQuantArgs* quant, void* stream,
                                              char* err, size_t err_len) {
  char scratch[8];
  char* message = err != nullptr && err_len > 0 ? err : scratch;
  const size_t message_len = err != nullptr && err_len > 0 ? err_len : sizeof(scratch);
  if (!Check(args, message, message_len) || !CheckQuant(*args, quant, message, message_len)) {
    return ONNXNORM_CUDA_INVALID_ARGUMENT;
  }
  message[0] = '\0';
  const NormArgs& a = *args;
  const onnxnorm::CudaQuantArgs& q = *quant;
  const bool dynamic = onnxnorm::kOps[static_cast<int>(a.op)].quantize == onnxnorm::QuantizeKind::kDynamic;
  if (a.rows == 0 && !dynamic) return ONNXNORM_CUDA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int config = ChooseConfig(a, q.q);
  QuantKernelArgs quantize;
  quantize.q = static_cast<uint8_t*>(q.q);
  quantize.q_type = q.q_type;
  quantize.scale = q.y_scale;
  quantize.zero_point = q.y_zero_point;
  cudaError_t status = cudaSuccess;
  if (!dynamic) {
    quantize.scale_type = a.x_type;  // Y_scale is of X's type
    status = DispatchQuant(a, quantize, QuantMode::kQuantize, config, s);
  } else {
    // 1. each row's statistics and the range of its Y into scratch (and Sum, when asked for)
    float* range = static_cast<float*>(q.scratch);
    if (a.rows > 0) {
      NormArgs first = a;
      first.y = nullptr;
      QuantKernelArgs ranges;
      ranges.range = range;
      status = DispatchQuant(first, ranges, QuantMode::kRange, config, s);
    }
    // 2. the scale and zero point, written to the outputs on the device
    if (status == cudaSuccess) {
      status =
          LaunchDynamicParams(range, a.rows, static_cast<float*>(q.y_scale), static_cast<uint8_t*>(q.y_zero_point), s);
    }
    // 3. the norm again, quantized with them (Sum was written by the first pass)
    if (status == cudaSuccess && a.rows > 0) {
      NormArgs second = a;
      second.sum = nullptr;
      quantize.scale_type = onnxnorm::ElemType::kFloat32;
      status = DispatchQuant(second, quantize, QuantMode::kQuantize, config, s);
    }
  }
  return LaunchResult(a, config, status, err, err_len);
}

extern "C" const char* onnxnorm_cuda_build_info(void) {
  return "onnxnorm-cuda archs " ONNXNORM_STR(ONNXNORM_CUDA_ARCHS);
}

extern "C" const char* onnxnorm_args_layout(void) {
  try {
    return onnxnorm::NormArgsLayoutJson();
  } catch (...) {
    return "{}";
  }
}

extern "C" const char* onnxnorm_cuda_ops(void) {
  try {
    return onnxnorm::CudaOpNames();
  } catch (...) {
    return "";
  }
}

extern "C" int onnxnorm_cuda_rotary_kernel_name(const onnxnorm::RotaryArgs* args, const onnxnorm::CudaRotaryArgs* call,
                                                char* name, size_t name_len) {
  if (!CheckRotary(args, call, name, name_len)) return ONNXNORM_CUDA_INVALID_ARGUMENT;
  RotaryKernelName(*args, *call, ChooseRotaryConfig(*args), name, name_len);
  return ONNXNORM_CUDA_OK;
}

extern "C" int onnxnorm_cuda_launch_rotary(const onnxnorm::RotaryArgs* args, const onnxnorm::CudaRotaryArgs* call,
                                           void* stream, char* err, size_t err_len) {
  if (!CheckRotary(args, call, err, err_len)) return ONNXNORM_CUDA_INVALID_ARGUMENT;
  if (err != nullptr && err_len > 0) err[0] = '\0';
  const onnxnorm::RotaryArgs& a = *args;
  RotaryKernelArgs p;
  p.a = a;
  p.rows_q = onnxnorm::RotaryRows(a, a.q);
  p.rows = p.rows_q + onnxnorm::RotaryRows(a, a.k);
  p.angle_rows = call->angle_rows;
  p.position_error = call->position_error;
  if (p.rows == 0 || RotaryWidth(a) == 0) return ONNXNORM_CUDA_OK;
  const int config = ChooseRotaryConfig(a);
  const cudaError_t status = DispatchRotary(p, *call, config, static_cast<cudaStream_t>(stream));
  if (status == cudaSuccess) return ONNXNORM_CUDA_OK;
  char name[128];
  RotaryKernelName(a, *call, config, name, sizeof(name));
  Write(err, err_len, "onnxnorm::%s: CUDA kernel %s (%lld rows of up to %lld values) failed to launch: %s (%s)",
        RotaryOp(a.norm)->name, name, (long long)p.rows, (long long)RotaryWidth(a), cudaGetErrorString(status),
        cudaGetErrorName(status));
  return ONNXNORM_CUDA_LAUNCH_FAILED;
}

extern "C" const char* onnxnorm_cuda_rotary_args_layout(void) {
  try {
    return onnxnorm::RotaryArgsLayoutJson();
  } catch (...) {
    return "{}";
  }
}

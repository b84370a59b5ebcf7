// The C launcher: argument checks, the choice of kernel, the launch, and its error.
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "launch.h"
#include "norm_kernels.cuh"

namespace onnxnorm {
namespace cuda {
namespace {

struct OpInfo {
  const char* name;
  int norm;
  int residual;
};

constexpr OpInfo kOps[] = {
    {"LayerNorm", kLayer, kNone},         {"RMSNorm", kRms, kNone},
    {"SkipLayerNorm", kLayer, kSkip},     {"SkipRMSNorm", kRms, kSkip},
    {"SandwichLayerNorm", kLayer, kSandwich}, {"SandwichRMSNorm", kRms, kSandwich},
};

const char* TypeName(int32_t type) {
  switch (type) {
    case ONNXNORM_CUDA_FLOAT32: return "float32";
    case ONNXNORM_CUDA_FLOAT16: return "float16";
    case ONNXNORM_CUDA_BFLOAT16: return "bfloat16";
    default: return "an unknown type";
  }
}

size_t TypeSize(int32_t type) { return type == ONNXNORM_CUDA_FLOAT32 ? 4 : 2; }

void Write(char* out, size_t len, const char* format, ...) {
  if (out == nullptr || len == 0) return;
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(out, len, format, ap);
  va_end(ap);
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The kernel for args: an index into kRegsConfigs, or -1 for the general kernel.
int ChooseConfig(const OnnxNormCudaArgs& a) {
  const int64_t ve = 16 / static_cast<int64_t>(TypeSize(a.x_type));
  bool vectorizable = a.cols % ve == 0;
  const void* arrays[] = {a.x, a.residual, a.scale, a.bias, a.inner_scale, a.inner_bias, a.xbias, a.y, a.sum};
  for (const void* p : arrays) vectorizable = vectorizable && Aligned16(p);  // nullptr is aligned
  if (!vectorizable) return -1;
  for (int i = 0; i < kNumRegsConfigs; ++i) {
    const RegsConfig& c = kRegsConfigs[i];
    if (static_cast<int64_t>(c.tpr) * c.vecs * ve >= a.cols) return i;
  }
  return -1;
}

void KernelName(const OnnxNormCudaArgs& a, int config, char* out, size_t len) {
  const bool weights = a.scale || a.bias || a.inner_scale || a.inner_bias || a.xbias;
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
  Write(out, len, "%s<%s,%s>/%s", kOps[a.op].name, TypeName(a.x_type),
        TypeName(weights ? a.weight_type : a.x_type), plan);
}

// True when args are fine, else false with the problem written into err.
bool Check(const OnnxNormCudaArgs* args, char* err, size_t len) {
  char scratch[8];  // when the caller gives no buffer, only the code matters
  if (err == nullptr || len == 0) {
    err = scratch;
    len = sizeof(scratch);
  }
  if (args == nullptr) return Write(err, len, "onnxnorm CUDA: args is NULL"), false;
  const OnnxNormCudaArgs& a = *args;
  if (a.abi_version != ONNXNORM_CUDA_ABI_VERSION) {
    return Write(err, len, "onnxnorm CUDA: args.abi_version is %d, this library expects %d", a.abi_version,
                 ONNXNORM_CUDA_ABI_VERSION), false;
  }
  if (a.op < 0 || a.op >= static_cast<int32_t>(sizeof(kOps) / sizeof(kOps[0]))) {
    return Write(err, len, "onnxnorm CUDA: unknown op %d", a.op), false;
  }
  const OpInfo& op = kOps[a.op];
  const char* n = op.name;
  if (a.x_type < ONNXNORM_CUDA_FLOAT32 || a.x_type > ONNXNORM_CUDA_BFLOAT16) {
    return Write(err, len, "onnxnorm::%s: X must be float32, float16 or bfloat16 (type code %d)", n, a.x_type), false;
  }
  const bool any_weight = a.scale || a.bias || a.inner_scale || a.inner_bias || a.xbias;
  if (any_weight && a.weight_type != a.x_type && a.weight_type != ONNXNORM_CUDA_FLOAT32) {
    return Write(err, len, "onnxnorm::%s: the weights must be of X's type %s or float32, got %s", n,
                 TypeName(a.x_type), TypeName(a.weight_type)), false;
  }
  if (a.rows < 0) return Write(err, len, "onnxnorm::%s: rows must be >= 0, got %lld", n, (long long)a.rows), false;
  if (a.rows > 0 && a.cols <= 0) {
    return Write(err, len, "onnxnorm::%s: the normalized dimensions hold no elements (cols %lld)", n,
                 (long long)a.cols), false;
  }
  if (a.cols < 0) return Write(err, len, "onnxnorm::%s: cols must be >= 0, got %lld", n, (long long)a.cols), false;
  if (a.rows > 0 && a.cols > INT64_MAX / a.rows) {
    return Write(err, len, "onnxnorm::%s: rows x cols overflows", n), false;
  }
  if (a.rows > 0 && (a.x == nullptr || a.y == nullptr)) {
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
  if (!std::isfinite(a.scale_offset) || (op.norm == kLayer && a.scale_offset != 0.f)) {
    return Write(err, len, "onnxnorm::%s: scale_offset must be finite (and 0 for LayerNorm ops), got %g", n,
                 (double)a.scale_offset), false;
  }
  if (!std::isfinite(a.alpha) || (op.residual != kSkip && a.alpha != 1.f)) {
    return Write(err, len, "onnxnorm::%s: alpha must be finite (and 1 for ops without it), got %g", n,
                 (double)a.alpha), false;
  }
  if (a.cast_before_scale != 0 && a.cast_before_scale != 1) {
    return Write(err, len, "onnxnorm::%s: cast_before_scale must be 0 or 1, got %d", n, a.cast_before_scale), false;
  }
  return true;
}

Params ToParams(const OnnxNormCudaArgs& a) {
  Params p;
  p.x = a.x;
  p.residual = a.residual;
  p.scale = a.scale;
  p.bias = a.bias;
  p.inner_scale = a.inner_scale;
  p.inner_bias = a.inner_bias;
  p.xbias = a.xbias;
  p.y = a.y;
  p.sum = a.sum;
  p.rows = a.rows;
  p.cols = a.cols;
  p.scale_rows = a.scale_rows;
  p.bias_rows = a.bias_rows;
  p.inner_scale_rows = a.inner_scale_rows;
  p.inner_bias_rows = a.inner_bias_rows;
  p.xbias_rows = a.xbias_rows;
  p.epsilon = a.epsilon;
  p.scale_offset = a.scale_offset;
  p.alpha = a.alpha;
  p.order_a = a.cast_before_scale != 0 && a.x_type != ONNXNORM_CUDA_FLOAT32;
  return p;
}

cudaError_t Dispatch(const OnnxNormCudaArgs& a, const Params& p, int config, cudaStream_t stream) {
  const int w = (a.scale || a.bias || a.inner_scale || a.inner_bias || a.xbias) ? a.weight_type : a.x_type;
  switch (a.op) {
    case ONNXNORM_CUDA_LAYER_NORM: return LaunchOp<kLayer, kNone>(p, a.x_type, w, config, stream);
    case ONNXNORM_CUDA_RMS_NORM: return LaunchOp<kRms, kNone>(p, a.x_type, w, config, stream);
    case ONNXNORM_CUDA_SKIP_LAYER_NORM: return LaunchOp<kLayer, kSkip>(p, a.x_type, w, config, stream);
    case ONNXNORM_CUDA_SKIP_RMS_NORM: return LaunchOp<kRms, kSkip>(p, a.x_type, w, config, stream);
    case ONNXNORM_CUDA_SANDWICH_LAYER_NORM: return LaunchOp<kLayer, kSandwich>(p, a.x_type, w, config, stream);
    case ONNXNORM_CUDA_SANDWICH_RMS_NORM: return LaunchOp<kRms, kSandwich>(p, a.x_type, w, config, stream);
    default: return cudaErrorInvalidValue;
  }
}

#define ONNXNORM_STR2(x) #x
#define ONNXNORM_STR(x) ONNXNORM_STR2(x)
#ifndef ONNXNORM_CUDA_ARCHS
#define ONNXNORM_CUDA_ARCHS unknown
#endif

}  // namespace
}  // namespace cuda
}  // namespace onnxnorm

using namespace onnxnorm::cuda;

extern "C" void onnxnorm_cuda_default_args(OnnxNormCudaArgs* args, int32_t op) {
  if (args == nullptr) return;
  std::memset(args, 0, sizeof(*args));
  args->abi_version = ONNXNORM_CUDA_ABI_VERSION;
  args->op = op;
  args->scale_rows = args->bias_rows = args->inner_scale_rows = args->inner_bias_rows = args->xbias_rows = 1;
  args->epsilon = 1e-5f;
  args->alpha = 1.f;
}

extern "C" int onnxnorm_cuda_kernel_name(const OnnxNormCudaArgs* args, char* name, size_t name_len) {
  if (!Check(args, name, name_len)) return ONNXNORM_CUDA_INVALID_ARGUMENT;
  KernelName(*args, ChooseConfig(*args), name, name_len);
  return ONNXNORM_CUDA_OK;
}

extern "C" int onnxnorm_cuda_launch(const OnnxNormCudaArgs* args, void* stream, char* err, size_t err_len) {
  if (!Check(args, err, err_len)) return ONNXNORM_CUDA_INVALID_ARGUMENT;
  if (err != nullptr && err_len > 0) err[0] = '\0';
  const OnnxNormCudaArgs& a = *args;
  if (a.rows == 0) return ONNXNORM_CUDA_OK;
  const int config = ChooseConfig(a);
  const cudaError_t status = Dispatch(a, ToParams(a), config, static_cast<cudaStream_t>(stream));
  if (status != cudaSuccess) {
    char name[128];
    KernelName(a, config, name, sizeof(name));
    Write(err, err_len, "onnxnorm CUDA kernel %s (%lld rows x %lld cols) failed to launch: %s (%s)", name,
          (long long)a.rows, (long long)a.cols, cudaGetErrorString(status), cudaGetErrorName(status));
    return ONNXNORM_CUDA_LAUNCH_FAILED;
  }
  return ONNXNORM_CUDA_OK;
}

extern "C" const char* onnxnorm_cuda_build_info(void) {
  return "onnxnorm-cuda abi " ONNXNORM_STR(ONNXNORM_CUDA_ABI_VERSION) " archs " ONNXNORM_STR(ONNXNORM_CUDA_ARCHS);
}

/* onnxnorm CUDA kernels: the plain C launcher API of libonnxnorm_cuda_ops.so.
 *
 * One entry point launches any catalogue op (LayerNorm, RMSNorm, SkipLayerNorm, SkipRMSNorm,
 * SandwichLayerNorm, SandwichRMSNorm) on a caller's stream. It checks every argument before it
 * launches anything, allocates nothing, and never synchronizes: errors the kernel raises while it
 * runs surface at the caller's next synchronization, as with any CUDA launch.
 *
 * Layout (as in custom_ops/include/onnxnorm/kernels.h): X, Residual, Y and Sum are row-major
 * [rows, cols] device arrays of x_type; the statistics of a row are taken over its cols values.
 * A weight input (Scale, Bias, InnerScale, InnerBias, XBias) is [<name>_rows, cols] of
 * weight_type (x_type or float32; one type for all weights of a call): row r of X uses weight
 * row r % <name>_rows. A null weight pointer means absent (Scale 1, Bias 0, XBias 0).
 *
 * Semantics are those of onnxnorm/ops/reference.py (DESIGN.md section 3):
 *   none:      Z = X
 *   skip:      Sum = round(alpha * Residual + X (+ XBias)); Z = Sum
 *   sandwich:  Sum = round(Residual + Norm(X; InnerScale, InnerBias)); Z = Sum
 *   LayerNorm: Y = (Z - mean) / sqrt(var + epsilon) * Scale + Bias
 *   RMSNorm:   Y = Z / sqrt(mean(Z^2) + epsilon) * (Scale + scale_offset) + Bias
 * with float32 statistics and cast_before_scale choosing rounding order A (1) or B (0) for
 * 16-bit X. The Sum output is optional (pass NULL when the caller does not need it).
 *
 * Any row width and any pointer alignment work: 16-byte aligned arrays whose cols are a multiple
 * of 16 bytes take the vectorized register-resident kernels, others a general kernel.
 */
#ifndef ONNXNORM_CUDA_LAUNCH_H_
#define ONNXNORM_CUDA_LAUNCH_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define ONNXNORM_CUDA_API __declspec(dllexport)
#else
#define ONNXNORM_CUDA_API __attribute__((visibility("default")))
#endif

/* Bumped whenever OnnxNormCudaArgs changes; callers put it into args.abi_version. */
#define ONNXNORM_CUDA_ABI_VERSION 1

/* op */
#define ONNXNORM_CUDA_LAYER_NORM 0
#define ONNXNORM_CUDA_RMS_NORM 1
#define ONNXNORM_CUDA_SKIP_LAYER_NORM 2
#define ONNXNORM_CUDA_SKIP_RMS_NORM 3
#define ONNXNORM_CUDA_SANDWICH_LAYER_NORM 4
#define ONNXNORM_CUDA_SANDWICH_RMS_NORM 5

/* element types (the numbering of onnxnorm::ElemType) */
#define ONNXNORM_CUDA_FLOAT32 0
#define ONNXNORM_CUDA_FLOAT16 1
#define ONNXNORM_CUDA_BFLOAT16 2

/* return codes */
#define ONNXNORM_CUDA_OK 0
#define ONNXNORM_CUDA_INVALID_ARGUMENT 1
#define ONNXNORM_CUDA_LAUNCH_FAILED 2

typedef struct OnnxNormCudaArgs {
  int32_t abi_version; /* ONNXNORM_CUDA_ABI_VERSION */
  int32_t op;          /* ONNXNORM_CUDA_<OP> */
  int32_t x_type;      /* of X, Residual, Y, Sum */
  int32_t weight_type; /* of every present weight: x_type or ONNXNORM_CUDA_FLOAT32 */
  int32_t cast_before_scale; /* 0: order B, 1: order A (no effect for float32) */
  int32_t reserved;

  int64_t rows; /* >= 0; rows == 0 launches nothing */
  int64_t cols; /* > 0 when rows > 0 */

  const void* x;          /* required */
  const void* residual;   /* required by the skip and sandwich ops, else NULL */
  const void* scale;      /* optional */
  const void* bias;       /* optional */
  const void* inner_scale; /* sandwich ops only, optional */
  const void* inner_bias;  /* sandwich ops only, optional */
  const void* xbias;       /* skip ops only, optional */
  void* y;                 /* required */
  void* sum;               /* skip and sandwich ops only, optional */

  int64_t scale_rows; /* >= 1 for each present weight */
  int64_t bias_rows;
  int64_t inner_scale_rows;
  int64_t inner_bias_rows;
  int64_t xbias_rows;

  float epsilon;      /* finite, >= 0 */
  float scale_offset; /* RMS ops; finite; must be 0 for the LayerNorm ops */
  float alpha;        /* skip ops; finite; must be 1 for the other ops */
  float reserved_f;
} OnnxNormCudaArgs;

/* Fills args with the defaults of the catalogue (epsilon 1e-5, alpha 1, every *_rows 1, no
 * inputs) for op. */
ONNXNORM_CUDA_API void onnxnorm_cuda_default_args(OnnxNormCudaArgs* args, int32_t op);

/* Checks args and launches the op's kernel on stream (a cudaStream_t; NULL: the legacy default
 * stream) of the current device. Returns ONNXNORM_CUDA_OK, or ONNXNORM_CUDA_INVALID_ARGUMENT
 * (nothing launched) or ONNXNORM_CUDA_LAUNCH_FAILED (the CUDA error of the launch), with a
 * message naming the op and the kernel written into err (err_len bytes, NUL-terminated; err may
 * be NULL). */
ONNXNORM_CUDA_API int onnxnorm_cuda_launch(const OnnxNormCudaArgs* args, void* stream, char* err,
                                           size_t err_len);

/* The name of the kernel onnxnorm_cuda_launch would run for args (e.g.
 * "SkipRMSNorm<bfloat16,float32>/regs:block128x4"), written into name; returns the same codes as
 * onnxnorm_cuda_launch without launching anything (no CUDA call at all). */
ONNXNORM_CUDA_API int onnxnorm_cuda_kernel_name(const OnnxNormCudaArgs* args, char* name,
                                                size_t name_len);

/* "onnxnorm-cuda <ABI> <architectures compiled in>" */
ONNXNORM_CUDA_API const char* onnxnorm_cuda_build_info(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ONNXNORM_CUDA_LAUNCH_H_ */

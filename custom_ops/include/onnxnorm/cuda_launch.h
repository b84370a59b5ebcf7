// The entry points of libonnxnorm_cuda_ops.so, the CUDA kernels of the catalogue ops.
//
// The CPU library loads it (dlopen) when ONNX Runtime first creates a kernel of an onnxnorm node
// on the CUDA execution provider, and launches through onnxnorm_cuda_launch on ORT's compute
// stream; tests and benchmarks call the same functions through ctypes.
//
// onnxnorm_cuda_launch checks every argument before it launches anything, allocates nothing and
// never synchronizes: errors the kernel raises while it runs surface at the caller's next
// synchronization, as with any CUDA launch. Any row width and pointer alignment work: 16-byte
// aligned arrays whose cols are a multiple of 16 bytes take the vectorized register-resident
// kernels, others a general kernel. Semantics are those of onnxnorm/ops/reference.py.
#pragma once

#include <cstddef>

#include "onnxnorm/norm_args.h"

#if defined(_WIN32)
#define ONNXNORM_EXPORT __declspec(dllexport)
#else
#define ONNXNORM_EXPORT __attribute__((visibility("default")))
#endif

// Return codes of onnxnorm_cuda_launch and onnxnorm_cuda_kernel_name.
#define ONNXNORM_CUDA_OK 0
#define ONNXNORM_CUDA_INVALID_ARGUMENT 1
#define ONNXNORM_CUDA_LAUNCH_FAILED 2

extern "C" {

// Checks args and launches its op's kernel on stream (a cudaStream_t; nullptr: the legacy
// default stream) of the current device. Returns ONNXNORM_CUDA_OK, ONNXNORM_CUDA_INVALID_ARGUMENT
// (nothing launched) or ONNXNORM_CUDA_LAUNCH_FAILED (the CUDA error of the launch), with a
// message naming the op (and the kernel) written into err (err_len bytes, NUL-terminated; err may
// be nullptr).
ONNXNORM_EXPORT int onnxnorm_cuda_launch(const onnxnorm::NormArgs* args, void* stream, char* err,
                                         size_t err_len);

// The name of the kernel onnxnorm_cuda_launch would run for args (e.g.
// "SkipRMSNorm<bfloat16,float32>/regs:block128x4"), written into name; the same codes as
// onnxnorm_cuda_launch, without any CUDA call.
ONNXNORM_EXPORT int onnxnorm_cuda_kernel_name(const onnxnorm::NormArgs* args, char* name, size_t name_len);

// "onnxnorm-cuda archs <architectures compiled in>"
ONNXNORM_EXPORT const char* onnxnorm_cuda_build_info(void);

// NormArgsLayoutJson() of the library (both libraries export it).
ONNXNORM_EXPORT const char* onnxnorm_args_layout(void);

}  // extern "C"

namespace onnxnorm {
using CudaLaunchFn = int (*)(const NormArgs* args, void* stream, char* err, size_t err_len);
using ArgsLayoutFn = const char* (*)();
}  // namespace onnxnorm

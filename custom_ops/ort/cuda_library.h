// libonnxnorm_cuda_ops.so, the CUDA kernels, as seen from this (the CPU) library: found next to
// it, loaded only when ORT first creates a kernel on the CUDA execution provider.
#pragma once

#include <string>

#include "onnxnorm/cuda_launch.h"

namespace onnxnorm {
namespace ort {

// The CUDA library's path: the folder of this library, and its file name.
std::string CudaLibraryPath();

// Whether the CUDA library file exists (checked without loading it).
bool CudaLibraryPresent();

// The CUDA library's entry points: the float ops' launcher, the quantized ops' and the rotary
// ops'.
struct CudaLaunchers {
  CudaLaunchFn launch;
  CudaLaunchQuantizedFn launch_quantized;
  CudaLaunchRotaryFn launch_rotary;
};

// The CUDA library's launchers, loading the library on the first call (it then stays loaded for
// the life of the process). nullptr with the reason in *error when it cannot be loaded, is not
// the onnxnorm CUDA library, or was built with another NormArgs or RotaryArgs layout or for other
// ops (every op of the generated table, GatedRMSNorm, L2Norm and the rotary ops included, has
// CUDA rows, so the library must have kernels for each). Thread-safe.
const CudaLaunchers* LoadCudaLaunchers(std::string* error);

}  // namespace ort
}  // namespace onnxnorm

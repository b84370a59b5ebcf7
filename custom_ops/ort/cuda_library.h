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

// The CUDA library's launcher, loading the library on the first call (it then stays loaded for
// the life of the process). nullptr with the reason in *error when it cannot be loaded, is not
// the onnxnorm CUDA library, or was built with another NormArgs layout. Thread-safe.
CudaLaunchFn LoadCudaLauncher(std::string* error);

// The launcher of the quantized ops (onnxnorm_cuda_launch_quantized), loading the library as
// LoadCudaLauncher does; nullptr with the reason in *error as there.
CudaLaunchQuantizedFn LoadCudaQuantizedLauncher(std::string* error);

}  // namespace ort
}  // namespace onnxnorm

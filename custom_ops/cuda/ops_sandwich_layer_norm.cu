// The kernels of one op (one translation unit per op, so that they compile in parallel).
#include "norm_kernels.cuh"

ONNXNORM_CUDA_DEFINE_LAUNCH_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kSandwich, onnxnorm::cuda::DeviceLauncher)

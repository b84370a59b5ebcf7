// The kernels of one op (one translation unit per op, so that they compile in parallel).
#include "norm_kernels.cuh"

ONNXNORM_CUDA_DEFINE_LAUNCH_OP(onnxnorm::cuda::kL2, onnxnorm::cuda::kNone, onnxnorm::cuda::DeviceLauncher)

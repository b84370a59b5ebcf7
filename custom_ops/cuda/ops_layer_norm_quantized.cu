// The quantized op's kernels of one norm (one translation unit per op, so that they compile in parallel).
#include "norm_kernels.cuh"

ONNXNORM_CUDA_DEFINE_LAUNCH_QUANT_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kNone, onnxnorm::cuda::DeviceLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_DYNAMIC_PARAMS(onnxnorm::cuda::DeviceLauncher)

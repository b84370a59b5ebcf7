// The quantized op's kernels of one norm (one translation unit per op, so that they compile in parallel).
#include "norm_kernels.cuh"

ONNXNORM_CUDA_DEFINE_LAUNCH_QUANT_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kSkip, onnxnorm::cuda::DeviceLauncher)

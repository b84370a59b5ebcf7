// The rotary op of one norm (one translation unit per norm, so that they compile in parallel).
#include "rotary_kernels.cuh"

ONNXNORM_CUDA_DEFINE_LAUNCH_ROTARY(onnxnorm::cuda::kRms, onnxnorm::cuda::DeviceLauncher)

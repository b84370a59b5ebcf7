// GatedRMSNorm's kernels with a Gate after the norm (norm_before_gate = 1), one translation unit
// per op and gate so that they compile in parallel; without a Gate it runs RMSNorm's kernels.
#include "norm_kernels.cuh"

ONNXNORM_CUDA_DEFINE_LAUNCH_GATED_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kNone, onnxnorm::cuda::GateMode::kAfterNorm,
                                     onnxnorm::cuda::DeviceLauncher)

// GatedRMSNorm's kernels with the Gate before the norm (norm_before_gate = 0), one translation
// unit per op and gate so that they compile in parallel.
#include "norm_kernels.cuh"

ONNXNORM_CUDA_DEFINE_LAUNCH_GATED_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kNone, onnxnorm::cuda::GateMode::kBeforeNorm,
                                     onnxnorm::cuda::DeviceLauncher)

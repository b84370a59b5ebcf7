// Spreads a row kernel over ORT's intra-op thread pool (KernelContext_ParallelFor) when the
// work is large enough to pay for it; small calls (single-token decode) stay on this thread.
#pragma once

#include <cstdint>

#include "onnxnorm/kernels.h"
#include "onnxruntime_c_api.h"

namespace onnxnorm {
namespace ort {

// Below this many elements (rows * cols) a call runs on the calling thread.
inline constexpr int64_t kParallelMinElements = 64 * 1024;
// Each task of the pool gets whole rows, about this many elements or more (each task prepares
// the shared weights of its rows once: larger tasks pay that less often), unless that leaves
// fewer than kParallelMinBlocks tasks.
inline constexpr int64_t kParallelBlockElements = 64 * 1024;
inline constexpr int64_t kParallelMinBlocks = 8;
// At most this many tasks per call, however large the tensor.
inline constexpr int64_t kParallelMaxBlocks = 1024;

// Runs fn over rows [0, args.rows) of args. Never fails: if the pool cannot be used, the rows
// run on the calling thread.
void RunRows(const OrtApi& api, OrtKernelContext* context, NormRowsFn fn, const NormArgs& args) noexcept;

// The same for a pass of a quantized op's row kernel.
void RunQuantRows(const OrtApi& api, OrtKernelContext* context, cpu::QuantRowsFn fn, const NormArgs& args,
                  const cpu::QuantArgs& quant) noexcept;

}  // namespace ort
}  // namespace onnxnorm

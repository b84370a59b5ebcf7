#include "parallel.h"

#include <algorithm>

namespace onnxnorm {
namespace ort {
namespace {

struct RowBlocks {
  NormRowsFn fn;
  cpu::QuantRowsFn quant_fn;  // used instead of fn when set
  const NormArgs* args;
  const cpu::QuantArgs* quant;
  int64_t rows_per_block;

  void Run(int64_t begin, int64_t end) const {
    if (quant_fn != nullptr) {
      quant_fn(*args, *quant, begin, end);
    } else {
      fn(*args, begin, end);
    }
  }
};

void RunBlock(void* user_data, size_t block) {
  const auto* job = static_cast<const RowBlocks*>(user_data);
  const int64_t begin = static_cast<int64_t>(block) * job->rows_per_block;
  const int64_t end = std::min(begin + job->rows_per_block, job->args->rows);
  if (begin < end) job->Run(begin, end);
}

void RunJob(const OrtApi& api, OrtKernelContext* context, RowBlocks job) noexcept;

}  // namespace

void RunRows(const OrtApi& api, OrtKernelContext* context, NormRowsFn fn, const NormArgs& args) noexcept {
  RunJob(api, context, RowBlocks{fn, nullptr, &args, nullptr, 0});
}

void RunQuantRows(const OrtApi& api, OrtKernelContext* context, cpu::QuantRowsFn fn, const NormArgs& args,
                  const cpu::QuantArgs& quant) noexcept {
  RunJob(api, context, RowBlocks{nullptr, fn, &args, &quant, 0});
}

namespace {

void RunJob(const OrtApi& api, OrtKernelContext* context, RowBlocks job) noexcept {
  const NormArgs& args = *job.args;
  const int64_t rows = args.rows;
  if (rows <= 0) return;
  const int64_t cols = std::max<int64_t>(args.cols, 1);
  // rows * cols is the element count of a tensor that exists, so it does not overflow.
  const int64_t elements = rows * cols;
  if (rows == 1 || elements < kParallelMinElements || context == nullptr) {
    job.Run(0, rows);
    return;
  }
  int64_t rows_per_block = std::max<int64_t>(1, kParallelBlockElements / cols);
  rows_per_block = std::min(rows_per_block, std::max<int64_t>(1, (rows + kParallelMinBlocks - 1) / kParallelMinBlocks));
  rows_per_block = std::max(rows_per_block, (rows + kParallelMaxBlocks - 1) / kParallelMaxBlocks);
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks <= 1) {
    job.Run(0, rows);
    return;
  }
  job.rows_per_block = rows_per_block;
  OrtStatus* status = api.KernelContext_ParallelFor(context, &RunBlock, static_cast<size_t>(blocks), 0, &job);
  if (status != nullptr) {
    // The pool refused before running anything (no context); do the work here. Rows are
    // independent and rewritten whole, so running any of them twice would be harmless too.
    api.ReleaseStatus(status);
    job.Run(0, rows);
  }
}

}  // namespace

}  // namespace ort
}  // namespace onnxnorm

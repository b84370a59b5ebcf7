#include "parallel.h"

#include <algorithm>

namespace onnxnorm {
namespace ort {
namespace {

struct RowBlocks {
  NormRowsFn fn;
  const NormArgs* args;
  int64_t rows_per_block;
};

void RunBlock(void* user_data, size_t block) {
  const auto* job = static_cast<const RowBlocks*>(user_data);
  const int64_t begin = static_cast<int64_t>(block) * job->rows_per_block;
  const int64_t end = std::min(begin + job->rows_per_block, job->args->rows);
  if (begin < end) job->fn(*job->args, begin, end);
}

}  // namespace

void RunRows(const OrtApi& api, OrtKernelContext* context, NormRowsFn fn, const NormArgs& args) noexcept {
  const int64_t rows = args.rows;
  if (rows <= 0) return;
  const int64_t cols = std::max<int64_t>(args.cols, 1);
  // rows * cols is the element count of a tensor that exists, so it does not overflow.
  const int64_t elements = rows * cols;
  if (rows == 1 || elements < kParallelMinElements || context == nullptr) {
    fn(args, 0, rows);
    return;
  }
  int64_t rows_per_block = std::max<int64_t>(1, kParallelBlockElements / cols);
  rows_per_block = std::min(rows_per_block, std::max<int64_t>(1, (rows + kParallelMinBlocks - 1) / kParallelMinBlocks));
  rows_per_block = std::max(rows_per_block, (rows + kParallelMaxBlocks - 1) / kParallelMaxBlocks);
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks <= 1) {
    fn(args, 0, rows);
    return;
  }
  RowBlocks job{fn, &args, rows_per_block};
  OrtStatus* status = api.KernelContext_ParallelFor(context, &RunBlock, static_cast<size_t>(blocks), 0, &job);
  if (status != nullptr) {
    // The pool refused before running anything (no context); do the work here. Rows are
    // independent and rewritten whole, so running any of them twice would be harmless too.
    api.ReleaseStatus(status);
    fn(args, 0, rows);
  }
}

}  // namespace ort
}  // namespace onnxnorm

// Host emulation of the onnxnorm CUDA kernels, for testing their logic on machines without a GPU
// (tests/test_cuda.py): the kernels of norm_kernels.cuh compiled by the host C++ compiler, with
// this folder's stand-ins for the CUDA headers. Each block's threads are std::threads, blocks
// run one after another; warp shuffles and __syncthreads are barriers (a lane that skipped one
// would hang the test). Not built into any library. Build:
//   c++ -std=c++20 -shared -fPIC -pthread -I. -I.. -I<ORT headers> -DONNXNORM_CUDA_HOST_EMULATION=1 \
//       host_emulation.cc ../ort_cuda_ops.cc -x c++ ../launch.cu -o libonnxnorm_cuda_emulation.so
// The ORT glue in it registers like the real library (its CUDA ops never run on the CPU).
#include <memory>
#include <thread>
#include <vector>
#include "norm_kernels.cuh"
#include "launch.h"

thread_local dim3 threadIdx;
thread_local dim3 blockIdx;
dim3 blockDim, gridDim;
static std::unique_ptr<std::barrier<>> g_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> g_warp_barriers;
static float g_warp_vals[32][32];

float emu_shfl(float v, int src) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_warp_vals[w][l] = v;
  g_warp_barriers[w]->arrive_and_wait();
  const float r = g_warp_vals[w][src];
  g_warp_barriers[w]->arrive_and_wait();
  return r;
}
void emu_syncthreads() { g_block_barrier->arrive_and_wait(); }

template <typename F>
static void Run(unsigned grid, unsigned block, F kernel) {
  gridDim.x = grid;
  blockDim.x = block;
  g_block_barrier = std::make_unique<std::barrier<>>(block);
  g_warp_barriers.clear();
  for (unsigned w = 0; w < (block + 31) / 32; ++w) g_warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
  for (unsigned b = 0; b < grid; ++b) {
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; ++t) {
      threads.emplace_back([=] {
        threadIdx.x = t;
        blockIdx.x = b;
        kernel();
      });
    }
    for (auto& th : threads) th.join();
  }
}

namespace onnxnorm {
namespace cuda {
template <typename T, typename W, int kNorm, int kResidual>
cudaError_t LaunchTyped(const Params& p, int config, cudaStream_t) {
  // a small grid, so that the kernels' grid-stride loops run too
  auto grid_for = [](int64_t units) { return static_cast<unsigned>(units < 3 ? units : 3); };
  if (config < 0 || config >= kNumRegsConfigs) {
    Run(grid_for(p.rows), kStreamBlock, [&] { StreamKernel<T, W, kNorm, kResidual>(p); });
    return 0;
  }
  const RegsConfig c = kRegsConfigs[config];
  const int64_t rpb = c.block / c.tpr;
  const unsigned grid = grid_for((p.rows + rpb - 1) / rpb);
  if (c.tpr == c.block) {
    if (c.vecs == 8) Run(grid, c.block, [&] { RegsKernel<T, W, kNorm, kResidual, 8, true, 512>(p, c.tpr); });
    else Run(grid, c.block, [&] { RegsKernel<T, W, kNorm, kResidual, 4, true, 512>(p, c.tpr); });
  } else if (c.vecs == 2) {
    Run(grid, c.block, [&] { RegsKernel<T, W, kNorm, kResidual, 2, false, 128>(p, c.tpr); });
  } else {
    Run(grid, c.block, [&] { RegsKernel<T, W, kNorm, kResidual, 4, false, 128>(p, c.tpr); });
  }
  return 0;
}
}  // namespace cuda
}  // namespace onnxnorm

ONNXNORM_CUDA_INSTANTIATE_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kNone)
ONNXNORM_CUDA_INSTANTIATE_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kNone)
ONNXNORM_CUDA_INSTANTIATE_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kSkip)
ONNXNORM_CUDA_INSTANTIATE_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kSkip)
ONNXNORM_CUDA_INSTANTIATE_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kSandwich)
ONNXNORM_CUDA_INSTANTIATE_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kSandwich)

// Built with ../ort_cuda_ops.cc (RegisterCustomOps, onnxnorm_cuda_op_manifest) and ../launch.cu.

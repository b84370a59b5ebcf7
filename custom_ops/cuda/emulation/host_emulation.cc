// Host emulation of the onnxnorm CUDA kernels, for testing their logic on machines without a GPU
// (tests/test_cuda.py, tests/cuda_harness.py): the kernels of norm_kernels.cuh and the real
// launcher (launch.cu, with its launch table) compiled by the host C++ compiler, with this
// folder's stand-ins for the CUDA headers; only the launch itself is emulated. Each block's
// threads are std::threads, blocks run one after another; warp shuffles and __syncthreads are
// barriers (a lane that skipped one would hang the test). Not part of the package build. Build:
//   c++ -std=c++20 -shared -fPIC -pthread -I. -I.. -I../../include host_emulation.cc \
//       -x c++ ../launch.cu -o libonnxnorm_cuda_ops.so
// It exports what the real CUDA library exports, so the CPU library loads it the same way.
#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "norm_kernels.cuh"

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

// launch(kernel, grid, block, args...) on the host: a small grid, so that the kernels'
// grid-stride loops run too.
struct EmulationLauncher {
  cudaStream_t stream;  // not used: every launch completes before it returns
  template <typename... Params, typename... Args>
  cudaError_t operator()(void (*kernel)(Params...), unsigned grid, int block, const Args&... args) const {
    Run(std::min(grid, 3u), static_cast<unsigned>(block), [&] { kernel(args...); });
    return cudaSuccess;
  }
};

}  // namespace cuda
}  // namespace onnxnorm

ONNXNORM_CUDA_DEFINE_LAUNCH_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kNone, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kNone, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kSkip, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kSkip, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kSandwich, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kSandwich, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_QUANT_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kNone, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_QUANT_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kNone, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_QUANT_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kSkip, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_QUANT_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kSkip, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_DYNAMIC_PARAMS(onnxnorm::cuda::EmulationLauncher)

// Host emulation of the onnxnorm CUDA kernels, for testing their logic on machines without a GPU
// (tests/test_cuda.py, tests/cuda_harness.py): the kernels of norm_kernels.cuh and the real
// launcher (launch.cu, with its launch table) compiled by the host C++ compiler, with this
// folder's stand-ins for the CUDA headers; only the launch itself is emulated.
//
// A block's threads are fibers (ucontext) on the launching thread, and blocks run one after
// another. A fiber runs until it reaches a barrier (__syncthreads, or the two barriers of a warp
// shuffle), where it gives way unless it is the last to arrive; a waiting fiber is resumed once
// its barrier's phase has passed. Switching fibers costs no kernel scheduling, where OS threads
// spent most of the emulation's time in futex waits and thread creation. A launch in which every
// unfinished fiber waits on a barrier that cannot complete (a lane that skipped a barrier) ends
// the process with a message instead of hanging. Not part of the package build. Build:
//   c++ -std=c++20 -shared -fPIC -I. -I.. -I../../include host_emulation.cc \
//       -x c++ ../launch.cu -o libonnxnorm_cuda_ops.so
// It exports what the real CUDA library exports, so the CPU library loads it the same way.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "norm_kernels.cuh"

thread_local dim3 threadIdx;
thread_local dim3 blockIdx;
thread_local dim3 blockDim, gridDim;

namespace {

struct Barrier {
  unsigned count = 0, arrived = 0;
  uint64_t phase = 0;
};

// A fiber's stack: mapped once, reused by every block; its lowest page is a guard page, so an
// overflow faults instead of writing into the next stack.
constexpr size_t kStackBytes = 256 * 1024;

struct Fiber {
  ucontext_t context;
  void* stack = nullptr;
  unsigned index = 0;
  bool done = false;
  const Barrier* waiting = nullptr;  // the barrier it waits on (nullptr: runnable)
  uint64_t phase = 0;                // that barrier's phase when it arrived
};

// The emulated launch in progress on this thread.
struct Block {
  std::vector<Fiber> fibers;
  ucontext_t scheduler;
  Fiber* current = nullptr;
  const std::function<void()>* kernel = nullptr;
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  float warp_vals[32][32];
};
thread_local Block t_block;

void FiberMain() {
  Block& b = t_block;
  (*b.kernel)();
  b.current->done = true;
  // returning resumes uc_link: the scheduler
}

void Arrive(Barrier& barrier) {
  Block& b = t_block;
  if (++barrier.arrived == barrier.count) {  // the last one: the phase passes, it runs on
    barrier.arrived = 0;
    ++barrier.phase;
    return;
  }
  Fiber* self = b.current;
  self->waiting = &barrier;
  self->phase = barrier.phase;
  swapcontext(&self->context, &b.scheduler);
}

// Runs every fiber of the block until all have returned from the kernel.
void Schedule(Block& b) {
  size_t finished = 0;
  while (finished < b.fibers.size()) {
    bool progress = false;
    for (Fiber& f : b.fibers) {
      if (f.done || (f.waiting != nullptr && f.waiting->phase == f.phase)) continue;
      f.waiting = nullptr;
      b.current = &f;
      threadIdx.x = f.index;
      swapcontext(&b.scheduler, &f.context);
      progress = true;
      if (f.done) ++finished;
    }
    if (!progress) {
      std::fprintf(stderr, "host emulation: every thread of block %u waits on a barrier that cannot "
                           "complete (a thread skipped a __syncthreads or a warp shuffle)\n", blockIdx.x);
      std::abort();
    }
  }
}

}  // namespace

float emu_shfl(float v, int src) {
  Block& b = t_block;
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  b.warp_vals[w][l] = v;
  Arrive(b.warp_barriers[w]);
  const float r = b.warp_vals[w][src];
  Arrive(b.warp_barriers[w]);
  return r;
}
void emu_syncthreads() { Arrive(t_block.block_barrier); }

template <typename F>
static void Run(unsigned grid, unsigned block, F kernel) {
  gridDim.x = grid;
  blockDim.x = block;
  Block& b = t_block;
  const std::function<void()> body = [&] { kernel(); };
  b.kernel = &body;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  while (b.fibers.size() < block) {
    Fiber f;
    f.stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (f.stack == MAP_FAILED || mprotect(f.stack, page, PROT_NONE) != 0) {
      std::perror("host emulation: fiber stack");
      std::abort();
    }
    f.index = static_cast<unsigned>(b.fibers.size());
    b.fibers.push_back(f);
  }
  std::vector<Fiber> spare(b.fibers.begin() + block, b.fibers.end());  // (kept for later launches)
  b.fibers.resize(block);
  b.block_barrier = Barrier{block};
  b.warp_barriers.assign((block + 31) / 32, Barrier{32});
  for (unsigned blk = 0; blk < grid; ++blk) {
    blockIdx.x = blk;
    for (Fiber& f : b.fibers) {
      f.done = false;
      f.waiting = nullptr;
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = f.stack;
      f.context.uc_stack.ss_size = kStackBytes;
      f.context.uc_link = &b.scheduler;
      makecontext(&f.context, FiberMain, 0);
    }
    Schedule(b);
  }
  b.fibers.insert(b.fibers.end(), spare.begin(), spare.end());
  b.current = nullptr;
  b.kernel = nullptr;
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

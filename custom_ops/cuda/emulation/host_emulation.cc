// Host emulation of the onnxnorm CUDA kernels, for testing their logic on machines without a GPU
// (tests/cuda/test_cuda.py, tests/support/cuda_harness.py, tests/cuda/test_cuda_rotary.py): the kernels of
// norm_kernels.cuh and rotary_kernels.cuh and the real
// launcher (launch.cu, with its launch table) compiled by the host C++ compiler, with this
// folder's stand-ins for the CUDA headers; only the launch itself is emulated.
//
// A block's threads are fibers on the launching thread, and blocks run one after another. A fiber
// runs until it reaches a barrier (__syncthreads, or the two barriers of a warp shuffle), where it
// gives way unless it is the last to arrive; a waiting fiber is resumed once its barrier's phase
// has passed. Switching fibers costs no kernel scheduling, where OS threads spent most of the
// emulation's time in futex waits and thread creation. On x86-64 a switch saves and restores only
// the callee-saved registers: swapcontext (the fallback elsewhere) also saves the signal mask, a
// system call per switch, and the quick matrix of tests/support/cuda_harness.py ran 3.7 times longer with
// it. A launch in which every unfinished fiber waits on a barrier that cannot complete (a lane
// that skipped a barrier) ends the process with a message instead of hanging. Not part of the
// package build. Build:
//   c++ -std=c++20 -shared -fPIC -I. -I.. -I../../include host_emulation.cc \
//       -x c++ ../launch.cu -o libonnxnorm_cuda_ops.so
// It exports what the real CUDA library exports, so the CPU library loads it the same way.
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "norm_kernels.cuh"
#include "rotary_kernels.cuh"

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

void FiberMain();

#if defined(__x86_64__)
// A suspended fiber is its stack pointer; below it on its stack lie the callee-saved registers
// and the address to resume at (System V ABI: rbx, rbp, r12-r15; the fibers change neither the
// floating-point control words nor the signal mask).
struct Context {
  void* sp = nullptr;
};
extern "C" void onnxnorm_emu_switch(void** save_sp, void* resume_sp);
asm(R"(
  .text
  .p2align 4
  .globl onnxnorm_emu_switch
  .hidden onnxnorm_emu_switch
  .type onnxnorm_emu_switch, @function
onnxnorm_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size onnxnorm_emu_switch, .-onnxnorm_emu_switch
)");
void Switch(Context& from, const Context& to) { onnxnorm_emu_switch(&from.sp, to.sp); }
// The first switch to the fiber pops six zeroed registers and "returns" into FiberMain with the
// stack aligned as after a call (a zero return address above it: FiberMain never returns).
void Prepare(Context& c, void* stack, size_t bytes) {
  auto* top = reinterpret_cast<uintptr_t*>((reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t{15});
  top[-1] = 0;
  top[-2] = reinterpret_cast<uintptr_t>(&FiberMain);
  for (int i = 3; i <= 8; ++i) top[-i] = 0;
  c.sp = top - 8;
}
#else
struct Context {
  ucontext_t uc;
};
void Switch(Context& from, const Context& to) { swapcontext(&from.uc, &to.uc); }
void Prepare(Context& c, void* stack, size_t bytes) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, FiberMain, 0);
}
#endif

struct Fiber {
  Context context;
  void* stack = nullptr;
  unsigned index = 0;
  bool done = false;
  const Barrier* waiting = nullptr;  // the barrier it waits on (nullptr: runnable)
  uint64_t phase = 0;                // that barrier's phase when it arrived
};

// The emulated launch in progress on this thread.
struct Block {
  std::vector<Fiber> fibers;
  Context scheduler;
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
  Switch(b.current->context, b.scheduler);  // never resumed
  std::abort();
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
  Switch(self->context, b.scheduler);
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
      Switch(b.scheduler, f.context);
      progress = true;
      if (f.done) ++finished;
    }
    if (!progress) {
      std::fprintf(stderr,
                   "host emulation: every thread of block %u waits on a barrier that cannot "
                   "complete (a thread skipped a __syncthreads or a warp shuffle)\n",
                   blockIdx.x);
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
      Prepare(f.context, f.stack, kStackBytes);
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
ONNXNORM_CUDA_DEFINE_LAUNCH_OP(onnxnorm::cuda::kL2, onnxnorm::cuda::kNone, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_GATED_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kNone, onnxnorm::cuda::GateMode::kAfterNorm,
                                     onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_GATED_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kNone, onnxnorm::cuda::GateMode::kBeforeNorm,
                                     onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_QUANT_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kNone, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_QUANT_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kNone, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_QUANT_OP(onnxnorm::cuda::kLayer, onnxnorm::cuda::kSkip, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_QUANT_OP(onnxnorm::cuda::kRms, onnxnorm::cuda::kSkip, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_DYNAMIC_PARAMS(onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_ROTARY(onnxnorm::cuda::kRms, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_ROTARY(onnxnorm::cuda::kLayer, onnxnorm::cuda::EmulationLauncher)
ONNXNORM_CUDA_DEFINE_LAUNCH_ROTARY(onnxnorm::cuda::kL2, onnxnorm::cuda::EmulationLauncher)

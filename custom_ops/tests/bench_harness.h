// What the CPU microbenchmarks (kernel_bench.cc, rotary_bench.cc) share: the ORT glue's row
// blocks, aligned buffers filled with small random values of a type, a team of spinning threads,
// and a timer that reports the median, the fastest and the CPU time of a call. Not a test.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "onnxnorm/kernels.h"

namespace onnxnorm {
namespace bench {

// The element type a --dtype names (float32, float16, bfloat16); false for another name.
inline bool DtypeNamed(const std::string& name, ElemType* t) {
  for (ElemType e : {ElemType::kFloat32, ElemType::kFloat16, ElemType::kBFloat16}) {
    if (name == kElemTypeNames[static_cast<int>(e)]) {
      *t = e;
      return true;
    }
  }
  return false;
}

// The instruction set an --isa names (cpu::IsaName's names; empty: the best this CPU has); false
// for an unknown name.
inline bool IsaNamed(const std::string& name, cpu::Isa* isa) {
  if (name.empty()) {
    *isa = cpu::SupportedIsa();
    return true;
  }
  for (int level = 0; level <= static_cast<int>(cpu::Isa::kAvx512Bf16); ++level) {
    if (name == cpu::IsaName(static_cast<cpu::Isa>(level))) {
      *isa = static_cast<cpu::Isa>(level);
      return true;
    }
  }
  return false;
}

// The ORT glue's row blocks (custom_ops/ort/parallel.h): rows of cols values in blocks of about
// block_elements values, no fewer than 8 blocks where there are rows for them and no more than
// 1024, spread on the pool (parallel) from 64 Ki values on. Without the pool, or with one thread,
// the glue still runs a large call block by block (ORT's ParallelFor runs them in order).
struct RowBlocks {
  int64_t rows_per_block;
  int64_t blocks;
  bool parallel;
};
inline RowBlocks GlueBlocks(int64_t rows, int64_t cols, int64_t block_elements = 64 * 1024) {
  int64_t per_block = std::max<int64_t>(1, block_elements / cols);
  per_block = std::min<int64_t>(per_block, std::max<int64_t>(1, (rows + 7) / 8));
  per_block = std::max<int64_t>(per_block, (rows + 1023) / 1024);
  const int64_t blocks = (rows + per_block - 1) / per_block;
  return {per_block, blocks, rows > 1 && rows * cols >= 64 * 1024 && blocks > 1};
}

struct Buffer {
  explicit Buffer(size_t bytes)
      : size(bytes), data(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))) {}
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  size_t size;
  char* data;
};

// Fills with small random values of the type (float16 / bfloat16 bits of values in [-2, 2)).
inline void Fill(Buffer& b, ElemType t, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  if (t == ElemType::kFloat32) {
    auto* p = reinterpret_cast<float*>(b.data);
    for (size_t i = 0; i < b.size / 4; ++i) p[i] = dist(rng);
    return;
  }
  auto* p = reinterpret_cast<uint16_t*>(b.data);
  for (size_t i = 0; i < b.size / 2; ++i) {
    const float f = dist(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    // bfloat16: the top half; float16 of a value in [-2, 2): a coarse but valid encoding
    p[i] = t == ElemType::kBFloat16 ? static_cast<uint16_t>(u >> 16)
                                    : static_cast<uint16_t>(((u >> 16) & 0x8000u) | (0x3800u + (rng() & 0x7ffu)));
  }
}

// Persistent worker threads that spin on a generation counter; Run(job) runs job(thread index) on
// every thread (the caller is thread 0) and returns when all are done.
class Team {
 public:
  explicit Team(int threads) : threads_(threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { Loop(t); });
  }
  ~Team() {
    stop_.store(true);
    generation_.fetch_add(1);
    for (auto& w : workers_) w.join();
  }
  void Run(const std::function<void(int)>& job) {
    job_ = &job;
    pending_.store(threads_ - 1);
    generation_.fetch_add(1, std::memory_order_release);
    job(0);
    while (pending_.load(std::memory_order_acquire) != 0) {
    }
  }

 private:
  void Loop(int t) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t g;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      }
      seen = g;
      if (stop_.load()) return;
      (*job_)(t);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
  int threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* job_ = nullptr;
};

struct Timing {
  double median_us;  // wall clock, median sample
  double best_us;    // wall clock, fastest sample
  double cpu_us;     // CPU time of the process per call and thread, fastest sample (time the
                     // threads were scheduled out does not count: a fairer number on a busy machine)
};

inline double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Times fn over samples of `calls` calls each (0: as many as last 2 ms), for about `seconds`.
inline Timing TimeCalls(const std::function<void()>& fn, double seconds, int64_t calls, int threads) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 3; ++i) fn();
  if (calls <= 0) {
    const auto t0 = Clock::now();
    fn();
    const double once = std::chrono::duration<double>(Clock::now() - t0).count();
    calls = std::max<int64_t>(1, static_cast<int64_t>(0.002 / std::max(once, 1e-7)));
  }
  std::vector<double> samples;
  double cpu_best = 1e300;
  const auto start = Clock::now();
  while (samples.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    const double c0 = CpuSeconds();
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < calls; ++i) fn();
    const double wall = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    cpu_best = std::min(cpu_best, (CpuSeconds() - c0) * 1e6 / threads);
    samples.push_back(wall / static_cast<double>(calls));
  }
  std::sort(samples.begin(), samples.end());
  return {samples[samples.size() / 2], samples.front(), cpu_best / static_cast<double>(calls)};
}

}  // namespace bench
}  // namespace onnxnorm

// A microbenchmark of the CPU row kernels through their C++ API (onnxnorm/kernels.h), without
// ONNX Runtime: for profiling (perf record, valgrind) and for telling the kernels' own time apart
// from the cost of ONNX Runtime's call path and thread pool. Not a test; docs/benchmarks.md uses it.
//
//   onnxnorm_kernel_bench --op RMSNorm --dtype float32 --shape 2048x4096 [--threads 2]
//       [--isa avx512_bf16|avx512|avx2|portable] [--stream-min BYTES] [--block-elements N] [--seconds 0.5] [--calls N]
//       [--activation 0|1] [--norm-before-gate 0|1]
//
// Prints, per call: the median microseconds of the kernel over the tensors (rows split into the
// same blocks as the ORT glue's, claimed by the threads from a shared counter, as ORT's pool
// does), the bytes it moves per microsecond, and the same for memcpy of the same bytes on the same
// threads (X [and Residual] into Y [and Sum]; GatedRMSNorm, which gets a Gate like X: X into Y
// and half of Gate into a second buffer, as many bytes as the op reads and writes). Threads spin between calls, so the
// hand-off costs next to nothing here: the difference to `onnxnorm bench kernels` is ORT's.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>

#include "bench_harness.h"
#include "onnxnorm/kernels.h"

namespace {

using onnxnorm::ElemType;
using onnxnorm::NormArgs;
using onnxnorm::NormRowsFn;
using onnxnorm::OpSpec;
using onnxnorm::bench::Buffer;
using onnxnorm::bench::Team;
using onnxnorm::bench::Timing;
namespace cpu = onnxnorm::cpu;

// The ORT glue's block size (bench_harness.h's GlueBlocks; --block-elements changes it).
int64_t kBlockElements = 64 * 1024;

int Usage(const char* argv0) {
  std::fprintf(
      stderr,
      "usage: %s --op NAME --dtype float32|float16|bfloat16 --shape ROWSxCOLS [--threads N] "
      "[--isa avx512_bf16|avx512|avx2|portable] [--stream-min BYTES] [--block-elements N] [--seconds S] [--calls N] "
      "[--activation 0|1] [--norm-before-gate 0|1]\n",
      argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string op_name, dtype = "float32", shape, isa_name;
  int threads = 1;
  double seconds = 0.5;
  int64_t calls = 0, stream_min = -1;
  int activation = 0, norm_before_gate = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return Usage(argv[0]);
    const char* value = argv[++i];
    if (arg == "--op") {
      op_name = value;
    } else if (arg == "--dtype") {
      dtype = value;
    } else if (arg == "--shape") {
      shape = value;
    } else if (arg == "--threads") {
      threads = std::atoi(value);
    } else if (arg == "--isa") {
      isa_name = value;
    } else if (arg == "--stream-min") {
      stream_min = std::atoll(value);
    } else if (arg == "--seconds") {
      seconds = std::atof(value);
    } else if (arg == "--block-elements") {
      kBlockElements = std::atoll(value);
    } else if (arg == "--calls") {
      calls = std::atoll(value);
    } else if (arg == "--activation") {
      activation = std::atoi(value);
    } else if (arg == "--norm-before-gate") {
      norm_before_gate = std::atoi(value);
    } else {
      return Usage(argv[0]);
    }
  }
  const OpSpec* op = nullptr;
  for (const OpSpec& o : onnxnorm::kOps) {
    if (op_name == o.name) op = &o;
  }
  ElemType t = ElemType::kFloat32;
  cpu::Isa isa = cpu::Isa::kPortable;
  long long rows = 0, cols = 0;
  if (op == nullptr || !onnxnorm::bench::DtypeNamed(dtype, &t) || !onnxnorm::bench::IsaNamed(isa_name, &isa) ||
      std::sscanf(shape.c_str(), "%lldx%lld", &rows, &cols) != 2 || rows <= 0 || cols <= 0 || threads < 1 ||
      (activation != 0 && activation != 1) || (norm_before_gate != 0 && norm_before_gate != 1)) {
    return Usage(argv[0]);
  }
  if (stream_min >= 0) cpu::SetStreamMinBytes(stream_min);
  const NormRowsFn fn = cpu::GetNormRowsFor(isa, op->norm, op->residual, t, t, t);
  if (fn == nullptr) {
    std::fprintf(stderr, "no %s kernel for %s on this CPU\n", cpu::IsaName(isa), op_name.c_str());
    return 2;
  }

  const size_t elem = t == ElemType::kFloat32 ? 4 : 2;
  const size_t tensor = static_cast<size_t>(rows) * static_cast<size_t>(cols) * elem;
  const bool residual = op->residual != onnxnorm::ResidualKind::kNone;
  bool gated = false;
  for (const auto& input : op->inputs) gated = gated || std::string(input.name) == "Gate";
  std::mt19937 rng(1);
  // (r: Residual or Gate; sum: Sum, or where the copy writes the half of Gate)
  Buffer x(tensor), r(residual || gated ? tensor : 64), y(tensor), sum(residual || gated ? tensor : 64);
  Buffer scale(static_cast<size_t>(cols) * elem), bias(static_cast<size_t>(cols) * elem);
  onnxnorm::bench::Fill(x, t, rng);
  onnxnorm::bench::Fill(r, t, rng);
  onnxnorm::bench::Fill(scale, t, rng);
  onnxnorm::bench::Fill(bias, t, rng);
  std::memset(y.data, 0, y.size);
  std::memset(sum.data, 0, sum.size);

  NormArgs a;
  a.op = op->id;
  a.x_type = a.weight_type = a.y_type = t;
  a.rows = rows;
  a.cols = cols;
  a.x = x.data;
  a.y = y.data;
  for (size_t i = 0; i < op->inputs.size(); ++i) {
    const std::string name = op->inputs[i].name;
    if (name == "Scale" || name == "InnerScale") (name == "Scale" ? a.scale : a.inner_scale) = scale.data;
    // as `onnxnorm bench kernels` feeds them: Bias only for the LayerNorm family
    const bool layer = op->norm == onnxnorm::NormKind::kLayer;
    if (layer && (name == "Bias" || name == "InnerBias")) (name == "Bias" ? a.bias : a.inner_bias) = bias.data;
    if (name == "Residual") a.residual = r.data;
    if (name == "Gate") a.gate = r.data;
  }
  if (residual) a.sum = sum.data;
  a.activation = activation;
  a.norm_before_gate = norm_before_gate;

  // The glue's blocks, claimed from a shared counter as ORT's pool does.
  const onnxnorm::bench::RowBlocks glue = onnxnorm::bench::GlueBlocks(rows, cols, kBlockElements);
  const int64_t rows_per_block = glue.rows_per_block, blocks = glue.blocks;
  const bool parallel = glue.parallel;
  if (!parallel) threads = 1;
  Team team(threads);
  std::atomic<int64_t> next{0};
  const std::function<void(int)> kernel_job = [&](int) {
    for (int64_t b; (b = next.fetch_add(1, std::memory_order_relaxed)) < blocks;) {
      fn(a, b * rows_per_block, std::min<int64_t>((b + 1) * rows_per_block, rows));
    }
  };
  const Timing kernel = onnxnorm::bench::TimeCalls(
      [&] {
        if (!parallel) {
          fn(a, 0, rows);
          return;
        }
        next.store(0, std::memory_order_relaxed);
        team.Run(kernel_job);
      },
      seconds, calls, threads);

  // memcpy of the same bytes, each thread its share of every tensor
  const int copy_threads = threads;
  const std::function<void(int)> copy_job = [&](int i) {
    const size_t begin = tensor / 64 * static_cast<size_t>(i) / static_cast<size_t>(copy_threads) * 64;
    const size_t end = i + 1 == copy_threads
                           ? tensor
                           : tensor / 64 * static_cast<size_t>(i + 1) / static_cast<size_t>(copy_threads) * 64;
    std::memcpy(y.data + begin, x.data + begin, end - begin);
    if (residual) std::memcpy(sum.data + begin, r.data + begin, end - begin);
    if (gated) std::memcpy(sum.data + begin / 2, r.data + begin / 2, (end - begin) / 2);
  };
  const Timing copy = onnxnorm::bench::TimeCalls([&] { team.Run(copy_job); }, seconds, calls, copy_threads);

  const double moved = static_cast<double>(tensor) * (residual ? 4 : gated ? 3 : 2);
  auto gbs = [&](double us) { return moved / us / 1e3; };
  std::printf("%s %s %lldx%lld %s threads=%d, %.0f MB moved\n", op_name.c_str(), dtype.c_str(), rows, cols,
              cpu::IsaName(isa), threads, moved / 1e6);
  std::printf("  kernel: median %9.2f us (%5.1f GB/s), best %9.2f us (%5.1f GB/s), cpu %9.2f us\n", kernel.median_us,
              gbs(kernel.median_us), kernel.best_us, gbs(kernel.best_us), kernel.cpu_us);
  std::printf("  memcpy: median %9.2f us (%5.1f GB/s), best %9.2f us (%5.1f GB/s), cpu %9.2f us\n", copy.median_us,
              gbs(copy.median_us), copy.best_us, gbs(copy.best_us), copy.cpu_us);
  std::printf("  kernel / memcpy: median %.2fx, best %.2fx, cpu %.2fx\n", kernel.median_us / copy.median_us,
              kernel.best_us / copy.best_us, kernel.cpu_us / copy.cpu_us);
  return 0;
}

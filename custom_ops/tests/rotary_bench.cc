// A microbenchmark of the rotary ops' CPU kernels (onnxnorm/rotary_kernels.h) without ONNX
// Runtime, beside what bounds them: a copy of Q and K, and the floor of rotary_floor.h (the
// kernels' per-head loads, products, roundings and stores alone, with the same instructions). Not
// a test; docs/benchmarks.md uses it. The node is the one `onnxnorm bench kernels` times:
//
//   onnxnorm_rotary_bench --dtype bfloat16 [--norm rms|layer|l2] [--tokens 512] [--q-heads 32]
//       [--k-heads 8] [--head-size 128] [--layout 0|2] [--rotary-in-t 1] [--order A|B]
//       [--threads 2] [--isa avx512_bf16|avx512|avx2|portable] [--seconds 0.5] [--calls N]
//
// a weight [head_size] of T for Q and for K (LayerNorm: a bias too), epsilon 1e-6, half-split
// rotation of the whole head, per-pair caches [4096, head_size / 2] of T gathered by position ids
// 0, 1, ... (a prefill). Prints the median, fastest and CPU microseconds of each, the kernel's
// and the floors' against the copy's, and the kernel's against each floor: a kernel near its floor
// can only get faster by computing less, which the rounding contract does not allow.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../cpu/cpu_internal.h"  // the scalar float16 / bfloat16 conversions
#include "bench_harness.h"
#include "onnxnorm/kernels.h"
#include "onnxnorm/rotary_kernels.h"
#include "rotary_floor.h"

namespace {

using onnxnorm::ElemType;
using onnxnorm::NormKind;
using onnxnorm::RotaryArgs;
using onnxnorm::RotaryRowsFn;
using onnxnorm::bench::Buffer;
using onnxnorm::bench::RotaryFloorArgs;
using onnxnorm::bench::Team;
using onnxnorm::bench::TimeCalls;
using onnxnorm::bench::Timing;
namespace cpu = onnxnorm::cpu;

constexpr int64_t kPositions = 4096;

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s --dtype float32|float16|bfloat16 [--norm rms|layer|l2] [--tokens N] [--q-heads N] "
               "[--k-heads N] [--head-size N] [--layout 0|2] [--rotary-in-t 0|1] [--order A|B] [--threads N] "
               "[--isa avx512_bf16|avx512|avx2|portable] [--seconds S] [--calls N]\n",
               argv0);
  return 2;
}

// n values of T from f(i)
void FillWith(Buffer& b, ElemType t, int64_t n, const std::function<float(int64_t)>& f) {
  for (int64_t i = 0; i < n; ++i) {
    if (t == ElemType::kFloat32) {
      reinterpret_cast<float*>(b.data)[i] = f(i);
    } else {
      reinterpret_cast<uint16_t*>(b.data)[i] =
          t == ElemType::kFloat16 ? cpu::FloatToHalf(f(i)) : cpu::FloatToBFloat16(f(i));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string dtype, norm_name = "rms", isa_name, order = "A";
  int64_t tokens = 512, q_heads = 32, k_heads = 8, head_size = 128, calls = 0;
  int layout = 0, rotary_in_t = 1, threads = 2;
  double seconds = 0.5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return Usage(argv[0]);
    const char* value = argv[++i];
    if (arg == "--dtype") {
      dtype = value;
    } else if (arg == "--norm") {
      norm_name = value;
    } else if (arg == "--tokens") {
      tokens = std::atoll(value);
    } else if (arg == "--q-heads") {
      q_heads = std::atoll(value);
    } else if (arg == "--k-heads") {
      k_heads = std::atoll(value);
    } else if (arg == "--head-size") {
      head_size = std::atoll(value);
    } else if (arg == "--layout") {
      layout = std::atoi(value);
    } else if (arg == "--rotary-in-t") {
      rotary_in_t = std::atoi(value);
    } else if (arg == "--order") {
      order = value;
    } else if (arg == "--threads") {
      threads = std::atoi(value);
    } else if (arg == "--isa") {
      isa_name = value;
    } else if (arg == "--seconds") {
      seconds = std::atof(value);
    } else if (arg == "--calls") {
      calls = std::atoll(value);
    } else {
      return Usage(argv[0]);
    }
  }
  ElemType t = ElemType::kFloat32;
  cpu::Isa isa = cpu::Isa::kPortable;
  const NormKind norm = norm_name == "rms"     ? NormKind::kRms
                        : norm_name == "layer" ? NormKind::kLayer
                        : norm_name == "l2"    ? NormKind::kL2
                                               : static_cast<NormKind>(-1);
  if (!onnxnorm::bench::DtypeNamed(dtype, &t) || !onnxnorm::bench::IsaNamed(isa_name, &isa) ||
      static_cast<int>(norm) < 0 || tokens < 1 || tokens > kPositions || q_heads < 1 || k_heads < 0 || head_size < 2 ||
      head_size % 2 != 0 || (layout != 0 && layout != 2) || (rotary_in_t != 0 && rotary_in_t != 1) ||
      (order != "A" && order != "B") || threads < 1) {
    return Usage(argv[0]);
  }
  const RotaryRowsFn fn = cpu::GetRotaryRowsFor(isa, norm, t, t, t);
  if (fn == nullptr) {
    std::fprintf(stderr, "no %s rotary kernel for %s on this CPU\n", cpu::IsaName(isa), dtype.c_str());
    return 2;
  }

  const size_t elem = t == ElemType::kFloat32 ? 4 : 2;
  const int64_t half = head_size / 2;
  const int64_t heads = q_heads + k_heads;
  const size_t q_bytes = static_cast<size_t>(tokens * q_heads * head_size) * elem;
  const size_t k_bytes = static_cast<size_t>(tokens * k_heads * head_size) * elem;
  // Q and K side by side in one buffer each way (the floor reads a token's heads together)
  Buffer x(q_bytes + k_bytes), y(q_bytes + k_bytes), floor_x(q_bytes + k_bytes), floor_y(q_bytes + k_bytes);
  Buffer cos(static_cast<size_t>(kPositions * half) * elem), sin(static_cast<size_t>(kPositions * half) * elem);
  Buffer weight(static_cast<size_t>(2 * head_size) * elem), bias(static_cast<size_t>(2 * head_size) * elem);
  std::mt19937 rng(1);
  onnxnorm::bench::Fill(x, t, rng);
  onnxnorm::bench::Fill(floor_x, t, rng);
  std::uniform_real_distribution<float> near_one(0.5f, 1.5f), small(-0.1f, 0.1f);
  FillWith(weight, t, 2 * head_size, [&](int64_t) { return near_one(rng); });
  FillWith(bias, t, 2 * head_size, [&](int64_t) { return small(rng); });
  // position p, pair i: angle p * 10000^(-2i / head_size), as the models' caches
  auto angle = [&](int64_t index) {
    const double pair = static_cast<double>(index % half), position = static_cast<double>(index / half);
    return position * std::pow(10000.0, -2.0 * pair / static_cast<double>(head_size));
  };
  FillWith(cos, t, kPositions * half, [&](int64_t i) { return static_cast<float>(std::cos(angle(i))); });
  FillWith(sin, t, kPositions * half, [&](int64_t i) { return static_cast<float>(std::sin(angle(i))); });
  std::vector<int64_t> positions(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) positions[static_cast<size_t>(i)] = i;

  RotaryArgs a;
  a.norm = norm;
  a.cast_before_scale = order == "A" ? 1 : 0;
  a.per_head = 1;
  a.rotary_in_t = rotary_in_t;
  a.layout = layout;
  a.epsilon = 1e-6f;
  a.batch = 1;
  a.seq = tokens;
  a.head_size = head_size;
  a.rotary_dim = head_size;
  a.cos = cos.data;
  a.sin = sin.data;
  a.angle_width = half;
  a.position_ids = positions.data();
  a.q = {x.data,  y.data,
         q_heads, norm == NormKind::kL2 ? nullptr : weight.data,
         1,       norm == NormKind::kLayer ? bias.data : nullptr,
         1};
  if (k_heads > 0) {
    a.k = {x.data + q_bytes,
           y.data + q_bytes,
           k_heads,
           norm == NormKind::kL2 ? nullptr : weight.data + head_size * elem,
           1,
           norm == NormKind::kLayer ? bias.data + head_size * elem : nullptr,
           1};
  }

  // The ORT glue's blocks (custom_ops/ort/rotary_op.cc), claimed from a shared counter as ORT's
  // pool does
  const int64_t rows = tokens * heads;
  const onnxnorm::bench::RowBlocks glue = onnxnorm::bench::GlueBlocks(rows, head_size);
  const int64_t per_block = glue.rows_per_block, blocks = glue.blocks;
  if (!glue.parallel) threads = 1;
  Team team(threads);
  std::atomic<int64_t> next{0};
  // (rows wider than the kernels' stack buffer: scratch of each thread's own, as the glue gives
  // each block its own)
  const int64_t scratch_floats =
      onnxnorm::RotaryScratchFloats(a) > onnxnorm::kRotaryStackFloats ? onnxnorm::RotaryScratchFloats(a) : 0;
  std::vector<float> scratch(static_cast<size_t>(threads * scratch_floats));
  auto by_blocks = [&](const std::function<void(int64_t, int64_t, int)>& body) {
    return [&, body](int thread) {
      for (int64_t b; (b = next.fetch_add(1, std::memory_order_relaxed)) < blocks;) {
        body(b * per_block, std::min((b + 1) * per_block, rows), thread);
      }
    };
  };
  auto time_blocks = [&](const std::function<void(int)>& job) {
    return TimeCalls(
        [&] {
          next.store(0, std::memory_order_relaxed);
          team.Run(job);
        },
        seconds, calls, threads);
  };
  const Timing kernel = time_blocks(by_blocks([&](int64_t begin, int64_t end, int thread) {
    fn(a, begin, end, scratch_floats > 0 ? scratch.data() + thread * scratch_floats : nullptr);
  }));

  // memcpy of Q and K, each thread its share
  const size_t bytes = q_bytes + k_bytes;
  const Timing copy = TimeCalls(
      [&] {
        team.Run([&](int i) {
          const size_t begin = bytes / 64 * static_cast<size_t>(i) / static_cast<size_t>(threads) * 64;
          const size_t end =
              i + 1 == threads ? bytes : bytes / 64 * static_cast<size_t>(i + 1) / static_cast<size_t>(threads) * 64;
          std::memcpy(y.data + begin, x.data + begin, end - begin);
        });
      },
      seconds, calls, threads);

  // the floors (AVX512-BF16 CPUs, half-split heads in vectors of 16 pairs)
  const bool floor_runs = cpu::SupportedIsa() == cpu::Isa::kAvx512Bf16 && half % 16 == 0;
  const bool half_precision = t == ElemType::kFloat16 && onnxnorm::bench::RotaryFloorCpuHasHalfPrecision();
  std::vector<float> weight32(static_cast<size_t>(head_size), 1.f);
  RotaryFloorArgs f;
  f.x = floor_x.data;
  f.y = floor_y.data;
  f.cos = cos.data;
  f.sin = sin.data;
  f.weight = weight32.data();
  f.head_size = head_size;
  f.heads_per_token = heads;
  f.inv_rms = 0.97f;
  Timing floors[2] = {};
  for (int contract = 0; contract < 2 && floor_runs; ++contract) {
    floors[contract] = time_blocks(by_blocks([&, contract](int64_t begin, int64_t end, int) {
      onnxnorm::bench::RotaryFloorHeads(t, contract == 1, f, begin, end);
    }));
  }

  const double moved = 2.0 * static_cast<double>(bytes);
  auto line = [&](const char* name, const Timing& time) {
    std::printf("  %-30s median %9.2f us (%5.1f GB/s), best %9.2f us, cpu %9.2f us", name, time.median_us,
                moved / time.median_us / 1e3, time.best_us, time.cpu_us);
  };
  std::printf(
      "%sNormRotary %s, %lld tokens, %lld q + %lld k heads of %lld, layout %d, rotary_in_t %d, order %s, %s, "
      "threads=%d, %.1f MB moved\n",
      norm == NormKind::kRms     ? "RMS"
      : norm == NormKind::kLayer ? "Layer"
                                 : "L2",
      dtype.c_str(), static_cast<long long>(tokens), static_cast<long long>(q_heads), static_cast<long long>(k_heads),
      static_cast<long long>(head_size), layout, rotary_in_t, order.c_str(), cpu::IsaName(isa), threads, moved / 1e6);
  line("kernel", kernel);
  std::printf(" = %.2fx copy\n", kernel.median_us / copy.median_us);
  line("copy (memcpy of Q and K)", copy);
  std::printf("\n");
  if (!floor_runs) {
    std::printf("  floors: n/a (they need AVX512-BF16 and head_size / 2 a multiple of 16)\n");
    return 0;
  }
  const char* names[2] = {"floor, rounded once", "floor, models' rounding"};
  for (int contract = 0; contract < 2; ++contract) {
    line(names[contract], floors[contract]);
    std::printf(" = %.2fx copy; kernel / floor %.2fx\n", floors[contract].median_us / copy.median_us,
                kernel.median_us / floors[contract].median_us);
  }
  if (half_precision) {
    std::printf(
        "  (this CPU has AVX512-FP16: the float16 kernel rotates in half precision, which the floors, in "
        "float32 with conversions, do not)\n");
  }
  return 0;
}

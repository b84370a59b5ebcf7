// The floor of the rotary ops' CPU kernels (rotary_bench.cc): loops over half-split heads that
// do what the AVX-512 kernels (custom_ops/cpu/rotary_rows.h) must do per head and nothing else,
// with the same instructions (the Isa of custom_ops/cpu/isa_avx512.h): load the head, multiply by
// 1/rms (a constant: the statistics are left out), round as the rounding contract says, multiply
// by the prepared float32 weight, load the token's angles, rotate, store. What a kernel cannot
// beat on this CPU, whatever it does about the statistics, the blocks or the memory. Not a test.
#pragma once

#include <cstdint>

#include "onnxnorm/kernels.h"

namespace onnxnorm {
namespace bench {

struct RotaryFloorArgs {
  const void* x = nullptr;  // of T: [heads in all, head_size], a token's heads together
  void* y = nullptr;        // of T, the same shape
  const void* cos = nullptr;  // of T: [tokens, head_size / 2], the row of token h / heads_per_token
  const void* sin = nullptr;
  const float* weight = nullptr;  // [head_size]
  int64_t head_size = 0;          // a multiple of 32
  int64_t heads_per_token = 1;
  float inv_rms = 1.f;
};

// Heads [begin, end) of a, in T = t (float32, float16 or bfloat16). contract: the rounding the
// fusion writes for the models' code (rotary_in_t = 1, order A: the normalized value, its
// product by the weight, each rotation product rounded to T, and the sum by the store: five
// roundings per value); else rounded once, by the store (rotary_in_t = 0, order B). Only on CPUs
// with AVX512-BF16 (the loops are compiled with its flags); does nothing on other builds.
void RotaryFloorHeads(ElemType t, bool contract, const RotaryFloorArgs& a, int64_t begin, int64_t end);

// Whether this CPU has AVX512-FP16: its float16 rotary kernels rotate in half precision, with
// fewer conversions than these float32 floors make.
bool RotaryFloorCpuHasHalfPrecision();

}  // namespace bench
}  // namespace onnxnorm

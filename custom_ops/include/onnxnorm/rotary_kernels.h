// The CPU row kernels of the rotary ops (RMSNormRotary, LayerNormRotary, L2NormRotary): Q and K
// normalized per head (or per token) and rotated (RoPE), over RotaryArgs. Plain C++ without ONNX
// Runtime types, like onnxnorm/kernels.h: the ORT glue (custom_ops/ort/rotary_op.cc) checks the
// inputs, fills one RotaryArgs per call and runs a kernel on row ranges, possibly from several
// threads at once.
//
// Rows: with per_head = 1 a row is one head of one token, with per_head = 0 one token (all its
// heads). Q's rows come first, then K's: row r < RotaryRows(args, args.q) is Q's row r. A
// tensor's rows are numbered in its input's memory order, so that row r of a tensor reads its
// values at x + r * RotaryRowWidth: layout 0 and 2 number (batch, seq, head), layout 1 (batch,
// head, seq).
//
// Per row: the statistics in float32 as the norm kernels take them (onnxnorm/kernels.h), the
// norm with its weights in the rounding order cast_before_scale says, rounded to T; then each
// head's first rotary_dim values rotated with its token's angles, in float32 and rounded once
// to T (rotary_in_t = 0), or with the angles, each product and the sum rounded to T
// (rotary_in_t = 1, a 16-bit T); values past rotary_dim unchanged. rotary_first = 1 rotates
// (rounded to T) and then normalizes. Every instruction set gives the same bits.
#pragma once

#include <cstdint>

#include "onnxnorm/kernels.h"
#include "onnxnorm/ops_generated.h"

namespace onnxnorm {

// Q or K of a rotary call.
struct RotaryTensor {
  const void* x = nullptr;  // of T; nullptr: absent (K alone may be)
  void* y = nullptr;        // of T, in the output layout
  int64_t heads = 0;
  const void* scale = nullptr;  // of S: [scale_rows, head_size]; nullptr: absent (1)
  int64_t scale_rows = 1;       // 1 (shared by every head) or heads
  const void* bias = nullptr;   // of S: [bias_rows, head_size]; nullptr: absent (0)
  int64_t bias_rows = 1;
};

struct RotaryArgs {
  NormKind norm = NormKind::kRms;
  // 0: order B (normalize and scale in float32, round once); 1: order A (round the normalized
  // value, then scale in T). No effect for float32.
  int32_t cast_before_scale = 0;
  int32_t per_head = 1;      // 1: a head's values normalized together; 0: a token's (layout 0 or 2)
  int32_t interleaved = 0;   // 0: value i rotated with i + rotary_dim / 2; 1: value 2j with 2j + 1
  int32_t rotary_first = 0;  // 1: rotate, then normalize
  int32_t rotary_in_t = 0;   // 1: the rotation's angles, products and sums rounded to T (16-bit T)
  // 0: x and y [batch, seq, heads, head_size]; 1: both [batch, heads, seq, head_size]; 2: x as in
  // 0, y [batch, heads, seq, head_size]
  int32_t layout = 0;
  float epsilon = 1e-5f;
  float scale_offset = 0.f;  // RMS: y = normalized * (Scale + offset)
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head_size = 0;   // > 0 where there are rows
  int64_t rotary_dim = 0;  // even, in [0, head_size]
  // cos and sin of the angles, of A: rows of angle_width values, angle_width = rotary_dim / 2
  // (one per rotated pair) or rotary_dim (one per rotated value)
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t angle_width = 0;
  // The row of cos and sin of token (b, s): position_ids[b * seq + s] (each in range), or without
  // position ids (nullptr) (b % cache_batch) * seq + s, cache_batch being 1 or batch.
  const int64_t* position_ids = nullptr;
  int64_t cache_batch = 1;
  RotaryTensor q;
  RotaryTensor k;
};

// The rows of tensor t of a call (0 for an absent tensor), and the values each row holds.
inline int64_t RotaryRows(const RotaryArgs& a, const RotaryTensor& t) {
  if (t.x == nullptr) return 0;
  return a.batch * a.seq * (a.per_head ? t.heads : 1);
}
inline int64_t RotaryRowWidth(const RotaryArgs& a, const RotaryTensor& t) {
  return a.per_head ? a.head_size : t.heads * a.head_size;
}

// Rows of up to this many floats of buffer (RotaryScratchFloats) keep it on the stack; wider ones
// take it from the caller's scratch.
inline constexpr int64_t kRotaryStackFloats = 8192;
// The float32 buffer a row needs: one head (normalized, then rotated in place), or with
// rotary_first = 1 the whole row (rotated, then normalized).
inline int64_t RotaryScratchFloats(const RotaryArgs& a) {
  const int64_t q = RotaryRowWidth(a, a.q);
  const int64_t k = a.k.x != nullptr ? RotaryRowWidth(a, a.k) : 0;
  return a.rotary_first ? (q > k ? q : k) : a.head_size;
}

// Processes rows [row_begin, row_end) of args (Q's, then K's). scratch: RotaryScratchFloats(args)
// floats of this caller's own where that is more than kRotaryStackFloats, else unused (nullptr).
// Safe to call concurrently on disjoint row ranges with scratch of each caller's own. Never
// throws; never allocates.
using RotaryRowsFn = void (*)(const RotaryArgs& args, int64_t row_begin, int64_t row_end, float* scratch);

namespace cpu {

// The rotary row kernel of a norm kind for Q and K of x_type, weights of weight_type (x_type or
// kFloat32; x_type for kL2, which has none) and angles of angle_type (x_type or kFloat32), on
// the instruction set GetNormRows chooses (ONNXNORM_CPU_ISA lowers it); nullptr when the
// combination is not implemented.
RotaryRowsFn GetRotaryRows(NormKind norm, ElemType x_type, ElemType weight_type, ElemType angle_type);

// The same kernel for calls of fewer than kSmallCallElements values, as GetNormRowsForSmallCalls
// chooses it (AVX2 instead of AVX-512 but for bfloat16). The same bits.
RotaryRowsFn GetRotaryRowsForSmallCalls(NormKind norm, ElemType x_type, ElemType weight_type, ElemType angle_type);

// GetRotaryRows for one instruction set: nullptr also when isa is above SupportedIsa(). (Named
// in full: the instruction-set units that include this header hold a struct Isa of their own.)
RotaryRowsFn GetRotaryRowsFor(::onnxnorm::cpu::Isa isa, NormKind norm, ElemType x_type, ElemType weight_type,
                              ElemType angle_type);

}  // namespace cpu
}  // namespace onnxnorm

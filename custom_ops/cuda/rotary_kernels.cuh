// The CUDA kernels of the rotary ops (RMSNormRotary, LayerNormRotary, L2NormRotary): Q and K
// normalized per head (or per token) and rotated (RoPE) in one launch, over onnxnorm::RotaryArgs
// (onnxnorm/rotary_kernels.h), the argument struct the CPU kernels take.
//
// Rows are the CPU kernels': with per_head = 1 one head of one token, with per_head = 0 one token
// (all its heads); Q's rows first, then K's, so the grid covers both tensors. A row is read in its
// input's memory order and only the output position depends on the layout (layout 2 writes
// [batch, heads, seq, head_size] directly).
//
// A row is cut into slots of two values that one thread owns from load to store, so the rotation
// needs no exchange between threads: a rotated pair (value k and k + rotary_dim / 2, or 2k and
// 2k + 1 where interleaved), or two neighbouring values past rotary_dim (the second absent at the
// end of an odd tail). Slot s of a row is head s / spd's slot s % spd (spd: the slots of one
// head, pairs first); lanes take slots lane, lane + tpr, ..., so a warp's loads of each half of
// its pairs are coalesced.
//
// Two kernels, as for the norms:
// * RotaryRegsKernel<..., kSlots, kBlockMode>: a group of tpr threads per row (4, 8, 16 or 32
//   lanes: several rows per block; or the whole block, 128 to 512 threads, for per_head = 0's
//   tokens) holds the row in registers, kSlots slots per thread: read once, written once.
// * RotaryStreamKernel: rows wider than that (a block of 512 per row), each pass re-reading the
//   row from L1/L2.
//
// Numerics: the statistics are the norm kernels' (ComputeRowStats: float32, LayerNorm two-pass
// around the row's first value), the weights' rounding orders ScaleShift's; then the normalized
// value is rounded to T, rotated in float32 without fused multiply-adds (__fmul_rn, __fadd_rn:
// each product rounded to float32, as the CPU kernels compute it) and rounded to T at the store;
// rotary_in_t = 1 (a 16-bit T) rounds the angles, each product and the sum to T. rotary_first = 1
// rotates (rounded to T) at the load and normalizes the rotated values.
//
// PositionIds: a token whose position id is outside [0, angle_rows) reads no angles; its rotated
// values are NaN and, where the launcher was given one, an error flag in device memory is set to
// 1 (no kernel can fail a launch on the data it reads: the ORT glue on the CPU checks the ids,
// which on the GPU would mean a copy to the host and a synchronization).
#pragma once

#include <cstdint>

#include "norm_kernels.cuh"
#include "onnxnorm/rotary_kernels.h"

namespace onnxnorm {
namespace cuda {

// The kernels' view of a call: the RotaryArgs and what the launcher adds.
struct RotaryKernelArgs {
  RotaryArgs a;
  int64_t rows_q = 0;                 // Q's rows: the grid's first
  int64_t rows = 0;                   // Q's and K's
  int64_t angle_rows = 0;             // rows of Cos and Sin: position ids must be below it
  int32_t* position_error = nullptr;  // set to 1 where a position id is out of range; nullptr: not reported
};

__device__ __forceinline__ float RotaryNaN() { return __int_as_float(0x7fc00000); }

// The rotation of a pair (a, b) with its angles (cos_a, sin_a) for a and (cos_b, sin_b) for b,
// each result rounded to T: a' = a cos_a - b sin_a, b' = b cos_b + a sin_b, each product rounded
// to float32 (no fused multiply-add); in_t (a 16-bit T): the angles, each product and the sum
// rounded to T.
template <typename T>
__device__ __forceinline__ void RotatePair(float a, float b, float ca, float sa, float cb, float sb, bool in_t,
                                           float* ra, float* rb) {
  if (sizeof(T) == 2 && in_t) {
    ca = RoundTo<T>(ca);
    sa = RoundTo<T>(sa);
    cb = RoundTo<T>(cb);
    sb = RoundTo<T>(sb);
    *ra = RoundTo<T>(__fsub_rn(RoundTo<T>(__fmul_rn(a, ca)), RoundTo<T>(__fmul_rn(b, sa))));
    *rb = RoundTo<T>(__fadd_rn(RoundTo<T>(__fmul_rn(b, cb)), RoundTo<T>(__fmul_rn(a, sb))));
  } else {
    *ra = RoundTo<T>(__fsub_rn(__fmul_rn(a, ca), __fmul_rn(b, sa)));
    *rb = RoundTo<T>(__fadd_rn(__fmul_rn(b, cb), __fmul_rn(a, sb)));
  }
}

// One slot of a row: its head (in the row), the positions of its values in that head, the angles'
// positions in the token's row of Cos and Sin, and whether it is a rotated pair and has a second
// value.
struct RotarySlot {
  int32_t hh = 0;
  int32_t ja = 0, jb = 0;
  int32_t ca = 0, cb = 0;
  bool pair = false;
  bool has_b = false;
};

// One row of a call, as a thread sees it: where its values come from and go, its weights and its
// token's angles.
template <typename T, typename W, typename A>
struct RotaryRowView {
  const RotaryArgs& a;
  const RotaryTensor* t = nullptr;
  int64_t local = 0;  // the row in its tensor
  int64_t b = 0, s = 0, h0 = 0;
  int32_t nh = 1;     // heads in the row
  int32_t d = 0;      // head_size
  int32_t n = 0;      // values in the row
  int32_t slots = 0;  // slots in the row
  int32_t spd = 0;    // slots per head
  int32_t pairs = 0;  // rotated pairs per head
  const T* x = nullptr;
  const A* cos = nullptr;  // the token's row of Cos and Sin; nullptr: its position id is out of range
  const A* sin = nullptr;
  bool bad_position = false;

  // Row r of the call (Q's rows first).
  __device__ __forceinline__ RotaryRowView(const RotaryKernelArgs& p, int64_t r) : a(p.a) {
    const bool is_q = r < p.rows_q;
    t = is_q ? &a.q : &a.k;
    local = is_q ? r : r - p.rows_q;
    const int64_t heads = t->heads;
    if (!a.per_head) {
      b = local / a.seq;
      s = local % a.seq;
      nh = static_cast<int32_t>(heads);
    } else if (a.layout == 1) {
      h0 = local / a.seq % heads;
      b = local / a.seq / heads;
      s = local % a.seq;
    } else {
      h0 = local % heads;
      b = local / heads / a.seq;
      s = local / heads % a.seq;
    }
    d = static_cast<int32_t>(a.head_size);
    n = nh * d;
    pairs = static_cast<int32_t>(a.rotary_dim / 2);
    spd = pairs + (d - static_cast<int32_t>(a.rotary_dim) + 1) / 2;
    slots = nh * spd;
    x = static_cast<const T*>(t->x) + local * n;
    const int64_t token = b * a.seq + s;
    int64_t cache_row = (b % a.cache_batch) * a.seq + s;
    if (a.position_ids != nullptr) {
      cache_row = a.position_ids[token];
      bad_position = cache_row < 0 || cache_row >= p.angle_rows;
    }
    if (!bad_position) {
      cos = static_cast<const A*>(a.cos) + cache_row * a.angle_width;
      sin = static_cast<const A*>(a.sin) + cache_row * a.angle_width;
    }
  }

  __device__ __forceinline__ RotarySlot Slot(int32_t slot) const {
    RotarySlot sl;
    sl.hh = slot / spd;
    const int32_t k = slot - sl.hh * spd;
    if (k < pairs) {
      sl.pair = true;
      sl.has_b = true;
      const bool per_value = a.angle_width == a.rotary_dim;
      if (a.interleaved) {
        sl.ja = 2 * k;
        sl.jb = 2 * k + 1;
        sl.ca = per_value ? 2 * k : k;
        sl.cb = per_value ? 2 * k + 1 : k;
      } else {
        sl.ja = k;
        sl.jb = k + pairs;
        sl.ca = k;
        sl.cb = per_value ? k + pairs : k;
      }
    } else {
      sl.ja = 2 * pairs + 2 * (k - pairs);
      sl.jb = sl.ja + 1;
      sl.has_b = sl.jb < d;
    }
    return sl;
  }

  __device__ __forceinline__ void Angles(const RotarySlot& sl, float* ca, float* sa, float* cb, float* sb) const {
    if (cos == nullptr) {
      *ca = *sa = *cb = *sb = RotaryNaN();
      return;
    }
    *ca = ToFloat(cos[sl.ca]);
    *sa = ToFloat(sin[sl.ca]);
    *cb = ToFloat(cos[sl.cb]);
    *sb = ToFloat(sin[sl.cb]);
  }

  // The slot's values as the norm sees them: Q's (K's) own, or with rotary_first rotated and
  // rounded to T. (vb is 0 where the slot has no second value.)
  __device__ __forceinline__ void Load(const RotarySlot& sl, float* va, float* vb) const {
    const T* h = x + static_cast<int64_t>(sl.hh) * d;
    *va = ToFloat(h[sl.ja]);
    *vb = sl.has_b ? ToFloat(h[sl.jb]) : 0.f;
    if (a.rotary_first && sl.pair) {
      float ca, sa, cb, sb;
      Angles(sl, &ca, &sa, &cb, &sb);
      RotatePair<T>(*va, *vb, ca, sa, cb, sb, a.rotary_in_t != 0, va, vb);
    }
  }

  // The slot's outputs from its values (Load's, LayerNorm's possibly shifted by the statistics)
  // and the row's statistics: normalized and weighted; without rotary_first, rounded to T and
  // rotated; stored at their place in the output layout.
  __device__ __forceinline__ void Store(const RotarySlot& sl, float va, float vb, const RowStats& st,
                                        bool order_a) const {
    const int64_t h = h0 + sl.hh;
    const W* scale = t->scale != nullptr ? static_cast<const W*>(t->scale) + (h % t->scale_rows) * d : nullptr;
    const W* bias = t->bias != nullptr ? static_cast<const W*>(t->bias) + (h % t->bias_rows) * d : nullptr;
    auto weighted = [&](float v, int32_t j) {
      return ScaleShift<T>(st.Normalize(v), scale != nullptr, scale != nullptr ? ToFloat(scale[j]) : 0.f,
                           bias != nullptr, bias != nullptr ? ToFloat(bias[j]) : 0.f, a.scale_offset, order_a);
    };
    float oa = weighted(va, sl.ja);
    float ob = sl.has_b ? weighted(vb, sl.jb) : 0.f;
    if (!a.rotary_first && sl.pair) {
      float ca, sa, cb, sb;
      Angles(sl, &ca, &sa, &cb, &sb);
      RotatePair<T>(RoundTo<T>(oa), RoundTo<T>(ob), ca, sa, cb, sb, a.rotary_in_t != 0, &oa, &ob);
    }
    const int64_t at =
        a.layout == 2 ? ((b * t->heads + h) * a.seq + s) * d : local * n + static_cast<int64_t>(sl.hh) * d;
    T* y = static_cast<T*>(t->y) + at;
    y[sl.ja] = FromFloat<T>(oa);
    if (sl.has_b) y[sl.jb] = FromFloat<T>(ob);
  }
};

// Reports an out-of-range position id (one thread of the row).
__device__ __forceinline__ void ReportPosition(const RotaryKernelArgs& p, bool bad, bool leader) {
  if (bad && leader && p.position_error != nullptr) *p.position_error = 1;
}

// ---------------------------------------------------------------------------------------------
// The register-resident kernel: kBlockMode, a block (up to kMaxBlock threads) per row; else tpr
// lanes (4, 8, 16 or 32) per row, blockDim.x / tpr rows per block. Each thread holds kSlots slots.
// ---------------------------------------------------------------------------------------------
template <typename T, typename W, typename A, NormKind kNorm, int kSlots, bool kBlockMode, int kMaxBlock>
__global__ void __launch_bounds__(kMaxBlock) RotaryRegsKernel(const RotaryKernelArgs p, const int tpr) {
  __shared__ float red[2][32];
  int parity = 0;
  const int rows_per_block = kBlockMode ? 1 : blockDim.x / tpr;
  const int lane = kBlockMode ? threadIdx.x : threadIdx.x % tpr;
  const int group = kBlockMode ? 0 : threadIdx.x / tpr;
  const bool order_a = p.a.cast_before_scale != 0 && kNorm != kL2;
  // Every thread runs the same iterations (shuffles and barriers need all lanes); a group past
  // the last row computes on zeros and stores nothing.
  for (int64_t row0 = static_cast<int64_t>(blockIdx.x) * rows_per_block; row0 < p.rows;
       row0 += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t r = row0 + group;
    const bool active = r < p.rows;
    const RotaryRowView<T, W, A> row(p, active ? r : 0);
    ReportPosition(p, active && row.bad_position, lane == 0);
    float va[kSlots], vb[kSlots];
    bool valid[kSlots], has_b[kSlots];
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int32_t slot = i * tpr + lane;
      valid[i] = active && slot < row.slots;
      has_b[i] = false;
      va[i] = vb[i] = 0.f;
      if (valid[i]) {
        const RotarySlot sl = row.Slot(slot);
        has_b[i] = sl.has_b;
        row.Load(sl, &va[i], &vb[i]);
      }
    }
    auto held = [&](auto&& f) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        if (!valid[i]) continue;
        f(va[i]);
        if (has_b[i]) f(vb[i]);
      }
    };
    // (slot 0 of lane 0 starts with the row's first value)
    auto first = [&] { return GroupBroadcast<kBlockMode>(va[0], tpr, red, parity); };
    const float inv_n = 1.f / static_cast<float>(row.n > 0 ? row.n : 1);
    const RowStats st = ComputeRowStats<kNorm, kBlockMode, true>(first, held, tpr, inv_n, p.a.epsilon, red, parity);
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (!valid[i]) continue;
      row.Store(row.Slot(i * tpr + lane), va[i], vb[i], st, order_a);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The general kernel: a block per row, any width; each pass reads the row again.
// ---------------------------------------------------------------------------------------------
constexpr int kRotaryStreamBlock = 512;

template <typename T, typename W, typename A, NormKind kNorm>
__global__ void __launch_bounds__(kRotaryStreamBlock) RotaryStreamKernel(const RotaryKernelArgs p) {
  __shared__ float red[2][32];
  int parity = 0;
  const bool order_a = p.a.cast_before_scale != 0 && kNorm != kL2;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const RotaryRowView<T, W, A> row(p, r);
    ReportPosition(p, row.bad_position, threadIdx.x == 0);
    auto each = [&](auto&& f) {
      for (int32_t slot = threadIdx.x; slot < row.slots; slot += kRotaryStreamBlock) {
        const RotarySlot sl = row.Slot(slot);
        float va, vb;
        row.Load(sl, &va, &vb);
        f(va);
        if (sl.has_b) f(vb);
      }
    };
    auto first = [&] {
      float va, vb;
      row.Load(row.Slot(0), &va, &vb);
      return va;
    };
    const float inv_n = 1.f / static_cast<float>(row.n > 0 ? row.n : 1);
    const RowStats st =
        ComputeRowStats<kNorm, true, false>(first, each, kRotaryStreamBlock, inv_n, p.a.epsilon, red, parity);
    for (int32_t slot = threadIdx.x; slot < row.slots; slot += kRotaryStreamBlock) {
      const RotarySlot sl = row.Slot(slot);
      float va, vb;
      row.Load(sl, &va, &vb);
      row.Store(sl, va, vb, st, order_a);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The launch table
// ---------------------------------------------------------------------------------------------
// The register configurations in increasing capacity (threads per row x slots per thread, two
// values each); the launcher takes the first that holds the widest row of the call, or the
// general kernel (-1) beyond the last. Heads of 64, 128 and 256 values take 8, 16 and 32 lanes;
// per_head = 0's tokens (32 heads of 128: 4096 values) a block.
struct RotaryConfig {
  int tpr;    // threads per row
  int slots;  // slots per thread
  int block;  // threads per block
};
constexpr RotaryConfig kRotaryConfigs[] = {
    {4, 4, 128}, {8, 4, 128}, {16, 4, 128}, {32, 4, 128}, {32, 8, 128}, {128, 8, 128}, {256, 8, 256}, {512, 8, 512},
};
constexpr int kNumRotaryConfigs = sizeof(kRotaryConfigs) / sizeof(kRotaryConfigs[0]);

// The kernel of norm kNorm for T, weights W and angles A in configuration config (-1: the
// general kernel), through launch(kernel, grid, block, args...) (DeviceLauncher, or the host
// emulation's).
template <typename T, typename W, typename A, NormKind kNorm, typename Launcher>
cudaError_t LaunchRotaryTyped(const RotaryKernelArgs& p, int config, const Launcher& launch) {
  if (config < 0 || config >= kNumRotaryConfigs) {
    return launch(&RotaryStreamKernel<T, W, A, kNorm>, GridFor(p.rows), kRotaryStreamBlock, p);
  }
  const RotaryConfig c = kRotaryConfigs[config];
  const int64_t rows_per_block = c.block / c.tpr;
  const unsigned grid = GridFor((p.rows + rows_per_block - 1) / rows_per_block);
  if (c.tpr == c.block) return launch(&RotaryRegsKernel<T, W, A, kNorm, 8, true, 512>, grid, c.block, p, c.tpr);
  if (c.slots == 8) return launch(&RotaryRegsKernel<T, W, A, kNorm, 8, false, 128>, grid, c.block, p, c.tpr);
  return launch(&RotaryRegsKernel<T, W, A, kNorm, 4, false, 128>, grid, c.block, p, c.tpr);
}

// The angles' type: T's or float32.
template <typename T, typename W, NormKind kNorm, typename Launcher>
cudaError_t LaunchRotaryAngles(const RotaryKernelArgs& p, ElemType angle_type, int config, const Launcher& launch) {
  if (angle_type == ElemType::kFloat32) return LaunchRotaryTyped<T, W, float, kNorm>(p, config, launch);
  if constexpr (sizeof(T) == 2) return LaunchRotaryTyped<T, W, T, kNorm>(p, config, launch);
  return cudaErrorInvalidValue;
}

// The kernel for Q of q_type, weights of weight_type (counted only where there are weights;
// L2NormRotary has none, so its kernels are compiled for one weight type) and angles of
// angle_type (the launcher has checked the combination).
template <NormKind kNorm, typename Launcher>
cudaError_t LaunchRotaryTypes(const RotaryKernelArgs& p, ElemType q_type, ElemType weight_type, ElemType angle_type,
                              int config, const Launcher& launch) {
  const bool weights = p.a.q.scale || p.a.q.bias || p.a.k.scale || p.a.k.bias;
  const bool w32 = kNorm != kL2 && weights && weight_type == ElemType::kFloat32;
  switch (q_type) {
    case ElemType::kFloat32: return LaunchRotaryTyped<float, float, float, kNorm>(p, config, launch);
    case ElemType::kFloat16:
      if constexpr (kNorm != kL2) {
        if (w32) return LaunchRotaryAngles<__half, float, kNorm>(p, angle_type, config, launch);
      }
      return LaunchRotaryAngles<__half, __half, kNorm>(p, angle_type, config, launch);
    case ElemType::kBFloat16:
      if constexpr (kNorm != kL2) {
        if (w32) return LaunchRotaryAngles<__nv_bfloat16, float, kNorm>(p, angle_type, config, launch);
      }
      return LaunchRotaryAngles<__nv_bfloat16, __nv_bfloat16, kNorm>(p, angle_type, config, launch);
    default: break;
  }
  return cudaErrorInvalidValue;
}

// The rotary kernels of norm kNorm on stream: defined once per norm, each in its own translation
// unit (ops_rotary_*.cu) so that they compile in parallel (the host emulation defines them too).
template <NormKind kNorm>
cudaError_t LaunchRotaryOp(const RotaryKernelArgs& p, ElemType q_type, ElemType weight_type, ElemType angle_type,
                           int config, cudaStream_t stream);

}  // namespace cuda
}  // namespace onnxnorm

#define ONNXNORM_CUDA_DEFINE_LAUNCH_ROTARY(NORM, LAUNCHER)                                           \
  namespace onnxnorm {                                                                               \
  namespace cuda {                                                                                   \
  template <>                                                                                        \
  cudaError_t LaunchRotaryOp<NORM>(const RotaryKernelArgs& p, ElemType q_type, ElemType weight_type, \
                                   ElemType angle_type, int config, cudaStream_t stream) {           \
    return LaunchRotaryTypes<NORM>(p, q_type, weight_type, angle_type, config, LAUNCHER{stream});    \
  }                                                                                                  \
  }                                                                                                  \
  }

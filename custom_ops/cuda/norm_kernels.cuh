// onnxnorm CUDA kernels: one template family for every float and quantized catalogue op.
//
// Two kernels per (op, X type, weight type):
//
// * RegsKernel<..., kVecs, kBlockMode>: the fast path. A group of tpr threads owns a row
//   (tpr = 4/8/16/32: a sub-warp or warp per row for Q/K-norm and short rows, several rows per
//   block; block mode: a block of 128..512 threads per row for hidden sizes). Each thread loads kVecs
//   128-bit vectors of the row (X, Residual) into registers once, so global memory is read once
//   and written once; statistics are float32, reduced with warp shuffles (and shared memory
//   across the warps of a block); LayerNorm is two-pass over the registers (mean, then the mean
//   of squared deviations) of the row minus its first element (exact differences), accurate for
//   rows of mean 1e4 and std 1e-2. Needs 16-byte
//   aligned arrays and cols a multiple of the vector width.
// * StreamKernel: any width and alignment (odd widths, unaligned views, rows wider than the
//   register path holds). A block per row walks the row with coalesced scalar accesses several
//   times (the row is re-read from L1/L2, not kept); the residual sum is recomputed each pass
//   (it is a pure function of the inputs), so no scratch memory is needed.
//
// Numerics follow onnxnorm/ops/reference.py: Sum is rounded to X's type before its statistics;
// order B multiplies and adds in float32 and rounds once; order A rounds the normalized value,
// then multiplies and adds in X's type (each step rounded).
//
// L2Norm is RMSNorm's code with the sum of squares in place of their mean (NormKind kL2).
// GatedRMSNorm is RMSNorm's code with a gate (GateMode): its groups come as rows (NormArgs), so the
// kernels never see group_size. Without a Gate it runs RMSNorm's kernels. With one, the gate's
// activation (Activate: float32, expf) multiplies either X before the statistics (kBeforeNorm,
// the product not rounded) or the weighted value after them (kAfterNorm, rounded once at the
// store); the Gate is read once, alongside X in the first case, in the store loop in the other.
//
// The quantized ops (a LayerNorm / RMSNorm or its Skip form followed by QuantizeLinear or
// DynamicQuantizeLinear) are the same two kernels with an epilogue (QuantMode): kQuantize rounds
// each Y value to X's type (the float op's Y, bit for bit; written to Y_float when asked for) and
// quantizes it as ONNX Runtime's QuantizeLinear does (Quantizer); kRange writes no Y but the
// min and max of the row's Y (NaN left out) into a [rows, 2] scratch, from which
// DynamicParamsKernel (one block) computes DynamicQuantizeLinear's scale and zero point on the
// device. A static op is one kQuantize launch; a dynamic op is kRange, DynamicParamsKernel, then
// kQuantize reading the scale and zero point it wrote (launch.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "onnxnorm/cuda_launch.h"
#include "onnxnorm/float8.h"
#include "onnxnorm/norm_args.h"

namespace onnxnorm {
namespace cuda {

constexpr NormKind kLayer = NormKind::kLayer;
constexpr NormKind kRms = NormKind::kRms;
constexpr NormKind kL2 = NormKind::kL2;
constexpr ResidualKind kNone = ResidualKind::kNone;
constexpr ResidualKind kSkip = ResidualKind::kSkip;
constexpr ResidualKind kSandwich = ResidualKind::kSandwich;

// ---------------------------------------------------------------------------------------------
// Element conversions
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// v rounded to T's precision (round to nearest even), as a float.
template <typename T>
__device__ __forceinline__ float RoundTo(float v) {
  return ToFloat(FromFloat<T>(v));
}

// ---------------------------------------------------------------------------------------------
// The output step shared by both kernels: normalized value n (float32) -> Y in Y (T, or float32
// for the mixed form of a 16-bit T, which leaves out the last rounding to T)
// ---------------------------------------------------------------------------------------------
template <typename T, typename Y = T>
__device__ __forceinline__ float ScaleShift(float n, bool has_scale, float s, bool has_bias, float b, float offset,
                                            bool order_a) {
  if (sizeof(T) == 2 && order_a) {
    // order A: round n to T, then every step in T (scale and bias are cast to T first)
    float st = has_scale ? RoundTo<T>(s) : 1.f;
    if (offset != 0.f) st = RoundTo<T>(st + RoundTo<T>(offset));
    float y = RoundTo<T>(RoundTo<T>(n) * st);
    if (has_bias) {
      y += RoundTo<T>(b);
      if (sizeof(Y) == 2) y = RoundTo<T>(y);
    }
    return y;
  }
  // order B: float32 throughout, one rounding at the store
  float y = n * ((has_scale ? s : 1.f) + offset);
  return has_bias ? y + b : y;
}

// ---------------------------------------------------------------------------------------------
// The gate of a gated norm (GatedRMSNorm with a Gate)
// ---------------------------------------------------------------------------------------------
// Where the gate acts (NormArgs::norm_before_gate): kNone, no gate; kAfterNorm (1): Y =
// Norm(X) * (Scale + offset) * act(Gate), the weighted value (in order A already rounded to T) times
// act(Gate) in float32, rounded once at the store; kBeforeNorm (0): Z = X * act(Gate) in float32,
// not rounded, and Y = Norm(Z) * (Scale + offset) in the op's rounding order.
enum class GateMode : int32_t { kNone = 0, kAfterNorm = 1, kBeforeNorm = 2 };

// The gate's activation of g (NormArgs::activation, the same for every thread: a uniform branch),
// in float32: 0 SiLU, g * sigmoid(g); 1 sigmoid(g) = 1 / (1 + exp(-g)). expf (at most 2 ulp) and
// an IEEE division, not __expf, whose error grows with |g| (2 + 1.16 |g| ulp); the kernels are
// bound by memory, so the exact forms cost no time. g = -Inf gives a sigmoid of 0 and a SiLU of NaN
// (-Inf * 0), as the reference's.
__device__ __forceinline__ float Activate(float g, int32_t activation) {
  const float sigmoid = 1.f / (1.f + expf(-g));
  return activation == 0 ? g * sigmoid : sigmoid;
}

// ---------------------------------------------------------------------------------------------
// The quantizing epilogue
// ---------------------------------------------------------------------------------------------
// What the kernels do after computing a row's Y: store it (the float ops), quantize it (and store
// it when Y_float is asked for), or take its range (the first pass of a dynamic op).
enum class QuantMode : int32_t { kNone = 0, kQuantize = 1, kRange = 2 };

// The kernels' view of a quantized op's call (launch.cu fills it from CudaQuantArgs).
struct QuantKernelArgs {
  uint8_t* q = nullptr;               // kQuantize: [rows, cols] bytes (uint8, int8's two's complement,
                                      // or float8 e4m3fn's bits)
  const void* scale = nullptr;        // kQuantize: one element of scale_type
  const void* zero_point = nullptr;   // kQuantize: one element of q_type; nullptr: 0 (float8: unused)
  ElemType scale_type = ElemType::kFloat32;
  ElemType q_type = ElemType::kUInt8;
  float* range = nullptr;             // kRange: [rows, 2]: the min and max of each row's Y
};

// ONNX Runtime's QuantizeLinear of a float32 value (onnxnorm/ops/reference.py quantize_linear):
// v / scale in float32 (an IEEE division whatever the compiler flags), NaN to the type's minimum,
// clamped to [min - zero_point, max - zero_point] (whole numbers: clamping before the rounding
// equals clamping after it), rounded half to even, plus the zero point. float8 e4m3fn: v / scale,
// the same division, converted by onnxnorm/float8.h (the CPU kernels' conversion: saturated to
// +-448, rounded half to even, NaN kept), the zero point not read (ORT does not use its value).
struct Quantizer {
  float scale, lo, hi, zero_point;
  bool is_float8;  // the same for every thread of a launch: a uniform branch

  __device__ __forceinline__ static Quantizer Make(const QuantKernelArgs& qa) {
    float s = 1.f;
    switch (qa.scale_type) {
      case ElemType::kFloat16: s = ToFloat(*static_cast<const __half*>(qa.scale)); break;
      case ElemType::kBFloat16: s = ToFloat(*static_cast<const __nv_bfloat16*>(qa.scale)); break;
      default: s = *static_cast<const float*>(qa.scale); break;
    }
    if (qa.q_type == ElemType::kFloat8E4M3FN) return Quantizer{s, 0.f, 0.f, 0.f, true};
    const bool signed8 = qa.q_type == ElemType::kInt8;
    float zp = 0.f;
    if (qa.zero_point != nullptr) {
      zp = signed8 ? static_cast<float>(*static_cast<const int8_t*>(qa.zero_point))
                   : static_cast<float>(*static_cast<const uint8_t*>(qa.zero_point));
    }
    return Quantizer{s, (signed8 ? -128.f : 0.f) - zp, (signed8 ? 127.f : 255.f) - zp, zp, false};
  }

  __device__ __forceinline__ uint8_t operator()(float v) const {
    float t = __fdiv_rn(v, scale);
    if (is_float8) return float8::FloatToE4M3FN(t);
    t = t > lo ? t : lo;  // (false for NaN: the minimum)
    t = t < hi ? t : hi;
    return static_cast<uint8_t>(static_cast<int32_t>(rintf(t) + zero_point));
  }
};

// kN quantized values (kN = 4 or 8: one 128-bit vector of X's type) in one 4- or 8-byte store.
template <int kN>
__device__ __forceinline__ void StoreBytes(uint8_t* p, const uint8_t (&b)[kN]) {
  static_assert(kN == 4 || kN == 8, "a vector of float32 or of a 16-bit type");
  uint32_t w[kN / 4];
#pragma unroll
  for (int c = 0; c < kN / 4; ++c) {
    w[c] = static_cast<uint32_t>(b[4 * c]) | (static_cast<uint32_t>(b[4 * c + 1]) << 8) |
           (static_cast<uint32_t>(b[4 * c + 2]) << 16) | (static_cast<uint32_t>(b[4 * c + 3]) << 24);
  }
  if constexpr (kN == 4) {
    *reinterpret_cast<uint32_t*>(p) = w[0];
  } else {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  }
}

// ---------------------------------------------------------------------------------------------
// 128-bit vector loads and stores of kN elements (kN * sizeof(U) is a multiple of 16 bytes)
// ---------------------------------------------------------------------------------------------
template <typename U, int kN>
__device__ __forceinline__ void LoadVec(const U* p, float (&out)[kN], bool streaming) {
  static_assert((kN * sizeof(U)) % 16 == 0, "vector loads are whole 16-byte chunks");
  constexpr int kPerChunk = 16 / sizeof(U);
#pragma unroll
  for (int c = 0; c < kN / kPerChunk; ++c) {
    const uint4* src = reinterpret_cast<const uint4*>(p) + c;
    uint4 raw = streaming ? __ldcs(src) : __ldg(src);
    const U* e = reinterpret_cast<const U*>(&raw);
#pragma unroll
    for (int j = 0; j < kPerChunk; ++j) out[c * kPerChunk + j] = ToFloat(e[j]);
  }
}

template <typename T, int kN>
__device__ __forceinline__ void StoreVec(T* p, const float (&in)[kN]) {
  static_assert((kN * sizeof(T)) % 16 == 0, "vector stores are whole 16-byte chunks");
  constexpr int kPerChunk = 16 / sizeof(T);
#pragma unroll
  for (int c = 0; c < kN / kPerChunk; ++c) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < kPerChunk; ++j) e[j] = FromFloat<T>(in[c * kPerChunk + j]);
    reinterpret_cast<uint4*>(p)[c] = raw;
  }
}

// ---------------------------------------------------------------------------------------------
// Row sums over the threads of a row: lanes of one warp, or the whole block
// ---------------------------------------------------------------------------------------------
// red: two buffers of 32 floats in shared memory, used alternately (parity flips per call) so
// that one __syncthreads per block-wide reduction suffices. kBlockMode: the group is the whole
// block (blockDim.x threads, a multiple of 32); else tpr (a power of two <= 32) lanes of a warp.
// op combines two values (sum, min, max); identity is its neutral value.
struct AddOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MinOp {  // fminf: NaN is left out
  __device__ __forceinline__ float operator()(float a, float b) const { return fminf(a, b); }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <bool kBlockMode, typename Op>
__device__ __forceinline__ float GroupReduce(float v, int tpr, float (*red)[32], int& parity, Op op, float identity) {
  const int width = kBlockMode ? 32 : tpr;
  for (int offset = width / 2; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if constexpr (kBlockMode) {
    const int warps = blockDim.x / 32;
    float* buffer = red[parity];
    parity ^= 1;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (lane == 0) buffer[warp] = v;
    __syncthreads();
    v = lane < warps ? buffer[lane] : identity;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

template <bool kBlockMode>
__device__ __forceinline__ float GroupSum(float v, int tpr, float (*red)[32], int& parity) {
  return GroupReduce<kBlockMode>(v, tpr, red, parity, AddOp{}, 0.f);
}

// The value v of the row's first thread (lane 0 of the group), for every thread of the row.
template <bool kBlockMode>
__device__ __forceinline__ float GroupBroadcast(float v, int tpr, float (*red)[32], int& parity) {
  if constexpr (kBlockMode) {
    float* buffer = red[parity];
    parity ^= 1;
    if (threadIdx.x == 0) buffer[0] = v;
    __syncthreads();
    return buffer[0];
  } else {
    return __shfl_sync(0xffffffffu, v, (threadIdx.x % 32) & ~(tpr - 1));
  }
}

template <typename W>
__device__ __forceinline__ const W* WeightRow(const void* base, int64_t weight_rows, int64_t row, int64_t cols) {
  return base == nullptr ? nullptr : static_cast<const W*>(base) + (row % weight_rows) * cols;
}

// ---------------------------------------------------------------------------------------------
// Row statistics, one helper for every norm of both kernels
// ---------------------------------------------------------------------------------------------
// A row's value v normalizes to ((v - shift) - mean) * rstd. LayerNorm takes its statistics of
// v - shift, shift being the row's first value: the differences are exact in float32, so rows of
// mean 1e4 and standard deviation 1e-2 stay accurate; then mean is the mean of the differences and
// rstd comes from the mean of their squared deviations (two passes). RMSNorm: shift = mean = 0 and
// rstd from the mean square; L2Norm: rstd from the sum of squares.
struct RowStats {
  float shift = 0.f;
  float mean = 0.f;
  float rstd = 1.f;
  __device__ __forceinline__ float Normalize(float v) const { return ((v - shift) - mean) * rstd; }
};

// The statistics of the row a thread group (kBlockMode: the block; else tpr lanes) holds:
// for_each(f) calls f(v) for every value v (a float&) of the row this thread holds, first()
// gives every thread the row's first value (asked for LayerNorm only). Every thread of the group
// calls it. kInRegisters: the values live in the caller's registers, and LayerNorm replaces them
// with v - shift once (the returned shift is then 0), rather than subtracting it in every pass:
// fewer live registers. Else each pass recomputes them (the general kernel).
template <NormKind kNorm, bool kBlockMode, bool kInRegisters, typename First, typename ForEach>
__device__ __forceinline__ RowStats ComputeRowStats(First first, ForEach for_each, int tpr, float inv_cols,
                                                    float epsilon, float (*red)[32], int& parity) {
  RowStats s;
  if constexpr (kNorm == kLayer) {
    const float shift = first();
    float acc = 0.f;
    for_each([&](float& v) {
      if constexpr (kInRegisters) {
        v -= shift;
        acc += v;
      } else {
        acc += v - shift;
      }
    });
    s.shift = kInRegisters ? 0.f : shift;
    s.mean = GroupSum<kBlockMode>(acc, tpr, red, parity) * inv_cols;
  }
  float acc = 0.f;
  for_each([&](float& v) {
    const float d = (v - s.shift) - s.mean;
    if constexpr (kInRegisters) {
      acc = fmaf(d, d, acc);
    } else {
      acc += d * d;  // (nvcc contracts this where it pays; an explicit fmaf spills more here)
    }
  });
  const float squares = GroupSum<kBlockMode>(acc, tpr, red, parity);
  s.rstd = 1.f / sqrtf((kNorm == kL2 ? squares : squares * inv_cols) + epsilon);
  return s;
}

// ---------------------------------------------------------------------------------------------
// The register-resident kernel
// ---------------------------------------------------------------------------------------------
// kBlockMode: a block (blockDim.x <= kMaxBlock threads) per row; else groups of tpr lanes
// (4, 8, 16 or 32) per row, blockDim.x / tpr rows per block.
// kGate: the gate (GateMode; kNone but for GatedRMSNorm with a Gate, whose residual is kNone).
// kQ: the epilogue (QuantMode; kNone for the float ops). Y: Y's type (T, or float32 for the mixed
// form of the ops without a residual).
template <typename T, typename W, NormKind kNorm, ResidualKind kResidual, GateMode kGate, int kVecs, bool kBlockMode,
          int kMaxBlock, QuantMode kQ, typename Y = T>
__global__ void __launch_bounds__(kMaxBlock) RegsKernel(const NormArgs p, const int tpr, const QuantKernelArgs qa) {
  static_assert(kGate == GateMode::kNone || (kResidual == kNone && kQ == QuantMode::kNone),
                "the gated norm has no residual and no quantized form");
  constexpr int kVE = 16 / sizeof(T);  // elements of T per 128-bit vector
  const int rows_per_block = kBlockMode ? 1 : blockDim.x / tpr;
  __shared__ float red[2][32];
  int parity = 0;

  const int lane = kBlockMode ? threadIdx.x : threadIdx.x % tpr;
  const int group = kBlockMode ? 0 : threadIdx.x / tpr;
  const int64_t cols = p.cols;
  const float inv_cols = 1.f / static_cast<float>(cols);
  const bool order_a = p.cast_before_scale != 0;
  const T* x_all = static_cast<const T*>(p.x);
  Quantizer quantizer{};
  if constexpr (kQ == QuantMode::kQuantize) quantizer = Quantizer::Make(qa);

  // Every thread of the block runs the same number of iterations (warp shuffles and barriers
  // need all lanes); a group past the last row just computes on zeros and stores nothing.
  for (int64_t row0 = static_cast<int64_t>(blockIdx.x) * rows_per_block; row0 < p.rows;
       row0 += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = row0 + group;
    const bool active = row < p.rows;
    const int64_t base = active ? row * cols : 0;

    float z[kVecs][kVE];
    bool valid[kVecs];
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t col = (static_cast<int64_t>(i) * tpr + lane) * kVE;
      valid[i] = active && col < cols;
      if (valid[i]) {
        LoadVec<T, kVE>(x_all + base + col, z[i], true);
      } else {
#pragma unroll
        for (int j = 0; j < kVE; ++j) z[i][j] = 0.f;
      }
    }
    // The row's values in this thread's registers, and its first one (lane 0's) for every lane.
    auto held = [&](auto&& f) {
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (!valid[i]) continue;
#pragma unroll
        for (int j = 0; j < kVE; ++j) f(z[i][j]);
      }
    };
    auto first = [&] { return GroupBroadcast<kBlockMode>(z[0][0], tpr, red, parity); };

    if constexpr (kGate == GateMode::kBeforeNorm) {
      // Z = X * act(Gate) in float32, not rounded: the statistics and the norm are Z's
      const T* g = static_cast<const T*>(p.gate) + base;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (!valid[i]) continue;
        const int64_t col = (static_cast<int64_t>(i) * tpr + lane) * kVE;
        float gv[kVE];
        LoadVec<T, kVE>(g + col, gv, true);
#pragma unroll
        for (int j = 0; j < kVE; ++j) z[i][j] *= Activate(gv[j], p.activation);
      }
    }

    if constexpr (kResidual == kSkip) {
      const T* r = static_cast<const T*>(p.residual) + base;
      const W* xb = WeightRow<W>(p.xbias, p.xbias_rows, row, cols);
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (!valid[i]) continue;
        const int64_t col = (static_cast<int64_t>(i) * tpr + lane) * kVE;
        float rv[kVE];
        LoadVec<T, kVE>(r + col, rv, true);
        float xbv[kVE];
        if (xb != nullptr) LoadVec<W, kVE>(xb + col, xbv, false);
#pragma unroll
        for (int j = 0; j < kVE; ++j) {
          float s = fmaf(p.alpha, rv[j], z[i][j]);
          if (xb != nullptr) s += xbv[j];
          z[i][j] = RoundTo<T>(s);
        }
        if (p.sum != nullptr) StoreVec<T, kVE>(static_cast<T*>(p.sum) + base + col, z[i]);
      }
    } else if constexpr (kResidual == kSandwich) {
      // the inner norm of X (held in z), rounded to T, plus Residual, rounded to T
      const RowStats inner =
          ComputeRowStats<kNorm, kBlockMode, true>(first, held, tpr, inv_cols, p.epsilon, red, parity);
      const T* r = static_cast<const T*>(p.residual) + base;
      const W* is = WeightRow<W>(p.inner_scale, p.inner_scale_rows, row, cols);
      const W* ib = WeightRow<W>(p.inner_bias, p.inner_bias_rows, row, cols);
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (!valid[i]) continue;
        const int64_t col = (static_cast<int64_t>(i) * tpr + lane) * kVE;
        float rv[kVE], sv[kVE], bv[kVE];
        LoadVec<T, kVE>(r + col, rv, true);
        if (is != nullptr) LoadVec<W, kVE>(is + col, sv, false);
        if (ib != nullptr) LoadVec<W, kVE>(ib + col, bv, false);
#pragma unroll
        for (int j = 0; j < kVE; ++j) {
          const float normed =
              RoundTo<T>(ScaleShift<T>(inner.Normalize(z[i][j]), is != nullptr, is != nullptr ? sv[j] : 0.f,
                                       ib != nullptr, ib != nullptr ? bv[j] : 0.f, p.scale_offset, order_a));
          z[i][j] = RoundTo<T>(rv[j] + normed);
        }
        if (p.sum != nullptr) StoreVec<T, kVE>(static_cast<T*>(p.sum) + base + col, z[i]);
      }
    }

    // Y from the statistics of Z
    const RowStats stats = ComputeRowStats<kNorm, kBlockMode, true>(first, held, tpr, inv_cols, p.epsilon, red, parity);
    const W* sc = WeightRow<W>(p.scale, p.scale_rows, row, cols);
    const W* bi = WeightRow<W>(p.bias, p.bias_rows, row, cols);
    [[maybe_unused]] const T* gate = kGate == GateMode::kAfterNorm ? static_cast<const T*>(p.gate) + base : nullptr;
    Y* y = p.y != nullptr ? static_cast<Y*>(p.y) + base : nullptr;
    float lo = INFINITY, hi = -INFINITY;  // kRange: the range of this thread's share of Y
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (!valid[i]) continue;
      const int64_t col = (static_cast<int64_t>(i) * tpr + lane) * kVE;
      float sv[kVE], bv[kVE], out[kVE];
      [[maybe_unused]] float gv[kVE];
      if (sc != nullptr) LoadVec<W, kVE>(sc + col, sv, false);
      if (bi != nullptr) LoadVec<W, kVE>(bi + col, bv, false);
      if constexpr (kGate == GateMode::kAfterNorm) LoadVec<T, kVE>(gate + col, gv, true);
#pragma unroll
      for (int j = 0; j < kVE; ++j) {
        out[j] = ScaleShift<T, Y>(stats.Normalize(z[i][j]), sc != nullptr, sc != nullptr ? sv[j] : 0.f, bi != nullptr,
                                  bi != nullptr ? bv[j] : 0.f, p.scale_offset, order_a);
        if constexpr (kGate == GateMode::kAfterNorm) out[j] *= Activate(gv[j], p.activation);
      }
      if constexpr (kQ == QuantMode::kNone) {
        StoreVec<Y, kVE>(y + col, out);
      } else {
#pragma unroll
        for (int j = 0; j < kVE; ++j) out[j] = RoundTo<T>(out[j]);  // the float op's Y
        if constexpr (kQ == QuantMode::kRange) {
#pragma unroll
          for (int j = 0; j < kVE; ++j) {
            lo = fminf(lo, out[j]);
            hi = fmaxf(hi, out[j]);
          }
        } else {
          if (y != nullptr) StoreVec<Y, kVE>(y + col, out);
          uint8_t b[kVE];
#pragma unroll
          for (int j = 0; j < kVE; ++j) b[j] = quantizer(out[j]);
          StoreBytes<kVE>(qa.q + base + col, b);
        }
      }
    }
    if constexpr (kQ == QuantMode::kRange) {
      lo = GroupReduce<kBlockMode>(lo, tpr, red, parity, MinOp{}, INFINITY);
      hi = GroupReduce<kBlockMode>(hi, tpr, red, parity, MaxOp{}, -INFINITY);
      if (active && lane == 0) {
        qa.range[2 * row] = lo;
        qa.range[2 * row + 1] = hi;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The general kernel: any width, any alignment
// ---------------------------------------------------------------------------------------------
constexpr int kStreamBlock = 512;

template <typename T, typename W, NormKind kNorm, ResidualKind kResidual, GateMode kGate>
struct StreamRow {
  const NormArgs& p;
  int64_t row;
  int64_t base;
  RowStats inner;  // of X, for the sandwich's inner norm

  __device__ __forceinline__ float Weight(const void* w, int64_t rows, int64_t col) const {
    return ToFloat(static_cast<const W*>(w)[(row % rows) * p.cols + col]);
  }

  __device__ __forceinline__ float X(int64_t col) const { return ToFloat(static_cast<const T*>(p.x)[base + col]); }

  // act(Gate) at col (a gated norm's)
  __device__ __forceinline__ float Gate(int64_t col) const {
    return Activate(ToFloat(static_cast<const T*>(p.gate)[base + col]), p.activation);
  }

  // Z at col (Sum for the residual ops, rounded to T; X * act(Gate) for a gate before the norm,
  // not rounded), in float32
  __device__ __forceinline__ float Z(int64_t col) const {
    const float x = X(col);
    if constexpr (kResidual == kNone) {
      if constexpr (kGate == GateMode::kBeforeNorm) return x * Gate(col);
      return x;
    } else {
      const float r = ToFloat(static_cast<const T*>(p.residual)[base + col]);
      if constexpr (kResidual == kSkip) {
        float s = fmaf(p.alpha, r, x);
        if (p.xbias != nullptr) s += Weight(p.xbias, p.xbias_rows, col);
        return RoundTo<T>(s);
      } else {
        const bool hs = p.inner_scale != nullptr, hb = p.inner_bias != nullptr;
        const float normed = RoundTo<T>(ScaleShift<T>(
            inner.Normalize(x), hs, hs ? Weight(p.inner_scale, p.inner_scale_rows, col) : 0.f, hb,
            hb ? Weight(p.inner_bias, p.inner_bias_rows, col) : 0.f, p.scale_offset, p.cast_before_scale != 0));
        return RoundTo<T>(r + normed);
      }
    }
  }
};

template <typename T, typename W, NormKind kNorm, ResidualKind kResidual, GateMode kGate, QuantMode kQ, typename Y = T>
__global__ void __launch_bounds__(kStreamBlock) StreamKernel(const NormArgs p, const QuantKernelArgs qa) {
  static_assert(kGate == GateMode::kNone || (kResidual == kNone && kQ == QuantMode::kNone),
                "the gated norm has no residual and no quantized form");
  __shared__ float red[2][32];
  int parity = 0;
  Quantizer quantizer{};
  if constexpr (kQ == QuantMode::kQuantize) quantizer = Quantizer::Make(qa);
  const int64_t cols = p.cols;
  const float inv_cols = 1.f / static_cast<float>(cols);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    StreamRow<T, W, kNorm, kResidual, kGate> r{p, row, row * cols};
    // each thread's share of the row: columns threadIdx.x, + kStreamBlock, ...
    auto each_x = [&](auto&& f) {
      for (int64_t col = threadIdx.x; col < cols; col += kStreamBlock) {
        float v = r.X(col);
        f(v);
      }
    };
    auto each_z = [&](auto&& f) {
      for (int64_t col = threadIdx.x; col < cols; col += kStreamBlock) {
        float v = r.Z(col);
        f(v);
      }
    };
    if constexpr (kResidual == kSandwich) {
      r.inner = ComputeRowStats<kNorm, true, false>([&] { return r.X(0); }, each_x, kStreamBlock, inv_cols, p.epsilon,
                                                    red, parity);
    }
    const RowStats stats = ComputeRowStats<kNorm, true, false>([&] { return r.Z(0); }, each_z, kStreamBlock, inv_cols,
                                                               p.epsilon, red, parity);

    const bool hs = p.scale != nullptr, hb = p.bias != nullptr;
    Y* y = p.y != nullptr ? static_cast<Y*>(p.y) + r.base : nullptr;
    T* sum = kResidual != kNone && p.sum != nullptr ? static_cast<T*>(p.sum) + r.base : nullptr;
    float lo = INFINITY, hi = -INFINITY;  // kRange
    for (int64_t col = threadIdx.x; col < cols; col += kStreamBlock) {
      const float z = r.Z(col);
      if (sum != nullptr) sum[col] = FromFloat<T>(z);
      float out =
          ScaleShift<T, Y>(stats.Normalize(z), hs, hs ? r.Weight(p.scale, p.scale_rows, col) : 0.f, hb,
                           hb ? r.Weight(p.bias, p.bias_rows, col) : 0.f, p.scale_offset, p.cast_before_scale != 0);
      if constexpr (kGate == GateMode::kAfterNorm) out *= r.Gate(col);
      if constexpr (kQ == QuantMode::kNone) {
        y[col] = FromFloat<Y>(out);
      } else if constexpr (kQ == QuantMode::kRange) {
        const float v = RoundTo<T>(out);
        lo = fminf(lo, v);
        hi = fmaxf(hi, v);
      } else {
        const float v = RoundTo<T>(out);
        if (y != nullptr) y[col] = FromFloat<Y>(v);
        qa.q[r.base + col] = quantizer(v);
      }
    }
    if constexpr (kQ == QuantMode::kRange) {
      lo = GroupReduce<true>(lo, kStreamBlock, red, parity, MinOp{}, INFINITY);
      hi = GroupReduce<true>(hi, kStreamBlock, red, parity, MaxOp{}, -INFINITY);
      if (threadIdx.x == 0) {
        qa.range[2 * row] = lo;
        qa.range[2 * row + 1] = hi;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// DynamicQuantizeLinear's scale and zero point from the rows' ranges
// ---------------------------------------------------------------------------------------------
// One block: the min and max over range[rows, 2] (kRange's output), then ONNX Runtime's rule
// (onnxnorm/ops/reference.py dynamic_quantize_linear, cpu::DynamicQuantParams): the range widened
// to hold 0, scale (hi - lo) / 255 in float32 or 1 when hi == lo, zero point 0 - lo / scale
// clamped to [0, 255] (255 when NaN) and rounded half to even. rows may be 0 (scale 1, zero
// point 0).
constexpr int kParamsBlock = 512;

// (a template, so that it is defined once wherever the header is included)
template <int kBlock = kParamsBlock>
__global__ void __launch_bounds__(kBlock)
    DynamicParamsKernel(const float* range, int64_t rows, float* scale, uint8_t* zero_point) {
  __shared__ float red[2][32];
  int parity = 0;
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    lo = fminf(lo, range[2 * r]);
    hi = fmaxf(hi, range[2 * r + 1]);
  }
  lo = GroupReduce<true>(lo, kBlock, red, parity, MinOp{}, INFINITY);
  hi = GroupReduce<true>(hi, kBlock, red, parity, MaxOp{}, -INFINITY);
  if (threadIdx.x == 0) {
    lo = fminf(lo, 0.f);
    hi = fmaxf(hi, 0.f);
    const float s = hi == lo ? 1.f : __fdiv_rn(hi - lo, 255.f);
    const float initial = 0.f - __fdiv_rn(lo, s);
    const float zp = initial != initial ? 255.f : rintf(fminf(fmaxf(initial, 0.f), 255.f));
    *scale = s;
    *zero_point = static_cast<uint8_t>(static_cast<int32_t>(zp));
  }
}

// ---------------------------------------------------------------------------------------------
// The launch table
// ---------------------------------------------------------------------------------------------
// The register-path configurations, in increasing row capacity (threads per row x vectors per
// thread x elements per vector). The launcher takes the first that holds the row. Configs with
// the same (vecs, block mode) share one kernel: 4 register kernels per op and type pair.
struct RegsConfig {
  int tpr;    // threads per row
  int vecs;   // 128-bit vectors per thread
  int block;  // threads per block
};
// Short rows take few lanes with two vectors each rather than more lanes with one: twice the
// bytes in flight per thread at about the same registers, and one shuffle step less.
constexpr RegsConfig kRegsConfigs[] = {
    {4, 2, 128},   {8, 2, 128},   {16, 2, 128},  {32, 2, 128},  {32, 4, 128},
    {128, 4, 128}, {256, 4, 256}, {512, 4, 512}, {512, 8, 512},
};
constexpr int kNumRegsConfigs = sizeof(kRegsConfigs) / sizeof(kRegsConfigs[0]);

// Grid size for `units` independent units of work (rows or row groups): one block per unit, up
// to a cap beyond which the kernels loop.
inline unsigned GridFor(int64_t units) {
  constexpr int64_t kMaxGrid = int64_t{1} << 30;
  return static_cast<unsigned>(units < kMaxGrid ? units : kMaxGrid);
}

// Launches op (kNorm, kResidual, kGate) for X of type T and weights of type W with config `config`
// (an index into kRegsConfigs, or -1 for StreamKernel) through launch(kernel, grid, block, args...),
// which returns the launch's error: a launch on a stream (DeviceLauncher below), or the host
// emulation's (custom_ops/cuda/emulation), so that both run this one table.
// kQ: the epilogue, with qa its arguments (QuantMode::kNone: the float ops, qa unused). Y: Y's type.
template <typename T, typename W, NormKind kNorm, ResidualKind kResidual, GateMode kGate, QuantMode kQ, typename Y = T,
          typename Launcher>
cudaError_t LaunchTyped(const NormArgs& p, const QuantKernelArgs& qa, int config, const Launcher& launch) {
  if (config < 0 || config >= kNumRegsConfigs) {
    return launch(&StreamKernel<T, W, kNorm, kResidual, kGate, kQ, Y>, GridFor(p.rows), kStreamBlock, p, qa);
  }
  const RegsConfig c = kRegsConfigs[config];
  const int64_t rows_per_block = c.block / c.tpr;
  const unsigned grid = GridFor((p.rows + rows_per_block - 1) / rows_per_block);
  if (c.tpr == c.block) {
    if (c.vecs == 8) {
      return launch(&RegsKernel<T, W, kNorm, kResidual, kGate, 8, true, 512, kQ, Y>, grid, c.block, p, c.tpr, qa);
    }
    return launch(&RegsKernel<T, W, kNorm, kResidual, kGate, 4, true, 512, kQ, Y>, grid, c.block, p, c.tpr, qa);
  }
  if (c.vecs == 2) {
    return launch(&RegsKernel<T, W, kNorm, kResidual, kGate, 2, false, 128, kQ, Y>, grid, c.block, p, c.tpr, qa);
  }
  return launch(&RegsKernel<T, W, kNorm, kResidual, kGate, 4, false, 128, kQ, Y>, grid, c.block, p, c.tpr, qa);
}

// X of a 16-bit T with float32 weights (or none): Y of T, or, in the mixed form of LayerNorm and
// RMSNorm (the float ops without a residual, a gate or L2's sum), float32.
template <typename T, NormKind kNorm, ResidualKind kResidual, GateMode kGate, QuantMode kQ, typename Launcher>
cudaError_t LaunchHalfW32(const NormArgs& p, const QuantKernelArgs& qa, int config, const Launcher& launch) {
  if (p.y_type != ElemType::kFloat32) return LaunchTyped<T, float, kNorm, kResidual, kGate, kQ>(p, qa, config, launch);
  if constexpr (kResidual == kNone && kQ == QuantMode::kNone && kGate == GateMode::kNone && kNorm != kL2) {
    return LaunchTyped<T, float, kNorm, kResidual, kGate, kQ, float>(p, qa, config, launch);
  }
  return cudaErrorInvalidValue;
}

// The same for p's element types (the weights' type counts only when there are weights; L2Norm
// has none, so its kernels are compiled for one weight type only).
template <NormKind kNorm, ResidualKind kResidual, QuantMode kQ, GateMode kGate = GateMode::kNone, typename Launcher>
cudaError_t LaunchTypes(const NormArgs& p, const QuantKernelArgs& qa, int config, const Launcher& launch) {
  const bool weights = p.scale || p.bias || p.inner_scale || p.inner_bias || p.xbias;
  const bool w32 = !weights || p.weight_type == ElemType::kFloat32;
  switch (p.x_type) {
    case ElemType::kFloat32: return LaunchTyped<float, float, kNorm, kResidual, kGate, kQ>(p, qa, config, launch);
    case ElemType::kFloat16:
      if constexpr (kNorm != kL2) {
        if (!w32) return LaunchTyped<__half, __half, kNorm, kResidual, kGate, kQ>(p, qa, config, launch);
      }
      return LaunchHalfW32<__half, kNorm, kResidual, kGate, kQ>(p, qa, config, launch);
    case ElemType::kBFloat16:
      if constexpr (kNorm != kL2) {
        if (!w32) return LaunchTyped<__nv_bfloat16, __nv_bfloat16, kNorm, kResidual, kGate, kQ>(p, qa, config, launch);
      }
      return LaunchHalfW32<__nv_bfloat16, kNorm, kResidual, kGate, kQ>(p, qa, config, launch);
    default: break;
  }
  return cudaErrorInvalidValue;
}

#if defined(__CUDACC__)
// A kernel launch on a stream.
struct DeviceLauncher {
  cudaStream_t stream;
  template <typename... Params, typename... Args>
  cudaError_t operator()(void (*kernel)(Params...), unsigned grid, int block, const Args&... args) const {
    kernel<<<grid, block, 0, stream>>>(args...);
    return cudaGetLastError();
  }
};
#endif

// Launches op (kNorm, kResidual) on stream, with its gate kGate (GatedRMSNorm with a Gate;
// GatedRMSNorm without one is LaunchOp<kRms, kNone>): defined once per op and gate, each in its
// own translation unit (ops_*.cu) so that they compile in parallel (the host emulation defines
// them too).
template <NormKind kNorm, ResidualKind kResidual, GateMode kGate = GateMode::kNone>
cudaError_t LaunchOp(const NormArgs& p, int config, cudaStream_t stream);

// The quantized form of op (kNorm, kResidual): one pass (mode kQuantize or kRange) on stream,
// each in its own translation unit (ops_*_quantized.cu).
template <NormKind kNorm, ResidualKind kResidual>
cudaError_t LaunchQuantOp(const NormArgs& p, const QuantKernelArgs& qa, QuantMode mode, int config,
                          cudaStream_t stream);

// DynamicParamsKernel on stream (defined with the quantized LayerNorm's kernels).
cudaError_t LaunchDynamicParams(const float* range, int64_t rows, float* scale, uint8_t* zero_point,
                                cudaStream_t stream);

}  // namespace cuda
}  // namespace onnxnorm

#define ONNXNORM_CUDA_DEFINE_LAUNCH_OP(NORM, RESIDUAL, LAUNCHER)                                          \
  namespace onnxnorm {                                                                                    \
  namespace cuda {                                                                                        \
  template <>                                                                                             \
  cudaError_t LaunchOp<NORM, RESIDUAL>(const NormArgs& p, int config, cudaStream_t stream) {              \
    return LaunchTypes<NORM, RESIDUAL, QuantMode::kNone>(p, QuantKernelArgs{}, config, LAUNCHER{stream}); \
  }                                                                                                       \
  }                                                                                                       \
  }

#define ONNXNORM_CUDA_DEFINE_LAUNCH_GATED_OP(NORM, RESIDUAL, GATE, LAUNCHER)                                    \
  namespace onnxnorm {                                                                                          \
  namespace cuda {                                                                                              \
  template <>                                                                                                   \
  cudaError_t LaunchOp<NORM, RESIDUAL, GATE>(const NormArgs& p, int config, cudaStream_t stream) {              \
    return LaunchTypes<NORM, RESIDUAL, QuantMode::kNone, GATE>(p, QuantKernelArgs{}, config, LAUNCHER{stream}); \
  }                                                                                                             \
  }                                                                                                             \
  }

#define ONNXNORM_CUDA_DEFINE_LAUNCH_QUANT_OP(NORM, RESIDUAL, LAUNCHER)                                                \
  namespace onnxnorm {                                                                                                \
  namespace cuda {                                                                                                    \
  template <>                                                                                                         \
  cudaError_t LaunchQuantOp<NORM, RESIDUAL>(const NormArgs& p, const QuantKernelArgs& qa, QuantMode mode, int config, \
                                            cudaStream_t stream) {                                                    \
    if (mode == QuantMode::kRange) {                                                                                  \
      return LaunchTypes<NORM, RESIDUAL, QuantMode::kRange>(p, qa, config, LAUNCHER{stream});                         \
    }                                                                                                                 \
    return LaunchTypes<NORM, RESIDUAL, QuantMode::kQuantize>(p, qa, config, LAUNCHER{stream});                        \
  }                                                                                                                   \
  }                                                                                                                   \
  }

#define ONNXNORM_CUDA_DEFINE_LAUNCH_DYNAMIC_PARAMS(LAUNCHER)                                           \
  namespace onnxnorm {                                                                                 \
  namespace cuda {                                                                                     \
  cudaError_t LaunchDynamicParams(const float* range, int64_t rows, float* scale, uint8_t* zero_point, \
                                  cudaStream_t stream) {                                               \
    return LAUNCHER{stream}(&DynamicParamsKernel<>, 1u, kParamsBlock, range, rows, scale, zero_point); \
  }                                                                                                    \
  }                                                                                                    \
  }

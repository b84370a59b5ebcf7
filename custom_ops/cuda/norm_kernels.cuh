// onnxnorm CUDA kernels: one template family for the six catalogue ops.
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
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

namespace onnxnorm {
namespace cuda {

enum NormKind : int { kLayer = 0, kRms = 1 };
enum ResidualKind : int { kNone = 0, kSkip = 1, kSandwich = 2 };

// Everything a kernel needs, passed by value.
struct Params {
  const void* x;
  const void* residual;
  const void* scale;
  const void* bias;
  const void* inner_scale;
  const void* inner_bias;
  const void* xbias;
  void* y;
  void* sum;
  int64_t rows;
  int64_t cols;
  int64_t scale_rows;
  int64_t bias_rows;
  int64_t inner_scale_rows;
  int64_t inner_bias_rows;
  int64_t xbias_rows;
  float epsilon;
  float scale_offset;
  float alpha;
  int order_a;  // cast_before_scale with 16-bit X
};

// ---------------------------------------------------------------------------------------------
// Element conversions
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// v rounded to T's precision (round to nearest even), as a float.
template <typename T>
__device__ __forceinline__ float RoundTo(float v) {
  return ToFloat(FromFloat<T>(v));
}

// ---------------------------------------------------------------------------------------------
// The output step shared by both kernels: normalized value n (float32) -> Y in T
// ---------------------------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ float ScaleShift(float n, bool has_scale, float s, bool has_bias, float b,
                                            float offset, bool order_a) {
  if (sizeof(T) == 2 && order_a) {
    // order A: round n to T, then every step in T (scale and bias are cast to T first)
    float st = has_scale ? RoundTo<T>(s) : 1.f;
    if (offset != 0.f) st = RoundTo<T>(st + RoundTo<T>(offset));
    float y = RoundTo<T>(RoundTo<T>(n) * st);
    if (has_bias) y = RoundTo<T>(y + RoundTo<T>(b));
    return y;
  }
  // order B: float32 throughout, one rounding at the store
  float y = n * ((has_scale ? s : 1.f) + offset);
  return has_bias ? y + b : y;
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
template <bool kBlockMode>
__device__ __forceinline__ float GroupSum(float v, int tpr, float (*red)[32], int& parity) {
  const int width = kBlockMode ? 32 : tpr;
  for (int offset = width / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if constexpr (kBlockMode) {
    const int warps = blockDim.x / 32;
    float* buffer = red[parity];
    parity ^= 1;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (lane == 0) buffer[warp] = v;
    __syncthreads();
    v = lane < warps ? buffer[lane] : 0.f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
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
// The register-resident kernel
// ---------------------------------------------------------------------------------------------
// kBlockMode: a block (blockDim.x <= kMaxBlock threads) per row; else groups of tpr lanes
// (4, 8, 16 or 32) per row, blockDim.x / tpr rows per block.
template <typename T, typename W, int kNorm, int kResidual, int kVecs, bool kBlockMode, int kMaxBlock>
__global__ void __launch_bounds__(kMaxBlock) RegsKernel(const Params p, const int tpr) {
  constexpr int kVE = 16 / sizeof(T);  // elements of T per 128-bit vector
  const int rows_per_block = kBlockMode ? 1 : blockDim.x / tpr;
  __shared__ float red[2][32];
  int parity = 0;

  const int lane = kBlockMode ? threadIdx.x : threadIdx.x % tpr;
  const int group = kBlockMode ? 0 : threadIdx.x / tpr;
  const int64_t cols = p.cols;
  const float inv_cols = 1.f / static_cast<float>(cols);
  const bool order_a = p.order_a != 0;
  const T* x_all = static_cast<const T*>(p.x);

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
      // inner norm of X (held in z), rounded to T, plus Residual, rounded to T
      // LayerNorm: statistics of X - X[0] (a shift that keeps rows of large mean and small
      // spread exact: the differences are exact in float32)
      float inner_mean = 0.f;
      if constexpr (kNorm == kLayer) {
        const float shift = GroupBroadcast<kBlockMode>(z[0][0], tpr, red, parity);
        float acc = 0.f;
#pragma unroll
        for (int i = 0; i < kVecs; ++i) {
          if (!valid[i]) continue;
#pragma unroll
          for (int j = 0; j < kVE; ++j) {
            z[i][j] -= shift;
            acc += z[i][j];
          }
        }
        inner_mean = GroupSum<kBlockMode>(acc, tpr, red, parity) * inv_cols;
      }
      float acc = 0.f;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (!valid[i]) continue;
#pragma unroll
        for (int j = 0; j < kVE; ++j) {
          const float d = z[i][j] - inner_mean;
          acc = fmaf(d, d, acc);
        }
      }
      const float inner_rstd = 1.f / sqrtf(GroupSum<kBlockMode>(acc, tpr, red, parity) * inv_cols + p.epsilon);
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
          const float n = (z[i][j] - inner_mean) * inner_rstd;
          const float inner = RoundTo<T>(ScaleShift<T>(n, is != nullptr, is != nullptr ? sv[j] : 0.f, ib != nullptr,
                                                       ib != nullptr ? bv[j] : 0.f, p.scale_offset, order_a));
          z[i][j] = RoundTo<T>(rv[j] + inner);
        }
        if (p.sum != nullptr) StoreVec<T, kVE>(static_cast<T*>(p.sum) + base + col, z[i]);
      }
    }

    // statistics of Z
    // (LayerNorm: of Z - Z[0], as above; Y only needs Z - mean)
    float mean = 0.f;
    if constexpr (kNorm == kLayer) {
      const float shift = GroupBroadcast<kBlockMode>(z[0][0], tpr, red, parity);
      float acc = 0.f;
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        if (!valid[i]) continue;
#pragma unroll
        for (int j = 0; j < kVE; ++j) {
          z[i][j] -= shift;
          acc += z[i][j];
        }
      }
      mean = GroupSum<kBlockMode>(acc, tpr, red, parity) * inv_cols;
    }
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (!valid[i]) continue;
#pragma unroll
      for (int j = 0; j < kVE; ++j) {
        const float d = z[i][j] - mean;
        acc = fmaf(d, d, acc);
      }
    }
    const float rstd = 1.f / sqrtf(GroupSum<kBlockMode>(acc, tpr, red, parity) * inv_cols + p.epsilon);

    // Y
    const W* sc = WeightRow<W>(p.scale, p.scale_rows, row, cols);
    const W* bi = WeightRow<W>(p.bias, p.bias_rows, row, cols);
    T* y = static_cast<T*>(p.y) + base;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (!valid[i]) continue;
      const int64_t col = (static_cast<int64_t>(i) * tpr + lane) * kVE;
      float sv[kVE], bv[kVE], out[kVE];
      if (sc != nullptr) LoadVec<W, kVE>(sc + col, sv, false);
      if (bi != nullptr) LoadVec<W, kVE>(bi + col, bv, false);
#pragma unroll
      for (int j = 0; j < kVE; ++j) {
        out[j] = ScaleShift<T>((z[i][j] - mean) * rstd, sc != nullptr, sc != nullptr ? sv[j] : 0.f, bi != nullptr,
                               bi != nullptr ? bv[j] : 0.f, p.scale_offset, order_a);
      }
      StoreVec<T, kVE>(y + col, out);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The general kernel: any width, any alignment
// ---------------------------------------------------------------------------------------------
constexpr int kStreamBlock = 512;

template <typename T, typename W, int kNorm, int kResidual>
struct StreamRow {
  const Params& p;
  int64_t row;
  int64_t base;
  float inner_shift = 0.f;  // LayerNorm statistics are taken of X - X[0] and Z - Z[0]
  float inner_mean = 0.f;   // of X - inner_shift
  float inner_rstd = 1.f;

  __device__ __forceinline__ float Weight(const void* w, int64_t rows, int64_t col) const {
    return ToFloat(static_cast<const W*>(w)[(row % rows) * p.cols + col]);
  }

  // X at col, then (sandwich) its inner norm: the value the residual is added to
  __device__ __forceinline__ float X(int64_t col) const { return ToFloat(static_cast<const T*>(p.x)[base + col]); }

  // Z at col (Sum for the residual ops), in float32, rounded to T
  __device__ __forceinline__ float Z(int64_t col) const {
    const float x = X(col);
    if constexpr (kResidual == kNone) {
      return x;
    } else {
      const float r = ToFloat(static_cast<const T*>(p.residual)[base + col]);
      if constexpr (kResidual == kSkip) {
        float s = fmaf(p.alpha, r, x);
        if (p.xbias != nullptr) s += Weight(p.xbias, p.xbias_rows, col);
        return RoundTo<T>(s);
      } else {
        const bool hs = p.inner_scale != nullptr, hb = p.inner_bias != nullptr;
        const float inner = RoundTo<T>(ScaleShift<T>((x - inner_shift - inner_mean) * inner_rstd, hs,
                                                     hs ? Weight(p.inner_scale, p.inner_scale_rows, col) : 0.f, hb,
                                                     hb ? Weight(p.inner_bias, p.inner_bias_rows, col) : 0.f,
                                                     p.scale_offset, p.order_a != 0));
        return RoundTo<T>(r + inner);
      }
    }
  }
};

// Sum over the block of f(col) for the row's columns.
template <typename F>
__device__ __forceinline__ float BlockRowSum(int64_t cols, F f, float (*red)[32], int& parity) {
  float acc = 0.f;
  for (int64_t col = threadIdx.x; col < cols; col += kStreamBlock) acc += f(col);
  return GroupSum<true>(acc, 32, red, parity);
}

template <typename T, typename W, int kNorm, int kResidual>
__global__ void __launch_bounds__(kStreamBlock) StreamKernel(const Params p) {
  __shared__ float red[2][32];
  int parity = 0;
  const int64_t cols = p.cols;
  const float inv_cols = 1.f / static_cast<float>(cols);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    StreamRow<T, W, kNorm, kResidual> r{p, row, row * cols};
    if constexpr (kResidual == kSandwich) {
      if constexpr (kNorm == kLayer) {
        r.inner_shift = r.X(0);
        const float sh = r.inner_shift;
        r.inner_mean = BlockRowSum(cols, [&](int64_t c) { return r.X(c) - sh; }, red, parity) * inv_cols;
      }
      const float m = r.inner_shift + 0.f;
      const float m2 = r.inner_mean;
      const float ss = BlockRowSum(cols, [&](int64_t c) { const float d = (r.X(c) - m) - m2; return d * d; }, red, parity);
      r.inner_rstd = 1.f / sqrtf(ss * inv_cols + p.epsilon);
    }
    float shift = 0.f, mean = 0.f;  // Z's mean is shift + mean
    if constexpr (kNorm == kLayer) {
      shift = r.Z(0);
      mean = BlockRowSum(cols, [&](int64_t c) { return r.Z(c) - shift; }, red, parity) * inv_cols;
    }
    const float ss = BlockRowSum(cols, [&](int64_t c) { const float d = (r.Z(c) - shift) - mean; return d * d; }, red, parity);
    const float rstd = 1.f / sqrtf(ss * inv_cols + p.epsilon);

    const bool hs = p.scale != nullptr, hb = p.bias != nullptr;
    T* y = static_cast<T*>(p.y) + r.base;
    T* sum = kResidual != kNone && p.sum != nullptr ? static_cast<T*>(p.sum) + r.base : nullptr;
    for (int64_t col = threadIdx.x; col < cols; col += kStreamBlock) {
      const float z = r.Z(col);
      if (sum != nullptr) sum[col] = FromFloat<T>(z);
      y[col] = FromFloat<T>(ScaleShift<T>(((z - shift) - mean) * rstd, hs, hs ? r.Weight(p.scale, p.scale_rows, col) : 0.f, hb,
                                          hb ? r.Weight(p.bias, p.bias_rows, col) : 0.f, p.scale_offset,
                                          p.order_a != 0));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Launch plans
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
    {4, 2, 128}, {8, 2, 128}, {16, 2, 128}, {32, 2, 128}, {32, 4, 128},
    {128, 4, 128}, {256, 4, 256}, {512, 4, 512}, {512, 8, 512},
};
constexpr int kNumRegsConfigs = sizeof(kRegsConfigs) / sizeof(kRegsConfigs[0]);

// Launches op (kNorm, kResidual) for X of type T and weights of type W on stream with config
// `config` (an index into kRegsConfigs, or -1 for StreamKernel). Returns the launch's error.
template <typename T, typename W, int kNorm, int kResidual>
cudaError_t LaunchTyped(const Params& p, int config, cudaStream_t stream);

// Grid size for `units` independent units of work (rows or row groups): one block per unit, up
// to a cap beyond which the kernels loop.
inline unsigned GridFor(int64_t units) {
  constexpr int64_t kMaxGrid = int64_t{1} << 30;
  return static_cast<unsigned>(units < kMaxGrid ? units : kMaxGrid);
}

// (A host emulation of the kernels, for testing their logic without a GPU, defines LaunchTyped
// itself.)
#ifndef ONNXNORM_CUDA_HOST_EMULATION
template <typename T, typename W, int kNorm, int kResidual>
cudaError_t LaunchTyped(const Params& p, int config, cudaStream_t stream) {
  if (config < 0 || config >= kNumRegsConfigs) {
    StreamKernel<T, W, kNorm, kResidual><<<GridFor(p.rows), kStreamBlock, 0, stream>>>(p);
    return cudaGetLastError();
  }
  const RegsConfig c = kRegsConfigs[config];
  const int64_t rows_per_block = c.block / c.tpr;
  const unsigned grid = GridFor((p.rows + rows_per_block - 1) / rows_per_block);
  if (c.tpr == c.block) {
    if (c.vecs == 8) {
      RegsKernel<T, W, kNorm, kResidual, 8, true, 512><<<grid, c.block, 0, stream>>>(p, c.tpr);
    } else {
      RegsKernel<T, W, kNorm, kResidual, 4, true, 512><<<grid, c.block, 0, stream>>>(p, c.tpr);
    }
  } else if (c.vecs == 2) {
    RegsKernel<T, W, kNorm, kResidual, 2, false, 128><<<grid, c.block, 0, stream>>>(p, c.tpr);
  } else {
    RegsKernel<T, W, kNorm, kResidual, 4, false, 128><<<grid, c.block, 0, stream>>>(p, c.tpr);
  }
  return cudaGetLastError();
}
#endif  // ONNXNORM_CUDA_HOST_EMULATION

// Launches op (kNorm, kResidual) for element types x_type / w_type (ONNXNORM_CUDA_FLOAT32, ...):
// one explicit instantiation per op, each in its own translation unit (ops_*.cu).
template <int kNorm, int kResidual>
cudaError_t LaunchOp(const Params& p, int x_type, int w_type, int config, cudaStream_t stream);

template <int kNorm, int kResidual>
cudaError_t LaunchOpImpl(const Params& p, int x_type, int w_type, int config, cudaStream_t stream) {
  const bool w32 = w_type == 0;
  switch (x_type) {
    case 0: return LaunchTyped<float, float, kNorm, kResidual>(p, config, stream);
    case 1:
      return w32 ? LaunchTyped<__half, float, kNorm, kResidual>(p, config, stream)
                 : LaunchTyped<__half, __half, kNorm, kResidual>(p, config, stream);
    case 2:
      return w32 ? LaunchTyped<__nv_bfloat16, float, kNorm, kResidual>(p, config, stream)
                 : LaunchTyped<__nv_bfloat16, __nv_bfloat16, kNorm, kResidual>(p, config, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace onnxnorm

#define ONNXNORM_CUDA_INSTANTIATE_OP(NORM, RESIDUAL)                                                           \
  namespace onnxnorm {                                                                                          \
  namespace cuda {                                                                                              \
  template <>                                                                                                   \
  cudaError_t LaunchOp<NORM, RESIDUAL>(const Params& p, int x_type, int w_type, int config, cudaStream_t stream) { \
    return LaunchOpImpl<NORM, RESIDUAL>(p, x_type, w_type, config, stream);                                    \
  }                                                                                                             \
  }                                                                                                             \
  }

// Host stand-in for the CUDA runtime pieces the onnxnorm kernels use (host emulation only).
#pragma once
#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
typedef void* cudaStream_t;
inline const char* cudaGetErrorString(cudaError_t) { return "emulated error"; }
inline const char* cudaGetErrorName(cudaError_t) { return "cudaErrorEmulated"; }
inline cudaError_t cudaGetLastError() { return 0; }
struct uint4 {
  unsigned x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
extern thread_local dim3 threadIdx;
extern thread_local dim3 blockIdx;
extern thread_local dim3 blockDim, gridDim;
float emu_shfl(float v, int src_lane);
void emu_syncthreads();
inline float __shfl_xor_sync(unsigned, float v, int mask) { return emu_shfl(v, (threadIdx.x % 32) ^ mask); }
inline float __shfl_sync(unsigned, float v, int src) { return emu_shfl(v, src); }
inline void __syncthreads() { emu_syncthreads(); }
inline uint4 __ldcs(const uint4* p) { return *p; }
inline uint4 __ldg(const uint4* p) { return *p; }

// Host stand-in for cuda_bf16.h (host emulation only): bfloat16, round to nearest even.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 b) {
  uint32_t u = uint32_t(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  __nv_bfloat16 b;
  if (std::isnan(v)) {
    b.bits = 0x7fc0;
    return b;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  b.bits = uint16_t(u >> 16);
  return b;
}

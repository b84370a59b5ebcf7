// Host stand-in for cuda_fp16.h (host emulation only): IEEE half through _Float16.
#pragma once
#include <cstdint>
#include <cstring>
struct __half {
  uint16_t bits;
};
inline float __half2float(__half h) {
  _Float16 f;
  std::memcpy(&f, &h.bits, 2);
  return static_cast<float>(f);
}
inline __half __float2half_rn(float v) {
  _Float16 f = static_cast<_Float16>(v);
  __half h;
  std::memcpy(&h.bits, &f, 2);
  return h;
}

// The entry points of libonnxnorm_cuda_ops.so, the CUDA kernels of the catalogue ops.
//
// The CPU library loads it (dlopen) when ONNX Runtime first creates a kernel of an onnxnorm node
// on the CUDA execution provider, and launches through onnxnorm_cuda_launch on ORT's compute
// stream; tests and benchmarks call the same functions through ctypes.
//
// onnxnorm_cuda_launch checks every argument before it launches anything, allocates nothing and
// never synchronizes: errors the kernel raises while it runs surface at the caller's next
// synchronization, as with any CUDA launch. Any row width and pointer alignment work: 16-byte
// aligned arrays whose cols are a multiple of 16 bytes take the vectorized register-resident
// kernels, others a general kernel. Semantics are those of onnxnorm/ops/reference.py.
#pragma once

#include <cstddef>
#include <string>

#include "onnxnorm/norm_args.h"
#include "onnxnorm/rotary_kernels.h"

#if defined(_WIN32)
#define ONNXNORM_EXPORT __declspec(dllexport)
#else
#define ONNXNORM_EXPORT __attribute__((visibility("default")))
#endif

// Return codes of onnxnorm_cuda_launch and onnxnorm_cuda_kernel_name.
#define ONNXNORM_CUDA_OK 0
#define ONNXNORM_CUDA_INVALID_ARGUMENT 1
#define ONNXNORM_CUDA_LAUNCH_FAILED 2

namespace onnxnorm {

// The quantizer of a quantized op (OpSpec::quantize != kNone) for onnxnorm_cuda_launch_quantized:
// its output, and where its scale and zero point live. Every pointer is device memory.
//   static (QuantizeLinear):         y_scale is the Y_scale input (one element of X's type),
//                                    y_zero_point the Y_zero_point input (one element of q_type;
//                                    nullptr: zero point 0; float8e4m3fn: not read, its value is
//                                    not used); scratch is not used. A float8e4m3fn q holds
//                                    float8 e4m3fn bits: QuantizeLinear's saturating conversion
//                                    of Y_float / Y_scale (onnxnorm/float8.h).
//   dynamic (DynamicQuantizeLinear): y_scale (one float32) and y_zero_point (one uint8) are the
//                                    Y_scale and Y_zero_point outputs, which the call writes;
//                                    scratch holds onnxnorm_cuda_quant_scratch_bytes(args) bytes
//                                    (each row's range between the passes), 4-byte aligned, in use
//                                    until the call's kernels have run on its stream.
// NormArgs::y is the float Y (Y_float; nullptr: not wanted) and NormArgs::sum Sum (Skip ops).
// Bytes of scratch per row of a dynamic op's call (onnxnorm_cuda_quant_scratch_bytes): its min and max.
inline constexpr size_t kCudaQuantScratchBytesPerRow = 2 * sizeof(float);

// The ops of the op table the library was built with, in OpId order: "LayerNorm,RMSNorm,...". The
// CPU library loads a CUDA library only where it gives the same text: one built before an op was
// added would refuse that op's nodes at run time.
inline const char* CudaOpNames() {
  static const std::string names = [] {
    std::string out;
    for (const char* name : kOpIdNames) out += (out.empty() ? "" : ",") + std::string(name);
    return out;
  }();
  return names.c_str();
}

struct CudaQuantArgs {
  ElemType q_type = ElemType::kUInt8;  // of q: kUInt8, kInt8 or kFloat8E4M3FN (dynamic: kUInt8)
  void* q = nullptr;                   // [rows, cols]: the quantized Y
  void* y_scale = nullptr;
  void* y_zero_point = nullptr;
  void* scratch = nullptr;
};

// What onnxnorm_cuda_launch_rotary needs besides a rotary op's RotaryArgs (onnxnorm/rotary_kernels.h,
// the CPU kernels' argument struct, every pointer then device memory): the element types, which
// the CPU kernels take from their table row, and the bound of the position ids, which the ORT glue
// checks on the host for the CPU kernels but cannot read on the device without a copy.
struct CudaRotaryArgs {
  ElemType q_type = ElemType::kFloat32;       // T: Q, K, QOut, KOut
  ElemType weight_type = ElemType::kFloat32;  // S: the norm weights, Q's type or float32 (none: unused)
  ElemType angle_type = ElemType::kFloat32;   // A: Cos and Sin, Q's type or float32
  // The rows of Cos and Sin: with PositionIds, max_position (each id must be below it); without,
  // at least cache_batch * seq.
  int64_t angle_rows = 0;
  // Device memory (one int32, 4-byte aligned) that a kernel sets to 1 when it meets a position id
  // outside [0, angle_rows); nullptr: not reported. Either way that token's rotated values are
  // NaN and no angle outside Cos and Sin is read.
  int32_t* position_error = nullptr;
};

// The layouts of RotaryArgs (RotaryTensor's fields as q.<field> and k.<field>) and CudaRotaryArgs,
// {"RotaryArgs": {"size": ..., "fields": [[name, offset, size], ...]}, "CudaRotaryArgs": {...}}:
// what onnxnorm_cuda_rotary_args_layout returns, which the CPU library checks before it uses the
// rotary launcher and the tests hold the Python mirror to.
inline const char* RotaryArgsLayoutJson() {
  static const std::string json = [] {
    struct Field {
      const char* name;
      size_t offset;
      size_t size;
    };
#define ONNXNORM_ROTARY_FIELD(s, f) Field{#f, offsetof(s, f), sizeof(s::f)}
#define ONNXNORM_ROTARY_TENSOR_FIELDS(t)                                                                             \
  Field{#t ".x", offsetof(RotaryArgs, t) + offsetof(RotaryTensor, x), sizeof(RotaryTensor::x)},                      \
      Field{#t ".y", offsetof(RotaryArgs, t) + offsetof(RotaryTensor, y), sizeof(RotaryTensor::y)},                  \
      Field{#t ".heads", offsetof(RotaryArgs, t) + offsetof(RotaryTensor, heads), sizeof(RotaryTensor::heads)},      \
      Field{#t ".scale", offsetof(RotaryArgs, t) + offsetof(RotaryTensor, scale), sizeof(RotaryTensor::scale)},      \
      Field{#t ".scale_rows", offsetof(RotaryArgs, t) + offsetof(RotaryTensor, scale_rows),                          \
            sizeof(RotaryTensor::scale_rows)},                                                                       \
      Field{#t ".bias", offsetof(RotaryArgs, t) + offsetof(RotaryTensor, bias), sizeof(RotaryTensor::bias)}, Field { \
    #t ".bias_rows", offsetof(RotaryArgs, t) + offsetof(RotaryTensor, bias_rows), sizeof(RotaryTensor::bias_rows)    \
  }
    const Field args[] = {
        ONNXNORM_ROTARY_FIELD(RotaryArgs, norm),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, cast_before_scale),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, per_head),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, interleaved),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, rotary_first),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, rotary_in_t),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, layout),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, epsilon),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, scale_offset),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, batch),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, seq),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, head_size),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, rotary_dim),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, cos),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, sin),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, angle_width),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, position_ids),
        ONNXNORM_ROTARY_FIELD(RotaryArgs, cache_batch),
        ONNXNORM_ROTARY_TENSOR_FIELDS(q),
        ONNXNORM_ROTARY_TENSOR_FIELDS(k),
    };
    const Field call[] = {
        ONNXNORM_ROTARY_FIELD(CudaRotaryArgs, q_type),         ONNXNORM_ROTARY_FIELD(CudaRotaryArgs, weight_type),
        ONNXNORM_ROTARY_FIELD(CudaRotaryArgs, angle_type),     ONNXNORM_ROTARY_FIELD(CudaRotaryArgs, angle_rows),
        ONNXNORM_ROTARY_FIELD(CudaRotaryArgs, position_error),
    };
#undef ONNXNORM_ROTARY_TENSOR_FIELDS
#undef ONNXNORM_ROTARY_FIELD
    auto layout = [](const char* name, size_t size, const Field* fields, size_t count) {
      std::string out = std::string("\"") + name + "\":{\"size\":" + std::to_string(size) + ",\"fields\":[";
      for (size_t i = 0; i < count; ++i) {
        out += (i == 0 ? "[\"" : ",[\"") + std::string(fields[i].name) + "\"," + std::to_string(fields[i].offset) +
               "," + std::to_string(fields[i].size) + "]";
      }
      return out + "]}";
    };
    return "{" + layout("RotaryArgs", sizeof(RotaryArgs), args, sizeof(args) / sizeof(args[0])) + "," +
           layout("CudaRotaryArgs", sizeof(CudaRotaryArgs), call, sizeof(call) / sizeof(call[0])) + "}";
  }();
  return json.c_str();
}

}  // namespace onnxnorm

extern "C" {

// Checks args and launches its op's kernel on stream (a cudaStream_t; nullptr: the legacy
// default stream) of the current device. Returns ONNXNORM_CUDA_OK, ONNXNORM_CUDA_INVALID_ARGUMENT
// (nothing launched) or ONNXNORM_CUDA_LAUNCH_FAILED (the CUDA error of the launch), with a
// message naming the op (and the kernel) written into err (err_len bytes, NUL-terminated; err may
// be nullptr).
ONNXNORM_EXPORT int onnxnorm_cuda_launch(const onnxnorm::NormArgs* args, void* stream, char* err, size_t err_len);

// The same for a quantized op: the static op in one launch (the norm's kernel quantizing its Y as
// it stores it); the dynamic op in three on stream (each row's Y range into scratch; the scale and
// zero point from the rows' ranges, written to y_scale and y_zero_point; the norm again, quantized
// with them). Returns as onnxnorm_cuda_launch; a float op is refused here, a quantized op there.
ONNXNORM_EXPORT int onnxnorm_cuda_launch_quantized(const onnxnorm::NormArgs* args, const onnxnorm::CudaQuantArgs* quant,
                                                   void* stream, char* err, size_t err_len);

// The bytes of device scratch a dynamic quantized op's call needs (CudaQuantArgs::scratch): two
// floats per row; 0 for other ops and for a NULL args.
ONNXNORM_EXPORT size_t onnxnorm_cuda_quant_scratch_bytes(const onnxnorm::NormArgs* args);

// Checks a rotary op's arguments (RMSNormRotary, LayerNormRotary, L2NormRotary: args->norm says
// which) and launches its kernel on stream: one launch for Q's rows and K's (rows as in
// onnxnorm/rotary_kernels.h; an absent K, k.x = nullptr, is left out). Returns as
// onnxnorm_cuda_launch; a rotary op is refused there. The refusals are worded as the CPU kernel's
// ORT errors where both check the same thing.
ONNXNORM_EXPORT int onnxnorm_cuda_launch_rotary(const onnxnorm::RotaryArgs* args, const onnxnorm::CudaRotaryArgs* call,
                                                void* stream, char* err, size_t err_len);

// The name of the kernel onnxnorm_cuda_launch_rotary would run (e.g.
// "RMSNormRotary<bfloat16,bfloat16,float32>/regs:subwarp16x4"), written into name.
ONNXNORM_EXPORT int onnxnorm_cuda_rotary_kernel_name(const onnxnorm::RotaryArgs* args,
                                                     const onnxnorm::CudaRotaryArgs* call, char* name, size_t name_len);

// RotaryArgsLayoutJson() of the library.
ONNXNORM_EXPORT const char* onnxnorm_cuda_rotary_args_layout(void);

// The name of the kernel onnxnorm_cuda_launch would run for args (e.g.
// "SkipRMSNorm<bfloat16,float32>/regs:block128x4"), written into name; the same codes as
// onnxnorm_cuda_launch, without any CUDA call.
ONNXNORM_EXPORT int onnxnorm_cuda_kernel_name(const onnxnorm::NormArgs* args, char* name, size_t name_len);

// "onnxnorm-cuda archs <architectures compiled in>"
ONNXNORM_EXPORT const char* onnxnorm_cuda_build_info(void);

// NormArgsLayoutJson() of the library (both libraries export it).
ONNXNORM_EXPORT const char* onnxnorm_args_layout(void);

// CudaOpNames() of the library: the ops it has kernels for.
ONNXNORM_EXPORT const char* onnxnorm_cuda_ops(void);

}  // extern "C"

namespace onnxnorm {
using CudaLaunchFn = int (*)(const NormArgs* args, void* stream, char* err, size_t err_len);
using ArgsLayoutFn = const char* (*)();
using CudaOpsFn = const char* (*)();
using CudaLaunchQuantizedFn = int (*)(const NormArgs* args, const CudaQuantArgs* quant, void* stream, char* err,
                                      size_t err_len);
using CudaQuantScratchBytesFn = size_t (*)(const NormArgs* args);
using CudaLaunchRotaryFn = int (*)(const RotaryArgs* args, const CudaRotaryArgs* call, void* stream, char* err,
                                   size_t err_len);
}  // namespace onnxnorm

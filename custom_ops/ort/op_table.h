// The registration table: one row per op, (T, S) type pair and execution provider, with the
// factory that creates the row's kernels. The ops (names, inputs, outputs, attributes, type
// pairs) come from the generated op table onnxnorm/ops_generated.h, itself made from
// onnxnorm/ops/catalogue.py; the custom-op objects, the domain and the JSON manifest are all
// built from here.
#pragma once

#include <cstddef>

#include "onnxnorm/ops_generated.h"
#include "onnxruntime_c_api.h"

namespace onnxnorm {
namespace ort {

// The execution providers with kernels. CUDA rows are registered only when the CUDA library is
// built next to this one (see custom_op.h).
enum class Provider { kCpu, kCuda };

// A kernel instance (one per node). Compute does not throw: it runs Run and returns its errors
// as OrtStatus, an exception as an internal error of the node's op.
class Kernel {
 public:
  Kernel(const OrtApi& api, const char* op) : api_(api), op_(op) {}
  virtual ~Kernel() = default;
  OrtStatus* Compute(OrtKernelContext* context) noexcept;

 protected:
  virtual OrtStatus* Run(OrtKernelContext* context) = 0;

 private:
  const OrtApi& api_;
  const char* op_;
};

struct KernelEntry;

// Creates the kernel of one node: reads and checks its attributes. Must not throw.
using KernelFactory = OrtStatus* (*)(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry,
                                     Kernel** out);

// One line of the registration table: an op for one (T, S) (and Q, for the quantized ops; A, for
// the rotary ops) on one execution provider.
struct KernelEntry {
  const OpSpec* spec;
  ElemType t;  // type of the TypeVar::kT inputs and outputs
  ElemType s;  // type of the TypeVar::kS inputs
  ElemType u;  // type of the TypeVar::kU output (Y of LayerNorm, RMSNorm; else t), unless y_from_node
  ElemType q;  // type of the TypeVar::kQ inputs and outputs (quantized ops; else kUInt8, unused)
  ElemType a;  // type of the TypeVar::kA inputs (the rotary ops' Cos and Sin: t or kFloat32; else t, unused)
  // Y (TypeVar::kU) may be of more than one type for this (T, S) (t, or float32 for a 16-bit t
  // with float32 weights): the row declares it of any type and each kernel takes the type of its
  // node's Y (checked at kernel creation).
  bool y_from_node;
  Provider provider;
  KernelFactory create;
};

// The factories (norm_op.cc). Both make the same kernel: attributes, input checks, shape rules
// and outputs are one code; it then runs the CPU row kernels on ORT's thread pool, or the CUDA
// launcher of libonnxnorm_cuda_ops.so (loaded on the first CUDA kernel) on ORT's compute stream.
OrtStatus* CreateCpuKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry, Kernel** out);
OrtStatus* CreateCudaKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry, Kernel** out);
// The factories of the rotary ops (rotary_op.cc): one kernel code, the CPU row kernels or the CUDA
// library's rotary launcher.
OrtStatus* CreateRotaryCpuKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry, Kernel** out);
OrtStatus* CreateRotaryCudaKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry, Kernel** out);

// Whether the op normalizes and rotates (inputs Cos and Sin of type TypeVar::kA): RMSNormRotary,
// LayerNormRotary, L2NormRotary.
constexpr bool IsRotary(const OpSpec& spec) {
  for (const ParamSpec& p : spec.inputs) {
    if (p.type == TypeVar::kA) return true;
  }
  return false;
}

// Every op x type pair (x quantized type) x provider.
Span<KernelEntry> KernelTable();

// "CPUExecutionProvider", "CUDAExecutionProvider".
const char* ProviderName(Provider provider);

// {"domain", "version", "ort_api_version", "elem_types", "ops": [{"name", "id", "norm",
// "residual", "since_version", "inputs", "outputs", "attributes", "kernels"}]}, built from the
// generated op table and KernelTable(). The string lives as long as the library.
const char* ManifestJson();

// "float32", "float16", "bfloat16", ... for messages and the manifest.
const char* TypeName(ONNXTensorElementDataType type);

ONNXTensorElementDataType OnnxType(ElemType type);

// ONNX element type -> kernel element type; false when the kernels have no such type.
bool ToElemType(ONNXTensorElementDataType type, ElemType* out);

}  // namespace ort
}  // namespace onnxnorm

// The library's exported entry points: RegisterCustomOps (called by ORT's
// SessionOptions.register_custom_ops_library), for CPU-only and CPU+CUDA sessions alike, and
// three facts for tests and tools: onnxnorm_op_manifest, onnxnorm_active_isa and
// onnxnorm_args_layout. Nothing else is exported (see onnxnorm_ops.map).
#include <string>

#include "cuda_library.h"
#include "custom_op.h"
#include "onnxnorm/cuda_launch.h"
#include "onnxnorm/kernels.h"
#include "onnxruntime_c_api.h"
#include "op_table.h"
#include "ort_util.h"

#define ONNXNORM_STR2(x) #x
#define ONNXNORM_STR(x) ONNXNORM_STR2(x)

namespace {

// Since ONNX Runtime 1.x ships C API version x, the headers' release is "1.<API version>".
constexpr const char* kBuiltFor =
    "ONNX Runtime C API " ONNXNORM_STR(ORT_API_VERSION) " (headers 1." ONNXNORM_STR(ORT_API_VERSION) ")";

OrtStatus* Register(OrtSessionOptions* options, const OrtApiBase& base, const OrtApi& api,
                    const char* runtime_version) {
  onnxnorm::ort::SetRegisteredApi(&api);
  onnxnorm::ort::EnableShapeReferences(base, api);
  const bool shape_inference = onnxnorm::ort::RuntimeAtLeast(runtime_version, 1, 24);  // see custom_op.h
  // The CUDA kernels join the domain when their library is built next to this one; it is loaded
  // only once ORT creates a kernel on the CUDA execution provider.
  const bool with_cuda = onnxnorm::ort::CudaLibraryPresent();
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* s = onnxnorm::ort::GetCustomOpDomain(api, shape_inference, with_cuda, &domain)) return s;
  return api.AddCustomOpDomain(options, domain);
}

}  // namespace

extern "C" ONNXNORM_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                     const OrtApiBase* api_base) {
  if (api_base == nullptr) return nullptr;  // nothing to report an error through
  const char* runtime = api_base->GetVersionString != nullptr ? api_base->GetVersionString() : nullptr;
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // This ONNX Runtime is older than the headers the library was built with. Every version
    // provides API 1, which is enough to say so.
    const OrtApi* api1 = api_base->GetApi(1);
    if (api1 == nullptr) return nullptr;
    try {
      std::string message = "onnxnorm: the onnxnorm custom-op library was built against ";
      message += kBuiltFor;
      message += ", which this ONNX Runtime (version ";
      message += runtime != nullptr ? runtime : "unknown";
      message += ") does not provide; use ONNX Runtime 1." ONNXNORM_STR(
          ORT_API_VERSION) " or newer, or rebuild onnxnorm against this runtime's headers";
      return api1->CreateStatus(ORT_FAIL, message.c_str());
    } catch (...) {
      return api1->CreateStatus(ORT_FAIL,
                                "onnxnorm: this ONNX Runtime is older than the one the library was built for");
    }
  }
  try {
    return Register(options, *api_base, *api, runtime);
  } catch (...) {
    // Register reports errors as statuses; this is only reached on std::bad_alloc and the like.
    return api->CreateStatus(ORT_FAIL, "onnxnorm: registration of the custom ops failed (out of memory?)");
  }
}

extern "C" ONNXNORM_EXPORT const char* onnxnorm_op_manifest(void) {
  try {
    return onnxnorm::ort::ManifestJson();
  } catch (...) {
    return "{}";
  }
}

// "avx512", "avx2" or "portable": the instruction set of the CPU kernels on this machine.
extern "C" ONNXNORM_EXPORT const char* onnxnorm_active_isa(void) { return onnxnorm::cpu::ActiveIsa(); }

extern "C" ONNXNORM_EXPORT const char* onnxnorm_args_layout(void) {
  try {
    return onnxnorm::NormArgsLayoutJson();
  } catch (...) {
    return "{}";
  }
}

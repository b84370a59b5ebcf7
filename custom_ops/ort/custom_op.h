// OrtCustomOp objects built from the registration table (op_table.h), and the onnxnorm custom-op
// domain that holds them. Both are created once per process and never freed: ORT requires them
// to outlive every session that uses them.
#pragma once

#include "onnxruntime_c_api.h"

namespace onnxnorm {
namespace ort {

// The API table the library was registered with (set by RegisterCustomOps before any op is
// handed to ORT).
void SetRegisteredApi(const OrtApi* api);

// The onnxnorm domain with one custom op per registration-table line; created on first use,
// shared by all session options. Thread-safe.
//
// with_cuda: also the lines of the CUDA execution provider (when the CUDA library is built next to
// this library). Nothing of CUDA is loaded here: a CUDA line's kernel loads the CUDA library when
// ORT creates it, which it does only for nodes it places on the CUDA execution provider. Decided
// on the first call, like shape_inference.
//
// shape_inference: give the ops an output shape inference function. ONNX Runtime before 1.24
// crashes (null dereference while building OrtShapeInferContext) on a node that has one when an
// optional input in the middle is omitted, e.g. RMSNorm(X, "", Bias): checked with 1.21, 1.22 and
// 1.23 (crash) and 1.24, 1.25, 1.26, 1.32 (fine). So the caller turns it on for 1.24 and newer
// only. Decided on the first call (one runtime per process).
OrtStatus* GetCustomOpDomain(const OrtApi& api, bool shape_inference, bool with_cuda, OrtCustomOpDomain** out);

// True when ONNX Runtime's version string ("1.24.1") is at least major.minor.
bool RuntimeAtLeast(const char* version, int major, int minor);

}  // namespace ort
}  // namespace onnxnorm

// The kernel of the rotary ops (RMSNormRotary, LayerNormRotary, L2NormRotary) on both execution
// providers: attributes, the checks of the inputs' shapes (worded as the reference,
// onnxnorm/ops/reference.py and rotation.py, words them), the outputs in their layout, one
// RotaryArgs; then the CPU row kernels (onnxnorm/rotary_kernels.h) over the rows of Q and K
// together, on ORT's thread pool above the size where that pays (parallel.h), or the CUDA
// library's rotary launcher (onnxnorm_cuda_launch_rotary) on ORT's compute stream.
#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "cuda_library.h"
#include "onnxnorm/cuda_launch.h"
#include "onnxnorm/kernels.h"
#include "onnxnorm/rotary_kernels.h"
#include "op_table.h"
#include "ort_util.h"
#include "parallel.h"

namespace onnxnorm {
namespace ort {
namespace {

// The inputs a rotary op may have, by name (an op has those of its spec).
enum Slot { kQ, kK, kQScale, kKScale, kQBias, kKBias, kCos, kSin, kPositionIds, kSlotCount };
constexpr const char* kSlotNames[kSlotCount] = {"Q",     "K",   "QScale", "KScale",     "QBias",
                                                "KBias", "Cos", "Sin",    "PositionIds"};

// Q or K as [batch, seq, heads, head_size] (the view the kernels number rows in).
struct Heads {
  int64_t batch = 0, seq = 0, heads = 0, head_size = 0;
};

// The row blocks of one call on the thread pool, each with its own scratch where rows need more
// than the kernels' stack buffer.
struct RotaryJob {
  RotaryRowsFn fn;
  const RotaryArgs* args;
  int64_t rows;
  int64_t rows_per_block;
  float* scratch;  // blocks * scratch_floats, or nullptr
  int64_t scratch_floats;
};

void RunRotaryBlock(void* user_data, size_t block) {
  const auto* job = static_cast<const RotaryJob*>(user_data);
  const int64_t begin = static_cast<int64_t>(block) * job->rows_per_block;
  const int64_t end = std::min(begin + job->rows_per_block, job->rows);
  float* scratch = job->scratch != nullptr ? job->scratch + static_cast<int64_t>(block) * job->scratch_floats : nullptr;
  if (begin < end) job->fn(*job->args, begin, end, scratch);
}

class RotaryKernel final : public Kernel {
 public:
  RotaryKernel(const OrtApi& api, const KernelEntry& entry) : Kernel(api, entry.spec->name), api_(api), entry_(entry) {}

  // Reads the attributes and maps the inputs onto their slots.
  OrtStatus* Init(const OrtKernelInfo* info) {
    const OpSpec& spec = *entry_.spec;
    const char* op = spec.name;
    for (const AttrSpec& attr : spec.attributes) {
      OrtStatus* s = nullptr;
      const char* name = attr.name;
      if (std::strcmp(name, "epsilon") == 0) {
        s = GetAttribute(api_, info, op, attr, &epsilon_);
      } else if (std::strcmp(name, "scale_offset") == 0) {
        s = GetAttribute(api_, info, op, attr, &scale_offset_);
      } else if (std::strcmp(name, "cast_before_scale") == 0) {
        s = GetAttribute(api_, info, op, attr, &cast_before_scale_);
      } else if (std::strcmp(name, "head_size") == 0) {
        s = GetAttribute(api_, info, op, attr, &head_size_);
      } else if (std::strcmp(name, "layout") == 0) {
        s = GetAttribute(api_, info, op, attr, &layout_);
      } else if (std::strcmp(name, "per_head") == 0) {
        s = GetAttribute(api_, info, op, attr, &per_head_);
      } else if (std::strcmp(name, "rotary_dim") == 0) {
        s = GetAttribute(api_, info, op, attr, &rotary_dim_);
      } else if (std::strcmp(name, "interleaved") == 0) {
        s = GetAttribute(api_, info, op, attr, &interleaved_);
      } else if (std::strcmp(name, "rotary_first") == 0) {
        s = GetAttribute(api_, info, op, attr, &rotary_first_);
      } else if (std::strcmp(name, "rotary_in_t") == 0) {
        s = GetAttribute(api_, info, op, attr, &rotary_in_t_);
      } else {
        return MakeError(api_, ORT_FAIL, op, std::string("the kernel does not know attribute ") + name);
      }
      if (s != nullptr) return s;
    }
    for (int& slot : slots_) slot = -1;
    for (size_t i = 0; i < spec.inputs.size(); ++i) {
      int found = -1;
      for (int k = 0; k < kSlotCount; ++k) {
        if (std::strcmp(spec.inputs[i].name, kSlotNames[k]) == 0) found = k;
      }
      if (found < 0) {
        return MakeError(api_, ORT_FAIL, op, std::string("the kernel does not know input ") + spec.inputs[i].name);
      }
      slots_[found] = static_cast<int>(i);
    }
    // whether the node has KOut (a trailing optional output: left out, or named "")
    size_t outputs = 0;
    if (OrtStatus* s = api_.KernelInfo_GetOutputCount(info, &outputs)) return s;
    if (outputs > 1) {
      size_t size = 0;
      if (OrtStatus* s = api_.KernelInfo_GetOutputName(info, 1, nullptr, &size)) return s;
      k_out_ = size > 1;  // (the size counts the terminating null)
    }
    return nullptr;
  }

  void UseCpu(RotaryRowsFn rows, RotaryRowsFn small_call_rows) {
    rows_ = rows;
    small_call_rows_ = small_call_rows;
  }

  void UseCuda(CudaLaunchRotaryFn launch) { cuda_launch_ = launch; }

 private:
  OrtStatus* Invalid(const std::string& message) const {
    return MakeError(api_, ORT_INVALID_ARGUMENT, entry_.spec->name, message);
  }

  // x (Q or K) as [batch, seq, heads, head_size], from its rank and the layout.
  OrtStatus* ToHeads(const char* name, const Dims& dims, Heads* out) const {
    const std::string n = name;
    if (dims.rank() == 3) {
      if (head_size_ <= 0 || dims[2] % head_size_ != 0) {
        return Invalid("a 3-D " + n + " of shape " + FormatShape(dims) +
                       " needs head_size (> 0) dividing its last dim; head_size is " + std::to_string(head_size_));
      }
      if (layout_ == 1) return Invalid("a 3-D " + n + " is [batch, seq, heads * head_size]: layout 0 or 2");
      *out = Heads{dims[0], dims[1], dims[2] / head_size_, head_size_};
      return nullptr;
    }
    if (dims.rank() != 4) return Invalid(n + " must be 3-D or 4-D, got shape " + FormatShape(dims));
    if (head_size_ != 0 && dims[3] != head_size_) {
      return Invalid(n + "'s heads are of size " + std::to_string(dims[3]) + ", head_size is " +
                     std::to_string(head_size_));
    }
    *out = layout_ == 1 ? Heads{dims[0], dims[2], dims[1], dims[3]} : Heads{dims[0], dims[1], dims[2], dims[3]};
    return nullptr;
  }

  // A norm weight of x's heads: head_size values (shared) or heads * head_size (one row each).
  OrtStatus* WeightRows(const char* name, const Dims& dims, const Heads& x, int64_t* rows) const {
    int64_t size = 1;
    for (size_t i = 0; i < dims.rank(); ++i) size *= dims[i];
    const int64_t all = x.heads * x.head_size;
    if (size != x.head_size && size != all) {
      return Invalid(std::string(name) + " of shape " + FormatShape(dims) + " must hold head_size = " +
                     std::to_string(x.head_size) + " values or heads * head_size = " + std::to_string(all));
    }
    *rows = size == x.head_size ? 1 : x.heads;
    return nullptr;
  }

  // The output of x's shape in the output layout (layout 2: [batch, heads, seq, head_size]).
  OrtStatus* Output(OrtKernelContext* context, size_t index, const Dims& x_dims, const Heads& x, void** data) {
    *data = nullptr;
    int64_t transposed[4] = {x.batch, x.heads, x.seq, x.head_size};
    const bool layout2 = layout_ == 2;
    OrtValue* value = nullptr;
    if (OrtStatus* s = api_.KernelContext_GetOutput(context, index, layout2 ? transposed : x_dims.data(),
                                                    layout2 ? 4 : x_dims.rank(), &value)) {
      return s;
    }
    if (value == nullptr) return nullptr;
    return api_.GetTensorMutableData(value, data);
  }

  OrtStatus* Run(OrtKernelContext* context) override {
    const char* op = entry_.spec->name;
    size_t input_count = 0;
    if (OrtStatus* s = api_.KernelContext_GetInputCount(context, &input_count)) return s;
    InputTensor in[kSlotCount];
    for (int k = 0; k < kSlotCount; ++k) {
      if (slots_[k] < 0) continue;
      if (OrtStatus* s = GetInput(api_, context, static_cast<size_t>(slots_[k]), input_count, &in[k])) return s;
    }
    for (int k : {kQ, kCos, kSin}) {
      if (!in[k].present)
        return MakeError(api_, ORT_INVALID_ARGUMENT, op, std::string("input ") + kSlotNames[k] + " is required");
    }
    // (the types are the kernel row's: ORT matched them)
    const InputTensor& q = in[kQ];
    const InputTensor& k = in[kK];
    if (k.present && k.dims.rank() != q.dims.rank()) {
      return Invalid(std::string("K must be of Q's type and rank, got ") + TypeName(k.type));
    }
    if (per_head_ == 0 && layout_ == 1) {
      return Invalid("per_head = 0 normalizes a token's heads together: layout 0 or 2");
    }
    Heads qh;
    if (OrtStatus* s = ToHeads("Q", q.dims, &qh)) return s;
    const int64_t head_size = qh.head_size;
    const int64_t rotary_dim = rotary_dim_ != 0 ? rotary_dim_ : head_size;
    if (rotary_dim % 2 != 0 || rotary_dim > head_size) {
      return Invalid("rotary_dim must be even and at most head_size " + std::to_string(head_size) + ", got " +
                     std::to_string(rotary_dim));
    }

    // the angles: per position (gathered by PositionIds) or per token
    const InputTensor& cos = in[kCos];
    const InputTensor& sin = in[kSin];
    const InputTensor& positions = in[kPositionIds];
    const int64_t width = cos.dims.rank() > 0 ? cos.dims[cos.dims.rank() - 1] : 0;
    bool same = cos.dims.rank() == sin.dims.rank();
    for (size_t i = 0; same && i < cos.dims.rank(); ++i) same = cos.dims[i] == sin.dims[i];
    if (!same) {
      return Invalid("Cos and Sin differ in shape: " + FormatShape(cos.dims) + " and " + FormatShape(sin.dims));
    }
    if (width != rotary_dim / 2 && width != rotary_dim) {
      return Invalid("Cos's last dim must be rotary_dim / 2 = " + std::to_string(rotary_dim / 2) +
                     " (one angle per pair) or rotary_dim = " + std::to_string(rotary_dim) + " (one per value), got " +
                     std::to_string(width));
    }
    const int64_t* position_ids = nullptr;
    int64_t cache_batch = 1;
    if (positions.present) {
      if (cos.dims.rank() != 2) {
        return Invalid("with PositionIds, Cos is [max_position, C], got " + FormatShape(cos.dims));
      }
      if (positions.dims.rank() != 2 || positions.dims[0] != qh.batch || positions.dims[1] != qh.seq) {
        return Invalid("PositionIds must be [batch, seq] = [" + std::to_string(qh.batch) + "," +
                       std::to_string(qh.seq) + "], got " + FormatShape(positions.dims));
      }
      position_ids = static_cast<const int64_t*>(positions.data);
      const int64_t count = qh.batch * qh.seq;
      // (on the CUDA provider the ids are device memory: the kernels check them, making an
      // out-of-range id's rotated values NaN, as onnxnorm/cuda_launch.h says)
      if (count > 0 && cuda_launch_ == nullptr) {
        const auto range = std::minmax_element(position_ids, position_ids + count);
        if (*range.first < 0 || *range.second >= cos.dims[0]) {
          return Invalid("a position id is outside Cos's " + std::to_string(cos.dims[0]) +
                         " rows: " + std::to_string(*range.first) + " to " + std::to_string(*range.second));
        }
      }
    } else {
      if (cos.dims.rank() != 3 || (cos.dims[0] != 1 && cos.dims[0] != qh.batch) || cos.dims[1] != qh.seq) {
        return Invalid("without PositionIds, Cos is per token, [batch or 1, seq, C] with batch " +
                       std::to_string(qh.batch) + " and seq " + std::to_string(qh.seq) + ", got " +
                       FormatShape(cos.dims));
      }
      cache_batch = cos.dims[0];
    }

    RotaryArgs args;
    args.norm = entry_.spec->norm;
    args.cast_before_scale = static_cast<int32_t>(cast_before_scale_);
    args.per_head = static_cast<int32_t>(per_head_);
    args.interleaved = static_cast<int32_t>(interleaved_);
    args.rotary_first = static_cast<int32_t>(rotary_first_);
    args.rotary_in_t = static_cast<int32_t>(rotary_in_t_);
    args.layout = static_cast<int32_t>(layout_);
    args.epsilon = epsilon_;
    args.scale_offset = scale_offset_;
    args.batch = qh.batch;
    args.seq = qh.seq;
    args.head_size = head_size;
    args.rotary_dim = rotary_dim;
    args.cos = cos.data;
    args.sin = sin.data;
    args.angle_width = width;
    args.position_ids = position_ids;
    args.cache_batch = cache_batch;

    // Q, then K: their shapes, weights and outputs
    struct Part {
      Slot x, scale, bias;
      const char* name;
      RotaryTensor* tensor;
    };
    const Part parts[] = {{kQ, kQScale, kQBias, "Q", &args.q}, {kK, kKScale, kKBias, "K", &args.k}};
    for (const Part& part : parts) {
      const InputTensor& x = in[part.x];
      if (!x.present) continue;
      Heads xh = qh;
      if (part.x == kK) {
        if (OrtStatus* s = ToHeads("K", x.dims, &xh)) return s;
        if (xh.batch != qh.batch || xh.seq != qh.seq || xh.head_size != qh.head_size) {
          return Invalid("K of shape " + FormatShape(x.dims) + " does not match Q's " + FormatShape(q.dims));
        }
      }
      RotaryTensor& t = *part.tensor;
      t.heads = xh.heads;
      const Slot weights[] = {part.scale, part.bias};
      for (Slot w : weights) {
        if (slots_[w] < 0 || !in[w].present) continue;
        int64_t rows = 1;
        if (OrtStatus* s = WeightRows(kSlotNames[w], in[w].dims, xh, &rows)) return s;
        (w == part.scale ? t.scale : t.bias) = in[w].data;
        (w == part.scale ? t.scale_rows : t.bias_rows) = rows;
      }
      if (part.x == kK && !k_out_) continue;  // K without KOut: checked, not computed
      void* y = nullptr;
      if (OrtStatus* s = Output(context, part.x == kQ ? 0 : 1, x.dims, xh, &y)) return s;
      if (y == nullptr) continue;
      t.x = x.data;
      t.y = y;
    }
    if (k_out_ && !k.present) return Invalid("output KOut needs input K");

    const int64_t rows_q = RotaryRows(args, args.q), rows_k = RotaryRows(args, args.k);
    const int64_t rows = rows_q + rows_k;
    if (rows == 0 || head_size == 0) return nullptr;  // empty outputs
    if (cuda_launch_ != nullptr) {
      CudaRotaryArgs call;
      call.q_type = entry_.t;
      call.weight_type = entry_.s;
      call.angle_type = entry_.a;
      call.angle_rows = positions.present ? cos.dims[0] : cache_batch * qh.seq;
      void* stream = nullptr;
      if (OrtStatus* s = api_.KernelContext_GetGPUComputeStream(context, &stream)) return s;
      char message[512] = "";
      const int rc = cuda_launch_(&args, &call, stream, message, sizeof(message));
      if (rc == ONNXNORM_CUDA_OK) return nullptr;
      return api_.CreateStatus(rc == ONNXNORM_CUDA_INVALID_ARGUMENT ? ORT_INVALID_ARGUMENT : ORT_FAIL, message);
    }
    // rows * width is the element count of tensors that exist, so it does not overflow
    const int64_t elements = rows_q * RotaryRowWidth(args, args.q) + rows_k * RotaryRowWidth(args, args.k);
    RotaryRowsFn fn = elements < cpu::kSmallCallElements ? small_call_rows_ : rows_;
    return Run(context, fn, args, rows, elements);
  }

  // Runs the rows of a call: on this thread for small calls, else in blocks on ORT's pool (with
  // the block sizes of parallel.h).
  OrtStatus* Run(OrtKernelContext* context, RotaryRowsFn fn, const RotaryArgs& args, int64_t rows, int64_t elements) {
    const int64_t cols = std::max<int64_t>(1, elements / rows);
    int64_t blocks = 1;
    RotaryJob job{fn, &args, rows, rows, nullptr, 0};
    if (rows > 1 && elements >= kParallelMinElements) {
      int64_t per_block = std::max<int64_t>(1, kParallelBlockElements / cols);
      per_block = std::min(per_block, std::max<int64_t>(1, (rows + kParallelMinBlocks - 1) / kParallelMinBlocks));
      per_block = std::max(per_block, (rows + kParallelMaxBlocks - 1) / kParallelMaxBlocks);
      blocks = (rows + per_block - 1) / per_block;
      job.rows_per_block = per_block;
    }
    // rows wider than the kernels' stack buffer: scratch of each block's own (the only allocation)
    std::unique_ptr<float[]> scratch;
    const int64_t floats = RotaryScratchFloats(args);
    if (floats > kRotaryStackFloats) {
      scratch.reset(new (std::nothrow) float[static_cast<size_t>(blocks * floats)]);
      if (!scratch) return MakeError(api_, ORT_FAIL, entry_.spec->name, "out of memory");
      job.scratch = scratch.get();
      job.scratch_floats = floats;
    }
    if (blocks > 1) {
      OrtStatus* status =
          api_.KernelContext_ParallelFor(context, &RunRotaryBlock, static_cast<size_t>(blocks), 0, &job);
      if (status == nullptr) return nullptr;
      // The pool refused before running anything; do the work here (rows are rewritten whole).
      api_.ReleaseStatus(status);
    }
    fn(args, 0, rows, job.scratch);
    return nullptr;
  }

  const OrtApi& api_;
  const KernelEntry& entry_;
  float epsilon_ = attr_default::kEpsilon;
  float scale_offset_ = attr_default::kScaleOffset;
  int64_t cast_before_scale_ = attr_default::kCastBeforeScale;
  int64_t head_size_ = attr_default::kHeadSize;
  int64_t layout_ = attr_default::kLayout;
  int64_t per_head_ = attr_default::kPerHead;
  int64_t rotary_dim_ = attr_default::kRotaryDim;
  int64_t interleaved_ = attr_default::kInterleaved;
  int64_t rotary_first_ = attr_default::kRotaryFirst;
  int64_t rotary_in_t_ = attr_default::kRotaryInT;
  int slots_[kSlotCount] = {};  // input index of each slot; -1: the op has no such input
  bool k_out_ = false;          // the node has output KOut
  RotaryRowsFn rows_ = nullptr;
  RotaryRowsFn small_call_rows_ = nullptr;  // the same bits, for calls below cpu::kSmallCallElements
  CudaLaunchRotaryFn cuda_launch_ = nullptr;  // the CUDA provider's kernels (then rows_ is nullptr)
};

}  // namespace

OrtStatus* CreateRotaryCpuKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry, Kernel** out) {
  *out = nullptr;
  const OpSpec& spec = *entry.spec;
  std::unique_ptr<RotaryKernel> kernel(new (std::nothrow) RotaryKernel(api, entry));
  if (!kernel) return api.CreateStatus(ORT_FAIL, "onnxnorm: out of memory");
  if (OrtStatus* s = kernel->Init(info)) return s;
  RotaryRowsFn rows = cpu::GetRotaryRows(spec.norm, entry.t, entry.s, entry.a);
  RotaryRowsFn small_call_rows = cpu::GetRotaryRowsForSmallCalls(spec.norm, entry.t, entry.s, entry.a);
  if (rows == nullptr || small_call_rows == nullptr) {
    return MakeError(api, ORT_FAIL, spec.name,
                     std::string("no CPU kernel for Q of type ") + kElemTypeNames[static_cast<int>(entry.t)] +
                         " with weights of type " + kElemTypeNames[static_cast<int>(entry.s)] + " and angles of type " +
                         kElemTypeNames[static_cast<int>(entry.a)]);
  }
  kernel->UseCpu(rows, small_call_rows);
  *out = kernel.release();
  return nullptr;
}

OrtStatus* CreateRotaryCudaKernel(const OrtApi& api, const OrtKernelInfo* info, const KernelEntry& entry,
                                  Kernel** out) {
  *out = nullptr;
  std::unique_ptr<RotaryKernel> kernel(new (std::nothrow) RotaryKernel(api, entry));
  if (!kernel) return api.CreateStatus(ORT_FAIL, "onnxnorm: out of memory");
  if (OrtStatus* s = kernel->Init(info)) return s;
  std::string error;
  const CudaLaunchers* launchers = LoadCudaLaunchers(&error);
  if (launchers == nullptr) return MakeError(api, ORT_FAIL, entry.spec->name, error);
  kernel->UseCuda(launchers->launch_rotary);
  *out = kernel.release();
  return nullptr;
}

}  // namespace ort
}  // namespace onnxnorm

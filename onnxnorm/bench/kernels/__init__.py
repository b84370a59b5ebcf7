"""``onnxnorm bench kernels``: the CPU kernels against everything else that computes the same math.

For each op, shape and dtype, in one process and with interleaved repetitions (each repetition
times every contender once, in a rotating order, so that a noisy neighbour hurts all of them
alike; each timed sample follows ``--warmup`` seconds of the same contender, untimed, so that it
sees the steady state of a loop of calls, not the slow first milliseconds after another
contender), the median time per call of:

- ``onnxnorm``: the onnxnorm node in ONNX Runtime with the library (weights of X's type; the
  residual ops also write Sum, as a Pre-Norm block needs);
- ``ort:<op>``: ONNX Runtime's built-in op(s) for the same math: LayerNormalization (opset 17),
  RMSNormalization (opset 23), SimplifiedLayerNormalization, com.microsoft SkipLayerNormalization
  and SkipSimplifiedLayerNormalization (the Sandwich ops: a norm followed by a Skip norm),
  com.microsoft GatedRMSNorm (the gate after the norm, a Scale of one group: n/a for Mamba2's
  form) and LpNormalization (p = 2, no epsilon) for L2Norm;
- ``decomposed``: the graph torch.onnx.export (dynamo) writes for the norm written out in torch
  ops, Hugging Face style (upcast to float32, pow/mean/rsqrt; GatedRMSNorm as Qwen3-Next's and
  Mamba2's code writes it, with SiLU in float32 and groups as Reshapes; L2Norm as the gated
  delta-net's x * rsqrt(sum(x^2) + eps)), run by ONNX Runtime with its default graph
  optimizations (which may fuse parts of it back);
- ``torch``: torch eager (F.layer_norm / F.rms_norm, plus the residual add; the gated and L2
  norms, which torch has no op for, as the decomposed code);
- ``floor``: ONNX Runtime running one node that only copies the same bytes (Identity of X; for
  the residual ops Concat of X and Residual, which reads both and writes as much as Y and Sum):
  ORT's own cost of a call, the least any node of the same size can take;
- ``copy``: a memory copy of the same bytes (X [and Residual] read, Y [and Sum] written into
  preallocated memory): the faster of ``numpy.copyto`` on one thread (glibc memcpy) and the same
  split into ``--threads`` equal slices copied at once on as many threads (numpy lets go of the
  GIL while it copies), as the kernels split their rows: the memory-bandwidth bound. (A copy on
  one thread is not that bound: on a 2-core machine it moves 16 MiB at less than half the rate of
  two.)

The quantized ops' target is a speed-up instead: on the large shapes at least QUANT_SPEEDUP times
as fast as ORT's fastest norm followed by its quantizer, elsewhere no slower.

The quantized ops (a norm followed by QuantizeLinear or DynamicQuantizeLinear, Y_scale 0.02 and
an int8 zero point for the static ones, or the zero point of ``--quant-type``: uint8, int8 or
float8e4m3fn) run against ORT's built-in norm followed by ORT's QuantizeLinear to the same type
(opset 21, which takes X's type; and after Casts of the norm's output and the scale to float32,
for float16 / bfloat16: ORT's CPU QuantizeLinear has no bfloat16 kernel, for float8 as for the
integers) or DynamicQuantizeLinear (after a Cast to float32 for float16 / bfloat16: it takes
float32 only); they have no decomposed or torch contender.

GatedRMSNorm and L2Norm run on shapes of their own (``OP_SHAPES``: Qwen3-Next's and Mamba2's
gated norms, the gated delta-net's q/k L2 norm; one token and 512), held to being at least
``DECOMPOSED_SPEEDUP`` times as fast as the decomposed graph.

The rotary ops (RMSNormRotary, LayerNormRotary, L2NormRotary: Q and K normalized per head and
rotated in one node) run on grouped-query attention's shapes (``OP_SHAPES``: 32 query heads and 8
key heads of 128, weights [128], caches [4096, 64] gathered by the positions; 1, 8 and 512
tokens, and the 512 in layout 2) against, for each of Q and K, ORT's norm followed by its
RotaryEmbedding (com.microsoft's, or ONNX's of opset 23) in one graph, the node's function body
inlined at opset 18 (``decomposed``), torch eager (the norm, then transformers'
``q * cos + rotate_half(q) * sin``), ORT's floor (Concat of Q and K) and a copy of Q and K; held
to being at least ``ROTARY_SPEEDUP`` times as fast as ORT's ops and, on the prefill rows, within
``ROTARY_COPY_FACTOR`` of the copy's time (module ``rotary``).

ONNX Runtime sessions use ``--threads`` intra-op threads and IO binding with preallocated inputs
and outputs, so no call allocates or copies. The Q/K-norm shape (1, 512, 32, 128) normalized over
128 is run as (1, 16384, 128) for every contender (the same bytes and math; ORT's Skip ops want
rank 3).

The benchmark is this package's modules: ``cases`` (the shapes, dtypes and targets;
:class:`Result`, a row), ``graphs`` (the ONNX models of the contenders), ``contenders`` (the
calls timed), ``rotary`` (the rotary ops' inputs and contenders), ``measure`` (a row, a run),
``report`` (the tables, the plot) and ``cli`` (the command). Their public names are this
package's too, imported on first use. The instruction set of the library is
:func:`onnxnorm._native.active_isa`.
"""

from onnxnorm import _lazy

#: public name -> the module of this package that defines it
_WHERE = {
    **dict.fromkeys(
        (
            "SHAPES",
            "OP_SHAPES",
            "ALL_SHAPES",
            "OpShape",
            "op_shapes",
            "DECOMPOSED_SPEEDUP",
            "BANDWIDTH_SHAPES",
            "BANDWIDTH_FRACTION",
            "SINGLE_TOKEN_SHAPES",
            "FLOOR_FACTOR",
            "QUANT_SPEEDUP",
            "ROTARY_SPEEDUP",
            "ROTARY_COPY_SHAPES",
            "ROTARY_COPY_FACTOR",
            "ROTARY_MAX_POSITION",
            "ROTARY_THETA",
            "DTYPES",
            "EPSILON",
            "Y_SCALE",
            "Y_ZERO_POINT",
            "QUANT_ZERO_POINTS",
            "QUANT_TYPE",
            "Result",
        ),
        "cases",
    ),
    **dict.fromkeys(
        (
            "ORT_BUILTINS",
            "onnx_type",
            "np_dtype",
            "quant_onnx_type",
            "zero_point",
            "input_names",
            "output_names",
            "onnxnorm_model",
            "ort_builtin_model",
            "ort_floor_model",
        ),
        "graphs",
    ),
    **dict.fromkeys(
        ("torch_fn", "decomposed_model", "ortvalue", "ort_runner", "threaded_copy"), "contenders"
    ),
    **dict.fromkeys(("bench_case", "run"), "measure"),
    **dict.fromkeys(
        (
            "environment",
            "us",
            "dtype_cell",
            "markdown_table",
            "comparison_table",
            "plot",
            "load_results",
        ),
        "report",
    ),
}

__getattr__, __dir__ = _lazy.names(__name__, _WHERE, globals())

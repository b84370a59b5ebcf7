"""``onnxnorm bench cuda`` (also ``python -m onnxnorm.bench.cuda``): the bandwidth of the
onnxnorm CUDA kernels against a device-to-device copy, on a GPU machine.

It drives the CUDA library's C launcher through :class:`onnxnorm._native.Kernels` on torch CUDA
tensors, on torch's current stream, without onnxruntime-gpu: bytes moved over time (CUDA events
around each launch, L2 flushed between repetitions by writing a buffer larger than L2, median of
the repetitions) against a copy of the same shape measured in the same run; prints a markdown
table with each target (RMSNorm and SkipRMSNorm at least 90 % of the copy bandwidth, LayerNorm
and SkipLayerNorm 85 %, Q/K-norm shapes 75 %; bfloat16).

    onnxnorm bench cuda [--reps N] [--dtype D] [--library PATH] [--json OUT]

The library is the one ``onnxnorm.runtime.library_path("cuda")`` finds. The kernels' correctness
matrix is tests/cuda_harness.py (run by tests/test_cuda.py).

The benchmark is the modules ``cuda_bandwidth`` (the shapes, the targets, the measurement and
its table) and ``cuda_cli`` (the options, one definition for the command and ``python -m``).
Their public names are this module's too, imported on first use. The binding of the library
(``NormArgs``, ``Kernels``, the type and op codes, ...) was here and is
:mod:`onnxnorm._native`; its old names here still work, with a DeprecationWarning.
"""

import sys

from onnxnorm.bench.common import exports

#: names of the binding that lived here, now in onnxnorm._native
_MOVED = (
    "elem_type_name",
    "ELEM_TYPES",
    "OP_IDS",
    "WEIGHT_INPUTS",
    "NormArgs",
    "CudaQuantArgs",
    "QUANT_ELEM_TYPES",
    "QUANT_NP_TYPES",
    "layout",
    "quant_torch_dtype",
    "to_numpy",
    "from_numpy",
    "Kernels",
)

__getattr__, __dir__ = exports(
    __name__,
    {
        **dict.fromkeys(
            ("BENCH_SHAPES", "TARGETS", "QK_TARGET", "bench", "markdown", "report"),
            "onnxnorm.bench.cuda_bandwidth",
        ),
        "main": "onnxnorm.bench.cuda_cli",
    },
    globals(),
    old={
        **{name: ("onnxnorm._native", name) for name in _MOVED},
        "library_path": ("onnxnorm._native", "cuda_library_path"),
    },
)

if __name__ == "__main__":
    from onnxnorm.bench.cuda_cli import main as _main

    sys.exit(_main())

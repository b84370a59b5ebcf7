"""``onnxnorm bench cuda`` (also ``python -m onnxnorm.bench.cuda``): the bandwidth of the
onnxnorm CUDA kernels against a device-to-device copy, torch and ONNX Runtime's CUDA ops, on a
GPU machine.

It drives the CUDA library's C launcher through :class:`onnxnorm._native.Kernels` on torch CUDA
tensors, on torch's current stream: bytes moved over time (CUDA events around each launch, L2
flushed between repetitions by writing a buffer larger than L2, median of the repetitions)
against a copy of the same shape measured in the same run; decode shapes of 1 to 64 rows in
microseconds per call, back to back; torch's ``F.rms_norm`` / ``F.layer_norm`` and, where
onnxruntime-gpu is present, ONNX Runtime's own CUDA ops as contenders. It prints a markdown table
per dtype with each target (RMSNorm and SkipRMSNorm at least 90 % of the copy bandwidth,
LayerNorm and SkipLayerNorm 85 %, Q/K-norm shapes 75 %, a decode call at most 5 us, faster than
ORT where ORT ran).

    onnxnorm bench cuda [--reps N] [--dtypes D,...] [--library PATH] [--no-ort] [--json OUT]

The library is the one ``onnxnorm.runtime.library_path("cuda")`` finds. The kernels' correctness
matrix is tests/support/cuda_harness.py (run by tests/cuda/test_cuda.py).

The benchmark is this package's modules: ``cases`` (the dtypes, shapes and targets), ``clock``
(how a call is timed), ``contenders`` (torch and ONNX Runtime), ``measure`` (a row, judged; the
rows of a dtype), ``table`` (the markdown table and its summary), ``runner`` (every dtype, the
JSON) and ``cli`` (the options, one definition for the command and ``python -m``, which runs
``__main__``). Their public names are this package's too, imported on first use. The binding of
the library is :mod:`onnxnorm._native`.
"""

from onnxnorm import _lazy

#: public name -> the module of this package that defines it
_WHERE = {
    **dict.fromkeys(("BENCH_SHAPES", "TARGETS", "QK_TARGET"), "cases"),
    "bench": "measure",
    "markdown": "table",
    "report": "runner",
    "main": "cli",
}

__getattr__, __dir__ = _lazy.names(__name__, _WHERE, globals())

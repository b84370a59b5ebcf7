"""Inputs for the kernel benchmark's models of the quantized ops (``onnxnorm bench kernels``),
which tests/kernels/test_kernels.py and tests/ops/test_quantized.py check against ONNX Runtime's
own ops."""

from __future__ import annotations

import numpy as np

from tests.support.matrix import DTYPES

# The shape of X the benchmark's models of the quantized ops are checked on.
BENCH_SHAPE = (2, 16, 256)


def bench_arrays(op, dtype, zero_point, rng, scale=1.0):
    """Inputs for the benchmark's models of the quantized ``op`` (``kernels.input_names``) on
    BENCH_SHAPE: X and Residual standard normal, Scale about ``scale``, Bias and XBias
    about 0, the benchmark's Y_scale and the given zero point."""
    from onnxnorm.bench import kernels

    np_type = DTYPES[dtype]
    arrays = {}
    for name in kernels.input_names(op).values():
        if name == "ys":
            arrays[name] = np.array(kernels.Y_SCALE, np_type)
        elif name == "yz":
            arrays[name] = zero_point
        elif name in ("x", "r"):
            arrays[name] = rng.standard_normal(BENCH_SHAPE).astype(np_type)
        else:
            arrays[name] = (
                scale * name.startswith("s") + 0.1 * rng.standard_normal(BENCH_SHAPE[-1])
            ).astype(np_type)
    return arrays

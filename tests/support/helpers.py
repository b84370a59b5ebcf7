"""Running models in ONNX Runtime and comparing with the reference, for the tests."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from onnxnorm import ops, runtime
from tests.support.matrix import BF16, F8

#: a float8 e4m3fn zero point: it gives Y its type, its value is not used
F8_ZERO_POINT = np.asarray(-3.5, np.float32).astype(F8)
#: the types ORT's Python API takes and gives only as their bits, with those bits' numpy type
_AS_BITS = {BF16: np.uint16, F8: np.uint8}


def run(
    model: onnx.ModelProto,
    arrays: dict[str, np.ndarray],
    *,
    with_library: bool = False,
    threads: int = 1,
) -> list[np.ndarray]:
    """Runs a model of :func:`onnxnorm.testing.graphs.single_node_model` on ``arrays`` in ORT
    (CPU). bfloat16 and float8 inputs go in as their bits; float8 outputs come back as float8
    arrays."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return run_session(runtime.session(model, options, with_library=with_library), arrays)


def run_session(sess: ort.InferenceSession, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Runs ``sess`` on ``arrays`` (by input name, lowercased): bfloat16 and float8 inputs go in
    as their bits; float8 outputs come back as float8 arrays."""
    feeds = {}
    for name, value in arrays.items():
        if value.dtype in _AS_BITS:
            value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                np.ascontiguousarray(value).view(_AS_BITS[value.dtype]),
                helper.np_dtype_to_tensor_dtype(value.dtype),
            )
        else:
            value = ort.OrtValue.ortvalue_from_numpy(value)
        feeds[name.lower()] = value
    outputs = sess.run_with_ort_values(None, feeds)
    return [
        value.numpy().view(F8) if value.data_type() == "tensor(float8e4m3fn)" else value.numpy()
        for value in outputs
    ]


def float8_nan(bits: np.ndarray) -> np.ndarray:
    """Where float8 e4m3fn bits are NaN (0x7F or 0xFF)."""
    return (bits & 0x7F) == 0x7F


def assert_float8_equal(got: np.ndarray, want: np.ndarray) -> None:
    """float8 e4m3fn arrays (or their uint8 bits): the same bits, any NaN code (0x7F, 0xFF) where
    ``want`` is NaN."""
    g, w = np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8)
    assert g.shape == w.shape
    bad = (g != w) & ~(float8_nan(g) & float8_nan(w))
    if bad.any():
        at = np.argwhere(bad)[:5].tolist()
        pairs = [(hex(g[tuple(i)]), hex(w[tuple(i)])) for i in at]
        raise AssertionError(
            f"{int(bad.sum())} float8 values differ; first at {at}: (got, want) {pairs}"
        )


def reference_outputs(op: str, arrays: dict[str, np.ndarray], attrs: dict | None = None):
    """The reference's outputs of ``op`` on ``arrays`` (by input name) with ``attrs``."""
    spec = ops.OPS[op]
    with np.errstate(invalid="ignore"):  # (GatedRMSNorm's SiLU of -Inf: -Inf * 0)
        return ops.reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **(attrs or {}))


def assert_close(got: np.ndarray, want: np.ndarray, dtype=None) -> None:
    """Compares in float32 within the reference's tolerance for ``dtype`` (default: want's)."""
    rtol, atol = ops.reference.tolerance(dtype or want.dtype)
    np.testing.assert_allclose(np.asarray(got, np.float32), want.astype(np.float32), rtol, atol)


def fuse_peak_rss(*argv: str) -> tuple[float, float]:
    """(peak resident MiB, seconds) of ``onnxnorm fuse *argv`` run in a child process."""
    import subprocess
    import sys

    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the (large) forking process
    code = (
        "import sys, time; from onnxnorm import cli; t = time.perf_counter(); "
        f"rc = cli.main(['fuse', *{list(argv)!r}]); t = time.perf_counter() - t; "
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]; "
        "print(int(hwm.split()[1]) / 1024, t); sys.exit(rc)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr
    peak, seconds = result.stdout.strip().splitlines()[-1].split()
    return float(peak), float(seconds)


@functools.lru_cache(maxsize=1)
def backend_cases() -> dict:
    """ONNX's backend node test cases of LayerNormalization and RMSNormalization and their
    ``_expanded`` forms, by name, as the installed onnx generates them (model, inputs, expected
    outputs, tolerances). onnx writes a module's cases when it is imported (its exporter classes
    run at class creation) into the package's list of cases; importing only these two modules
    takes a second, where ``collect_testcases`` writes every op's cases (13 s)."""
    import importlib
    import warnings

    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for module in ("layernormalization", "rmsnormalization"):
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
        cases = getattr(node, "_NodeTestCases", None)
        if not cases:  # another onnx: the public, slower way
            cases = node.collect_testcases(None)
    return {
        c.name: c
        for c in cases
        if c.name.startswith(("test_layer_normalization", "test_rms_normalization"))
    }

"""Small builders shared by the tests."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from onnxnorm import ops, runtime

BF16 = np.dtype(ml_dtypes.bfloat16)
F8 = np.dtype(ml_dtypes.float8_e4m3fn)
NP_TO_ONNX = {
    np.dtype(np.float32): onnx.TensorProto.FLOAT,
    np.dtype(np.float16): onnx.TensorProto.FLOAT16,
    BF16: onnx.TensorProto.BFLOAT16,
    np.dtype(np.uint8): onnx.TensorProto.UINT8,
    np.dtype(np.int8): onnx.TensorProto.INT8,
    F8: onnx.TensorProto.FLOAT8E4M3FN,
    np.dtype(np.float64): onnx.TensorProto.DOUBLE,
}  # a type no op takes
#: the types ORT's Python API takes and gives only as their bits, with those bits' numpy type
_AS_BITS = {BF16: np.uint16, F8: np.uint8}


def single_node_model(
    op: str,
    arrays: dict[str, np.ndarray],
    attrs: dict | None = None,
    opset: int = 18,
    functions: bool = True,
    optional_outputs: bool = True,
) -> onnx.ModelProto:
    """A model holding one onnxnorm node of ``op``; each present input is a graph input named
    after its parameter (lower case); Sum is an output for ops with a Residual unless
    ``optional_outputs`` is False (a set of names: those optional outputs). bfloat16 outputs are
    cast to float32 (exactly) because ORT's Python API cannot return bfloat16 arrays. Input
    names: "Y_zero_point" -> "y_zero_point"; a quantized op's outputs are named after theirs
    with "_out" (Y_scale is an input and an output of the quantized ops). A float8 e4m3fn
    Y_zero_point makes Y float8 (its function body needs ``opset`` 19 or newer)."""
    spec = ops.OPS[op]
    inputs = [p.name.lower() if p.name in arrays else "" for p in spec.inputs]
    while inputs and not inputs[-1]:
        inputs.pop()
    quantized = spec.quantize != "none"
    wanted = [
        p
        for p in spec.outputs
        if not p.optional
        or optional_outputs is True
        or (not isinstance(optional_outputs, bool) and p.name in optional_outputs)
    ]
    x_type = NP_TO_ONNX[arrays["X"].dtype]
    q_type = (
        NP_TO_ONNX[arrays["Y_zero_point"].dtype]
        if "Y_zero_point" in arrays
        else onnx.TensorProto.UINT8
    )
    shape = arrays["X"].shape
    cast = x_type == onnx.TensorProto.BFLOAT16
    names, nodes, infos = [], [], []
    for p in spec.outputs:
        if p not in wanted:
            names.append("")
            continue
        name = p.name.lower() + ("_out" if quantized else "")
        # (a Y of type U has X's type here)
        elem = {"T": x_type, "U": x_type, "Q": q_type, "F": onnx.TensorProto.FLOAT}[p.type_var]
        dims = shape if p.type_var in ("T", "U") or p.name == "Y" else []
        if cast and p.type_var in ("T", "U"):
            names.append(name + "_raw")
            nodes.append(
                helper.make_node("Cast", [name + "_raw"], [name], to=onnx.TensorProto.FLOAT)
            )
            elem = onnx.TensorProto.FLOAT
        else:
            names.append(name)
        infos.append(helper.make_tensor_value_info(name, elem, dims))
    while names and not names[-1]:
        names.pop()
    nodes.insert(0, helper.make_node(op, inputs, names, domain=ops.DOMAIN, **(attrs or {})))
    graph = helper.make_graph(
        nodes,
        op,
        [
            helper.make_tensor_value_info(
                p.name.lower(), NP_TO_ONNX[arrays[p.name].dtype], arrays[p.name].shape
            )
            for p in spec.inputs
            if p.name in arrays
        ],
        infos,
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", opset),
            helper.make_opsetid(ops.DOMAIN, ops.VERSION),
        ],
    )
    return ops.attach_functions(model) if functions else model


def run(
    model: onnx.ModelProto,
    arrays: dict[str, np.ndarray],
    *,
    with_library: bool = False,
    threads: int = 1,
) -> list[np.ndarray]:
    """Runs a :func:`single_node_model` on ``arrays`` in ORT (CPU). bfloat16 and float8 inputs
    go in as their bits; float8 outputs come back as float8 arrays."""
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
                np.ascontiguousarray(value).view(_AS_BITS[value.dtype]), NP_TO_ONNX[value.dtype]
            )
        else:
            value = ort.OrtValue.ortvalue_from_numpy(value)
        feeds[name.lower()] = value
    outputs = sess.run_with_ort_values(None, feeds)
    return [
        value.numpy().view(F8) if value.data_type() == "tensor(float8e4m3fn)" else value.numpy()
        for value in outputs
    ]


def _float8_nan(bits: np.ndarray) -> np.ndarray:
    """Where float8 e4m3fn bits are NaN (0x7F or 0xFF)."""
    return (bits & 0x7F) == 0x7F


def assert_float8_equal(got: np.ndarray, want: np.ndarray) -> None:
    """float8 e4m3fn arrays (or their uint8 bits): the same bits, any NaN code (0x7F, 0xFF) where
    ``want`` is NaN."""
    g, w = np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8)
    assert g.shape == w.shape
    bad = (g != w) & ~(_float8_nan(g) & _float8_nan(w))
    if bad.any():
        at = np.argwhere(bad)[:5].tolist()
        pairs = [(hex(g[tuple(i)]), hex(w[tuple(i)])) for i in at]
        raise AssertionError(
            f"{int(bad.sum())} float8 values differ; first at {at}: (got, want) {pairs}"
        )


def reference_outputs(op: str, arrays: dict[str, np.ndarray], attrs: dict | None = None):
    spec = ops.OPS[op]
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

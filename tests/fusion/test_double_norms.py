"""Norms computed in double (X cast to DOUBLE, the statistics, scale and bias in double, the
result cast back). onnxnorm computes statistics in float32: a result rounded
to float16/bfloat16 is fused, with a note saying what changes (at most one unit in the last
place, measured: docs/fusion.md), and checked here against the original on rows of every
magnitude; a float32 or double result, or any under ``strict_precision``, stays, with the
reason naming DOUBLE and what float32 statistics would lose."""

from __future__ import annotations

import contextlib
import io
import warnings

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as T, helper, numpy_helper
from onnx.backend.test.case.node import function_testcase_helper

from onnxnorm import runtime
from onnxnorm.fusion import fuse
from onnxnorm.fusion.verify import verify
from onnxnorm.ops import catalogue

BF16 = np.dtype(ml_dtypes.bfloat16)
NP = {
    T.FLOAT: np.dtype(np.float32),
    T.FLOAT16: np.dtype(np.float16),
    T.BFLOAT16: BF16,
    T.DOUBLE: np.dtype(np.float64),
}
H = 32
EPS = 1e-6  # as models write it: not a float32 value, the double graph adds it in double
RMS, LAYER = "RMSNorm (decomposed)", "LayerNorm (decomposed)"
HALF = [T.FLOAT16, T.BFLOAT16]


def _weights(seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.random(H) + 0.5).astype(np.float32), (rng.random(H) - 0.5).astype(np.float32)


def _double_norm(
    kind: str = "rms",
    x_type: int = T.FLOAT16,
    weight: str = "none",
    out_type: int | None = None,
    read_as_float: bool = False,
) -> onnx.ModelProto:
    """``Cast(x, DOUBLE)``, the norm in double as PyTorch's dynamo exporter writes it
    (``x * Reciprocal(Sqrt(mean + eps))``; LayerNorm ``centred / Sqrt(var + eps)``), then
    ``weight``: "none"; "folded" (a double initializer, as the exporter's optimizer folds
    ``w.double()``); "cast" (``Cast(w, DOUBLE)``); "gemma" (``1 + w`` folded into one double
    initializer); "gemma_add" (``Add(Cast(w, DOUBLE), 1.0)``); "llama" (the result cast back
    first, then ``Mul`` by the weight in X's type); LayerNorm takes "folded" or "cast" for both
    its weight and bias. The result is cast to ``out_type`` (X's type by default; DOUBLE: none).
    ``read_as_float``: the output also cast to float32 (exact), as ORT's Python API gives no
    bfloat16 array."""
    out_type = x_type if out_type is None else out_type
    w, b = _weights()
    inits = {
        "axes": np.array([-1], np.int64),
        "two": np.array(2, np.float64),
        "eps": np.array(EPS, np.float64),
    }
    nodes = [helper.make_node("Cast", ["x"], ["xd"], to=T.DOUBLE)]
    if kind == "layer":
        nodes += [
            helper.make_node("ReduceMean", ["xd", "axes"], ["mu"]),
            helper.make_node("Sub", ["xd", "mu"], ["c"]),
            helper.make_node("Mul", ["c", "c"], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "axes"], ["var"]),
            helper.make_node("Add", ["var", "eps"], ["ve"]),
            helper.make_node("Sqrt", ["ve"], ["sd"]),
            helper.make_node("Div", ["c", "sd"], ["n"], name="normalize"),
        ]
    else:
        nodes += [
            helper.make_node("Pow", ["xd", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
            helper.make_node("Add", ["ms", "eps"], ["mse"]),
            helper.make_node("Sqrt", ["mse"], ["rt"]),
            helper.make_node("Reciprocal", ["rt"], ["inv"]),
            helper.make_node("Mul", ["xd", "inv"], ["n"], name="normalize"),
        ]
    last = "n"

    def double_weight(name: str, value: np.ndarray) -> str:
        if weight == "cast" or weight == "gemma_add":
            inits[name + "_f"] = value
            nodes.append(helper.make_node("Cast", [name + "_f"], [name], to=T.DOUBLE))
        else:
            inits[name] = value.astype(np.float64)
        return name

    if weight in ("folded", "cast", "gemma_add"):
        factor = double_weight("w", w)
        if weight == "gemma_add":
            inits["one"] = np.array(1, np.float64)
            nodes.append(helper.make_node("Add", ["w", "one"], ["w1"]))
            factor = "w1"
        nodes.append(helper.make_node("Mul", [last, factor], ["nw"]))
        last = "nw"
        if kind == "layer":
            nodes.append(helper.make_node("Add", [last, double_weight("b", b)], ["nb"]))
            last = "nb"
    elif weight == "gemma":
        inits["w1"] = 1.0 + w.astype(np.float64)
        nodes.append(helper.make_node("Mul", [last, "w1"], ["nw"]))
        last = "nw"
    output = "y"
    if out_type == T.DOUBLE:
        nodes.append(helper.make_node("Identity", [last], [output]))
    elif weight == "llama":
        inits["wt"] = w.astype(NP[x_type])
        nodes += [
            helper.make_node("Cast", [last], ["nt"], to=out_type),
            helper.make_node("Mul", ["nt", "wt"], [output]),
        ]
    else:
        nodes.append(helper.make_node("Cast", [last], [output], to=out_type))
    if read_as_float:
        nodes.append(helper.make_node("Cast", [output], ["y_float"], to=T.FLOAT))
        output, out_type = "y_float", T.FLOAT
    graph = helper.make_graph(
        nodes,
        "double_norm",
        [helper.make_tensor_value_info("x", x_type, ["batch", "seq", H])],
        [helper.make_tensor_value_info(output, out_type, ["batch", "seq", H])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _rows(x_type: int, rows: int = 512, seed: int = 1) -> np.ndarray:
    """Rows of every kind the measurement took: normal, uniform, mean-dominated, one outlier,
    each at its own scale 2^k over the type's range (float16: its normal numbers)."""
    rng = np.random.default_rng(seed)
    low, high = (-14, 6) if x_type == T.FLOAT16 else (-40, 40)
    scale = 2.0 ** rng.integers(low, high + 1, size=(rows, 1))
    kind = rng.integers(0, 4, size=(rows, 1))
    x = rng.standard_normal((rows, H))
    x = np.where(kind == 1, rng.uniform(-1, 1, (rows, H)), x)
    x = np.where(kind == 2, 3 + 1e-3 * x, x)
    x[:, 0] += np.where(kind[:, 0] == 3, 300.0, 0.0)
    return (x * scale).reshape(rows // 8, 8, H).astype(NP[x_type])


def _run(model: onnx.ModelProto, x: np.ndarray, with_library: bool) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = runtime.session(model, options, with_library=with_library)
    if x.dtype == BF16:
        value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x.view(np.uint16), T.BFLOAT16)
    else:
        value = ort.OrtValue.ortvalue_from_numpy(x)
    return session.run_with_ort_values(None, {"x": value})[0].numpy()


def _ulps(a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """How many values of ``dtype`` lie between a and b (both exactly of that type)."""
    bits = [a.astype(dtype).view(np.int16).astype(np.int64) for a in (a, b)]
    ordered = [np.where(i < 0, -(i + 32768), i) for i in bits]
    return np.abs(ordered[0] - ordered[1])


def _fused(model, **options):
    fused, report = fuse(model, **options)
    nodes = [n for n in fused.graph.node if n.domain == catalogue.DOMAIN]
    return fused, report, nodes


def _attrs(node: onnx.NodeProto) -> dict:
    return {
        **catalogue.get(node.op_type).defaults,
        **{a.name: helper.get_attribute_value(a) for a in node.attribute},
    }


def _computing_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node if n.op_type != "Cast"]


def _assert_stays(original, fused, report, rule: str, *reasons: str) -> None:
    assert _computing_ops(fused) == _computing_ops(original), str(report)
    assert report.norms == 0
    skips = [s.reason for s in report[rule].skips]
    assert skips, str(report)
    for reason in reasons:
        assert any(reason in s for s in skips), str(report)


# ---------------------------------------------------------------------------------------------
# fused: a result rounded to float16/bfloat16


RMS_WEIGHTS = ["none", "folded", "cast", "gemma", "gemma_add", "llama"]


@pytest.mark.parametrize("x_type", HALF, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("weight", RMS_WEIGHTS)
def test_double_rms_norm_rounded_to_half_fuses_with_a_note(x_type, weight):
    original = _double_norm("rms", x_type, weight, read_as_float=x_type == T.BFLOAT16)
    onnx.checker.check_model(original, full_check=True)
    fused, report, nodes = _fused(original)
    assert [n.op_type for n in nodes] == ["RMSNorm"], str(report)
    assert _computing_ops(fused) == ["RMSNorm"], str(report)
    assert report.norms == 1
    node = nodes[0]
    attrs = _attrs(node)
    assert attrs["y_float32"] == 0 and attrs["axis"] == -1
    assert attrs["epsilon"] == pytest.approx(EPS, rel=1e-7)
    assert attrs["cast_before_scale"] == int(weight == "llama")
    assert attrs["scale_offset"] == (1.0 if weight == "gemma_add" else 0.0)
    assert node.input[0] == "x" and (len(node.input) > 1) == (weight != "none")
    name = helper.tensor_dtype_to_string(x_type)[len("TensorProto.") :]
    [note] = report[RMS].notes
    assert note.node == "normalize"
    assert f"computed in DOUBLE in the original, its result rounded to {name}" in note.reason
    assert "at most 1 unit in the last place" in note.reason
    onnx.checker.check_model(fused, full_check=True)

    # parity as the note says: at most one unit in the last place (two where the result is
    # rounded before the weight), on rows of every magnitude
    x = _rows(x_type)
    have = _run(fused, x, with_library=True)
    if weight == "llama":
        # the original's arithmetic in numpy: ONNX Runtime's CPU provider has no float16 or
        # bfloat16 Mul, computes it in float32 between casts it inserts, and drops the cast to
        # X's type before it with them (the product of the unrounded value: order B)
        t = NP[x_type]
        xd = x.astype(np.float64)
        n = xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + EPS)
        nt = n.astype(np.float32).astype(t).astype(np.float64)  # as ORT and PyTorch round
        want = (nt * _weights()[0].astype(t)).astype(np.float32).astype(t)
    else:
        want = _run(original, x, with_library=False)
    if not (weight == "llama" and x_type == T.BFLOAT16):  # (no bfloat16 Mul in ORT's CPU)
        checks = verify(original, fused)
        assert all(c.ok for c in checks), checks
    ulps = _ulps(have, want, NP[x_type])
    assert ulps.max() <= (2 if weight == "llama" else 1)
    assert (ulps > 0).mean() < 0.01


@pytest.mark.parametrize("x_type", HALF, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("weight", ["folded", "cast"])
def test_double_layer_norm_rounded_to_half_fuses_with_a_note(x_type, weight):
    original = _double_norm("layer", x_type, weight, read_as_float=x_type == T.BFLOAT16)
    fused, report, nodes = _fused(original)
    assert _computing_ops(fused) == ["LayerNorm"], str(report)
    assert report.norms == 1
    attrs = _attrs(nodes[0])
    assert attrs["y_float32"] == 0 and attrs["cast_before_scale"] == 0
    assert len(nodes[0].input) == 3
    [note] = report[LAYER].notes
    assert "computed in DOUBLE in the original" in note.reason
    assert "the row's largest |Y|" in note.reason
    checks = verify(original, fused)
    assert all(c.ok for c in checks), checks
    # within one unit in the last place of each row's largest value
    x = _rows(x_type)
    want = _run(original, x, with_library=False).astype(np.float64)
    have = _run(fused, x, with_library=True).astype(np.float64)
    mantissa = 10 if x_type == T.FLOAT16 else 7
    unit = 2.0 ** (np.floor(np.log2(np.abs(want).max(-1, keepdims=True))) - mantissa)
    assert (np.abs(have - want) <= unit).all()


def test_double_norm_of_a_float32_value_rounded_to_half():
    """X float32, the norm in double, the result cast to float16 (a float16 model's norm kept
    in higher precision): the statistics fuse, the cast to float16 stays, as the fused op has Y
    of X's type or float32."""
    original = _double_norm("rms", T.FLOAT, "folded", out_type=T.FLOAT16)
    fused, report = fuse(original)
    assert _computing_ops(fused) == ["RMSNorm"], str(report)
    assert [n.op_type for n in fused.graph.node][-1] == "Cast"
    assert report.norms == 1 and report[RMS].notes
    row = report["RMSNorm computed in double: cast absorbed"]
    assert "the result is cast to FLOAT16, X is FLOAT" in row.skips[0].reason
    checks = verify(original, fused)
    assert all(c.ok for c in checks), checks


def _rms_normalization_in_double(x_type: int) -> onnx.ModelProto:
    """ONNX's own function body of RMSNormalization-23 (onnx's expansion), written for
    stash_type = DOUBLE (onnx's builder writes no such body: its casts are set here): X and
    epsilon cast to double, the normalized value back to X's type, the weight in X's type."""
    node = helper.make_node("RMSNormalization", ["X", "W"], ["Y"], axis=-1, epsilon=EPS)
    types = [helper.make_tensor_type_proto(x_type, None)] * 2
    bodies, _ = function_testcase_helper(node, types, "n", [helper.make_opsetid("", 23)])
    nodes = bodies[-1][0]
    for n in nodes:
        if n.op_type == "Cast":
            wide = n.output[0].endswith(("XU", "Epsilon"))
            n.attribute[0].i = T.DOUBLE if wide else x_type
    graph = helper.make_graph(
        nodes,
        "expanded",
        [helper.make_tensor_value_info("X", x_type, ["batch", "seq", H])],
        [helper.make_tensor_value_info("Y", x_type, ["batch", "seq", H])],
        [numpy_helper.from_array(_weights()[0].astype(NP[x_type]), "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


def test_rms_normalization_body_in_double_fuses_with_a_note():
    """ONNX's expansion rounds the normalized value before its weight (order A)."""
    original = _rms_normalization_in_double(T.FLOAT16)
    onnx.checker.check_model(original, full_check=True)
    fused, report, nodes = _fused(original)
    assert _computing_ops(fused) == ["RMSNorm"], str(report)
    attrs = _attrs(nodes[0])
    assert attrs["cast_before_scale"] == 1 and attrs["y_float32"] == 0
    assert list(nodes[0].input) == ["X", "W"]
    assert "computed in DOUBLE in the original" in report[RMS].notes[0].reason
    checks = verify(original, fused)
    assert all(c.ok for c in checks), checks
    strict, report, nodes = _fused(original, strict_precision=True)
    assert not nodes
    _assert_stays(original, strict, report, RMS, "(strict precision)")


# ---------------------------------------------------------------------------------------------
# left as they are, with the reason


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("x_type", HALF, ids=["float16", "bfloat16"])
def test_strict_precision_leaves_a_double_norm(kind, x_type):
    original = _double_norm(kind, x_type, "folded")
    fused, report, nodes = _fused(original, strict_precision=True)
    assert not nodes
    _assert_stays(
        original,
        fused,
        report,
        LAYER if kind == "layer" else RMS,
        "the statistics are computed in DOUBLE; onnxnorm computes them in FLOAT (strict precision)",
        "float32 statistics would lose double's precision",
    )


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("x_type", [T.FLOAT, T.FLOAT16], ids=["float32_x", "float16_x"])
def test_a_double_norm_rounded_to_float32_stays(kind, x_type):
    """A float32 result holds more than float32 statistics give (up to 9 units in the last
    place at 4096 values a row, measured): left, with what would be lost."""
    original = _double_norm(kind, x_type, "folded", out_type=T.FLOAT)
    fused, report, nodes = _fused(original)
    assert not nodes
    _assert_stays(
        original,
        fused,
        report,
        LAYER if kind == "layer" else RMS,
        "the statistics are computed in DOUBLE; onnxnorm computes them in FLOAT and has no "
        "DOUBLE kernels: the result is rounded to FLOAT, and float32 statistics would be up to",
        "units in the last place",
    )


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_a_double_result_stays(kind):
    """The result used in double (here a graph output): nothing rounds what float32
    statistics change."""
    original = _double_norm(kind, T.FLOAT16, "folded", out_type=T.DOUBLE)
    fused, report, nodes = _fused(original)
    assert not nodes
    _assert_stays(
        original,
        fused,
        report,
        LAYER if kind == "layer" else RMS,
        "the statistics are computed in DOUBLE; onnxnorm computes them in FLOAT and has no "
        "DOUBLE kernels: fusing would lose the original's precision",
    )


# ---------------------------------------------------------------------------------------------
# PyTorch modules that compute their norm in double, exported by both exporters


class DoubleRMSNorm(torch.nn.Module):
    """An RMSNorm computed in double: ``x.to(torch.float64)``, the statistics and the weight in
    double (``mode``: "weight", "gemma" for ``1 + w``, "llama" for the weight after the cast
    back), the result cast back to X's type."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.weight = torch.nn.Parameter(torch.from_numpy(_weights()[0]))

    def forward(self, x):
        xd = x.to(torch.float64)
        n = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS)
        if self.mode == "llama":
            return self.weight.to(x.dtype) * n.to(x.dtype)
        factor = 1.0 + self.weight.double() if self.mode == "gemma" else self.weight.double()
        return (n * factor).to(x.dtype)


def _export(module: torch.nn.Module, dtype: torch.dtype, exporter: str) -> onnx.ModelProto:
    x = torch.randn(2, 5, H, dtype=dtype)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    with (
        torch.no_grad(),
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            program = torch.onnx.export(
                module,
                (x,),
                input_names=["x"],
                dynamo=True,
                dynamic_shapes=({0: batch, 1: seq},),
                optimize=True,
            )
            return program.model_proto
        buffer = io.BytesIO()
        torch.onnx.export(
            module,
            (x,),
            buffer,
            input_names=["x"],
            dynamo=False,
            opset_version=17,
            dynamic_axes={"x": {0: "batch", 1: "seq"}},
        )
        return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize(
    "mode,dtype",
    [("weight", torch.float16), ("gemma", torch.float16), ("llama", torch.float16)],
    ids=["weight", "gemma", "llama"],
)
def test_exported_double_rms_norm_fuses(exporter, mode, dtype):
    module = DoubleRMSNorm(mode).to(dtype) if mode == "llama" else DoubleRMSNorm(mode)
    original = _export(module, dtype, exporter)
    fused, report, nodes = _fused(original)
    assert [n.op_type for n in nodes] == ["RMSNorm"], str(report)
    assert _computing_ops(fused) == ["RMSNorm"], str(report)
    assert "computed in DOUBLE in the original" in report[RMS].notes[0].reason
    x = _rows(T.FLOAT16)
    have = _run(fused, x, with_library=True)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    assert _ulps(have, want, np.dtype(np.float16)).max() <= (2 if mode == "llama" else 1)
    checks = verify(original, fused, sizes={"batch": 3, "seq": 7})
    assert all(c.ok for c in checks), checks


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_exported_double_rms_norm_of_float32_stays(exporter):
    original = _export(DoubleRMSNorm("weight"), torch.float32, exporter)
    fused, report, nodes = _fused(original)
    assert not nodes
    _assert_stays(original, fused, report, RMS, "the result is rounded to FLOAT")

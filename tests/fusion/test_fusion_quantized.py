"""Fusing a norm with the quantizer after it, on a small Llama-style decoder quantized by ONNX
Runtime's own tools: quantize_dynamic (DynamicQuantizeLinear before each MatMulInteger) and
quantize_static in QDQ format (QuantizeLinear/DequantizeLinear pairs around the MatMuls), to int8
and to float8 e4m3fn. The fused graph holds exactly the expected ops on every target, and its
quantized tensors equal the original's (the quantizers' outputs, compared by name: the fused op's
outputs keep them; one step apart only at a tie, and with plain ORT a dynamic scale a few units
in the last place apart)."""

from __future__ import annotations

import collections

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from models import pipelines
from onnxnorm import runtime
from onnxnorm.fusion.pipeline import fuse
from onnxnorm.fusion.verify import generate_inputs
from onnxnorm.ops import reference
from onnxnorm.testing import hf
from tests.support.matrix import NODE_TARGETS, TARGETS_WITHOUT_LIBRARY

FLOAT8 = reference.FLOAT8_E4M3FN
SOURCES = {
    "dynamic": "dynamic MatMul quantization",
    "static": "static QDQ, MatMul only",
    "float8": None,
}


def _float8_qdq(folder):
    """The corpus Llama quantized by ORT's quantize_static in QDQ format, its MatMuls only, to
    float8 e4m3fn (activations and weights; ORT's float8 calibration is its Distribution
    method). The quantizer writes opset 19, the least float8 needs; the model then imports
    opset 21, where QuantizeLinear and DequantizeLinear have their latest form (no op of this
    graph changed its meaning from 19 to 21; opset 19 is tested in tests/ops/test_catalogue.py)."""
    import contextlib
    import io
    import warnings

    from onnxruntime.quantization import CalibrationMethod, QuantType

    model = pipelines.llama()
    src, out = folder / "float.onnx", folder / "qdq_float8.onnx"
    onnx.save(model, src)
    with (
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        hf.quantize(
            src,
            out,
            "static",
            pipelines.calibration_feeds(model),
            activation_type=QuantType.QFLOAT8E4M3FN,
            weight_type=QuantType.QFLOAT8E4M3FN,
            calibrate_method=CalibrationMethod.Distribution,
        )
    quantized = onnx.load(out)
    for imp in quantized.opset_import:
        if imp.domain in ("", "ai.onnx"):
            assert imp.version == 19, imp
            imp.version = 21
    return quantized


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(kind):
        if kind not in cache:
            folder = tmp_path_factory.mktemp(kind)
            cache[kind] = (
                _float8_qdq(folder)
                if kind == "float8"
                else pipelines.SOURCES[SOURCES[kind]][1](folder)
            )
        return cache[kind]

    return get


def _ops(model):
    return collections.Counter(
        (n.domain, n.op_type)
        for n in model.graph.node
        if n.domain == "onnxnorm" or "Quantize" in n.op_type or "Normalization" in n.op_type
    )


#: quantization -> target -> the norm and quantizer ops of the fused graph. The decoder has 5
#: RMSNorms: the first and three residual ones feed the quantized q/k/v and MLP MatMuls; the
#: last one's output is the graph's output (the decoder returns its hidden states).
EXPECTED = {
    "dynamic": {
        "function": {
            ("onnxnorm", "RMSNormDynamicQuantizeLinear"): 1,
            ("onnxnorm", "SkipRMSNormDynamicQuantizeLinear"): 3,
            ("onnxnorm", "SkipRMSNorm"): 1,
            ("", "DynamicQuantizeLinear"): 4,
        },
        "ort": {
            ("", "SimplifiedLayerNormalization"): 1,
            ("com.microsoft", "SkipSimplifiedLayerNormalization"): 4,
            ("", "DynamicQuantizeLinear"): 8,
        },
    },
    "static": {
        "function": {
            ("onnxnorm", "RMSNormQuantizeLinear"): 1,
            ("onnxnorm", "SkipRMSNormQuantizeLinear"): 3,
            ("onnxnorm", "SkipRMSNorm"): 1,
            ("", "QuantizeLinear"): 30,
        },
        "ort": {
            ("", "SimplifiedLayerNormalization"): 1,
            ("com.microsoft", "SkipSimplifiedLayerNormalization"): 4,
            ("", "QuantizeLinear"): 34,
        },
    },
}
EXPECTED["dynamic"]["fused"] = EXPECTED["dynamic"]["function"]
EXPECTED["static"]["fused"] = EXPECTED["static"]["function"]
# standard ONNX below opset 23: the norms' function bodies inlined, the quantizers kept
EXPECTED["dynamic"]["onnx"] = {("", "DynamicQuantizeLinear"): 8}
EXPECTED["static"]["onnx"] = {("", "QuantizeLinear"): 34}
# float8: the same graph as int8's, every quantizer to float8 e4m3fn
EXPECTED["float8"] = EXPECTED["static"]
#: (target, whether ORT runs the fused model with the onnxnorm library): the targets that keep
#: the nodes with it, those whose models need no library without it (so the function target
#: both ways: the library's kernels, and plain ORT inlining the function bodies)
RUNS = [(t, True) for t in NODE_TARGETS] + [(t, False) for t in TARGETS_WITHOUT_LIBRARY]


def _with_outputs(model, names):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    known = {o.name for o in out.graph.output}
    out.graph.output.extend(
        helper.make_value_info(n, onnx.TypeProto()) for n in names if n not in known
    )
    return out


def _run(model, feeds, with_library):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = runtime.session(model, options, with_library=with_library)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def _float8_near_tie(values, scale):
    """Where values / scale is within float rounding of a tie between two float8 e4m3fn values:
    there a float value one unit in the last place away may round to the other."""
    v = values.astype(np.float64) / np.float64(scale)
    low, high = (
        np.clip(v * f, -448.0, 448.0).astype(FLOAT8).view(np.uint8) for f in (1 - 1e-5, 1 + 1e-5)
    )
    return low != high


@pytest.mark.parametrize("kind", list(SOURCES))
@pytest.mark.parametrize(
    "target, library", RUNS, ids=[f"{t}-{'library' if lib else 'plain'}" for t, lib in RUNS]
)
def test_norm_and_quantizer_fused_exactly(built, kind, target, library):
    model = built(kind)
    fused, report = fuse(model, target)
    if target != "ort":  # (ORT's SimplifiedLayerNormalization is no ONNX op the checker knows)
        onnx.checker.check_model(fused)
    assert _ops(fused) == EXPECTED[kind][target], _ops(fused)
    quantizer = "DynamicQuantizeLinear" if kind == "dynamic" else "QuantizeLinear"
    assert report[f"RMSNorm + {quantizer}"].fused == 1, str(report)
    assert report[f"SkipRMSNorm + {quantizer}"].fused == 3, str(report)
    if kind != "dynamic":  # every DequantizeLinear stays
        assert sum(n.op_type == "DequantizeLinear" for n in fused.graph.node) == sum(
            n.op_type == "DequantizeLinear" for n in model.graph.node
        )
    if kind == "float8":  # every quantizer still gives float8, the fused ops' Y too
        q_types = {o.name: o.type.tensor_type.elem_type for o in fused.graph.value_info}
        assert {
            q_types.get(n.output[0])
            for n in fused.graph.node
            if n.op_type.endswith("QuantizeLinear")
        } == {onnx.TensorProto.FLOAT8E4M3FN}

    # the quantized tensors the fused ops give (they keep the quantizers' output names), and for
    # the dynamic ones their scales and zero points: the original's
    fused_outputs = {o for n in fused.graph.node for o in n.output}
    quantizers = [
        n for n in model.graph.node if n.op_type == quantizer and n.output[0] in fused_outputs
    ]
    names = [o for n in quantizers for o in n.output]
    floats = [n.input[0] for n in quantizers]
    feeds = generate_inputs(model, 0)
    want = _run(_with_outputs(model, names + floats), feeds, with_library=False)
    got = _run(_with_outputs(fused, names), feeds, with_library=library)
    for q in quantizers:
        scale = (
            want[q.output[1]]
            if kind == "dynamic"
            else onnx.numpy_helper.to_array(
                next(i for i in model.graph.initializer if i.name == q.input[1])
            )
        )
        if kind == "dynamic":
            # with the library's kernels this decoder's scales and zero points are the
            # original's bit for bit; ORT's own ops running the function bodies or the lowering
            # compute the norm in other orders than the decomposed graph's, so an end of the
            # range, and the scale, may be a few units in the last place off (for about half
            # the weight draws), and the zero point a step at a tie
            np.testing.assert_allclose(
                got[q.output[1]], want[q.output[1]], atol=0, rtol=0 if library else 1e-6
            )
            zero_points = [int(got[q.output[2]]), int(want[q.output[2]])]
            assert abs(zero_points[0] - zero_points[1]) <= (0 if library else 1), zero_points
        g, w = got[q.output[0]], want[q.output[0]]
        assert g.dtype == w.dtype and g.shape == w.shape
        diff = g.astype(np.int32) - w.astype(np.int32)
        if kind == "float8":  # (ORT gives float8 as uint8 codes: compared as bits)
            near_tie = _float8_near_tie(want[q.input[0]], scale)
            assert near_tie.mean() < 0.01
            np.testing.assert_array_equal(g[~near_tie], w[~near_tie])
            # a tie: the two neighbouring codes of one sign (the codes of one sign run in order)
            assert np.all((g >> 7) == (w >> 7)) and np.abs(diff).max(initial=0) <= 1
            continue
        # one step only where the original's float value is within float rounding of a tie
        steps = want[q.input[0]].astype(np.float64) / np.float64(scale)
        near_tie = np.abs(np.abs(steps - np.floor(steps)) - 0.5) < 1e-3
        np.testing.assert_array_equal(diff[~near_tie], 0)
        assert np.abs(diff).max(initial=0) <= 1


def test_float_output_kept_for_other_readers(built):
    """A norm whose float output is also a graph output keeps it as the fused op's Y_float;
    the quantized values do not change."""
    model = onnx.ModelProto()
    model.CopyFrom(built("static"))
    quantizer = next(
        n
        for n in model.graph.node
        if n.op_type == "QuantizeLinear"
        and n.input[0] in {m.output[0] for m in model.graph.node if m.op_type == "Mul"}
    )
    model.graph.output.append(helper.make_value_info(quantizer.input[0], onnx.TypeProto()))
    fused, _ = fuse(model, "fused")
    node = next(n for n in fused.graph.node if quantizer.output[0] in n.output)
    assert node.domain == "onnxnorm" and node.op_type.endswith("QuantizeLinear")
    assert node.output[-1] == quantizer.input[0]  # Y_float, the graph output
    feeds = generate_inputs(model, 1)
    want = _run(_with_outputs(model, [quantizer.output[0]]), feeds, with_library=False)
    got = _run(_with_outputs(fused, [quantizer.output[0]]), feeds, with_library=True)
    np.testing.assert_allclose(
        got[quantizer.input[0]], want[quantizer.input[0]], rtol=1e-5, atol=1e-5
    )
    steps = want[quantizer.input[0]].astype(np.float64) / np.float64(
        onnx.numpy_helper.to_array(
            next(i for i in model.graph.initializer if i.name == quantizer.input[1])
        )
    )
    near_tie = np.abs(np.abs(steps - np.floor(steps)) - 0.5) < 1e-3
    diff = got[quantizer.output[0]].astype(np.int32) - want[quantizer.output[0]].astype(np.int32)
    np.testing.assert_array_equal(diff[~near_tie], 0)
    # without other readers the function target's nodes leave Y_float out
    plain, _ = fuse(built("static"))
    for n in plain.graph.node:
        if n.op_type in ("RMSNormQuantizeLinear", "SkipRMSNormQuantizeLinear"):
            spec_outputs = 1 if n.op_type == "RMSNormQuantizeLinear" else 2
            assert len(n.output) <= spec_outputs, n


#: QuantizeLinear nodes after a norm: (zero point, scale, attributes, opset, fused or the
#: reason the report gives for leaving it)
QUANTIZERS = {
    "per-axis scale": (
        np.zeros(4, np.uint8),
        np.array([0.1, 0.2, 0.3, 0.4], np.float32),
        {"axis": 1},
        17,
        "is not per tensor",
    ),
    "float8": (np.array(0, FLOAT8), np.array(1e-3, np.float32), {}, 21, None),
    "float8 saturate 1": (
        np.array(0, FLOAT8),
        np.array(1e-3, np.float32),
        {"saturate": 1},
        19,
        None,
    ),
    "float8 saturate 0": (
        np.array(0, FLOAT8),
        np.array(1e-3, np.float32),
        {"saturate": 0},
        21,
        "saturate = 0: the fused op always saturates",
    ),
    "float8 e5m2": (
        np.array(0, ml_dtypes.float8_e5m2),
        np.array(1e-3, np.float32),
        {},
        21,
        "y_zero_point of type FLOAT8E5M2: the fused op quantizes to UINT8, INT8, FLOAT8E4M3FN",
    ),
}


@pytest.mark.parametrize("case", QUANTIZERS)
def test_quantizer_fused_or_left_with_the_reason(case):
    """A decomposed RMSNorm and the QuantizeLinear after it: one quantized op where the pair is
    its semantics (the float8 one quantizes as ORT's QuantizeLinear, bit for bit, through the
    function body); else the QuantizeLinear stays, with the reason in the report: a per-channel
    scale, float8 without saturation (ORT's CPU conversion then departs from the ONNX
    specification in [480, 496), docs/fusion.md), a float8 type the op does not have."""
    zero_point, scale, attrs, opset, reason = QUANTIZERS[case]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["y"]),
        helper.make_node("QuantizeLinear", ["y", "scale", "zp"], ["q"], **attrs),
        helper.make_node(
            "DequantizeLinear",
            ["q", "scale", "zp"],
            ["out"],
            **{k: v for k, v in attrs.items() if k == "axis"},
        ),
    ]
    if opset >= 18:  # ReduceMean's axes became an input
        nodes[1] = helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1)
    graph = helper.make_graph(
        nodes,
        "g",
        [x],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [2, 4])],
        [
            onnx.numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
            onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes"),
            onnx.numpy_helper.from_array(scale, "scale"),
            onnx.numpy_helper.from_array(zero_point, "zp"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    fused, report = fuse(model)
    row = report["RMSNorm + QuantizeLinear"]
    if reason is not None:
        assert _ops(fused) == {("onnxnorm", "RMSNorm"): 1, ("", "QuantizeLinear"): 1}
        assert (row.found, row.fused) == (1, 0)
        assert reason in row.skips[0].reason, row.skips[0].reason
        return
    assert _ops(fused) == {("onnxnorm", "RMSNormQuantizeLinear"): 1}
    assert (row.found, row.fused) == (1, 1)
    node = next(n for n in fused.graph.node if n.domain == "onnxnorm")
    assert list(node.input)[3:] == ["scale", "zp"]
    assert "saturate" not in {a.name for a in node.attribute}  # (the op has no such attribute)
    # values that saturate (|x / rms| / 0.001 > 448), round to subnormals and to -0
    feeds = {"x": np.array([[3.0, -1e-5, 2e-4, 0.01], [-2.0, 1.0, -1e-7, 5.0]], np.float32)}
    want = _run(_with_outputs(model, ["q"]), feeds, with_library=False)
    got = _run(_with_outputs(fused, ["q"]), feeds, with_library=False)
    np.testing.assert_array_equal(got["q"], want["q"])
    np.testing.assert_array_equal(got["out"], want["out"])
    assert {0x7E, 0xFE, 0x80} <= set(want["q"].ravel().tolist())  # +-448, -0
    assert np.any(((want["q"] & 0x78) == 0) & ((want["q"] & 0x07) != 0))  # a subnormal


#: (quantizer, its zero point, its scale): int8, and float8 with a scale that makes values saturate
FLOAT16_QUANTIZERS = {
    "QuantizeLinear-int8": ("QuantizeLinear", np.array(-2, np.int8), 0.02),
    "QuantizeLinear-float8": ("QuantizeLinear", np.array(0, FLOAT8), 0.005),
    "DynamicQuantizeLinear": ("DynamicQuantizeLinear", None, None),
}


@pytest.mark.parametrize("case", FLOAT16_QUANTIZERS)
def test_float16_norm_and_quantizer(case, rng):
    """A float16 SkipRMSNorm followed by a float16 QuantizeLinear (opset 21; to int8 or float8),
    or by a Cast to float32 and a DynamicQuantizeLinear (which takes float32 only): one quantized
    op, the Cast included, with the original's quantized values, through the library's kernel
    and through the function body; the Sum keeps its reader."""
    from onnxnorm import ops
    from onnxnorm.fusion.lowering import lower

    quantizer, zero_point, scale = FLOAT16_QUANTIZERS[case]
    f16 = onnx.TensorProto.FLOAT16
    nodes = [
        helper.make_node(
            "SkipRMSNorm", ["x", "r", "w"], ["y", "sum"], domain="onnxnorm", cast_before_scale=1
        )
    ]
    outputs = []
    weights = [
        onnx.numpy_helper.from_array((1 + 0.1 * rng.standard_normal(64)).astype(np.float16), "w")
    ]
    if quantizer == "QuantizeLinear":
        nodes.append(helper.make_node("QuantizeLinear", ["y", "scale", "zp"], ["q"]))
        outputs.append(
            helper.make_tensor_value_info(
                "q", helper.np_dtype_to_tensor_dtype(zero_point.dtype), [4, 64]
            )
        )
        weights += [
            onnx.numpy_helper.from_array(np.array(scale, np.float16), "scale"),
            onnx.numpy_helper.from_array(zero_point, "zp"),
        ]
    else:
        nodes += [
            helper.make_node("Cast", ["y"], ["y32"], to=onnx.TensorProto.FLOAT),
            helper.make_node("DynamicQuantizeLinear", ["y32"], ["q", "qs", "qz"]),
        ]
        outputs += [
            helper.make_tensor_value_info("q", onnx.TensorProto.UINT8, [4, 64]),
            helper.make_tensor_value_info("qs", onnx.TensorProto.FLOAT, []),
            helper.make_tensor_value_info("qz", onnx.TensorProto.UINT8, []),
        ]
    nodes.append(helper.make_node("Neg", ["sum"], ["next"]))
    outputs.append(helper.make_tensor_value_info("next", f16, [4, 64]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, f16, [4, 64]) for n in ("x", "r")],
        outputs,
        weights,
    )
    model = ops.attach_functions(
        helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxnorm", 1)]
        )
    )
    fused, _ = fuse(model, "fused")
    assert _ops(fused) == {("onnxnorm", f"SkipRMSNorm{quantizer}"): 1}
    assert not any(n.op_type == "Cast" for n in fused.graph.node)
    node = next(n for n in fused.graph.node if n.domain == "onnxnorm")
    assert list(node.output) == (
        ["q", "sum"] if quantizer == "QuantizeLinear" else ["q", "qs", "qz", "sum"]
    )
    feeds = {
        "x": rng.standard_normal((4, 64)).astype(np.float16),
        "r": rng.standard_normal((4, 64)).astype(np.float16),
    }
    want = _run(model, feeds, with_library=True)  # the float kernel, then ORT's quantizer
    if zero_point is not None and zero_point.dtype == FLOAT8:
        assert {0x7E, 0xFE} <= set(want["q"].ravel().tolist())  # some saturate to +-448
    bodies = _run(lower(fused, "function"), feeds, with_library=False)
    got = _run(fused, feeds, with_library=True)
    for name in want:
        np.testing.assert_array_equal(bodies[name], want[name])
        np.testing.assert_array_equal(got[name], want[name])

"""Fusing a norm with the quantizer after it, on a small Llama-style decoder quantized by ONNX
Runtime's own tools: quantize_dynamic (DynamicQuantizeLinear before each MatMulInteger) and
quantize_static in QDQ format (QuantizeLinear/DequantizeLinear pairs around the MatMuls). The
fused graph holds exactly the expected ops on every target, and its quantized tensors equal the
original's (the quantizers' outputs, compared by name: the fused op's outputs keep them)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from models import pipelines
from onnxnorm import runtime
from onnxnorm.fusion.pipeline import fuse
from onnxnorm.fusion.verify import generate_inputs

SOURCES = {"dynamic": "dynamic MatMul quantization", "static": "static QDQ, MatMul only"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = pipelines.SOURCES[SOURCES[kind]][1](tmp_path_factory.mktemp(kind))
        return cache[kind]

    return get


def _ops(model):
    return collections.Counter((n.domain, n.op_type) for n in model.graph.node
                               if n.domain == "onnxnorm" or "Quantize" in n.op_type
                               or "Normalization" in n.op_type)


#: quantization -> target -> the norm and quantizer ops of the fused graph. The decoder has 5
#: RMSNorms: the first and three residual ones feed the quantized q/k/v and MLP MatMuls; the
#: last one's output is the graph's output (the decoder returns its hidden states).
EXPECTED = {
    "dynamic": {
        "function": {("onnxnorm", "RMSNormDynamicQuantizeLinear"): 1,
                     ("onnxnorm", "SkipRMSNormDynamicQuantizeLinear"): 3,
                     ("onnxnorm", "SkipRMSNorm"): 1, ("", "DynamicQuantizeLinear"): 4},
        "ort": {("", "SimplifiedLayerNormalization"): 1,
                ("com.microsoft", "SkipSimplifiedLayerNormalization"): 4,
                ("", "DynamicQuantizeLinear"): 8},
    },
    "static": {
        "function": {("onnxnorm", "RMSNormQuantizeLinear"): 1,
                     ("onnxnorm", "SkipRMSNormQuantizeLinear"): 3,
                     ("onnxnorm", "SkipRMSNorm"): 1, ("", "QuantizeLinear"): 30},
        "ort": {("", "SimplifiedLayerNormalization"): 1,
                ("com.microsoft", "SkipSimplifiedLayerNormalization"): 4,
                ("", "QuantizeLinear"): 34},
    },
}
EXPECTED["dynamic"]["fused"] = EXPECTED["dynamic"]["function"]
EXPECTED["static"]["fused"] = EXPECTED["static"]["function"]
# standard ONNX below opset 23: the norms' function bodies inlined, the quantizers kept
EXPECTED["dynamic"]["onnx"] = {("", "DynamicQuantizeLinear"): 8}
EXPECTED["static"]["onnx"] = {("", "QuantizeLinear"): 34}


def _with_outputs(model, names):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    known = {o.name for o in out.graph.output}
    out.graph.output.extend(helper.make_value_info(n, onnx.TypeProto()) for n in names
                            if n not in known)
    return out


def _run(model, feeds, with_library):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = runtime.session(model, options, with_library=with_library)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


@pytest.mark.parametrize("kind", list(SOURCES))
@pytest.mark.parametrize("target", ["function", "fused", "ort", "onnx"])
def test_norm_and_quantizer_fused_exactly(built, kind, target):
    model = built(kind)
    fused, report = fuse(model, target)
    if target != "ort":  # (ORT's SimplifiedLayerNormalization is no ONNX op the checker knows)
        onnx.checker.check_model(fused)
    assert _ops(fused) == EXPECTED[kind][target], _ops(fused)
    quantizer = "DynamicQuantizeLinear" if kind == "dynamic" else "QuantizeLinear"
    assert report[f"RMSNorm + {quantizer}"].fused == 1, str(report)
    assert report[f"SkipRMSNorm + {quantizer}"].fused == 3, str(report)
    if kind == "static":  # every DequantizeLinear stays
        assert sum(n.op_type == "DequantizeLinear" for n in fused.graph.node) == \
            sum(n.op_type == "DequantizeLinear" for n in model.graph.node)

    # the quantized tensors the fused ops give (they keep the quantizers' output names), and for
    # the dynamic ones their scales and zero points: the original's
    fused_outputs = {o for n in fused.graph.node for o in n.output}
    quantizers = [n for n in model.graph.node if n.op_type == quantizer
                  and n.output[0] in fused_outputs]
    names = [o for n in quantizers for o in n.output]
    floats = [n.input[0] for n in quantizers]
    feeds = generate_inputs(model, 0)
    want = _run(_with_outputs(model, names + floats), feeds, with_library=False)
    got = _run(_with_outputs(fused, names), feeds, with_library=target in ("function", "fused"))
    for q in quantizers:
        scale = want[q.output[1]] if kind == "dynamic" else onnx.numpy_helper.to_array(
            next(i for i in model.graph.initializer if i.name == q.input[1]))
        if kind == "dynamic":
            np.testing.assert_array_equal(got[q.output[1]], want[q.output[1]])
            np.testing.assert_array_equal(got[q.output[2]], want[q.output[2]])
        g, w = got[q.output[0]], want[q.output[0]]
        assert g.dtype == w.dtype and g.shape == w.shape
        diff = g.astype(np.int32) - w.astype(np.int32)
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
    quantizer = next(n for n in model.graph.node if n.op_type == "QuantizeLinear"
                     and n.input[0] in {m.output[0] for m in model.graph.node if m.op_type == "Mul"})
    model.graph.output.append(helper.make_value_info(quantizer.input[0], onnx.TypeProto()))
    fused, report = fuse(model, "fused")
    node = next(n for n in fused.graph.node if quantizer.output[0] in n.output)
    assert node.domain == "onnxnorm" and node.op_type.endswith("QuantizeLinear")
    assert node.output[-1] == quantizer.input[0]  # Y_float, the graph output
    feeds = generate_inputs(model, 1)
    want = _run(_with_outputs(model, [quantizer.output[0]]), feeds, with_library=False)
    got = _run(_with_outputs(fused, [quantizer.output[0]]), feeds, with_library=True)
    np.testing.assert_allclose(got[quantizer.input[0]], want[quantizer.input[0]], rtol=1e-5,
                               atol=1e-5)
    steps = want[quantizer.input[0]].astype(np.float64) / np.float64(onnx.numpy_helper.to_array(
        next(i for i in model.graph.initializer if i.name == quantizer.input[1])))
    near_tie = np.abs(np.abs(steps - np.floor(steps)) - 0.5) < 1e-3
    diff = got[quantizer.output[0]].astype(np.int32) - want[quantizer.output[0]].astype(np.int32)
    np.testing.assert_array_equal(diff[~near_tie], 0)
    # without other readers the function target's nodes leave Y_float out
    plain, _ = fuse(built("static"))
    for n in plain.graph.node:
        if n.op_type in ("RMSNormQuantizeLinear", "SkipRMSNormQuantizeLinear"):
            spec_outputs = 1 if n.op_type == "RMSNormQuantizeLinear" else 2
            assert len(n.output) <= spec_outputs, n


def test_quantizer_with_per_axis_scale_is_not_fused():
    """A QuantizeLinear with a per-channel scale stays, with the reason in the report."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
    nodes = [
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["y"]),
        helper.make_node("QuantizeLinear", ["y", "scale", "zp"], ["q"], axis=1),
        helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["out"], axis=1),
    ]
    nodes.insert(0, helper.make_node("Mul", ["x", "x"], ["sq"]))
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info(
        "out", onnx.TensorProto.FLOAT, [2, 4])], [
        onnx.numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        onnx.numpy_helper.from_array(np.array([0.1, 0.2, 0.3, 0.4], np.float32), "scale"),
        onnx.numpy_helper.from_array(np.zeros(4, np.uint8), "zp")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    fused, report = fuse(model)
    assert _ops(fused) == {("onnxnorm", "RMSNorm"): 1, ("", "QuantizeLinear"): 1}
    row = report["RMSNorm + QuantizeLinear"]
    assert (row.found, row.fused) == (1, 0)
    assert "is not per tensor" in row.skips[0].reason


@pytest.mark.parametrize("quantizer", ["QuantizeLinear", "DynamicQuantizeLinear"])
def test_float16_norm_and_quantizer(quantizer, rng):
    """A float16 SkipRMSNorm followed by a float16 QuantizeLinear (opset 21), or by a Cast to
    float32 and a DynamicQuantizeLinear (which takes float32 only): one quantized op, the Cast
    included, with the original's quantized values; the Sum keeps its reader."""
    from onnxnorm import ops

    f16 = onnx.TensorProto.FLOAT16
    nodes = [helper.make_node("SkipRMSNorm", ["x", "r", "w"], ["y", "sum"], domain="onnxnorm",
                              cast_before_scale=1)]
    outputs = []
    if quantizer == "QuantizeLinear":
        nodes.append(helper.make_node("QuantizeLinear", ["y", "scale", "zp"], ["q"]))
        outputs.append(helper.make_tensor_value_info("q", onnx.TensorProto.INT8, [4, 64]))
    else:
        nodes += [helper.make_node("Cast", ["y"], ["y32"], to=onnx.TensorProto.FLOAT),
                  helper.make_node("DynamicQuantizeLinear", ["y32"], ["q", "qs", "qz"])]
        outputs += [helper.make_tensor_value_info("q", onnx.TensorProto.UINT8, [4, 64]),
                    helper.make_tensor_value_info("qs", onnx.TensorProto.FLOAT, []),
                    helper.make_tensor_value_info("qz", onnx.TensorProto.UINT8, [])]
    nodes.append(helper.make_node("Neg", ["sum"], ["next"]))
    outputs.append(helper.make_tensor_value_info("next", f16, [4, 64]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, f16, [4, 64]) for n in ("x", "r")], outputs,
        [onnx.numpy_helper.from_array((1 + 0.1 * rng.standard_normal(64)).astype(np.float16), "w"),
         onnx.numpy_helper.from_array(np.array(0.02, np.float16), "scale"),
         onnx.numpy_helper.from_array(np.array(-2, np.int8), "zp")])
    model = ops.attach_functions(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("onnxnorm", 1)]))
    fused, report = fuse(model, "fused")
    assert _ops(fused) == {("onnxnorm", f"SkipRMSNorm{quantizer}"): 1}
    assert not any(n.op_type == "Cast" for n in fused.graph.node)
    node = next(n for n in fused.graph.node if n.domain == "onnxnorm")
    assert list(node.output) == (["q", "sum"] if quantizer == "QuantizeLinear"
                                 else ["q", "qs", "qz", "sum"])
    feeds = {"x": rng.standard_normal((4, 64)).astype(np.float16),
             "r": rng.standard_normal((4, 64)).astype(np.float16)}
    want = _run(model, feeds, with_library=True)  # the float kernel, then ORT's quantizer
    got = _run(fused, feeds, with_library=True)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])

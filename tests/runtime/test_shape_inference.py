"""The library's output shape inference in ONNX Runtime (custom_ops/ort/custom_op.cc): a dim that
ONNX Runtime knows neither by value nor by name stays unknown through an onnxnorm node. It once
came out as the value -1, and a Reshape after the node then inferred negative dims (a load error,
or a shape warning on every run)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxnorm import runtime

HEAD = 16


def _model(op: str, attrs: dict, float16: bool = False) -> onnx.ModelProto:
    """X [batch, ?, 4 * HEAD] (the middle dim without value or name) -> op -> Reshape [0, -1,
    HEAD]; both outputs are graph outputs without shapes."""
    t = TensorProto.FLOAT16 if float16 else TensorProto.FLOAT
    x = helper.make_tensor_value_info("x", t, ["batch", None, 4 * HEAD])
    x.type.tensor_type.shape.dim[1].Clear()
    inputs, inits = ["x"], [numpy_helper.from_array(np.array([0, -1, HEAD], np.int64), "shape")]
    if op == "RMSNormRotary":
        cache = np.zeros((64, HEAD // 2), np.float16 if float16 else np.float32)
        inits += [numpy_helper.from_array(cache, "cos"), numpy_helper.from_array(cache, "sin")]
        inits.append(numpy_helper.from_array(np.zeros((2, 3), np.int64), "positions"))
        inputs += ["", "", "", "cos", "sin", "positions"]
    nodes = [
        helper.make_node(op, inputs, ["n"], domain="onnxnorm", **attrs),
        helper.make_node("Reshape", ["n", "shape"], ["y"]),
    ]
    outputs = [onnx.ValueInfoProto(name=name) for name in "ny"]
    graph = helper.make_graph(nodes, "unnamed_dim", [x], outputs, inits)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("onnxnorm", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


@pytest.mark.parametrize(
    "op, attrs, float16, y_type",
    [
        ("RMSNorm", {}, False, "tensor(float)"),
        ("LayerNorm", {}, True, "tensor(float16)"),
        # the mixed form: Y in float32 from a float16 X
        ("RMSNorm", {"y_float32": 1}, True, "tensor(float)"),
        # a rotary op's QOut transposed to [batch, heads, seq, head]
        ("RMSNormRotary", {"head_size": HEAD, "layout": 2}, False, "tensor(float)"),
    ],
)
def test_an_unnamed_dim_stays_unknown(op, attrs, float16, y_type):
    session = runtime.session(_model(op, attrs, float16), ort.SessionOptions(), with_library=True)
    shapes = {o.name: o.shape for o in session.get_outputs()}
    types = {o.name: o.type for o in session.get_outputs()}
    assert types["n"] == y_type
    for name, shape in shapes.items():
        assert not [d for d in shape if isinstance(d, int) and d < 0], (name, shape)
    # the node's known dims are kept: batch by its name, the last by its value
    if attrs.get("layout") == 2:
        assert shapes["n"][0] == "batch" and shapes["n"][1:4:2] == [4, HEAD]
    else:
        assert shapes["n"][0] == "batch" and shapes["n"][2] == 4 * HEAD
    assert shapes["y"][2] == HEAD
    x = (
        np.random.default_rng(0)
        .standard_normal((2, 3, 4 * HEAD))
        .astype(np.float16 if float16 else np.float32)
    )
    feeds = {"x": x}
    n, y = session.run(["n", "y"], feeds)
    assert y.shape == (2, n.size // (2 * HEAD), HEAD)

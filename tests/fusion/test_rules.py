"""The fusion rules one by one on hand-built graphs: single norm ops of ONNX and ONNX Runtime,
LayerNorm spelled out, Gemma's (1 + w), residual, DeepNorm, XBias and Sandwich fusion, and
BatchNorm folding. Each fused model runs in plain onnxruntime and matches the original."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxnorm.fusion import fuse
from onnxnorm.fusion.verify import verify
from tests.support.matrix import LOWERED_TARGETS

F = TensorProto.FLOAT
H = 16
SHAPE = [2, 5, H]


def _model(nodes, inputs, outputs, inits, opset=18, ms=False):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    imports = [helper.make_opsetid("", opset)] + (
        [helper.make_opsetid("com.microsoft", 1)] if ms else []
    )
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _w(seed=0, shape=(H,), offset=1.0):
    return (np.random.default_rng(seed).random(shape) * 0.8 + offset).astype(np.float32)


def _ops(model):
    return [(n.domain, n.op_type) for n in model.graph.node]


def _check(original, fused):
    checks = verify(original, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


def _attr(node, name):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None


def test_layer_normalization_op_and_residual():
    original = _model(
        [
            helper.make_node("Add", ["x", "r"], ["s"]),
            helper.make_node("LayerNormalization", ["s", "w", "b"], ["y"], epsilon=1e-5),
            helper.make_node("Add", ["s", "y"], ["out"]),
        ],
        [("x", F, SHAPE), ("r", F, SHAPE)],
        [("out", F, SHAPE)],
        {"w": _w(), "b": _w(1, offset=-0.4)},
    )
    fused, report = fuse(original)
    assert _ops(fused) == [("onnxnorm", "SkipLayerNorm"), ("", "Add")]
    assert len(fused.graph.node[0].output) == 2  # Sum reused: Pre-Norm
    assert report.norms == 1 and report.residual_adds == 1
    _check(original, fused)


def test_post_norm_drops_the_sum():
    original = _model(
        [
            helper.make_node("Add", ["x", "r"], ["s"]),
            helper.make_node("LayerNormalization", ["s", "w", "b"], ["y"], epsilon=1e-5),
        ],
        [("x", F, SHAPE), ("r", F, SHAPE)],
        [("y", F, SHAPE)],
        {"w": _w(), "b": _w(1, offset=-0.4)},
    )
    fused, _ = fuse(original, "fused")
    assert _ops(fused) == [("onnxnorm", "SkipLayerNorm")]
    assert list(fused.graph.node[0].output) == ["y"]


def test_residual_add_that_broadcasts_is_not_absorbed():
    original = _model(
        [
            helper.make_node("Add", ["x", "r"], ["s"]),
            helper.make_node("LayerNormalization", ["s", "w"], ["y"], epsilon=1e-5),
        ],
        [("x", F, SHAPE), ("r", F, [1, 5, H])],
        [("y", F, SHAPE)],
        {"w": _w()},
    )
    fused, report = fuse(original)
    assert _ops(fused) == [("", "Add"), ("onnxnorm", "LayerNorm")]
    assert "broadcasts" in str(report)
    _check(original, fused)


def test_deep_norm_alpha_from_the_mul():
    original = _model(
        [
            helper.make_node("Mul", ["r", "alpha"], ["ar"]),
            helper.make_node("Add", ["ar", "x"], ["s"]),
            helper.make_node("LayerNormalization", ["s", "w", "b"], ["y"], epsilon=1e-5),
        ],
        [("x", F, SHAPE), ("r", F, SHAPE)],
        [("y", F, SHAPE)],
        {"alpha": np.array(2.5, np.float32), "w": _w(), "b": _w(1, offset=-0.4)},
    )
    fused, _ = fuse(original)
    assert _ops(fused) == [("onnxnorm", "SkipLayerNorm")]
    node = fused.graph.node[0]
    assert list(node.input[:2]) == ["x", "r"] and _attr(node, "alpha") == 2.5
    _check(original, fused)
    for target in LOWERED_TARGETS:
        _check(original, fuse(original, target)[0])


def test_sublayer_bias_becomes_xbias():
    original = _model(
        [
            helper.make_node("MatMul", ["h", "wm"], ["m"]),
            helper.make_node("Add", ["m", "bm"], ["mb"]),
            helper.make_node("Add", ["mb", "r"], ["s"]),
            helper.make_node("LayerNormalization", ["s", "w", "b"], ["y"], epsilon=1e-5),
        ],
        [("h", F, SHAPE), ("r", F, SHAPE)],
        [("y", F, SHAPE)],
        {"wm": _w(2, (H, H), -0.4), "bm": _w(3, offset=-0.4), "w": _w(), "b": _w(1, offset=-0.4)},
    )
    fused, _ = fuse(original)
    assert _ops(fused) == [("", "MatMul"), ("onnxnorm", "SkipLayerNorm")]
    assert list(fused.graph.node[1].input) == ["m", "r", "w", "b", "bm"]
    _check(original, fused)
    ort_model = fuse(original, "ort")[0]
    assert ("com.microsoft", "SkipLayerNormalization") in _ops(ort_model)
    _check(original, ort_model)


def test_decomposed_layer_norm_and_gemma_offset():
    """LayerNorm spelled out (opset < 17), then Gemma's x * (1 + w) RMSNorm on its output."""
    original = _model(
        [
            helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
            helper.make_node("Sub", ["x", "mu"], ["d"]),
            helper.make_node("Pow", ["d", "two"], ["d2"]),
            helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
            helper.make_node("Add", ["var", "eps"], ["ve"]),
            helper.make_node("Sqrt", ["ve"], ["std"]),
            helper.make_node("Div", ["d", "std"], ["n"]),
            helper.make_node("Mul", ["n", "w"], ["nw"]),
            helper.make_node("Add", ["nw", "b"], ["ln"]),
            helper.make_node("Mul", ["ln", "ln"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
            helper.make_node("Add", ["ms", "eps"], ["mse"]),
            helper.make_node("Sqrt", ["mse"], ["rms"]),
            helper.make_node("Reciprocal", ["rms"], ["inv"]),
            helper.make_node("Mul", ["ln", "inv"], ["rn"]),
            helper.make_node("Add", ["one", "g"], ["g1"]),
            helper.make_node("Mul", ["rn", "g1"], ["y"]),
        ],
        [("x", F, SHAPE)],
        [("y", F, SHAPE)],
        {
            "two": np.array(2, np.float32),
            "eps": np.array(1e-6, np.float32),
            "one": np.array(1, np.float32),
            "w": _w(),
            "b": _w(1, offset=-0.4),
            "g": _w(4, offset=-0.5),
        },
        opset=17,
    )
    fused, _ = fuse(original)
    assert _ops(fused) == [("onnxnorm", "LayerNorm"), ("onnxnorm", "RMSNorm")]
    rms = fused.graph.node[1]
    assert list(rms.input) == ["ln", "g"] and _attr(rms, "scale_offset") == 1.0
    _check(original, fused)


def test_layer_norm_times_weight_plus_constant_takes_the_sum_as_scale():
    """LayerNorm has no scale_offset: Mul(norm, w + c) gets the sum as its Scale."""
    original = _model(
        [
            helper.make_node("LayerNormalization", ["x", "ones"], ["n"], epsilon=1e-5),
            helper.make_node("Add", ["w", "c"], ["f"]),
            helper.make_node("Mul", ["n", "f"], ["y"]),
        ],
        [("x", F, SHAPE)],
        [("y", F, SHAPE)],
        {"ones": np.ones(H, np.float32), "w": _w(), "c": np.array(1.0, np.float32)},
    )
    fused, report = fuse(original)
    onnx.checker.check_model(fused, full_check=True)
    assert _ops(fused) == [("", "Add"), ("onnxnorm", "LayerNorm")]
    assert list(fused.graph.node[1].input) == ["x", "f"] and report.norms == 1
    _check(original, fused)


def test_sandwich_of_two_rms_norms():
    original = _model(
        [
            helper.make_node("RMSNormalization", ["x", "wa"], ["na"], epsilon=1e-6),
            helper.make_node("Add", ["r", "na"], ["s"]),
            helper.make_node("RMSNormalization", ["s", "wb"], ["y"], epsilon=1e-6),
            helper.make_node("Add", ["s", "y"], ["out"]),
        ],
        [("x", F, SHAPE), ("r", F, SHAPE)],
        [("out", F, SHAPE)],
        {"wa": _w(), "wb": _w(1)},
        opset=23,
    )
    fused, report = fuse(original)
    assert _ops(fused) == [("onnxnorm", "SandwichRMSNorm"), ("", "Add")]
    assert list(fused.graph.node[0].input) == ["x", "r", "wa", "", "wb"]
    assert report.norms == 2 and report.residual_adds == 1
    _check(original, fused)
    for target in LOWERED_TARGETS:
        _check(original, fuse(original, target)[0])


def test_ort_ops_become_catalogue_ops():
    original = _model(
        [
            helper.make_node(
                "SkipLayerNormalization",
                ["x", "r", "w", "b"],
                ["y", "", "", "s"],
                domain="com.microsoft",
                epsilon=1e-5,
            ),
            helper.make_node(
                "SkipSimplifiedLayerNormalization",
                ["y", "s", "w"],
                ["y2", "", "", "s2"],
                domain="com.microsoft",
                epsilon=1e-6,
            ),
            helper.make_node("SimplifiedLayerNormalization", ["s2", "w"], ["y3"], epsilon=1e-6),
            helper.make_node("Add", ["y2", "y3"], ["out"]),
        ],
        [("x", F, SHAPE), ("r", F, SHAPE)],
        [("out", F, SHAPE)],
        {"w": _w(), "b": _w(1, offset=-0.4)},
        ms=True,
    )
    fused, _ = fuse(original)
    assert [t for _, t in _ops(fused)] == ["SkipLayerNorm", "SkipRMSNorm", "RMSNorm", "Add"]
    _check(original, fused)


def test_norm_output_used_as_mean_is_left_alone():
    original = _model(
        [helper.make_node("LayerNormalization", ["x", "w"], ["y", "mean"], epsilon=1e-5)],
        [("x", F, SHAPE)],
        [("y", F, SHAPE), ("mean", F, [2, 5, 1])],
        {"w": _w()},
    )
    fused, report = fuse(original)
    assert _ops(fused) == [("", "LayerNormalization")]
    assert "is used" in str(report)


def test_batch_norm_folded_into_conv_and_matmul_and_reported_elsewhere():
    c = 3
    bn = {"s": _w(5, (c,)), "bb": _w(6, (c,), -0.5), "m": _w(7, (c,), -0.5), "v": _w(8, (c,))}
    original = _model(
        [
            helper.make_node("Conv", ["x", "k"], ["cv"]),
            helper.make_node("BatchNormalization", ["cv", "s", "bb", "m", "v"], ["y"]),
            helper.make_node("MatMul", ["x2", "wm"], ["mm"]),
            helper.make_node("BatchNormalization", ["mm", "s", "bb", "m", "v"], ["y2"]),
            helper.make_node("MatMul", ["x3", "wm3"], ["mm3"]),
            helper.make_node("BatchNormalization", ["mm3", "s", "bb", "m", "v"], ["y3"]),
        ],
        [("x", F, [1, 3, 8, 8]), ("x2", F, [5, 6]), ("x3", F, [2, c, 6])],
        [("y", F, [1, c, 6, 6]), ("y2", F, [5, c]), ("y3", F, [2, c, c])],
        {
            "k": _w(9, (c, 3, 3, 3), -0.5),
            "wm": _w(10, (6, c), -0.5),
            "wm3": _w(11, (6, c), -0.5),
            **bn,
        },
    )
    fused, report = fuse(original)
    assert [t for _, t in _ops(fused)] == ["Conv", "MatMul", "Add", "MatMul", "BatchNormalization"]
    row = report[
        "BatchNormalization folded into Conv/ConvTranspose/Gemm (onnxscript rule) or MatMul"
    ]
    assert (row.found, row.fused, row.skipped) == (3, 2, 1)
    assert "after MatMul" in row.skips[0].reason
    _check(original, fused)


def test_norms_inside_subgraphs_are_fused_and_lowered():
    """A norm inside an If branch is fused there too (the rule set visits subgraphs)."""
    branch = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "w"], ["yb"], epsilon=1e-5)],
        "then",
        [],
        [helper.make_tensor_value_info("yb", F, SHAPE)],
    )
    original = _model(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
        [("c", TensorProto.BOOL, []), ("x", F, SHAPE)],
        [("y", F, SHAPE)],
        {"w": _w()},
    )
    fused, report = fuse(original, "onnx")
    onnx.checker.check_model(fused)
    assert report.norms == 2


@pytest.mark.parametrize("final_read", [True, False], ids=["final_read", "final_unread"])
def test_skip_op_without_sum_output(final_read):
    """Model builders (onnxruntime-genai) write the final norm as a Skip op with no Sum output;
    in Phi-3-style models nothing reads it. It used to crash the pass (the 4-output rule took
    the 1-output node)."""
    nodes = [
        helper.make_node(
            "SkipSimplifiedLayerNormalization",
            ["x", "r", "w"],
            ["y", "", "", "s"],
            domain="com.microsoft",
            epsilon=1e-6,
        ),
        helper.make_node("MatMul", ["y", "m"], ["h"]),
        helper.make_node(
            "SkipSimplifiedLayerNormalization",
            ["s", "h", "w2"],
            ["final"],
            domain="com.microsoft",
            epsilon=1e-6,
        ),
    ]
    outputs = [("final", F, SHAPE)] if final_read else [("h", F, SHAPE)]
    original = _model(
        nodes,
        [("x", F, SHAPE), ("r", F, SHAPE)],
        outputs,
        {"w": _w(), "w2": _w(1), "m": _w(2, (H, H), -0.9)},
        ms=True,
    )
    fused, report = fuse(original)
    row = report["SkipRMSNorm (ORT SkipSimplifiedLayerNormalization)"]
    assert (row.found, row.fused, row.skipped) == (2, 2, 0)
    if final_read:
        assert [t for _, t in _ops(fused)] == ["SkipRMSNorm", "MatMul", "SkipRMSNorm"]
        assert len(fused.graph.node[2].output) == 2  # the function target keeps Sum
        lowered = fuse(original, "fused")[0]
        assert list(lowered.graph.node[2].output) == ["final"]
    else:  # the unread norm is dead code and goes
        assert [t for _, t in _ops(fused)] == ["SkipRMSNorm", "MatMul"]
        assert (report.norms, report.residual_adds) == (1, 1)
    _check(original, fused)


def test_qdq_inside_a_norm_is_reported_with_where():
    """Q/DQ pairs inside a norm (the statistics rounded to int8 steps; the Pow exponent a
    quantized constant) fuse in no tool; the report says why and where."""
    nodes = [
        helper.make_node("DequantizeLinear", ["two_q", "two_s"], ["two"]),
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["mean"], keepdims=1),
        helper.make_node("QuantizeLinear", ["mean", "s", "z"], ["mean_q"]),
        helper.make_node("DequantizeLinear", ["mean_q", "s", "z"], ["mean_dq"]),
        helper.make_node("Add", ["mean_dq", "eps"], ["var"]),
        helper.make_node("Sqrt", ["var"], ["rms"], name="sqrt"),
        helper.make_node("Div", ["x", "rms"], ["y0"]),
        helper.make_node("Mul", ["y0", "w"], ["y"]),
    ]
    original = _model(
        nodes,
        [("x", F, SHAPE)],
        [("y", F, SHAPE)],
        {
            "two_q": np.array(200, np.uint8),
            "two_s": np.array(0.01, np.float32),
            "axes": np.array([-1], np.int64),
            "s": np.array(0.02, np.float32),
            "z": np.array(0, np.uint8),
            "eps": np.array(1e-6, np.float32),
            "w": _w(),
        },
    )
    fused, report = fuse(original)
    row = report["RMSNorm (decomposed)"]
    assert (row.found, row.fused, row.skipped) == (1, 0, 1), str(report)
    assert row.skips[0].node == "sqrt"
    assert row.skips[0].reason.startswith(
        "QuantizeLinear/DequantizeLinear pairs inside the norm (after ReduceMean, on the Pow "
        "exponent): the original rounds its statistics to the quantizer's steps between "
        "ReduceMean, Add and Sqrt, which no fused norm computes"
    )
    assert _ops(fused) == _ops(original)
    _check(original, fused)


@pytest.mark.parametrize("inner_first", [False, True], ids=["inner_as_skip", "inner_as_input"])
def test_norm_into_skip_op_becomes_sandwich(inner_first):
    """Gemma 2 as onnxruntime-genai's builder writes it: the post-sublayer norm, then a
    SkipSimplifiedLayerNormalization adding it to the residual stream; one Sandwich op."""
    skip_inputs = ["inner", "r", "w2"] if inner_first else ["r", "inner", "w2"]
    original = _model(
        [
            helper.make_node("SimplifiedLayerNormalization", ["x", "w1"], ["inner"], epsilon=1e-6),
            helper.make_node(
                "SkipSimplifiedLayerNormalization",
                skip_inputs,
                ["y", "", "", "s"],
                domain="com.microsoft",
                epsilon=1e-6,
            ),
            helper.make_node("Add", ["y", "s"], ["out"]),
        ],
        [("x", F, SHAPE), ("r", F, SHAPE)],
        [("out", F, SHAPE)],
        {"w1": _w(), "w2": _w(1)},
        ms=True,
    )
    fused, report = fuse(original)
    assert _ops(fused) == [("onnxnorm", "SandwichRMSNorm"), ("", "Add")]
    assert list(fused.graph.node[0].input) == ["x", "r", "w1", "", "w2"]
    assert (report.norms, report.residual_adds) == (2, 1)
    _check(original, fused)
    _check(original, fuse(original, "ort")[0])


def test_norm_into_skip_op_with_epsilons_apart_stays_two_ops():
    original = _model(
        [
            helper.make_node("SimplifiedLayerNormalization", ["x", "w1"], ["inner"], epsilon=1e-6),
            helper.make_node(
                "SkipSimplifiedLayerNormalization",
                ["r", "inner", "w2"],
                ["y"],
                domain="com.microsoft",
                epsilon=1e-5,
            ),
        ],
        [("x", F, SHAPE), ("r", F, SHAPE)],
        [("y", F, SHAPE)],
        {"w1": _w(), "w2": _w(1)},
        ms=True,
    )
    fused, report = fuse(original)
    assert [t for _, t in _ops(fused)] == ["RMSNorm", "SkipRMSNorm"]
    assert "the two norms differ in epsilon" in str(report)
    _check(original, fused)

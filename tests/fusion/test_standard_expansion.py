"""ONNX's own function body of LayerNormalization (opsets 17 and 18), as onnx's inliner writes it
for the op (``onnx.inliner.inline_selected_functions(..., inline_schema_functions=True)``, what
tools that inline functions leave): Flatten, ReduceMean, Sub, Mul, Sqrt, Div and Reshape, with
the statistics' shape built from ``Shape(X)`` by Slice, ConstantOfShape and Concat.

- Its statistics unused: on every axis (0, positive, negative down to -rank) of 1-D, 2-D and
  4-D inputs, float32 and float16, static and dynamic dims, it becomes one onnxnorm LayerNorm.
- Its Mean and/or InvStdDev used (graph outputs, or read by other nodes): one standard
  ``LayerNormalization`` with those outputs wired to their readers, on every target, noted in
  the report; nothing of the body stays.
- Where that op cannot take its place (an opset below 17, statistics in float16, a statistic
  read in the body's [rows, 1] view), the body stays as it is, with the reason.

Parity: ``onnxnorm.fusion.verify.verify(original, fused)``; the standard op's numbers against
onnx's reference evaluator (the body's own rounding, order A) are measured below.
"""

from __future__ import annotations

import collections

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper, numpy_helper
from onnx.inliner import inline_selected_functions
from onnx.reference import ReferenceEvaluator

from onnxnorm.fusion import fuse
from onnxnorm.fusion.verify import TOLERANCE, verify
from onnxnorm.ops import catalogue
from tests.support.matrix import NODE_TARGETS, TARGETS

EXPANDED = "LayerNorm (ONNX LayerNormalization function body)"
STANDARD_NOTE = "became ONNX's LayerNormalization"
NP = {
    T.FLOAT: np.dtype(np.float32),
    T.FLOAT16: np.dtype(np.float16),
    T.BFLOAT16: ml_dtypes.bfloat16,
}
EPS = 2.0**-12  # exact in float32
H = 16
#: the nodes that read the statistics in the "read" graphs (no op of the body)
READERS = {"Mean": "Abs", "InvStdDev": "Log"}
BOTH = ("Mean", "InvStdDev")

#: (X's shape, axis): every axis of 1-D, 2-D and 4-D X, negative ones down to -rank
AXES = [
    ([H], 0),
    ([H], -1),
    ([4, H], 0),
    ([4, H], 1),
    ([4, H], -1),
    ([4, H], -2),
    ([2, 3, 4, 8], 0),
    ([2, 3, 4, 8], 1),
    ([2, 3, 4, 8], 2),
    ([2, 3, 4, 8], 3),
    ([2, 3, 4, 8], -1),
    ([2, 3, 4, 8], -3),
    ([2, 3, 4, 8], -4),
]


def _body(
    shape: list[int],
    axis: int,
    dtype: int = T.FLOAT,
    opset: int = 18,
    use: tuple[str, ...] = BOTH,
    read: bool = False,
    dims: list | None = None,
) -> onnx.ModelProto:
    """One LayerNormalization (with Scale and Bias) expanded by onnx's inliner into its function
    body; Y a graph output, the statistics in ``use`` graph outputs too, or (``read``) read by
    an Abs / Log node whose output is. ``dims``: X's dims as declared (names for dynamic ones)."""
    rank = len(shape)
    kept = axis % rank
    rng = np.random.default_rng(0)
    normalized = shape[kept:]
    weights = {
        "W": (rng.random(normalized) + 0.5).astype(np.float32).astype(NP[dtype]),
        "B": (rng.random(normalized) - 0.5).astype(np.float32).astype(NP[dtype]),
    }
    declared = dims or shape
    stat_dims = [d if i < kept else 1 for i, d in enumerate(declared)]
    nodes = [
        helper.make_node(
            "LayerNormalization", ["X", "W", "B"], ["Y", *BOTH], axis=axis, epsilon=EPS
        )
    ]
    outputs = [helper.make_tensor_value_info("Y", dtype, declared)]
    for stat in use:
        name = stat
        if read:
            name = f"{stat}_read"
            nodes.append(helper.make_node(READERS[stat], [stat], [name], name=f"read_{stat}"))
        outputs.append(helper.make_tensor_value_info(name, T.FLOAT, stat_dims))
    graph = helper.make_graph(
        nodes,
        "body",
        [helper.make_tensor_value_info("X", dtype, declared)],
        outputs,
        [numpy_helper.from_array(w, n) for n, w in weights.items()],
        # (the inliner wants the type of every input of the function it expands)
        value_info=[helper.make_tensor_value_info(n, dtype, normalized) for n in weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    model = inline_selected_functions(
        model, [("", "LayerNormalization")], inline_schema_functions=True
    )
    del model.graph.value_info[:]
    assert "LayerNormalization" not in _ops(model) and "Flatten" in _ops(model)
    return model


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _negative(axis: int, rank: int) -> int:
    return axis - rank if axis >= 0 else axis


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _parity(original: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    checks = verify(original, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


def _assert_standard_op(
    original, fused, report, axis: int, rank: int, use, read: bool, inputs=("X", "W", "B")
) -> None:
    """One LayerNormalization with the body's inputs and attributes, the statistics in ``use``
    wired to where the body's went; the readers; nothing else."""
    readers = collections.Counter(READERS[s] for s in use) if read else collections.Counter()
    assert collections.Counter(_ops(fused)) == {"LayerNormalization": 1, **readers}, str(report)
    node = next(n for n in fused.graph.node if n.op_type == "LayerNormalization")
    assert node.domain in ("", "ai.onnx") and tuple(node.input) == inputs
    attrs = _attrs(node)
    assert attrs["axis"] == _negative(axis, rank)
    assert attrs["epsilon"] == EPS and attrs.get("stash_type", 1) == 1
    assert [o.name for o in fused.graph.output] == [o.name for o in original.graph.output]
    for i, stat in enumerate(BOTH, start=1):
        wired = i < len(node.output) and node.output[i] != ""
        readers_of = [n for n in fused.graph.node if wired and node.output[i] in n.input]
        as_output = wired and node.output[i] in [o.name for o in fused.graph.output]
        if stat in use:
            assert (readers_of and not as_output) if read else (as_output and not readers_of)
        else:
            assert not readers_of and not as_output
    row = report[EXPANDED]
    assert (row.found, row.fused, row.skipped) == (1, 1, 0), str(report)
    assert row.notes[0].reason.startswith(STANDARD_NOTE)
    assert report.norms == 0  # no onnxnorm node: the standard op
    onnx.checker.check_model(fused, full_check=True)


# ---------------------------------------------------------------------------------------------
# statistics unused: one onnxnorm LayerNorm on every axis


@pytest.mark.parametrize("dtype", [T.FLOAT, T.FLOAT16], ids=["float32", "float16"])
@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("shape,axis", AXES, ids=str)
def test_unused_statistics_fuse_into_layer_norm_on_every_axis(shape, axis, opset, dtype):
    original = _body(shape, axis, dtype, opset, use=())
    for target in TARGETS:
        fused, report = fuse(original, target)
        if target in NODE_TARGETS:
            assert _ops(fused) == ["LayerNorm"], str(report)
            node = fused.graph.node[0]
            assert node.domain == catalogue.DOMAIN and list(node.input) == ["X", "W", "B"]
            attrs = _attrs(node)
            assert attrs["axis"] == _negative(axis, len(shape)) and attrs["epsilon"] == EPS
            assert attrs.get("cast_before_scale", 1) == int(dtype != T.FLOAT)
        assert report.norms == 1 and report[EXPANDED].fused == 1, str(report)
        assert not {"ReduceMean", "Flatten", "Sqrt"} & set(_ops(fused)), str(report)
        _parity(original, fused)


# ---------------------------------------------------------------------------------------------
# statistics used: one standard LayerNormalization


@pytest.mark.parametrize("read", [False, True], ids=["outputs", "read"])
@pytest.mark.parametrize("dtype", [T.FLOAT, T.FLOAT16], ids=["float32", "float16"])
@pytest.mark.parametrize("shape,axis", AXES, ids=str)
def test_used_statistics_make_one_standard_op_for_every_target(shape, axis, dtype, read):
    original = _body(shape, axis, dtype, use=BOTH, read=read)
    onnx.checker.check_model(original, full_check=True)
    for target in TARGETS:
        fused, report = fuse(original, target)
        _assert_standard_op(original, fused, report, axis, len(shape), BOTH, read)
        note = report[EXPANDED].notes[0].reason
        assert ("order B" in note) == (dtype != T.FLOAT), note
        _parity(original, fused)


@pytest.mark.parametrize("read", [False, True], ids=["outputs", "read"])
@pytest.mark.parametrize("use", [("Mean",), ("InvStdDev",)], ids=str)
@pytest.mark.parametrize(
    "shape,axis", [([2, 3, 4, 8], -1), ([4, H], 0), ([2, 3, 4, 8], 1)], ids=str
)
def test_one_statistic_used(shape, axis, use, read):
    original = _body(shape, axis, use=use, read=read)
    for target in TARGETS:
        fused, report = fuse(original, target)
        _assert_standard_op(original, fused, report, axis, len(shape), use, read)
        _parity(original, fused)


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize(
    "dims,axis",
    [
        (["batch", "sequence", H], -1),
        (["batch", 4, H], 1),
        (["batch", 4, H], -2),
        ([3, "sequence", H], 2),
    ],
    ids=str,
)
def test_dynamic_dims(dims, axis, opset):
    """The statistics' shape is ``Concat(Slice(Shape(X), 0, axis), ConstantOfShape(...))``,
    proved to be X's dims before ``axis`` then 1s without X's dims being static."""
    shape = [d if isinstance(d, int) else 2 for d in dims]
    for use in (BOTH, ()):
        original = _body(shape, axis, opset=opset, use=use, dims=dims)
        fused, report = fuse(original)
        if use:
            _assert_standard_op(original, fused, report, axis, len(dims), use, False)
        else:
            assert _ops(fused) == ["LayerNorm"], str(report)
        _parity(original, fused)


def test_after_constant_folding():
    """onnxscript's optimizer folds the body's shape arithmetic (X's 2-D view a Reshape to a
    constant shape, the Shape of X a constant)."""
    from onnxscript import optimizer

    original = optimizer.optimize(_body([2, 5, H], -1, use=BOTH, read=True))
    assert "Flatten" not in _ops(original) and "Shape" not in _ops(original)
    fused, report = fuse(original)
    # (the weights are the folded Flatten(W, 0), of shape [1, 16]: X's one normalized dim)
    inputs = ("X", "Scale2D__1", "B2D__1")
    assert {"Scale2D__1", "B2D__1"} <= {i.name for i in original.graph.initializer}
    _assert_standard_op(original, fused, report, -1, 3, BOTH, True, inputs)
    _parity(original, fused)


def test_readers_of_the_statistics_before_the_output_reshape():
    """The statistics' readers may come before Y's Reshape, where the standard op is written:
    the output is sorted again."""
    original = _body([2, 3, 4, 8], 2, use=BOTH, read=True)
    nodes = list(original.graph.node)
    reshape_y = next(n for n in nodes if n.op_type == "Reshape" and n.output[0] == "Y")
    nodes.remove(reshape_y)
    del original.graph.node[:]
    original.graph.node.extend([*nodes, reshape_y])
    onnx.checker.check_model(original, full_check=True)
    fused, report = fuse(original)
    _assert_standard_op(original, fused, report, 2, 4, BOTH, True)
    _parity(original, fused)


def test_bfloat16():
    """bfloat16: ONNX Runtime's CPU provider has no bfloat16 Mul for the body but a
    LayerNormalization kernel; the body in onnx's reference evaluator."""
    original = _body([4, 7, 64], -1, T.BFLOAT16, use=BOTH)
    original.graph.node.append(helper.make_node("Cast", ["Y"], ["Y32"], to=T.FLOAT))
    original.graph.output[0].CopyFrom(helper.make_tensor_value_info("Y32", T.FLOAT, [4, 7, 64]))
    fused, report = fuse(original)
    assert collections.Counter(_ops(fused)) == {"LayerNormalization": 1, "Cast": 1}, str(report)
    assert "in BFLOAT16" in report[EXPANDED].notes[0].reason
    x = np.random.default_rng(1).standard_normal([4, 7, 64]).astype(ml_dtypes.bfloat16)
    want, have = _reference(original, x), _ort(fused, x)
    rtol, atol = TOLERANCE["bfloat16"]
    for w, h in zip(want, have, strict=True):
        np.testing.assert_allclose(h, w, rtol, atol)


# ---------------------------------------------------------------------------------------------
# what the standard op computes, against the body's own arithmetic


def _reference(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(v, np.float64) for v in ReferenceEvaluator(model).run(None, {"X": x})]


def _ort(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    if x.dtype == ml_dtypes.bfloat16:
        value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x.view(np.uint16), T.BFLOAT16)
    else:
        value = ort.OrtValue.ortvalue_from_numpy(x)
    return [
        np.asarray(v.numpy(), np.float64) for v in session.run_with_ort_values(None, {"X": value})
    ]


@pytest.mark.parametrize("dtype", [T.FLOAT, T.FLOAT16], ids=["float32", "float16"])
@pytest.mark.parametrize(
    "shape,axis", [([4, 7, 64], -1), ([4, 7, 64], 1), ([64, 768], -1)], ids=str
)
def test_standard_op_against_the_body_measured(shape, axis, dtype):
    """ONNX Runtime's LayerNormalization against onnx's reference evaluator running the body,
    rows of mean 50 and spread 100. Y: within 4 units in the last place of max |Y| (float32:
    the statistics summed in another order) and within one (float16: the op rounds once at the
    end, order B; the body rounds the normalized value before Scale and Bias, order A); Mean and
    InvStdDev (float32) within 4e-6 relative."""
    original = _body(shape, axis, dtype, use=BOTH)
    fused, _ = fuse(original)
    x = (np.random.default_rng(1).standard_normal(shape) * 100 + 50).astype(NP[dtype])
    want, have = _reference(original, x), _ort(fused, x)
    ulp = float(np.spacing(np.abs(want[0]).max().astype(NP[dtype])))
    assert np.abs(have[0] - want[0]).max() <= (4 if dtype == T.FLOAT else 1) * ulp
    for w, h in zip(want[1:], have[1:], strict=True):
        np.testing.assert_allclose(h, w, rtol=4e-6, atol=0)


# ---------------------------------------------------------------------------------------------
# where the standard op cannot take its place: left as it is, with the reason


def _assert_left(original: onnx.ModelProto, reason: str) -> None:
    fused, report = fuse(original)
    assert "LayerNormalization" not in _ops(fused) and "LayerNorm" not in _ops(fused)
    assert "ReduceMean" in _ops(fused), str(report)
    row = report[EXPANDED]
    assert not row.fused and any(reason in s.reason for s in row.skips), str(report)


def _base(name: str) -> str:
    """A value's name in the function body (the inliner appends ``__<n>``)."""
    return name.split("__")[0]


def _named(model: onnx.ModelProto, base: str) -> str:
    return next(o for n in model.graph.node for o in n.output if _base(o) == base)


def test_opset_below_17_says_why():
    """A body converted down to opset 16 (its ops all exist there): LayerNormalization does
    not; without statistics the onnxnorm op takes it all the same."""
    for use in (BOTH, ()):
        original = _body([2, 5, H], -1, opset=17, use=use)
        original.opset_import[0].version = 16
        onnx.checker.check_model(original, full_check=True)
        if use:
            _assert_left(original, "only LayerNormalization gives them, which needs opset 17")
        else:
            fused, report = fuse(original)
            assert _ops(fused) == ["LayerNorm"], str(report)
            _parity(original, fused)


def test_statistics_in_float16_say_why():
    """A body whose statistics are float16 (its Casts to stash_type cast to float16):
    LayerNormalization's Mean and InvStdDev would be float32."""
    original = _body([2, 5, H], -1, T.FLOAT16, use=BOTH)
    for node in original.graph.node:
        if node.op_type == "Cast" and _base(node.output[0]) in ("XU", "Epsilon"):
            node.attribute[0].i = T.FLOAT16
    for output in original.graph.output[1:]:
        output.type.tensor_type.elem_type = T.FLOAT16
    _ort(original, np.ones([2, 5, H], np.float16))  # a sound model
    _assert_left(original, "computed in FLOAT16 (no Cast to stash_type FLOAT)")


def test_a_statistic_read_in_the_bodys_view_says_why():
    """The mean as a graph output in its [rows, 1] view; the standard deviation read itself."""
    original = _body([2, 5, H], -1, use=("Mean",))
    original.graph.output.append(
        helper.make_tensor_value_info(_named(original, "Mean2D"), T.FLOAT, None)
    )
    _assert_left(original, "is a graph output in the function body's [rows, 1] view")

    original = _body([2, 5, H], -1, use=())
    original.graph.node.append(helper.make_node("Identity", [_named(original, "StdDev")], ["sd"]))
    original.graph.output.append(helper.make_tensor_value_info("sd", T.FLOAT, None))
    _assert_left(original, "LayerNormalization gives only its reciprocal (InvStdDev)")


def test_a_statistic_reshaped_to_another_shape_says_why():
    original = _body([2, 5, H], -1, use=("Mean",))
    flat = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    original.graph.initializer.append(flat)
    for node in original.graph.node:
        if node.op_type == "Reshape" and node.output[0] == "Mean":
            node.input[1] = "flat"
    original.graph.output[1].CopyFrom(helper.make_tensor_value_info("Mean", T.FLOAT, [10]))
    onnx.checker.check_model(original, full_check=True)
    _assert_left(original, "the statistics are reshaped to [-1], not to X's dims before axis -1")

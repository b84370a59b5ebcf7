"""Norm spellings other tools write: ONNX's own function expansions of LayerNormalization-17 and
RMSNormalization-23 (onnx's backend test models, and the expansion of other types and axes),
tf2onnx's Keras LayerNorm, a residual add whose sum is cast before the norm, and norms computed
in double. Each fuses into the exact onnxnorm op, and the fused model, run with the onnxnorm
library, matches the original run without it; each near miss stays as it was, with the reason
in the report."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper, numpy_helper
from onnx.backend.test.case.node import function_testcase_helper
from onnx.reference import ReferenceEvaluator
from onnx_ir.passes.common import RemoveUnusedNodesPass, ShapeInferencePass

from onnxnorm import runtime
from onnxnorm.fusion import fuse
from onnxnorm.fusion.standard import FOLDED, ONE_PASS
from onnxnorm.ops import catalogue, functions, reference
from tests.support import helpers
from tests.support.matrix import BF16, NODE_TARGETS, TARGETS

EXPANDED = "LayerNorm (ONNX LayerNormalization function body)"
KERAS = "LayerNorm (TensorFlow/Keras: scale folded into the reciprocal)"
LAYER, RMS = "LayerNorm (decomposed)", "RMSNorm (decomposed)"
NP = {
    T.FLOAT: np.dtype(np.float32),
    T.FLOAT16: np.dtype(np.float16),
    T.BFLOAT16: BF16,
    T.DOUBLE: np.dtype(np.float64),
}
EPS = 2.0**-12  # exact in float32: the fused attribute holds it to the bit
H = 16


def backend_cases() -> dict:
    """onnx's backend test models of the two expansions."""
    return {
        name: case
        for name, case in helpers.backend_cases().items()
        if name.endswith(("_expanded", "_expanded_ver18"))
    }


def _ort_value(array: np.ndarray):
    if array.dtype == BF16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), T.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))


def _run(model: onnx.ModelProto, feeds: dict, with_library: bool) -> list[np.ndarray]:
    """The model in ONNX Runtime (CPU); the original without graph optimizations, so that it runs
    as written (ORT would fuse some spellings into its own LayerNormalization)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not with_library:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = runtime.session(model, options, with_library=with_library)
    return [
        v.numpy()
        for v in session.run_with_ort_values(None, {k: _ort_value(v) for k, v in feeds.items()})
    ]


def _original(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """The original without the library: bfloat16 models, whose ops ORT's CPU provider lacks,
    in onnx's reference evaluator."""
    if any(v.dtype == BF16 for v in feeds.values()):
        return [np.asarray(y) for y in ReferenceEvaluator(model).run(None, feeds)]
    return _run(model, feeds, with_library=False)


def _check_parity(original, fused, feeds, dtype) -> None:
    rtol, atol = reference.tolerance(dtype)
    want, have = _original(original, feeds), _run(fused, feeds, with_library=True)
    assert len(want) == len(have)
    for w, h in zip(want, have):
        assert w.dtype == h.dtype and w.shape == h.shape
        np.testing.assert_allclose(h.astype(np.float64), w.astype(np.float64), rtol, atol)


def _attrs(node: onnx.NodeProto) -> dict:
    return {
        **catalogue.get(node.op_type).defaults,
        **{a.name: helper.get_attribute_value(a) for a in node.attribute},
    }


def _fused(model, **options):
    fused, report = fuse(model, **options)
    onnxnorm_nodes = [n for n in fused.graph.node if n.domain == catalogue.DOMAIN]
    return fused, report, onnxnorm_nodes


def _pruned(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without the nodes nothing reads (the expansion writes the statistics of
    LayerNormalization's optional outputs either way; the pass drops them too)."""
    graph = ir.serde.deserialize_model(model)
    RemoveUnusedNodesPass()(graph)
    return ir.serde.serialize_model(graph)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _computation(model: onnx.ModelProto) -> collections.Counter:
    """The ops that compute, counted (the pass bypasses Casts to the type a value has and
    merges equal Constants)."""
    return collections.Counter(op for op in _ops(_pruned(model)) if op not in ("Cast", "Constant"))


def _assert_left_alone(original, fused, report, rule: str, reason: str) -> None:
    assert _computation(fused) == _computation(original), str(report)
    assert report.norms == 0
    row = report[rule]
    assert row.found and not row.fused and row.skips, str(report)
    assert any(reason in s.reason for s in row.skips), str(report)
    assert reason in str(report)


def _weights(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (
        (rng.random(shape) + 0.5).astype(np.float32).astype(NP[dtype]),
        (rng.random(shape) - 0.5).astype(np.float32).astype(NP[dtype]),
    )


def _x(shape, dtype, seed=1):
    return (np.random.default_rng(seed).standard_normal(shape) * 2 + 0.5).astype(NP[dtype])


# ---------------------------------------------------------------------------------------------
# 1, 2. ONNX's function expansions


def _expanded(
    op: str,
    shape: list[int],
    axis: int,
    dtype: int = T.FLOAT,
    bias: bool = True,
    body: int = -1,
    stash: int = T.FLOAT,
) -> onnx.ModelProto:
    """One LayerNormalization / RMSNormalization node (Y only) expanded into its function body by
    onnx's own expansion (the backend test generator's), constant weights; ``body``: which of
    the op's function bodies (LayerNormalization: 0 for opset 17, ReduceMean's axes as an
    attribute; 1 for opset 18). bfloat16's Y is also cast to float32, which ORT gives back."""
    inputs = ["X", "W"] + (["B"] if bias and op == "LayerNormalization" else [])
    node = helper.make_node(op, inputs, ["Y"], axis=axis, epsilon=EPS, stash_type=stash)
    types = [helper.make_tensor_type_proto(dtype, None)] * len(inputs)
    opset = 23 if op == "RMSNormalization" else 18
    bodies, _ = function_testcase_helper(node, types, "n", [helper.make_opsetid("", opset)])
    nodes, imports = bodies[body]
    weights = _weights(shape[axis:], dtype)
    inits = [numpy_helper.from_array(w, name) for w, name in zip(weights, inputs[1:])]
    output = helper.make_tensor_value_info("Y", dtype, shape)
    if dtype == T.BFLOAT16:
        nodes = [*nodes, helper.make_node("Cast", ["Y"], ["Yf"], to=T.FLOAT)]
        output = helper.make_tensor_value_info("Yf", T.FLOAT, shape)
    graph = helper.make_graph(
        nodes, "expanded", [helper.make_tensor_value_info("X", dtype, shape)], [output], inits
    )
    version = max([i.version for i in imports if i.domain in ("", "ai.onnx")] + [17])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=10)


def _negative(axis: int, rank: int) -> int:
    return axis - rank if axis >= 0 else axis


def _statistics_dropped(model: onnx.ModelProto) -> onnx.ModelProto:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    del model.graph.output[1:]
    return model


def test_backend_layer_norm_expansions():
    """Every expanded LayerNormalization backend test: as given, its Mean and InvStdDev are
    graph outputs, which onnxnorm's LayerNorm does not give: it becomes the standard
    LayerNormalization again, with the reason (tests/fusion/test_standard_expansion.py has the
    rest). Without them each fuses into one LayerNorm with the expansion's axis, epsilon and
    inputs."""
    cases = {k: v for k, v in backend_cases().items() if "layer_normalization" in k}
    assert len(cases) == 38
    for name, case in sorted(cases.items()):
        fused, report, nodes = _fused(case.model)
        assert not nodes and _ops(fused) == ["LayerNormalization"], (name, str(report))
        assert report[EXPANDED].notes[0].reason.startswith("became ONNX's LayerNormalization")
        inputs, outputs = case.data_sets[0]
        feeds = dict(zip((i.name for i in case.model.graph.input), inputs))
        rtol, atol = reference.tolerance(np.float32)
        for have, want in zip(_run(fused, feeds, False), outputs, strict=True):
            np.testing.assert_allclose(have, want, rtol, atol)

        model = _statistics_dropped(case.model)
        fused, report, nodes = _fused(model)
        assert _ops(fused) == ["LayerNorm"], (name, str(report))
        flatten = next(n for n in model.graph.node if n.op_type == "Flatten")
        rank = len(model.graph.input[0].type.tensor_type.shape.dim)
        eps = next(
            n
            for n in model.graph.node
            if n.op_type == "Constant" and n.output[0].endswith("FloatEpsilon")
        )
        attrs = _attrs(nodes[0])
        assert attrs["axis"] == _negative(flatten.attribute[0].i, rank), name
        assert attrs["epsilon"] == pytest.approx(
            float(numpy_helper.to_array(eps.attribute[0].t)), rel=1e-7
        )
        assert attrs["cast_before_scale"] == 0 and list(nodes[0].input) == ["X", "W", "B"]
        row = report[EXPANDED]
        assert (row.found, row.fused, row.skipped) == (1, 1, 0)
        assert row.notes[0].reason == ONE_PASS
        inputs, outputs = case.data_sets[0]
        feeds = dict(zip((i.name for i in model.graph.input), inputs))
        _check_parity(model, fused, feeds, np.float32)
        rtol, atol = reference.tolerance(np.float32)
        np.testing.assert_allclose(_run(fused, feeds, True)[0], outputs[0], rtol, atol)


def test_backend_rms_norm_expansions():
    """Every expanded RMSNormalization backend test fuses into one RMSNorm: the axes the body
    computes from X's rank (``Range(axis, Size(Shape(X)), 1)``) give the axis. (With axis 0 the
    scale, a graph input there, has X's full static shape: a norm over all of X takes it as its
    Scale, which there spans every element.)"""
    cases = {k: v for k, v in backend_cases().items() if "rms_normalization" in k}
    assert len(cases) == 19
    for name, case in sorted(cases.items()):
        fused, report, nodes = _fused(case.model)
        axis = next(
            int(numpy_helper.to_array(n.attribute[0].t))
            for n in case.model.graph.node
            if n.op_type == "Constant" and n.output[0].endswith("_function_Axis")
        )
        rank = len(case.model.graph.input[0].type.tensor_type.shape.dim)
        assert _ops(fused) == ["RMSNorm"], (name, str(report))
        assert _attrs(nodes[0])["axis"] == _negative(axis, rank), name
        assert _attrs(nodes[0])["cast_before_scale"] == 0
        assert list(nodes[0].input) == ["X", "W"]
        assert not any(r.skips for r in report.rules), str(report)
        inputs, outputs = case.data_sets[0]
        feeds = dict(zip((i.name for i in case.model.graph.input), inputs))
        _check_parity(case.model, fused, feeds, np.float32)
        rtol, atol = reference.tolerance(np.float32)
        np.testing.assert_allclose(_run(fused, feeds, True)[0], outputs[0], rtol, atol)


EXPANSIONS = [
    # (op, X's type, shape, axis, bias, body)
    ("LayerNormalization", T.FLOAT16, [2, 5, H], -1, True, 1),
    ("LayerNormalization", T.FLOAT16, [3, 4, H], -2, False, 0),
    ("LayerNormalization", T.BFLOAT16, [2, 3, 4, 8], 2, True, 1),
    ("LayerNormalization", T.BFLOAT16, [4, H], 0, False, 1),
    ("LayerNormalization", T.FLOAT, [2, 5, H], 1, False, 0),
    ("RMSNormalization", T.FLOAT16, [2, 5, H], -1, False, -1),
    ("RMSNormalization", T.FLOAT16, [2, 3, 4, 8], 1, False, -1),
    ("RMSNormalization", T.BFLOAT16, [2, 3, 8], -2, False, -1),
]


@pytest.mark.parametrize(
    "op,dtype,shape,axis,bias,body",
    EXPANSIONS,
    ids=lambda v: T.DataType.Name(v) if isinstance(v, int) and v in NP else str(v),
)
def test_expansion_fuses_in_every_type(op, dtype, shape, axis, bias, body):
    """float16 and bfloat16 X: the body casts X to float32 (stash_type 1), rounds the
    normalized value back to X's type, then scales (and shifts) in X's type: order A."""
    original = _expanded(op, shape, axis, dtype, bias, body)
    onnx.checker.check_model(original, full_check=True)
    fused, report, nodes = _fused(original)
    name = "LayerNorm" if op == "LayerNormalization" else "RMSNorm"
    assert [n.op_type for n in nodes] == [name] and report.norms == 1, str(report)
    assert _ops(fused) == [name] + (["Cast"] if dtype == T.BFLOAT16 else [])
    attrs = _attrs(nodes[0])
    assert attrs["axis"] == _negative(axis, len(shape))
    assert attrs["epsilon"] == EPS
    assert attrs["cast_before_scale"] == int(dtype != T.FLOAT)
    assert list(nodes[0].input) == ["X", "W"] + (["B"] if bias and name == "LayerNorm" else [])
    if name == "LayerNorm":
        assert report[EXPANDED].notes[0].reason == ONE_PASS
    assert not any(r.skips for r in report.rules), str(report)
    onnx.checker.check_model(fused, full_check=True)
    _check_parity(original, fused, {"X": _x(shape, dtype)}, NP[dtype])


@pytest.mark.parametrize(
    "op,dtype,shape,axis",
    [
        ("LayerNormalization", T.FLOAT, [2, 5, H], -1),
        ("LayerNormalization", T.FLOAT16, [2, 5, H], 2),
        ("RMSNormalization", T.FLOAT16, [2, 3, 8], 1),
    ],
    ids=str,
)
def test_expansion_after_constant_folding_fuses(op, dtype, shape, axis):
    """onnxscript's optimizer folds the expansion's shape arithmetic: the Flatten of X becomes a
    Reshape to [rows, cols], Flatten(W) and Shape(X) constants; it fuses all the same."""
    from onnxscript import optimizer

    original = optimizer.optimize(_expanded(op, shape, axis, dtype))
    assert "Flatten" not in _ops(original) and "Range" not in _ops(original)
    fused, report, nodes = _fused(original)
    name = "LayerNorm" if op == "LayerNormalization" else "RMSNorm"
    assert _ops(fused) == [name], str(report)
    attrs = _attrs(nodes[0])
    assert attrs["axis"] == _negative(axis, len(shape))
    assert attrs["cast_before_scale"] == int(dtype != T.FLOAT)
    assert len(nodes[0].input) == (3 if name == "LayerNorm" else 2)
    _check_parity(original, fused, {"X": _x(shape, dtype)}, NP[dtype])


def test_expansion_with_folded_weights_over_several_dims_says_why():
    """Folded, Flatten(W) of a LayerNorm over two dims is a [1, rows * cols] constant, which the
    fused op cannot take for a Scale of X's normalized dims."""
    from onnxscript import optimizer

    original = optimizer.optimize(_expanded("LayerNormalization", [2, 3, 4, 8], 2))
    fused, report, nodes = _fused(original)
    assert not nodes
    _assert_left_alone(
        original,
        fused,
        report,
        EXPANDED,
        "is already flattened (a constant folding ran) and X is normalized over 2 dims",
    )


def _edit(model: onnx.ModelProto, edit) -> onnx.ModelProto:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for node in model.graph.node:
        edit(node)
    return model


def _stash_double(x_type: int):
    """The body written for stash_type = DOUBLE (onnx's expansion writes none: its builder
    refuses it): X and epsilon cast to double, the normalized value back to X's type."""

    def edit(node):
        if node.op_type == "Cast":
            out = node.output[0]
            node.attribute[0].i = T.DOUBLE if out.endswith(("XU", "Epsilon")) else x_type

    return edit


def _eps_vector(node):
    if node.op_type == "Constant" and node.output[0].endswith("FloatEpsilon"):
        node.attribute[0].t.CopyFrom(numpy_helper.from_array(np.full(H, EPS, np.float32)))


def _reduce_axis_0(node):
    if node.op_type == "Constant" and node.output[0].endswith(("Axes_1", "Axis1D")):
        node.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array([0], np.int64)))
    if node.op_type == "ReduceMean":
        for a in node.attribute:
            if a.name == "axes":
                a.ints[:] = [0]


EXPANSION_NEAR_MISSES = {
    # case: (op, edit, rule, reason)
    "layer_stash_double": (
        "LayerNormalization",
        _stash_double(T.FLOAT),
        EXPANDED,
        "stash_type is DOUBLE",
    ),
    "layer_eps_not_scalar": ("LayerNormalization", _eps_vector, EXPANDED, "is not a scalar"),
    "layer_wrong_axis": ("LayerNormalization", _reduce_axis_0, EXPANDED, "reduces over axes [0]"),
    "rms_stash_double": (
        "RMSNormalization",
        _stash_double(T.FLOAT),
        RMS,
        "computed in DOUBLE; onnxnorm computes them in FLOAT and has no DOUBLE kernels",
    ),
    "rms_eps_not_scalar": ("RMSNormalization", _eps_vector, RMS, "is not a scalar"),
}


@pytest.mark.parametrize("case", EXPANSION_NEAR_MISSES)
def test_expansion_near_miss_is_left_alone(case):
    op, edit, rule, reason = EXPANSION_NEAR_MISSES[case]
    original = _edit(_expanded(op, [2, 5, H], -1, T.FLOAT, body=0 if "axis" in case else -1), edit)
    onnx.checker.check_model(original, full_check=True)
    _run(original, {"X": _x([2, 5, H], T.FLOAT)}, with_library=False)  # a sound model
    fused, report, nodes = _fused(original)
    assert not nodes
    _assert_left_alone(original, fused, report, rule, reason)


# ---------------------------------------------------------------------------------------------
# 4. tf2onnx's Keras LayerNorm


def _keras(
    opset: int = 13,
    square: str = "Mul",
    inverse: str = "Reciprocal",
    dtype: int = T.FLOAT,
    axes=(-1,),
    eps=EPS,
    gamma_shape=(H,),
    shape=(2, 5, H),
):
    """Keras' LayerNormalization as tf2onnx writes it: ``tf.nn.moments`` (the squared
    difference as Sub and Mul, or Pow 2) and ``tf.nn.batch_normalization`` (Rsqrt as Reciprocal
    of Sqrt, or Pow -0.5, or Div(1, Sqrt); the scale folded into it)."""
    kw = {"axes": list(axes)} if opset < 18 else {}
    extra = [] if opset < 18 else ["axes"]
    nodes = [
        helper.make_node("ReduceMean", ["x", *extra], ["mean"], name="mean", **kw),
        helper.make_node("Sub", ["x", "mean"], ["d"], name="sub"),
        helper.make_node(square, ["d", "d" if square == "Mul" else "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", *extra], ["var"], name="var", **kw),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
    ]
    if inverse == "Pow":
        nodes.append(helper.make_node("Pow", ["ve", "minus_half"], ["inv"]))
    else:
        nodes.append(helper.make_node("Sqrt", ["ve"], ["sd"]))
        nodes.append(
            helper.make_node("Reciprocal", ["sd"], ["inv"])
            if inverse == "Reciprocal"
            else helper.make_node("Div", ["one", "sd"], ["inv"])
        )
    nodes += [
        helper.make_node("Mul", ["inv", "gamma"], ["s"], name="scale"),
        helper.make_node("Mul", ["x", "s"], ["xs"]),
        helper.make_node("Mul", ["mean", "s"], ["ms"]),
        helper.make_node("Sub", ["beta", "ms"], ["shift"]),
        helper.make_node("Add", ["xs", "shift"], ["y"], name="batchnorm_add"),
    ]
    t = NP[dtype]
    gamma, beta = _weights(gamma_shape, dtype)
    inits = {
        "two": np.array(2, t),
        "minus_half": np.array(-0.5, t),
        "one": np.array(1, t),
        "eps": np.asarray(eps, t),
        "gamma": gamma,
        "beta": beta,
    }
    if opset >= 18:
        inits["axes"] = np.array(axes, np.int64)
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(
        nodes,
        "keras",
        [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items() if k in used],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize(
    "variant",
    [
        {"opset": 11},
        {"opset": 13, "square": "Pow", "inverse": "Pow"},
        {"opset": 13, "inverse": "Div"},
        {"opset": 18, "axes": (-2, -1), "gamma_shape": (5, H)},
    ],
    ids=str,
)
def test_keras_layer_norm_fuses_with_a_note(variant):
    original = _keras(**variant)
    onnx.checker.check_model(original, full_check=True)
    fused, report, nodes = _fused(original)
    assert _ops(fused) == ["LayerNorm"], str(report)
    attrs = _attrs(nodes[0])
    assert attrs["axis"] == -len(variant.get("axes", (-1,)))
    assert attrs["epsilon"] == EPS and attrs["cast_before_scale"] == 0
    assert list(nodes[0].input) == ["x", "gamma", "beta"]
    row = report[KERAS]
    assert (row.found, row.fused, row.skipped) == (1, 1, 0) and row.notes[0].reason == FOLDED
    onnx.checker.check_model(fused, full_check=True)
    _check_parity(original, fused, {"x": _x([2, 5, H], T.FLOAT)}, np.float32)


def test_keras_layer_norm_in_float32_inside_a_float16_model():
    """Keras' mixed precision computes LayerNormalization in float32 between casts: the casts
    join the norm, which rounds once at the end (order B)."""
    inner = _keras()
    graph = inner.graph
    graph.node.insert(0, helper.make_node("Cast", ["x16"], ["x"], to=T.FLOAT))
    graph.node.append(helper.make_node("Cast", ["y"], ["y16"], to=T.FLOAT16))
    del graph.input[:], graph.output[:]
    graph.input.append(helper.make_tensor_value_info("x16", T.FLOAT16, [2, 5, H]))
    graph.output.append(helper.make_tensor_value_info("y16", T.FLOAT16, [2, 5, H]))
    fused, report, nodes = _fused(inner)
    assert _ops(fused) == ["LayerNorm"], str(report)
    assert list(nodes[0].input) == ["x16", "gamma", "beta"]
    assert _attrs(nodes[0])["cast_before_scale"] == 0
    _check_parity(inner, fused, {"x16": _x([2, 5, H], T.FLOAT16)}, np.float16)


KERAS_NEAR_MISSES = {
    "axis_minus_2": ({"axes": (-2,), "gamma_shape": (5, 1)}, "reduces over axes [-2]"),
    "eps_not_scalar": ({"eps": np.full(H, EPS)}, "is not a scalar"),
    "double": ({"dtype": T.DOUBLE}, "computed in DOUBLE"),
    "gamma_broadcasts": ({"gamma_shape": (1,)}, "not a suffix"),
}


@pytest.mark.parametrize("case", KERAS_NEAR_MISSES)
def test_keras_near_miss_is_left_alone(case):
    variant, reason = KERAS_NEAR_MISSES[case]
    original = _keras(**variant)
    onnx.checker.check_model(original, full_check=True)
    fused, report, nodes = _fused(original)
    assert not nodes
    _assert_left_alone(original, fused, report, KERAS, reason)
    assert report[KERAS].skips[0].node == "batchnorm_add"


# ---------------------------------------------------------------------------------------------
# 3, 5. a residual add cast before the norm; statistics in double


def _norm_nodes(kind: str, x: str, y: str, p: str = "") -> list[onnx.NodeProto]:
    """A decomposed LayerNorm ("layer") or RMSNorm ("rms") of ``x`` over the last axis, with
    Scale ``w`` (and Bias ``b`` for LayerNorm), as PyTorch's exporters write it."""
    nodes = []
    if kind == "layer":
        nodes += [
            helper.make_node("ReduceMean", [x, "axes"], [p + "mu"]),
            helper.make_node("Sub", [x, p + "mu"], [p + "c"]),
        ]
        x = p + "c"
    nodes += [
        helper.make_node("Pow", [x, "two"], [p + "sq"]),
        helper.make_node("ReduceMean", [p + "sq", "axes"], [p + "var"]),
        helper.make_node("Add", [p + "var", "eps"], [p + "ve"]),
        helper.make_node("Sqrt", [p + "ve"], [p + "sd"]),
        helper.make_node("Div", [x, p + "sd"], [p + "n"], name=p + "normalize"),
        helper.make_node("Mul", [p + "n", "w"], [p + "nw" if kind == "layer" else y]),
    ]
    if kind == "layer":
        nodes.append(helper.make_node("Add", [p + "nw", "b"], [y]))
    return nodes


def _model(nodes, inputs, outputs, stats_type=T.FLOAT, opset=18):
    t = NP[stats_type]
    w, b = _weights((H,), stats_type)
    inits = [
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(2, t), "two"),
        numpy_helper.from_array(np.array(EPS, t), "eps"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(b, "b"),
    ]
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, d, [2, 5, H]) for n, d in inputs],
        [helper.make_tensor_value_info(n, d, [2, 5, H]) for n, d in outputs],
        [i for i in inits if i.name in used],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_half_residual_add_cast_to_a_float32_norm_and_back(kind):
    """float16 BERT/Llama blocks converted with their norms kept in float32: the float16 sum is
    cast to float32, normalized and cast back. The casts join the norm (X is the float16 sum,
    order B), so the Skip op's Sum (the add rounded to float16) is the original's sum."""
    nodes = [
        helper.make_node("Add", ["a", "r"], ["s"], name="residual_add"),
        helper.make_node("Cast", ["s"], ["sf"], to=T.FLOAT),
        *_norm_nodes(kind, "sf", "yf"),
        helper.make_node("Cast", ["yf"], ["y"], to=T.FLOAT16),
        helper.make_node("Add", ["s", "y"], ["out"]),
    ]
    original = _model(nodes, [("a", T.FLOAT16), ("r", T.FLOAT16)], [("out", T.FLOAT16)])
    fused, report, nodes = _fused(original)
    op = "SkipLayerNorm" if kind == "layer" else "SkipRMSNorm"
    assert _ops(fused) == [op, "Add"], str(report)
    node = nodes[0]
    assert list(node.input) == ["a", "r", "w"] + (["b"] if kind == "layer" else [])
    assert len(node.output) == 2 and list(fused.graph.node[1].input) == list(node.output)[::-1]
    assert _attrs(node)["cast_before_scale"] == 0 and _attrs(node)["epsilon"] == EPS
    assert report.norms == 1 and report.residual_adds == 1
    feeds = {"a": _x([2, 5, H], T.FLOAT16), "r": _x([2, 5, H], T.FLOAT16, seed=2)}
    _check_parity(original, fused, feeds, np.float16)


@pytest.mark.parametrize(
    "sum_type,norm_type,reason",
    [
        (
            T.FLOAT16,
            T.FLOAT,
            "the residual add runs in FLOAT16 and its sum is cast to FLOAT for the "
            "norm: the Skip op would give Y in FLOAT16",
        ),
        (
            T.FLOAT,
            T.FLOAT16,
            "the residual add runs in FLOAT and its sum is cast to FLOAT16 for the "
            "norm: a Skip op in FLOAT16 would round the operands",
        ),
    ],
    ids=["half_sum_float_norm", "float_sum_half_norm"],
)
def test_residual_add_cast_to_the_norm_says_why_not(sum_type, norm_type, reason):
    """A sum cast to another type for a norm that stays in that type: no Skip op computes it
    (it has one type for X, Sum and Y); the norm fuses, the add and the Cast stay."""
    nodes = [
        helper.make_node("Add", ["a", "r"], ["s"], name="residual_add"),
        helper.make_node("Cast", ["s"], ["sc"], to=norm_type),
        *_norm_nodes("layer", "sc", "y"),
        helper.make_node("Add", ["s", "s"], ["twice"]),
    ]
    original = _model(
        nodes,
        [("a", sum_type), ("r", sum_type)],
        [("y", norm_type), ("twice", sum_type)],
        stats_type=norm_type,
    )
    fused, report, nodes = _fused(original)
    assert _ops(fused) == ["Add", "Cast", "LayerNorm", "Add"], str(report)
    assert list(nodes[0].input) == ["sc", "w", "b"]
    assert report.residual_adds == 0
    row = report["SkipLayerNorm (residual add cast before the norm)"]
    assert (row.found, row.fused, row.skipped) == (1, 0, 1)
    assert row.skips[0].reason.startswith(reason), str(report)
    feeds = {"a": _x([2, 5, H], sum_type), "r": _x([2, 5, H], sum_type, seed=2)}
    _check_parity(original, fused, feeds, NP[T.FLOAT16])


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("spelling", ["float_cast_to_double", "double_x"])
def test_double_statistics_are_left_alone(kind, spelling):
    """onnxnorm has no double kernels: a decomposed norm computed in double, on a float32 X cast
    to double and back or on a double X, stays, and the report names DOUBLE."""
    if spelling == "double_x":
        nodes, x_type = _norm_nodes(kind, "x", "y"), T.DOUBLE
    else:
        nodes = [
            helper.make_node("Cast", ["x"], ["xd"], to=T.DOUBLE),
            *_norm_nodes(kind, "xd", "yd"),
            helper.make_node("Cast", ["yd"], ["y"], to=T.FLOAT),
        ]
        x_type = T.FLOAT
    original = _model(nodes, [("x", x_type)], [("y", x_type)], stats_type=T.DOUBLE)
    fused, report, nodes = _fused(original)
    assert not nodes
    rule = LAYER if kind == "layer" else RMS
    _assert_left_alone(
        original,
        fused,
        report,
        rule,
        "the statistics are computed in DOUBLE; onnxnorm computes them in FLOAT "
        "and has no DOUBLE kernels",
    )
    assert report[rule].skips[0].node == "normalize"


def test_layer_normalization_with_double_stash_type_says_double():
    original = _model(
        [
            helper.make_node(
                "LayerNormalization",
                ["x", "w", "b"],
                ["y"],
                name="ln",
                epsilon=EPS,
                stash_type=T.DOUBLE,
            )
        ],
        [("x", T.FLOAT)],
        [("y", T.FLOAT)],
        opset=17,
    )
    fused, report, nodes = _fused(original)
    assert not nodes
    _assert_left_alone(
        original,
        fused,
        report,
        "LayerNorm (ONNX LayerNormalization)",
        "stash_type is DOUBLE; onnxnorm computes the statistics in FLOAT and has no DOUBLE kernels",
    )


def test_cast_to_the_same_type_between_add_and_norm_fuses_through_the_rule_set():
    """Applied as ``rules()`` (without the pipeline, which bypasses such casts first), a Cast to
    the type the sum already has is no obstacle to the Skip op."""
    from onnxnorm.fusion import rules

    original = _model(
        [
            helper.make_node("Add", ["a", "r"], ["s"]),
            helper.make_node("Cast", ["s"], ["sc"], to=T.FLOAT),
            *_norm_nodes("rms", "sc", "y"),
        ],
        [("a", T.FLOAT), ("r", T.FLOAT)],
        [("y", T.FLOAT)],
    )
    model = ir.serde.deserialize_model(original)
    ShapeInferencePass()(model)  # the rules read the sum's type
    rule_set = rules()
    while rule_set.apply_to_model(model):
        RemoveUnusedNodesPass()(model)
    assert [(n.domain, n.op_type) for n in model.graph] == [(catalogue.DOMAIN, "SkipRMSNorm")]


def test_expansion_with_castlike_fuses():
    """Expansions that round the normalized value with CastLike(normalized, X) (older onnx
    function bodies, hand-inlined graphs) are the same computation."""

    def castlike(node):
        if node.op_type == "Cast" and node.output[0].endswith("NormalizedT"):
            node.op_type = "CastLike"
            node.input.append("X")
            del node.attribute[:]

    original = _edit(_expanded("LayerNormalization", [2, 5, H], -1, T.FLOAT16), castlike)
    assert "CastLike" in _ops(original)
    fused, report, nodes = _fused(original)
    assert _ops(fused) == ["LayerNorm"], str(report)
    assert _attrs(nodes[0])["cast_before_scale"] == 1
    _check_parity(original, fused, {"X": _x([2, 5, H], T.FLOAT16)}, np.float16)


def _mixed_model(op: str, x_type: int, bias: bool = True, opset: int = 16) -> onnx.ModelProto:
    """One ONNX Runtime LayerNormalization / SimplifiedLayerNormalization (ONNX domain, below
    opset 17) of a 16-bit X with float32 weights and a float32 Y: its mixed-precision form."""
    w, b = _weights((H,), T.FLOAT)
    inputs = ["x", "w"] + (["b"] if bias and op == "LayerNormalization" else [])
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], name="norm", epsilon=EPS)],
        "mixed",
        [helper.make_tensor_value_info("x", x_type, [2, 5, H])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2, 5, H])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")][: len(inputs) - 1],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


@pytest.mark.parametrize("op", ["LayerNormalization", "SimplifiedLayerNormalization"])
@pytest.mark.parametrize("target", TARGETS)
def test_ort_norm_with_float32_output_for_half_x_is_one_op_of_those_types(op, target):
    """ONNX Runtime's LayerNormalization / SimplifiedLayerNormalization of a float16 X with
    float32 Scale (and Bias) give a float32 Y, computed in float32 and not rounded to float16:
    one onnxnorm LayerNorm / RMSNorm taking and returning exactly those types, equal to ORT's
    own op within float32's tolerance, on every target (the function body and the lowerings
    write the float32 Y without the rounding to X's type)."""
    original = _mixed_model(op, T.FLOAT16)
    feeds = {"x": _x([2, 5, H], T.FLOAT16)}
    want = _run(original, feeds, with_library=False)[0]  # ORT runs it
    assert want.dtype == np.float32
    fused, report, nodes = _fused(original, target=target)
    name = "LayerNorm" if op == "LayerNormalization" else "RMSNorm"
    if target in NODE_TARGETS:
        assert _ops(fused) == [name], str(report)
        assert (_attrs(nodes[0])["cast_before_scale"], _attrs(nodes[0])["y_float32"]) == (0, 1)
        assert [f.overload for f in fused.functions] == (
            ["scale_bias_yfloat32" if name == "LayerNorm" else "scale_yfloat32"]
            if target == "function"
            else []
        )
    declared = {v.name: v.type.tensor_type.elem_type for v in fused.graph.output}
    assert declared["y"] == T.FLOAT
    rtol, atol = reference.tolerance(np.float32)
    for with_library in (True, False):
        if target == "fused" and not with_library:
            continue
        got = _run(fused, feeds, with_library=with_library)[0]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol, atol)
    # the reference of the op gives the same values, which a float16 Y could not hold
    w, b = _weights((H,), T.FLOAT)
    ref = reference.run(
        name, feeds["x"], w, b if name == "LayerNorm" else None, y_float32=1, epsilon=EPS
    )[0]
    np.testing.assert_allclose(want, ref, rtol, atol)
    assert np.abs(ref - ref.astype(np.float16).astype(np.float32)).max() > 0


@pytest.mark.parametrize("order_a", [0, 1])
@pytest.mark.parametrize("x_type", [T.FLOAT16, T.BFLOAT16])
def test_mixed_form_kernel_and_body_agree_with_the_reference(x_type, order_a):
    """The onnxnorm LayerNorm of a 16-bit X with a float32 Y, both rounding orders: the kernel
    (library registered) and the function body (not registered) give the reference's values."""
    w, b = _weights((H,), T.FLOAT)
    node = helper.make_node(
        "LayerNorm",
        ["x", "w", "b"],
        ["y"],
        domain=catalogue.DOMAIN,
        epsilon=EPS,
        cast_before_scale=order_a,
        y_float32=1,
    )
    graph = helper.make_graph(
        [node],
        "mixed",
        [helper.make_tensor_value_info("x", x_type, [2, 5, H])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2, 5, H])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(catalogue.DOMAIN, 1)]
    )
    functions.attach_functions(model)
    assert model.graph.node[0].overload == "scale_bias_" + ("a_" if order_a else "") + "yfloat32"
    x = _x([2, 5, H], x_type)
    want = reference.run("LayerNorm", x, w, b, y_float32=1, epsilon=EPS, cast_before_scale=order_a)[
        0
    ]
    assert want.dtype == np.float32
    rtol, atol = reference.tolerance(NP[x_type] if order_a else np.float32)
    for with_library in (True, False):
        got = _run(model, {"x": x}, with_library=with_library)[0]
        np.testing.assert_allclose(got, want, rtol, atol)


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("target", TARGETS)
def test_a_norm_without_its_epsilon_add_is_a_norm_of_epsilon_0(kind, target):
    """torch.onnx's dynamo exporter drops the Add of a tiny epsilon (1e-12 in some configs):
    ``x * rsqrt(mean(x^2))`` with its weight (and the centred LayerNorm likewise) is exactly a
    norm with epsilon 0, fused as one; an all-zero row gives NaN in both (0 * inf)."""
    stat = ["Mul", "x", "x"] if kind == "rms" else ["Mul", "c", "c"]
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["mu"], keepdims=1)] * (kind != "rms")
    nodes += [helper.make_node("Sub", ["x", "mu"], ["c"])] * (kind != "rms")
    nodes += [
        helper.make_node(stat[0], stat[1:], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Sqrt", ["ms"], ["root"]),
        helper.make_node("Reciprocal", ["root"], ["inv"]),
        helper.make_node("Mul", ["x" if kind == "rms" else "c", "inv"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 3, H])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2, 3, H])],
        [
            numpy_helper.from_array(np.array([-1], np.int64), "axes"),
            numpy_helper.from_array(_weights((H,), T.FLOAT)[0], "w"),
        ],
    )
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    fused, report = fuse(original, target)
    op = "RMSNorm" if kind == "rms" else "LayerNorm"
    assert report[RMS if kind == "rms" else LAYER].fused == 1, str(report)
    if target in NODE_TARGETS:
        (node,) = fused.graph.node
        assert (node.op_type, _attrs(node)["epsilon"]) == (op, 0.0)
        assert list(node.input)[:2] == ["x", "w"]
    x = _x((2, 3, H), T.FLOAT).copy()
    x[0, 1] = 0.0  # a zero row: 0 * rsqrt(0) is NaN in the original
    want, got = _original(original, {"x": x})[0], _run(fused, {"x": x}, target != "onnx")[0]
    assert np.isnan(want[0, 1]).all() and np.isnan(got[0, 1]).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)

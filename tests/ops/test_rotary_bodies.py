"""The function bodies of the rotary ops (RMSNormRotary, LayerNormRotary, L2NormRotary): a model
of one node with its body attached, run by plain ONNX Runtime (the body inlined, no onnxnorm
library), matches the numpy reference over a pairwise matrix of the ops' forms, at every opset
from 7 (bfloat16 from 13) to 23; the models pass the checker and onnx shape inference gives QOut
and KOut their shapes."""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxnorm import ops
from onnxnorm.ops import catalogue, functions, reference
from onnxnorm.testing.graphs import single_node_model
from tests.support.helpers import assert_close, run
from tests.support.matrix import DTYPES
from tests.support.rotary_cases import HEAD_SIZE, arrays_and_attrs, fit

#: each axis of the matrix (besides the op and Q's type) and its values. layout: 0, 1, 2 (4-D)
#: and "0-3d", "2-3d" ([batch, seq, heads * head_size]); rotary_dim: the whole head (0), a
#: part, the whole head named; cache: one angle per pair gathered by PositionIds, one per value
#: gathered, one per value per token, one per pair per token shared by the batch; weights:
#: none, one head's shared by every head, each head's; weight_type and angle_type: Q's or
#: float32.
AXES = {
    "layout": ("0", "0-3d", "1", "2", "2-3d"),
    "interleaved": (0, 1),
    "rotary_dim": (0, 6, HEAD_SIZE),
    "cache": ("pairs-ids", "values-ids", "values-token", "pairs-token-batch1"),
    "k": (True, False),
    "rotary_first": (0, 1),
    "per_head": (1, 0),
    "rotary_in_t": (0, 1),
    "weights": ("none", "shared", "per-head"),
    "weight_type": ("T", "float32"),
    "angle_type": ("T", "float32"),
    "cast_before_scale": (0, 1),
    "scale_offset": (0.0, 1.0),
}


def _allowed(op: str, case: dict) -> bool:
    """per_head = 0 needs layout 0 or 2; an L2 norm has no weights, no rounding order, no
    offset; only RMSNorm has a scale offset."""
    norm = catalogue.get(op).norm
    if case.get("per_head") == 0 and case.get("layout") == "1":
        return False
    if norm == "l2" and (
        case.get("weights", "none") != "none"
        or case.get("cast_before_scale", 0)
        or case.get("weight_type", "T") != "T"
    ):
        return False
    return not (norm != "rms" and case.get("scale_offset", 0.0))


def _pairwise(op: str, seed: int) -> list[dict]:
    """Cases of ``op`` that together hold every allowed pair of values of two axes (a greedy
    covering: each case the best of 40 random candidates at covering pairs not yet held), for
    one type of Q."""
    rand = random.Random(seed)
    names = list(AXES)

    def pairs(case):
        return {
            (a, case[a], b, case[b])
            for a, b in itertools.combinations(names, 2)
            if _allowed(op, {a: case[a], b: case[b]})
        }

    wanted = set()
    for a, b in itertools.combinations(names, 2):
        for va, vb in itertools.product(AXES[a], AXES[b]):
            if _allowed(op, {a: va, b: vb}):
                wanted.add((a, va, b, vb))
    cases = []
    while wanted:
        best, gain = None, -1
        for _ in range(40):
            case = {name: rand.choice(values) for name, values in AXES.items()}
            if not _allowed(op, case):
                continue
            covered = len(pairs(case) & wanted)
            if covered > gain:
                best, gain = case, covered
        if best is None or gain == 0:
            # the pairs left: one case built around each
            a, va, b, vb = min(wanted, key=repr)  # (not a set's order: the hash seed's)
            while True:
                best = {name: rand.choice(values) for name, values in AXES.items()}
                best.update({a: va, b: vb})
                if _allowed(op, best):
                    break
        wanted -= pairs(best)
        cases.append(best)
    return cases


def _case_id(op: str, case: dict) -> str:
    short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
    return "-".join(
        [
            op,
            short[case["dtype"]],
            f"layout{case['layout']}",
            "inter" if case["interleaved"] else "half",
            f"rot{case['rotary_dim']}",
            case["cache"],
            "qk" if case["k"] else "q",
            "rotfirst" if case["rotary_first"] else "normfirst",
            "perhead" if case["per_head"] else "pertoken",
            "int" if case["rotary_in_t"] else "inf32",
            f"w{case['weights']}-{case['weight_type']}",
            f"cos{case['angle_type']}",
            f"a{case['cast_before_scale']}",
            f"off{case['scale_offset']:g}",
        ]
    )


def _matrix():
    """Every op and type of Q, each over a pairwise covering of the other axes."""
    for index, (op, dtype) in enumerate(itertools.product(catalogue.ROTARY_OPS, DTYPES)):
        for case in _pairwise(op, seed=index):
            case = {**case, "dtype": dtype}
            yield pytest.param(op, case, id=_case_id(op, case))


def _model(op, arrays, attrs, opset=18):
    """The one-node model with its body, at ``opset``, with the IR version of that opset's
    ONNX release (which the body raises to 10)."""
    model = single_node_model(
        op, arrays, attrs, opset=opset, functions=False, optional_outputs="K" in arrays
    )
    model.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
    return ops.attach_functions(model)


def _assert_matches(model, arrays, op, attrs, dtype):
    spec = catalogue.get(op)
    want = reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **attrs)
    got = run(model, arrays)  # plain ONNX Runtime: the body inlined
    assert len(got) == len(want) == (2 if "K" in arrays else 1)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert_close(g, w, DTYPES[dtype])
        if w.dtype != np.float32:
            # the body rounds where the op says (each product with rotary_in_t = 1, once
            # without): bit for bit but for the rare value its float32 statistics round apart
            exact = np.mean((g == w) | (np.isnan(g) & np.isnan(w)))
            assert exact >= 0.98, f"{exact:.4f} of the values bit for bit"


@pytest.mark.parametrize("op, case", _matrix())
def test_body_matches_reference(op, case, rng):
    arrays, attrs = arrays_and_attrs(op, case, rng)
    model = _model(op, arrays, attrs)
    (node,) = [n for n in model.graph.node if n.domain == ops.DOMAIN]
    (function,) = model.functions
    assert node.overload and node.overload == function.overload
    _assert_matches(model, arrays, op, attrs, case["dtype"])


#: the default value of each axis
DEFAULTS = {name: values[0] for name, values in AXES.items()}
#: the cases run at every opset: K, partial interleaved rotary over per-pair caches gathered
#: by PositionIds, weights per head, order A; and a 3-D Q alone into layout 2, rotated first
#: over full-width caches per token, per token, rotation in Q's type
OPSET_CASES = {
    "qk-partial-interleaved-ids": {
        **DEFAULTS,
        "dtype": "float16",
        "interleaved": 1,
        "rotary_dim": 6,
        "cache": "pairs-ids",
        "weights": "per-head",
        "weight_type": "float32",
        "cast_before_scale": 1,
        "scale_offset": 1.0,
    },
    "q-3d-layout2-rotaryfirst": {
        **DEFAULTS,
        "dtype": "bfloat16",
        "layout": "2-3d",
        "k": False,
        "cache": "values-token",
        "rotary_first": 1,
        "per_head": 0,
        "rotary_in_t": 1,
        "weights": "shared",
    },
}
OPSETS = range(functions.OLDEST_OPSET, 24)


def _opset_params():
    for opset in OPSETS:
        for name, case in OPSET_CASES.items():
            if case["dtype"] == "bfloat16" and opset < functions.BFLOAT16_MIN_OPSET:
                continue  # test_bfloat16_below_opset_13_has_no_body
            for op in catalogue.ROTARY_OPS:
                yield pytest.param(op, case, opset, id=f"opset{opset}-{op}-{name}")


@pytest.mark.parametrize("op, case, opset", _opset_params())
def test_body_at_every_opset(op, case, opset, rng):
    case = fit(op, case)
    arrays, attrs = arrays_and_attrs(op, case, rng)
    model = _model(op, arrays, attrs, opset)
    (node,) = [n for n in model.graph.node if n.domain == ops.DOMAIN]
    (function,) = model.functions
    assert node.overload == function.overload and function.opset_import[0].version == opset
    if opset < functions.MIN_OPSET:
        short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[case["dtype"]]
        assert f"_{short}" in node.overload
        assert not any(n.op_type == "CastLike" for n in function.node)
    if opset < functions.REF_OPSET:
        assert "_eps1.5258789e-05" in node.overload
        assert not any(a.ref_attr_name for n in function.node for a in n.attribute)
    onnx.checker.check_model(model, full_check=True)
    _assert_matches(model, arrays, op, attrs, case["dtype"])


def test_bfloat16_below_opset_13_has_no_body(rng):
    """Cast-13 added bfloat16: at opset 12 a bfloat16 rotary node keeps no body and the note
    says why and what to do."""
    case = {**OPSET_CASES["q-3d-layout2-rotaryfirst"], "weights": "none"}
    arrays, attrs = arrays_and_attrs("L2NormRotary", case, rng)
    model = single_node_model("L2NormRotary", arrays, attrs, opset=12, functions=False)
    notes: list = []
    functions.attach_functions(model, notes)
    (node,) = [n for n in model.graph.node if n.domain == ops.DOMAIN]
    assert not node.overload and not model.functions
    assert len(notes) == 1 and notes[0].emitted == functions.WITHOUT_BODY
    assert re.search(
        r"Q is bfloat16, which ONNX casts to from opset 13 .* imports opset 12: convert the "
        r"model to opset 13 or newer",
        notes[0].reason,
    ), notes[0].reason
    assert functions.body_problem("RMSNormRotary", 13, TensorProto.BFLOAT16) is None
    with pytest.raises(ValueError, match="Q is bfloat16"):
        functions.function_proto("RMSNormRotary", "none_bf16_eps1e-06", 12)


@pytest.mark.parametrize("op", catalogue.ROTARY_OPS)
@pytest.mark.parametrize("layout", ["0", "0-3d", "1", "2", "2-3d"])
def test_checker_and_shape_inference(op, layout, rng):
    """The model with its body passes onnx.checker (full check: the schemas' inference over the
    node and the body); with the graph outputs' shapes cleared, onnx shape inference gives
    QOut and KOut the reference's shapes and Q's type."""
    case = {**DEFAULTS, "layout": layout, "dtype": "float16"}
    arrays, attrs = arrays_and_attrs(op, case, rng)
    model = _model(op, arrays, attrs)
    onnx.checker.check_model(model, full_check=True)
    spec = catalogue.get(op)
    want = reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **attrs)
    for output in model.graph.output:
        output.type.tensor_type.ClearField("shape")
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    found = {
        v.name: ([d.dim_value for d in v.type.tensor_type.shape.dim], v.type.tensor_type.elem_type)
        for v in list(inferred.graph.value_info) + list(inferred.graph.output)
    }
    for name, value in zip(("qout", "kout"), want):
        assert found[name] == (list(value.shape), TensorProto.FLOAT16), name


def test_shape_inference_rejects_what_the_op_does_not_take():
    """Inference says where a node cannot be valid: K of another type than Q, per_head = 0 in
    layout 1, a 3-D Q without head_size."""
    f16, f32 = TensorProto.FLOAT16, TensorProto.FLOAT

    def infer(q, k, attrs):
        node = helper.make_node(
            "RMSNormRotary",
            ["q", "k", "", "", "cos", "sin"],
            ["qout", "kout"],
            domain=ops.DOMAIN,
            **attrs,
        )
        graph = helper.make_graph(
            [node],
            "g",
            [
                helper.make_tensor_value_info("q", q[0], q[1]),
                helper.make_tensor_value_info("k", k[0], k[1]),
                helper.make_tensor_value_info("cos", f32, [1, 3, 8]),
                helper.make_tensor_value_info("sin", f32, [1, 3, 8]),
            ],
            [helper.make_tensor_value_info(n, f16, None) for n in ("qout", "kout")],
        )
        model = helper.make_model(
            graph,
            opset_imports=[
                helper.make_opsetid("", 18),
                helper.make_opsetid(ops.DOMAIN, ops.VERSION),
            ],
        )
        return onnx.shape_inference.infer_shapes(model, strict_mode=True)

    infer((f16, [2, 3, 4, 16]), (f16, [2, 3, 2, 16]), {})
    with pytest.raises(onnx.shape_inference.InferenceError, match="K must be of Q's type"):
        infer((f16, [2, 3, 4, 16]), (f32, [2, 3, 2, 16]), {})
    with pytest.raises(onnx.shape_inference.InferenceError, match="per_head = 0"):
        infer((f16, [2, 4, 3, 16]), (f16, [2, 2, 3, 16]), {"layout": 1, "per_head": 0})
    with pytest.raises(onnx.shape_inference.InferenceError, match="needs head_size"):
        infer((f16, [2, 3, 64]), (f16, [2, 3, 32]), {})

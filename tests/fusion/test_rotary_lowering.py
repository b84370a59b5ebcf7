"""onnxnorm.fusion.lowering of the rotary ops (RMSNormRotary, LayerNormRotary, L2NormRotary): one-
node models lowered to every target, and written --for the runtimes, run in plain ONNX Runtime
(no onnxnorm library) and match the numpy reference; the lowered graph holds the norm op and
RotaryEmbedding where the node can be written so exactly, else the inlined function body, with
the reason in the note."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxnorm.fusion.lowering import lower, lower_with_notes, op_types
from onnxnorm.ops import catalogue, reference
from onnxnorm.targets import RUNTIMES
from onnxnorm.testing.graphs import single_node_model
from tests.support.helpers import assert_close, run
from tests.support.matrix import DTYPES
from tests.support.rotary_cases import DEFAULTS, arrays_and_attrs, fit

MS = "com.microsoft"
NORM_OPS = {"RMSNormalization", "LayerNormalization", "SimplifiedLayerNormalization"}

#: the cases of the matrix, each a change to rotary_cases.DEFAULTS (layout 0 4-D, half-
#: split, the whole head rotated, per-pair caches gathered by PositionIds, K, norm first, per
#: head, rotation in float32, no weights); "const": Cos and Sin as initializers of one angle per
#: value whose halves (interleaved: pairs) repeat ("repeat") or not ("differ")
CASES = {
    "ids-qk-perhead-weights": {"weights": "per-head", "weight_type": "float32"},
    "ids-2-3d-inter-partial-a-offset": {
        "layout": "2-3d",
        "interleaved": 1,
        "rotary_dim": 6,
        "weights": "shared",
        "cast_before_scale": 1,
        "scale_offset": 1.0,
    },
    "ids-1-rotfirst-q": {"layout": "1", "k": False, "rotary_first": 1, "weights": "shared"},
    "ids-0-3d-pertoken-cosf32": {
        "layout": "0-3d",
        "per_head": 0,
        "weights": "per-head",
        "angle_type": "float32",
    },
    "ids-2-rotfirst-pertoken-partial": {
        "layout": "2",
        "rotary_first": 1,
        "per_head": 0,
        "rotary_dim": 6,
        "weights": "shared",
    },
    "ids-in-t": {"rotary_in_t": 1, "weights": "shared"},
    "token-pairs-batch1": {"cache": "pairs-token-batch1", "interleaved": 1, "weights": "shared"},
    "token-values": {"cache": "values-token"},
    "ids-values-input": {"cache": "values-ids"},
    "ids-values-const-repeat": {"cache": "values-ids", "const": "repeat", "weights": "shared"},
    "ids-values-const-repeat-inter-partial": {
        "cache": "values-ids",
        "const": "repeat",
        "interleaved": 1,
        "rotary_dim": 6,
        "layout": "1",
    },
    "ids-values-const-differ": {"cache": "values-ids", "const": "differ"},
}


def _case(op: str, name: str, dtype: str, rng) -> tuple[onnx.ModelProto, dict, dict, dict]:
    """The model (without bodies) of one case, its graph inputs, its attributes and the case."""
    case = fit(op, {**DEFAULTS, **CASES[name], "dtype": dtype})
    arrays, attrs = arrays_and_attrs(op, case, rng)
    const = case.get("const")
    if const == "repeat":  # one angle per value, each pair's two the same
        half = arrays["Cos"].shape[-1] // 2
        for key in ("Cos", "Sin"):
            pairs = arrays[key][..., :half]
            if case["interleaved"]:
                arrays[key] = np.repeat(pairs, 2, axis=-1)
            else:
                arrays[key] = np.concatenate([pairs, pairs], axis=-1)
    model = single_node_model(
        op, arrays, attrs, opset=23, functions=False, optional_outputs="K" in arrays
    )
    if const:  # Cos and Sin as initializers
        graph = model.graph
        kept = [i for i in graph.input if i.name not in ("cos", "sin")]
        del graph.input[:]
        graph.input.extend(kept)
        for key in ("Cos", "Sin"):
            graph.initializer.append(numpy_helper.from_array(arrays[key], key.lower()))
    return model, arrays, attrs, case


def _with_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for imp in out.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = opset
    return out


def _expected(op: str, case: dict, target: str, opset: int) -> str | None:
    """None where the node must become a norm op and RotaryEmbedding, else a pattern of the
    reason its body is inlined."""
    if catalogue.get(op).norm == "l2":
        return r"sqrt\(sum\(x\^2\) \+ epsilon\)"
    if target == "onnx" and opset < 23:
        return rf"opset {opset} has no standard RotaryEmbedding"
    if case["rotary_in_t"] and case["dtype"] != "float32":
        return "rotary_in_t = 1 rounds each product"
    if target == "ort" and not case["cache"].endswith("ids"):
        return "gathers Cos and Sin by position_ids"
    if case["cache"].startswith("values"):
        if case.get("const") is None:
            return "one angle per value .* not initializers"
        if case["const"] == "differ":
            return f"the {'pairs' if case['interleaved'] else 'halves'} of cos .* differ"
    return None


def _outputs(model, arrays, const: bool) -> list[np.ndarray]:
    feeds = {k: v for k, v in arrays.items() if not (const and k in ("Cos", "Sin"))}
    return run(model, feeds)


def _assert_matches(got, arrays, op, attrs, dtype, exact: float = 0.98):
    """Within the reference's tolerance; for float16/bfloat16 ``exact`` of the values bit for
    bit (the rare others are a float32 statistic or product rounding apart)."""
    spec = catalogue.get(op)
    want = reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **attrs)
    assert len(got) == len(want) == (2 if "K" in arrays else 1)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert_close(g, w, DTYPES[dtype])
        if w.dtype != np.float32:
            same = np.mean(g == w)
            assert same >= exact, f"{same:.4f} of the values bit for bit"


def _check_forms(lowered, notes, op, case, target, opset):
    """The note and the lowered graph's ops say the expected form."""
    assert len(notes) == 1, notes
    kinds = set(op_types(lowered))
    assert not any(d == catalogue.DOMAIN for d, _ in kinds), kinds
    why = _expected(op, case, target, opset)
    if why is not None:
        assert notes[0].emitted == "inlined function body", notes
        assert re.search(why, notes[0].reason), notes[0].reason
        assert not {t for _, t in kinds} & {"RotaryEmbedding"}, kinds
        assert not any(i.name.endswith("_pairs") for i in lowered.graph.initializer)
        return
    assert notes[0].reason == "", notes
    layer = catalogue.get(op).norm == "layer"
    if target == "onnx":
        norm, rope = ("LayerNormalization" if layer else "RMSNormalization"), ("", "")
    else:
        norm = "LayerNormalization" if layer else "SimplifiedLayerNormalization"
        rope = (MS, "")
    assert ("", norm) in kinds and (rope[0], "RotaryEmbedding") in kinds, kinds
    assert {t for _, t in kinds} & NORM_OPS == {norm}, kinds
    nodes = [n for n in lowered.graph.node if n.op_type == "RotaryEmbedding"]
    assert len(nodes) == (2 if case["k"] else 1)
    # ONNX Runtime's op takes float16 as it is (it computes in float32 and rounds once)
    in_q_type = target == "ort" and case["dtype"] == "float16" and case["angle_type"] == "T"
    assert ("(float32)" in notes[0].emitted) == (case["dtype"] != "float32" and not in_q_type)
    if case.get("const") == "repeat":  # the caches' first halves (pairs), one angle per pair
        widths = {i.name: list(i.dims)[-1] for i in lowered.graph.initializer}
        assert widths["cos_pairs"] == widths["sin_pairs"] == (case["rotary_dim"] or 16) // 2


def _params():
    for op in catalogue.ROTARY_OPS:
        for dtype in DTYPES:
            for name in CASES:
                if op == "L2NormRotary" and name not in ("ids-qk-perhead-weights", "token-values"):
                    continue
                yield pytest.param(op, dtype, name, id=f"{op}-{dtype}-{name}")


@pytest.mark.parametrize("opset", [18, 23])
@pytest.mark.parametrize("target", ["onnx", "ort"])
@pytest.mark.parametrize("op, dtype, name", _params())
def test_lowered_matches_reference(op, dtype, name, target, opset, rng):
    """Each case lowered to ``onnx`` and ``ort`` holds the expected ops (or the body, with the
    reason) and matches the reference in plain ONNX Runtime."""
    model, arrays, attrs, case = _case(op, name, dtype, rng)
    model = _with_opset(model, opset)
    lowered, notes = lower_with_notes(model, target)
    _check_forms(lowered, notes, op, case, target, opset)
    if target == "onnx":
        assert not any(d not in ("", "ai.onnx") for d, _ in op_types(lowered))
        onnx.checker.check_model(lowered, full_check=True)
    got = _outputs(lowered, arrays, bool(case.get("const")))
    _assert_matches(got, arrays, op, attrs, dtype)


@pytest.mark.parametrize("opset", [7, 12, 13, 17, 22])
@pytest.mark.parametrize("target", ["onnx", "ort"])
@pytest.mark.parametrize("name", ["ids-qk-perhead-weights", "ids-2-3d-inter-partial-a-offset"])
def test_other_opsets(name, target, opset, rng):
    """ONNX Runtime's ops are written at every opset (float16 here: bfloat16 needs 13 for its
    casts); ONNX's RotaryEmbedding needs 23, below it the body is inlined."""
    op, dtype = ("LayerNormRotary" if opset % 2 else "RMSNormRotary"), "float16"
    model, arrays, attrs, case = _case(op, name, dtype, rng)
    lowered, notes = lower_with_notes(_with_opset(model, opset), target)
    _check_forms(lowered, notes, op, case, target, opset)
    _assert_matches(_outputs(lowered, arrays, False), arrays, op, attrs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", catalogue.ROTARY_OPS)
def test_function_and_fused(op, dtype, rng):
    """``function``: the node with its body, which plain ONNX Runtime runs; ``fused``: the node
    without one (it needs the library)."""
    model, arrays, attrs, _ = _case(op, "ids-2-3d-inter-partial-a-offset", dtype, rng)
    with_body, notes = lower_with_notes(model, "function")
    (node,) = [n for n in with_body.graph.node if n.domain == catalogue.DOMAIN]
    assert not notes and node.overload
    assert [(f.name, f.overload) for f in with_body.functions] == [(op, node.overload)]
    _assert_matches(run(with_body, arrays), arrays, op, attrs, dtype)
    fused = lower(model, "fused")
    (node,) = [n for n in fused.graph.node if n.domain == catalogue.DOMAIN]
    assert not node.overload and not fused.functions


def test_bfloat16_below_opset_13_keeps_the_node(rng):
    """A bfloat16 node at opset 12 has no body and no casts to lower to: it stays an onnxnorm
    node without a body, and the note says why."""
    model, *_ = _case("RMSNormRotary", "ids-qk-perhead-weights", "bfloat16", rng)
    lowered, notes = lower_with_notes(_with_opset(model, 12), "ort")
    assert lowered.graph.node[0].op_type == "RMSNormRotary"
    assert "Q is bfloat16" in notes[0].reason


def test_unknown_shapes_inline_the_body(rng):
    """Without Q's head count (a dim not known) the rotation cannot be laid out for
    RotaryEmbedding: the body, with the reason."""
    model, arrays, attrs, _ = _case("RMSNormRotary", "ids-qk-perhead-weights", "float32", rng)
    for value in model.graph.input:
        if value.name == "q":
            value.type.tensor_type.shape.dim[2].dim_param = "heads"
    lowered, notes = lower_with_notes(model, "onnx")
    assert notes[0].emitted == "inlined function body"
    assert notes[0].reason == "the head size and head count of Q are not known"
    _assert_matches(run(lowered, arrays), arrays, "RMSNormRotary", attrs, "float32")


def test_dynamic_batch_expands_per_token_caches(rng):
    """Per-token caches of one row for a batch not known: expanded to Q's batch."""
    model, arrays, attrs, _ = _case("LayerNormRotary", "token-pairs-batch1", "float16", rng)
    for value in model.graph.input:
        if value.name in ("q", "k"):
            value.type.tensor_type.shape.dim[0].dim_param = "batch"
    lowered, notes = lower_with_notes(model, "onnx")
    assert notes[0].reason == "" and ("", "Expand") in set(op_types(lowered))
    _assert_matches(run(lowered, arrays), arrays, "LayerNormRotary", attrs, "float16")


def test_layers_share_the_caches_of_one_angle_per_pair(rng):
    """Two nodes rotating by the same per-value caches (two layers) share one pair of new
    initializers of one angle per pair."""
    model, arrays, attrs, _ = _case("RMSNormRotary", "ids-values-const-repeat", "float32", rng)
    graph = model.graph
    second = onnx.NodeProto()
    second.CopyFrom(graph.node[0])
    second.output[:] = [name + "2" for name in second.output]
    graph.node.append(second)
    graph.output.extend(
        helper.make_tensor_value_info(o.name + "2", o.type.tensor_type.elem_type, None)
        for o in list(graph.output)
    )
    lowered, notes = lower_with_notes(model, "onnx")
    assert [n.reason for n in notes] == ["", ""]
    pairs = sorted(i.name for i in lowered.graph.initializer if i.name.endswith("_pairs"))
    assert pairs == ["cos_pairs", "sin_pairs"]
    got = _outputs(lowered, arrays, True)
    _assert_matches(got[:2], arrays, "RMSNormRotary", attrs, "float32")
    _assert_matches(got[2:], arrays, "RMSNormRotary", attrs, "float32")


@pytest.mark.parametrize("opset", [18, 23])
@pytest.mark.parametrize(
    "runtime", ["onnx", "openvino", "ort-openvino", "tensorrt", "ort-cpu", "ort-cuda"]
)
def test_runtime_forms(runtime, opset, rng):
    """Written --for a runtime: the library's keep the op with its body; "onnx" writes ONNX's
    ops where the opset has them, the others the body; each runs in plain ONNX Runtime."""
    op, dtype = "RMSNormRotary", "float16"
    model, arrays, attrs, _ = _case(op, "ids-2-3d-inter-partial-a-offset", dtype, rng)
    lowered, notes = lower_with_notes(_with_opset(model, opset), runtime=runtime)
    forms = RUNTIMES[runtime].forms["rotary"]
    assert (forms == ("library",)) == runtime.startswith("ort-c")
    kinds = {t for _, t in op_types(lowered)}
    if forms == ("library",):
        assert notes[0].emitted == "onnxnorm op" and op in kinds
        assert [f.name for f in lowered.functions] == [op]
    elif "standard" in forms and opset >= 23:
        assert "RotaryEmbedding" in kinds and "RMSNormalization" in kinds, notes
    else:
        assert notes[0].emitted == "inlined function body" and "RotaryEmbedding" not in kinds
        if "standard" in forms:
            assert (
                notes[0].reason == f"not standard: opset {opset} has no RotaryEmbedding (needs 23)"
            )
    _assert_matches(run(lowered, arrays), arrays, op, attrs, dtype)


def test_ort_rounding_of_its_rotary_embedding():
    """What the lowering relies on, measured: ONNX Runtime's RotaryEmbedding (ONNX's, opset 23,
    and com.microsoft's) computes float16 in float32 and rounds once (the bits of the float32
    op's result rounded to float16), not each product and the sum (rotary_in_t = 1); neither
    has a bfloat16 kernel on the CPU."""
    import onnxruntime as ort

    rng = np.random.default_rng(5)
    batch, heads, seq, size, positions = 2, 4, 32, 16, 40
    x = (rng.standard_normal((batch, heads, seq, size)) * 3).astype(np.float16)
    angle = rng.uniform(-50, 50, (positions, size // 2))
    cos, sin = np.cos(angle).astype(np.float16), np.sin(angle).astype(np.float16)
    ids = rng.integers(0, positions, (batch, seq)).astype(np.int64)

    def session(domain: str, t: int) -> ort.InferenceSession:
        names = ["x", "cos", "sin", "ids"] if domain == "" else ["x", "ids", "cos", "sin"]
        inputs = [helper.make_tensor_value_info(n, t, None) for n in ("x", "cos", "sin")]
        inputs.append(helper.make_tensor_value_info("ids", TensorProto.INT64, None))
        node = helper.make_node("RotaryEmbedding", names, ["y"], domain=domain)
        graph = helper.make_graph(
            [node], "g", inputs, [helper.make_tensor_value_info("y", t, None)]
        )
        imports = [helper.make_opsetid("", 23)] + ([helper.make_opsetid(MS, 1)] if domain else [])
        model = helper.make_model(graph, opset_imports=imports, ir_version=10)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])

    # the first half of each head: x1 * cos - x2 * sin, each product and the difference rounded
    c, s = cos[ids][:, None], sin[ids][:, None]
    x1, x2 = x[..., : size // 2], x[..., size // 2 :]
    each_step = (c * x1).astype(np.float16) - (s * x2).astype(np.float16)
    for domain in ("", MS):
        half = session(domain, TensorProto.FLOAT16).run(
            None, {"x": x, "cos": cos, "sin": sin, "ids": ids}
        )[0]
        feeds = {"x": x, "cos": cos, "sin": sin}
        single = session(domain, TensorProto.FLOAT).run(
            None, {**{k: v.astype(np.float32) for k, v in feeds.items()}, "ids": ids}
        )[0]
        assert np.array_equal(half.view(np.uint16), single.astype(np.float16).view(np.uint16))
        assert not np.array_equal(half[..., : size // 2], each_step), domain
        with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
            session(domain, TensorProto.BFLOAT16)

"""onnxnorm.fusion.lowering: every op, dtype and variant lowered to every target runs in plain
ONNX Runtime and matches the numpy reference; the lowered graph holds the expected ops."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxnorm.fusion.lowering import lower, lower_with_notes, op_types
from onnxnorm.ops import catalogue, reference
from onnxnorm.targets import DEFAULT, RUNTIMES, TARGETS, help_text
from onnxnorm.testing.graphs import single_node_model
from tests.support.helpers import assert_close, reference_outputs, run
from tests.support.matrix import DTYPES, LOWERED_TARGETS, NODE_TARGETS, TARGETS_WITHOUT_LIBRARY

EPS = 2.0**-16

# (op, present optional inputs, attributes, scale spans heads)
VARIANTS = [
    ("LayerNorm", ("Scale", "Bias"), {}, False),
    ("LayerNorm", (), {}, False),
    ("LayerNorm", ("Scale",), {"cast_before_scale": 1}, False),
    ("LayerNorm", ("Scale", "Bias"), {"axis": 2}, True),  # Cohere's per-head Q/K LayerNorm
    ("RMSNorm", ("Scale",), {}, False),
    ("RMSNorm", ("Scale",), {"cast_before_scale": 1}, False),
    ("RMSNorm", ("Scale",), {"scale_offset": 1.0}, False),  # Gemma
    ("RMSNorm", ("Scale",), {"scale_offset": 1.0, "cast_before_scale": 1}, False),
    ("RMSNorm", ("Scale", "Bias"), {}, False),
    ("RMSNorm", ("Scale",), {"axis": 2}, True),  # per-head Q/K RMSNorm
    ("SkipLayerNorm", ("Scale", "Bias"), {}, False),
    ("SkipLayerNorm", ("Scale", "Bias", "XBias"), {"alpha": 1.7}, False),  # DeepNorm
    ("SkipLayerNorm", ("Scale",), {"cast_before_scale": 1}, False),
    ("SkipRMSNorm", ("Scale",), {}, False),
    ("SkipRMSNorm", ("Scale",), {"alpha": 0.5, "cast_before_scale": 1}, False),
    ("SkipRMSNorm", ("Scale", "XBias"), {"scale_offset": 1.0}, False),
    ("SandwichLayerNorm", ("InnerScale", "InnerBias", "Scale", "Bias"), {}, False),
    ("SandwichRMSNorm", ("InnerScale", "Scale"), {"scale_offset": 1.0}, False),
    ("SandwichRMSNorm", ("InnerScale", "Scale"), {"cast_before_scale": 1}, False),
]


def _variant_id(v) -> str:
    """(op, present inputs, attributes, ...) -> a test id; a hybrid variant's fourth field (its
    Scale's kind) too."""
    kind = f"-{v[3]}" if isinstance(v[3], str) or v[3] is None else ""
    return f"{v[0]}-{'+'.join(v[1]) or 'none'}{kind}-" + "-".join(
        f"{k}{val}" for k, val in v[2].items()
    )


def _arrays(op, present, dtype, per_head, rng):
    t = DTYPES[dtype]
    shape = (2, 3, 4, 16) if per_head else (2, 5, 32)
    param = shape[1:] if per_head else shape[-1:]
    arrays = {"X": (rng.standard_normal(shape) * 2 + 0.5).astype(t)}
    if catalogue.get(op).has_residual:
        arrays["Residual"] = rng.standard_normal(shape).astype(t)
    for name in present:
        arrays[name] = (rng.standard_normal(param) * 0.7 + (1 if "Scale" in name else 0)).astype(t)
    return arrays


def _expected_ops(op, dtype, attrs, target, opset, present, per_head):
    """The norm op types the lowered graph must hold."""
    layer = "Layer" in op
    if target == "onnx":
        if layer and opset >= 17:
            return {"LayerNormalization"}
        if not layer and opset >= 23:
            return {"RMSNormalization"}
        return set()  # inlined function body
    direct = (
        dtype == "float32"
        and not attrs.get("scale_offset")
        and not per_head
        and not ("Bias" in present and not layer)
    )
    if op.startswith("Skip") and direct:
        return {"SkipLayerNormalization" if layer else "SkipSimplifiedLayerNormalization"}
    base = {"LayerNormalization" if layer else "SimplifiedLayerNormalization"}
    if op.startswith("Sandwich") and direct:
        base.add("SkipLayerNormalization" if layer else "SkipSimplifiedLayerNormalization")
    return base


NORM_OPS = {
    "LayerNormalization",
    "RMSNormalization",
    "SimplifiedLayerNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
}


@pytest.mark.parametrize("target", TARGETS_WITHOUT_LIBRARY)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "variant",
    VARIANTS,
    ids=_variant_id,
)
@pytest.mark.parametrize("opset", [18, 23])
def test_lowered_op_matches_reference(variant, dtype, target, opset, rng):
    op, present, attrs, per_head = variant
    attrs = {"epsilon": EPS, **attrs}
    arrays = _arrays(op, present, dtype, per_head, rng)
    model = single_node_model(op, arrays, attrs, opset=opset, functions=False)
    before = model.SerializeToString()
    lowered, notes = lower_with_notes(model, target)
    assert model.SerializeToString() == before, "lower modified its input"
    kinds = {t for d, t in op_types(lowered)}
    if target != "function":
        assert not any(d == catalogue.DOMAIN for d, _ in op_types(lowered))
        assert not any(f.domain == catalogue.DOMAIN for f in lowered.functions)
        assert len(notes) == 1
        assert kinds & NORM_OPS == _expected_ops(
            op, dtype, attrs, target, opset, present, per_head
        ), notes
        if target == "onnx":
            assert not any(d not in ("", "ai.onnx") for d, _ in op_types(lowered))
            onnx.checker.check_model(lowered, full_check=True)
    got = run(lowered, arrays)
    want = reference_outputs(op, arrays, attrs)
    for g, w in zip(got, want):
        assert_close(g, w, DTYPES[dtype])


def test_fused_target_strips_bodies(rng):
    arrays = _arrays("RMSNorm", ("Scale",), "float32", False, rng)
    model = single_node_model("RMSNorm", arrays, {}, functions=True)
    fused = lower(model, "fused")
    assert not fused.functions and model.functions
    assert [(d, t) for d, t in op_types(fused)] == [(catalogue.DOMAIN, "RMSNorm")]


def test_unknown_target():
    with pytest.raises(ValueError, match="unknown target"):
        lower(onnx.ModelProto(), "tensorrt")


def test_both_commands_offer_the_targets_defined_once():
    from onnxnorm.cli import parser

    assert list(TARGETS) == ["function", "fused", "ort", "onnx"] and DEFAULT == "function"
    # the subsets the tests take (tests/support/matrix.py) name targets that exist
    assert {*NODE_TARGETS, *LOWERED_TARGETS} == set(TARGETS) and "fused" in NODE_TARGETS
    for command, option in (("export", "--mode"), ("fuse", "--target")):
        sub = parser(command)._subparsers._group_actions[0].choices[command]
        action = next(a for a in sub._actions if option in a.option_strings)
        assert (action.choices, action.default, action.help) == (TARGETS, DEFAULT, help_text())


STATIC = [name for name, spec in catalogue.QUANTIZED_OPS.items() if spec.quantize == "static"]
ZERO_POINTS = {
    "uint8": np.array(131, np.uint8),
    "int8": np.array(-5, np.int8),
    "float8e4m3fn": np.array(0, reference.FLOAT8_E4M3FN),
}


def _quantized_model(op, arrays, attrs, opset):
    """single_node_model without bodies, and the arrays to feed it."""
    return single_node_model(op, arrays, attrs, opset=opset, functions=False), arrays


@pytest.mark.parametrize("target", LOWERED_TARGETS)
@pytest.mark.parametrize("zero_point", ZERO_POINTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", STATIC)
def test_static_quantized_op_lowered_to_norm_and_quantizer(op, dtype, zero_point, target, rng):
    """A static quantized op becomes its norm and a QuantizeLinear that takes the node's own zero
    point (uint8, int8 or float8: Y's type), run by plain ONNX Runtime: Y_float as the
    reference's, and Y exactly the reference's quantizer of that Y_float (float8: its bits).
    The scale makes some values saturate."""
    spec = catalogue.get(op)
    arrays = _arrays(op, ("Scale",), dtype, False, rng)
    arrays["Y_scale"] = np.array(0.005, DTYPES[dtype])
    arrays["Y_zero_point"] = ZERO_POINTS[zero_point]
    attrs = {"epsilon": EPS, "cast_before_scale": 1}
    # (opset 23 for onnx: its RMSNormalization; below it the body, quantizer and all, is inlined)
    model, feeds = _quantized_model(op, arrays, attrs, 23 if target == "onnx" else 21)
    lowered, notes = lower_with_notes(model, target)
    assert not any(d == catalogue.DOMAIN for d, _ in op_types(lowered))
    (quantizer,) = [n for n in lowered.graph.node if n.op_type == "QuantizeLinear"]
    assert quantizer.input[2] == "y_zero_point" and not quantizer.attribute
    assert notes[0].emitted.endswith("+ QuantizeLinear"), notes
    if target == "onnx":
        onnx.checker.check_model(lowered, full_check=True)
    got = dict(zip([p.name for p in spec.outputs], run(lowered, feeds)))
    want = dict(zip([p.name for p in spec.outputs], reference_outputs(op, arrays, attrs)))
    assert_close(got["Y_float"], want["Y_float"], DTYPES[dtype])
    own = reference.quantize_linear(
        got["Y_float"].astype(DTYPES[dtype]), arrays["Y_scale"], arrays["Y_zero_point"]
    )
    assert got["Y"].dtype == own.dtype
    np.testing.assert_array_equal(got["Y"].view(np.uint8), own.view(np.uint8))
    if zero_point == "float8e4m3fn":
        assert {0x7E, 0xFE} <= set(got["Y"].view(np.uint8).ravel().tolist())  # +-448


# (op, present optional inputs, attributes, Scale: "row" over the normalized dim, "group": one
# group's, None) of the norms of hybrid models
HYBRID = [
    ("GatedRMSNorm", ("Scale", "Gate"), {}, "row"),  # Qwen3-Next in float32
    ("GatedRMSNorm", ("Scale", "Gate"), {"cast_before_scale": 1}, "row"),  # ... in half
    ("GatedRMSNorm", ("Scale", "Gate"), {"activation": 1}, "row"),  # Kimi Linear
    ("GatedRMSNorm", ("Scale", "Gate"), {"group_size": 8}, "group"),  # ORT's own
    ("GatedRMSNorm", ("Scale", "Gate"), {"group_size": 8}, "row"),  # Falcon-H1, norm first
    ("GatedRMSNorm", ("Scale", "Gate"), {"group_size": 8, "norm_before_gate": 0}, "row"),
    (
        "GatedRMSNorm",
        ("Scale", "Gate"),
        {"group_size": 8, "norm_before_gate": 0, "cast_before_scale": 1},
        "row",
    ),  # Mamba2
    ("GatedRMSNorm", ("Scale", "Gate"), {"scale_offset": 1.0}, "row"),
    ("GatedRMSNorm", ("Gate",), {"group_size": 8, "activation": 1}, None),
    ("GatedRMSNorm", ("Scale",), {"group_size": 8}, "row"),  # grouped, no gate
    ("L2Norm", (), {}, None),
]


def _ms_exact(op, present, attrs, scale, dtype) -> bool:
    """Whether ONNX Runtime's GatedRMSNorm computes the node: the gate after the norm, float32 or
    rounded once, one group's Scale (the whole row without groups), no offset (a Scale that is
    a graph input cannot take it), and the installed ORT runs the op for this type."""
    from onnxnorm.fusion.lowering import ms_gated_rms_norm_problem

    elem = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16}
    return (
        op == "GatedRMSNorm"
        and "Gate" in present
        and attrs.get("norm_before_gate", 1) == 1
        and (dtype == "float32" or not attrs.get("cast_before_scale"))
        and (scale is None or (scale == "group") == bool(attrs.get("group_size")))
        and not attrs.get("scale_offset")
        and ms_gated_rms_norm_problem(elem.get(dtype, onnx.TensorProto.BFLOAT16)) is None
    )


@pytest.mark.parametrize("target", TARGETS_WITHOUT_LIBRARY)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "variant",
    HYBRID,
    ids=_variant_id,
)
def test_hybrid_norms_lowered(variant, dtype, target, rng):
    """GatedRMSNorm and L2Norm, which ONNX has no op of: ``onnx`` inlines their bodies (standard
    ops only), ``ort`` writes ONNX Runtime's com.microsoft GatedRMSNorm exactly where that op
    computes the node and the body elsewhere, with the reason; all match the reference."""
    op, present, attrs, scale = variant
    attrs = {"epsilon": EPS, **attrs}
    t = DTYPES[dtype]
    shape = (2, 5, 16)
    arrays = {"X": (rng.standard_normal(shape) * 2 + 0.5).astype(t)}
    if "Gate" in present:
        arrays["Gate"] = rng.standard_normal(shape).astype(t)
    if "Scale" in present:
        size = 8 if scale == "group" else 16
        arrays["Scale"] = (rng.standard_normal(size) * 0.3 + 1).astype(t)
    model = single_node_model(op, arrays, attrs, functions=False)
    lowered, notes = lower_with_notes(model, target)
    kinds = set(op_types(lowered))
    if target != "function":
        assert not any(d == catalogue.DOMAIN for d, _ in kinds) and len(notes) == 1
        ms = ("com.microsoft", "GatedRMSNorm") in kinds
        assert ms == (target == "ort" and _ms_exact(op, present, attrs, scale, dtype)), notes
        if not ms:
            assert notes[0].emitted == "inlined function body" and notes[0].reason, notes
        if target == "onnx":
            assert not any(d not in ("", "ai.onnx") for d, _ in kinds)
            onnx.checker.check_model(lowered, full_check=True)
    got = run(lowered, arrays)
    want = reference_outputs(op, arrays, attrs)
    for g, w in zip(got, want):
        assert_close(g, w, t)


# -- the runtimes' forms (--for): each distinct table of forms once --------------------------
def _distinct_form_tables() -> dict[str, str]:
    """A runtime per distinct table of forms that lowers every node (no library form)."""
    seen: dict[tuple, str] = {}
    for runtime in RUNTIMES.values():
        if not runtime.keeps_ops:
            seen.setdefault(tuple(sorted(runtime.forms.items())), runtime.name)
    return {name: name for name in seen.values()}


FORM_RUNTIMES = tuple(_distinct_form_tables())


def _first_form(forms: tuple[str, ...], family: str, opset: int) -> str:
    """The form the lowering must pick: the first one a node of ``family`` can take at
    ``opset`` (X's rank is known in these models)."""
    norm = family in ("layer", "rms")
    takes = {
        "standard": norm and opset >= (17 if family == "layer" else 23),
        "contrib": norm,
        "decomposed": family != "gated",
        "body": True,
        "library": True,
    }
    for form in forms:
        if takes[form]:
            return form
    raise AssertionError(f"no form for {family}")


@pytest.mark.parametrize("runtime", FORM_RUNTIMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "variant",
    VARIANTS,
    ids=_variant_id,
)
@pytest.mark.parametrize("opset", [18, 23])
def test_runtime_forms_match_reference(variant, dtype, runtime, opset, rng):
    """Written --for a runtime, every op takes the first form of the runtime's table it can
    (the standard op where the opset has it, ONNX Runtime's op, the plain decomposition) and
    matches the numpy reference in plain ONNX Runtime, every rounding order included."""
    op, present, attrs, per_head = variant
    attrs = {"epsilon": EPS, **attrs}
    arrays = _arrays(op, present, dtype, per_head, rng)
    model = single_node_model(op, arrays, attrs, opset=opset, functions=False)
    lowered, notes = lower_with_notes(model, runtime=runtime)
    kinds = {t for _, t in op_types(lowered)}
    assert not any(d == catalogue.DOMAIN for d, _ in op_types(lowered)) and len(notes) == 1
    family = "layer" if "Layer" in op else "rms"
    form = _first_form(RUNTIMES[runtime].forms[family], family, opset)
    if form == "decomposed":
        assert "plain ops" in notes[0].emitted and not kinds & NORM_OPS, notes
        assert not kinds & {"Flatten", "Reshape"}, kinds
    elif form == "standard":
        assert kinds & NORM_OPS <= {"LayerNormalization", "RMSNormalization"}, notes
        assert kinds & NORM_OPS, notes
    else:
        assert form == "contrib", form
        assert kinds & NORM_OPS - {"RMSNormalization"}, notes
    got = run(lowered, arrays)
    want = reference_outputs(op, arrays, attrs)
    for g, w in zip(got, want):
        assert_close(g, w, DTYPES[dtype])


@pytest.mark.parametrize("runtime", FORM_RUNTIMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "variant",
    HYBRID,
    ids=_variant_id,
)
def test_runtime_forms_of_hybrid_norms(variant, dtype, runtime, rng):
    """GatedRMSNorm and L2Norm written --for a runtime: L2Norm as the plain decomposition
    (``x / sqrt(sum(x^2) + eps)``), GatedRMSNorm as its body; both match the reference."""
    op, present, attrs, scale = variant
    attrs = {"epsilon": EPS, **attrs}
    t = DTYPES[dtype]
    arrays = {"X": (rng.standard_normal((2, 5, 16)) * 2 + 0.5).astype(t)}
    if "Gate" in present:
        arrays["Gate"] = rng.standard_normal((2, 5, 16)).astype(t)
    if "Scale" in present:
        arrays["Scale"] = (rng.standard_normal(8 if scale == "group" else 16) * 0.3 + 1).astype(t)
    lowered, notes = lower_with_notes(
        single_node_model(op, arrays, attrs, functions=False), runtime=runtime
    )
    assert not any(d == catalogue.DOMAIN for d, _ in op_types(lowered)) and len(notes) == 1
    expected = "plain ops" if op == "L2Norm" else "inlined function body"
    assert notes[0].emitted == expected, notes
    got = run(lowered, arrays)
    want = reference_outputs(op, arrays, attrs)
    for g, w in zip(got, want):
        assert_close(g, w, t)


def test_library_runtimes_keep_the_ops_with_their_bodies(rng):
    arrays = _arrays("RMSNorm", ("Scale",), "float32", False, rng)
    model = single_node_model("RMSNorm", arrays, {}, functions=False)
    for name, runtime in RUNTIMES.items():
        if runtime.keeps_ops:
            lowered, notes = lower_with_notes(model, runtime=name)
            assert [n.op_type for n in lowered.graph.node] == ["RMSNorm"], name
            assert [f.name for f in lowered.functions] == ["RMSNorm"], name
            assert notes[0].emitted == "onnxnorm op"


def test_unknown_runtime():
    with pytest.raises(ValueError, match="unknown runtime 'openvno'"):
        lower(onnx.ModelProto(), runtime="openvno")

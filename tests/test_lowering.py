"""onnxnorm.fusion.lowering: every op, dtype and variant lowered to every target runs in plain
ONNX Runtime and matches the numpy reference; the lowered graph holds the expected ops."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxnorm.fusion.lowering import lower, lower_with_notes, op_types
from onnxnorm.ops import catalogue
from onnxnorm.targets import DEFAULT, TARGETS, help_text
from tests.helpers import BF16, assert_close, reference_outputs, run, single_node_model

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": BF16}
EPS = 2.0 ** -16

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
    direct = (dtype == "float32" and not attrs.get("scale_offset") and not per_head
              and not ("Bias" in present and not layer))
    if op.startswith("Skip") and direct:
        return {"SkipLayerNormalization" if layer else "SkipSimplifiedLayerNormalization"}
    base = {"LayerNormalization" if layer else "SimplifiedLayerNormalization"}
    if op.startswith("Sandwich") and direct:
        base.add("SkipLayerNormalization" if layer else "SkipSimplifiedLayerNormalization")
    return base


NORM_OPS = {"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization",
            "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}


@pytest.mark.parametrize("target", ["ort", "onnx", "function"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{'+'.join(v[1]) or 'none'}-"
                         + "-".join(f"{k}{val}" for k, val in v[2].items()))
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
        assert kinds & NORM_OPS == _expected_ops(op, dtype, attrs, target, opset, present,
                                                 per_head), notes
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
    for command, option in (("export", "--mode"), ("fuse", "--target")):
        sub = parser(command)._subparsers._group_actions[0].choices[command]
        action = next(a for a in sub._actions if option in a.option_strings)
        assert (action.choices, action.default, action.help) == (TARGETS, DEFAULT, help_text())

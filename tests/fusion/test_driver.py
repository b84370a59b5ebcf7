"""onnxnorm.fusion.driver: a rule is commuted and tried only where the graph holds every op its
pattern needs, and skipping the others changes nothing: the same fused graph, node for node, as
a driver that builds and tries every rule."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnxnorm.fusion import _onnxscript_private, driver, fuse, pipeline
from onnxnorm.fusion.lowering import lower
from onnxnorm.fusion.report import Tracker
from onnxnorm.ops import catalogue
from onnxnorm.testing.graphs import single_node_model

#: (op, present optional inputs, attributes): every family the stages fuse
CASES = [
    ("LayerNorm", ("Scale", "Bias"), {}),
    ("RMSNorm", ("Scale",), {"scale_offset": 1.0}),
    ("SkipRMSNorm", ("Scale", "XBias"), {"alpha": 0.5}),
    ("SkipLayerNorm", ("Scale", "Bias"), {}),
    ("SandwichRMSNorm", ("InnerScale", "Scale"), {}),
    ("GatedRMSNorm", ("Scale", "Gate"), {"group_size": 8, "norm_before_gate": 0}),
    ("GatedRMSNorm", ("Scale", "Gate"), {}),
    ("L2Norm", (), {}),
]


def _model(op: str, present: tuple[str, ...], attrs: dict, form: str):
    rng = np.random.default_rng(len(op) + len(present))
    arrays = {"X": rng.standard_normal((2, 5, 32)).astype(np.float32)}
    for name in ("Residual", "Gate", *present):
        if name == "Residual" and not op.startswith(("Skip", "Sandwich")):
            continue
        if name == "Gate" and "Gate" not in present:
            continue
        shape = (2, 5, 32) if name in ("Residual", "Gate") else (32,)
        arrays[name] = rng.standard_normal(shape).astype(np.float32)
    model = single_node_model(op, arrays, attrs, functions=False)
    # the form another tool writes: ONNX's ops, ONNX Runtime's, plain ops (OpenVINO's form)
    return lower(model, "onnx", runtime="openvino") if form == "plain" else lower(model, form)


def _fused(model) -> tuple[str, bytes]:
    fused, report = fuse(model, "fused")
    return str(report), fused.SerializeToString()


@pytest.mark.parametrize("form", ["onnx", "ort", "plain"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'+'.join(c[1]) or 'none'}")
def test_skipping_rules_changes_nothing(case, form, monkeypatch):
    model = _model(*case, form)
    fused = _fused(model)
    assert f"{catalogue.DOMAIN}" in fused[0] and "fused 0" not in fused[0], fused[0]
    # every rule built and tried at every node of its root op, as before the driver skipped any
    monkeypatch.setattr(driver, "required_ops", lambda rule: frozenset())
    monkeypatch.setattr(driver, "_BUILT", driver._Built())
    assert _fused(model) == fused


def _expected(stage: driver.Driver, model: ir.Model) -> set[int]:
    present = driver.ops_of(model)
    return {i for i, entry in enumerate(stage.entries) if entry.needs <= present}


def test_rules_are_commuted_only_where_the_graph_may_match():
    model = ir.serde.deserialize_model(_model("RMSNorm", ("Scale",), {}, "onnx"))
    stages = {name: driver.Driver(rules) for name, rules in pipeline.stage_rules(Tracker())}
    for name in ("skip", "sandwich", "xbias", "gated"):
        expected = _expected(stages[name], model)
        stages[name].apply(model)
        assert set(stages[name]._variants) <= expected, name
    # no onnxnorm op yet: every rule of the residual stages needs one
    assert not any(stages[name].variants_built() for name in ("skip", "sandwich", "xbias"))
    norms = stages["norms"]
    norms.apply(model)
    built = {norms.entries[i].rule.name for i in norms._variants}
    # the decomposed RMSNorm holds no Sub: no rule of a decomposed LayerNorm was built
    assert built and not any(name.startswith("LayerNormCore") for name in built), built
    assert norms.variants_built() < len(norms.entries)


def test_required_ops_are_read():
    _onnxscript_private.check()

    class Opaque:
        pass

    # a rule whose pattern cannot be read needs nothing: it is built for every graph
    assert _onnxscript_private.required_ops(Opaque()) == frozenset()

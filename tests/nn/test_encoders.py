"""Encoders (BERT, ViT, CLIP text and vision, Whisper's encoder) exported with a dynamic batch
(and sequence) by both PyTorch exporters: every residual add is absorbed with parity, as many as
ONNX Runtime's transformers optimizer and onnxscript's ort_fusions absorb, and the one Add
before the first norm, which broadcasts the position embeddings over the batch, is reported
with its dims. ORT's symbolic shape inference proves the dims equal where onnx's cannot
(TorchScript exports), and never by assuming that a broadcast's two dims are equal."""

from __future__ import annotations

import collections
import os

import onnx
import pytest
from onnx import TensorProto, helper

from onnxnorm.fusion import fuse
from onnxnorm.fusion.verify import verify

pytest.importorskip("transformers")

from models import compare, corpus

#: encoder -> (norms, residual adds): each layer's two norms and the final one (CLIP vision:
#: the norm before the layers instead; its final norm reads the pooled token, which the test
#: does not return); every residual add that a norm follows
COUNTS = {
    "bert_encoder": (5, 4),
    "vit": (5, 4),
    "clip_text": (5, 4),
    "clip_vision": (5, 3),
    "whisper_encoder": (5, 4),
}
#: the first norm's Add that stays: embeddings + position embeddings of batch 1
FIRST_ADD = {
    "bert_encoder": "may broadcast: dim 0 is 1 in one and batch in the other",
    "vit": "may broadcast: dim 0 is 1 in one and batch in the other",
    "clip_text": "may broadcast: dim 0 is 1 in one and batch in the other",
    "clip_vision": "may broadcast: dim 0 is 1 in one and batch in the other",
    "whisper_encoder": "differ in rank (3 and 2): the Add broadcasts",
}


@pytest.fixture(scope="module")
def exported():
    cache = {}

    def get(name, exporter):
        if (name, exporter) not in cache:
            cache[name, exporter] = corpus.export(name, exporter)[0]
        return cache[name, exporter]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("name", list(corpus.ENCODERS))
def test_every_residual_add_absorbed_with_parity(exported, name, exporter, tmp_path, monkeypatch):
    model = exported(name, exporter)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    monkeypatch.chdir(tmp_path)
    fused, report = fuse(model)
    assert not os.listdir(tmp_path)  # ORT's inference saves where it stops; ours does not
    norms, adds = COUNTS[name]
    assert (report.norms, report.residual_adds) == (norms, adds), str(report)
    ops = collections.Counter(n.op_type for n in fused.graph.node if n.domain == "onnxnorm")
    assert ops == {"SkipLayerNorm": adds, "LayerNorm": norms - adds}
    assert not [n for n in fused.graph.node if n.op_type == "LayerNormalization"]
    skips = report["SkipLayerNorm (residual add)"].skips
    assert len(skips) == 1 and FIRST_ADD[name] in skips[0].reason, str(report)
    checks = verify(model, fused, sizes={"batch": 3, "sequence": 6})
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(corpus.ENCODERS))
def test_at_least_as_many_as_other_tools(exported, name, tmp_path):
    model = exported(name, "torchscript")
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    mine = compare.count(fuse(model)[0])
    for tool, run in (
        ("ort", lambda: compare.run_ort(model, path, name)),
        ("onnxscript", lambda: compare.run_onnxscript(model, path)),
    ):
        theirs = compare.count(run())
        assert mine[0] >= theirs[0] and mine[1] >= theirs[1], (tool, mine, theirs)


def _residual_model(x_dims, r_dims):
    """LayerNorm(x + r) over the last axis, with the given (symbolic) input shapes."""
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [8], [0.5 + i / 8 for i in range(8)])
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "r"], ["sum"]),
            helper.make_node("LayerNormalization", ["sum", "scale"], ["y"], axis=-1),
        ],
        "residual",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, r_dims),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [scale],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_add_that_may_broadcast_is_never_absorbed():
    """Two dims of different names may differ (one may be 1 at run time): ORT's inference
    with auto_merge would call them equal; the pass keeps the Add and says which dims."""
    model = _residual_model(["n", 8], ["m", 8])
    fused, report = fuse(model)
    assert report.residual_adds == 0
    [skip] = report["SkipLayerNorm (residual add)"].skips
    assert skip.reason.startswith(
        "cannot prove that the residual add's operands have the same shape: "
        "dim 0 is n and m ([n, 8] and [m, 8])"
    )
    checks = verify(model, fused, sizes={"n": 3, "m": 1})  # a broadcast the original runs
    assert checks and all(c.ok for c in checks)


def test_an_add_of_equal_dims_is_absorbed():
    model = _residual_model(["n", 8], ["n", 8])
    fused, report = fuse(model)
    assert report.residual_adds == 1
    assert [n.op_type for n in fused.graph.node] == ["SkipLayerNorm"]
    checks = verify(model, fused, sizes={"n": 3})
    assert checks and all(c.ok for c in checks)

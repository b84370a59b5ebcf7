"""Models from the wild (models/wild.py): older opsets, hand-built graphs, sloppy metadata.

On every model that ONNX Runtime loads, `onnxnorm fuse` fuses its norms for every target, never
ends in an internal error, writes a model that ONNX Runtime loads and that matches the original,
and mends what ONNX Runtime tolerates, saying so. What the pass refuses, ONNX Runtime refuses too
(tests/validate/test_hostile.py).
"""

from __future__ import annotations

import collections
import contextlib

import onnx
import onnxruntime as ort
import pytest

from models import compare, wild
from onnxnorm import cli, runtime
from onnxnorm.fusion import fuse
from onnxnorm.fusion.pipeline import OutputDoesNotLoad
from onnxnorm.fusion.verify import load_problem, verify
from onnxnorm.ops import catalogue
from tests.support.matrix import NODE_TARGETS, TARGETS, TARGETS_WITHOUT_LIBRARY
from tests.support.tools import load_tool

CORPUS = {w.name: w for w in wild.corpus()}
SLOPPY = {s.name: s for s in wild.sloppy()}


def _loads(model: onnx.ModelProto, with_library: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if with_library:
        runtime.register(options)
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _onnxnorm_ops(model: onnx.ModelProto) -> dict[str, int]:
    return dict(
        collections.Counter(n.op_type for n in model.graph.node if n.domain == catalogue.DOMAIN)
    )


def _check_parity(original: onnx.ModelProto, fused: onnx.ModelProto, with_library: bool) -> None:
    checks = verify(original, fused, with_library=with_library)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(CORPUS))
def test_corpus_fuses_for_every_target(name, target):
    entry = CORPUS[name]
    original = entry.build()
    _loads(original, with_library=False)  # the premise: ONNX Runtime runs it
    fused, report = fuse(original, target)
    assert report.norms == sum(entry.expect.values()), str(report)
    if target in NODE_TARGETS:
        assert _onnxnorm_ops(fused) == entry.expect, str(report)
        assert not [n for n in fused.graph.node if n.op_type in ("ReduceMean", "Sqrt")], (
            "a norm was left decomposed"
        )
    else:
        assert _onnxnorm_ops(fused) == {}, "a node was not lowered"
    assert fused.opset_import and {o.domain for o in fused.opset_import} >= {""}
    _check_parity(original, fused, with_library=target != "onnx")
    if target == "function":
        # no library: ONNX Runtime inlines each node's body, written in the model's own opset
        assert {o.version for o in fused.opset_import if o.domain == ""} == {
            o.version for o in original.opset_import if o.domain in ("", "ai.onnx")
        }
        _check_parity(original, fused, with_library=False)


def _fused_by_others(model: onnx.ModelProto, path) -> tuple[int, int]:
    """The most (norms, residual adds) in single ops that ONNX Runtime's graph transformers
    (session optimization), its transformers optimizer or onnxscript's ort_fusions leave."""
    onnx.save(model, path)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(path.with_suffix(".ort.onnx"))
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    results = [compare.count(onnx.load(options.optimized_model_filepath))]
    for tool in (
        lambda: compare.run_ort(model, path, "bert"),
        lambda: compare.run_onnxscript(model, path),
    ):
        with contextlib.suppress(Exception):  # a tool that fails on the model fuses nothing
            results.append(compare.count(tool()))
    return max(r[0] for r in results), max(r[1] for r in results)


@pytest.mark.parametrize("name", [n for n in CORPUS if "opset1" in n or "opset7" in n])
def test_fuses_at_least_what_the_other_tools_fuse(tmp_path, name):
    original = CORPUS[name].build()
    norms, adds = _fused_by_others(original, tmp_path / "model.onnx")
    fused, _ = fuse(original, "fused")
    mine = compare.count(fused)
    assert mine[0] >= norms and mine[1] >= adds, (mine, (norms, adds))


@pytest.mark.parametrize("name", list(SLOPPY))
def test_sloppy_models_are_mended_and_say_so(tmp_path, capsys, name):
    entry = SLOPPY[name]
    original = entry.build()
    _loads(original, with_library=False)  # ONNX Runtime tolerates the fault
    path, out = tmp_path / "model.onnx", tmp_path / "fused.onnx"
    onnx.save(original, path)
    assert cli.main(["fuse", str(path), "-o", str(out), "--verify"]) == 0
    printed = capsys.readouterr().out
    assert entry.report in printed, printed
    fused = onnx.load(out)
    assert _onnxnorm_ops(fused) == entry.expect, printed
    _loads(fused, with_library=True)
    for target in TARGETS_WITHOUT_LIBRARY:
        lowered, report = fuse(original, target)
        assert entry.report in str(report)
        _check_parity(original, lowered, with_library=target != "onnx")


def test_the_written_model_is_checked_to_load(monkeypatch):
    """A fused model ONNX Runtime would not load is never returned (nor written): a bug of the
    pass, which the command line reports as an internal error (exit 2)."""
    from onnxnorm.fusion import pipeline

    original = CORPUS["gpt2_opset13"].build()
    real = pipeline.lower_with_notes

    def broken(model, target, weights=(), runtime=None):
        lowered, notes = real(model, target, weights, runtime)
        lowered.graph.node[-1].input[0] = "lost"  # a value the rewrite forgot to produce
        return lowered, notes

    monkeypatch.setattr(pipeline, "lower_with_notes", broken)
    with pytest.raises(
        OutputDoesNotLoad, match="does not load in ONNX Runtime, although the input does"
    ):
        fuse(original, "fused")


def test_the_load_check_reads_no_weight():
    """The check hands ONNX Runtime the graph with its large weights as inputs."""
    model = CORPUS["bert_opset13"].build()
    assert load_problem(model) is None
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    broken.graph.node[0].op_type = "NoSuchOp"
    assert "NoSuchOp" in load_problem(broken)


def test_nan_outputs_of_both_models_are_equal_in_verify():
    model = SLOPPY["LayerNormalization, epsilon NaN"].build()
    fused, report = fuse(model, "fused")
    assert "epsilon must be a finite number >= 0, got nan" in str(report)
    checks = verify(model, fused)
    assert checks and all(c.ok for c in checks)


def _bfloat16_norm(opset: int) -> onnx.ModelProto:
    """One onnxnorm RMSNorm on bfloat16, whose body needs opset 13 (Cast-13 added bfloat16)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("RMSNorm", ["x"], ["y"], domain=catalogue.DOMAIN)],
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 8])],
    )
    return helper.make_model(
        graph,
        ir_version=7,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(catalogue.DOMAIN, 1)],
    )


def test_upgrade_opset_gives_the_body_or_says_why_not(monkeypatch):
    """--upgrade-opset takes an opset-11 model whose bfloat16 node has no body there to 13;
    where onnx's version converter fails, the model keeps its opset, the node stays without a
    body, and the report says both."""
    from onnx import version_converter

    fused, report = fuse(_bfloat16_norm(11), "function", upgrade=True)
    assert report.upgrade.startswith("ONNX opset 11 -> 13"), str(report)
    assert [n.overload for n in fused.graph.node] == ["none_bf16"] and len(fused.functions) == 1

    def refuse(model, target):
        raise RuntimeError("no adapter for this op\nmore detail")

    monkeypatch.setattr(version_converter, "convert_version", refuse)
    fused, report = fuse(_bfloat16_norm(11), "function", upgrade=True)
    assert (
        "--upgrade-opset: onnx's version converter could not take the model from opset 11 "
        "to 13 (no adapter for this op); the model keeps its opset"
    ) in str(report)
    assert [n.overload for n in fused.graph.node] == [""] and not fused.functions
    assert "X is bfloat16, which ONNX casts to from opset 13 on" in str(report)


def test_the_comparison_times_the_fuse_command_as_a_user_runs_it(tmp_path):
    """tools/fusion_page.py times `onnxnorm fuse` with every option at its default; it once built
    the command's arguments by hand and broke when the command gained an option."""
    path, out = tmp_path / "model.onnx", tmp_path / "out.onnx"
    onnx.save(CORPUS["bert_opset13"].build(), path)
    page = load_tool("fusion_page")
    seconds, peak = page.timed(page.TIMED["onnxnorm fuse"], path, out)
    assert seconds > 0 and peak > 0
    assert _onnxnorm_ops(onnx.load(out)) == CORPUS["bert_opset13"].expect


@pytest.mark.parametrize("target", TARGETS_WITHOUT_LIBRARY)
def test_an_opset_below_7_keeps_the_node_without_a_body_and_says_why(target):
    """Below opset 7 (Add and Mul broadcast from 7 on) no body is written, on any target: the
    node stays an onnxnorm node, and the report names the opset to convert to."""
    model = _bfloat16_norm(6)
    model.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    fused, report = fuse(model, target)
    assert [(n.domain, n.op_type, n.overload) for n in fused.graph.node] == [
        (catalogue.DOMAIN, "RMSNorm", "")
    ] and not fused.functions
    assert (
        "onnxnorm writes function bodies in ONNX opset 7 or newer; the model imports opset "
        "6: convert the model to opset 7 or newer"
    ) in str(report), str(report)

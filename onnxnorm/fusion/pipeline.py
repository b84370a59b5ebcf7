"""The fuse pipeline: ONNX model in, model with onnxnorm nodes and a report out."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern

from onnxnorm.ops import catalogue
from onnxnorm.fusion import rms_norm
from onnxnorm.fusion.lowering import TARGETS, lower
from onnxnorm.fusion.report import FusionReport, Tracker


def rules(tracker: Tracker | None = None) -> pattern.RewriteRuleSet:
    """Every onnxnorm fusion rule as one onnxscript rule set (commuted variants included).

    Pass a :class:`Tracker` to learn what the rules found, fused and skipped
    (``tracker.report()``); its counts hold for a run without a ``MatchingTracer``.
    """
    return pattern.RewriteRuleSet(rms_norm.rule_families(tracker or Tracker()), commute=True)


def _count_fused_ops(model: ir.Model) -> int:
    return sum(1 for node in ir.traversal.RecursiveGraphIterator(model.graph)
               if node.domain == catalogue.DOMAIN)


def fuse(model: onnx.ModelProto, target: str = "function") -> tuple[onnx.ModelProto, FusionReport]:
    """Rewrites the decomposed norms of ``model`` into onnxnorm ops; ``model`` is left as is.

    ``target`` "function" gives every onnxnorm node its model-local function body (any runtime
    runs it), "fused" leaves the bodies out (the onnxnorm library is needed to run it).
    """
    if target not in TARGETS:
        raise ValueError(f"unknown fusion target {target!r}; supported: {', '.join(TARGETS)}")
    graph = ir.serde.deserialize_model(model)
    # the checks need element types and shapes, which exporters do not always write out
    common_passes.ShapeInferencePass(strict_mode=False)(graph)
    before = _count_fused_ops(graph)
    tracker = Tracker()
    rules(tracker).apply_to_model(graph)
    ir.passes.PassManager([
        common_passes.RemoveUnusedNodesPass(),
        common_passes.RemoveUnusedFunctionsPass(),
        common_passes.RemoveUnusedOpsetsPass(),
    ])(graph)
    report = tracker.report()
    if _count_fused_ops(graph) - before != report.fused_total:
        raise RuntimeError("internal error: the fusion report disagrees with the rewritten graph")
    fused = ir.serde.serialize_model(graph)
    return lower(fused, target), report

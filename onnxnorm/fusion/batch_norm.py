"""Inference BatchNormalization folded into the Conv, ConvTranspose or Gemm before it, with
onnxscript's own rules (their checks: constant weights and statistics, the BatchNormalization
the only user of the layer's output, inference mode)."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules.common import (fuse_batchnorm_into_conv_rule,
                                              fuse_batchnorm_into_conv_transpose_rule,
                                              fuse_batchnorm_into_gemm_rule)

from onnxnorm.fusion.report import Tracker

TITLE = "BatchNormalization folded into Conv/ConvTranspose/Gemm (onnxscript rule)"


def rule_set() -> pattern.RewriteRuleSet:
    return pattern.RewriteRuleSet([fuse_batchnorm_into_conv_rule,
                                   fuse_batchnorm_into_conv_transpose_rule,
                                   fuse_batchnorm_into_gemm_rule])


def _batch_norms(model: ir.Model) -> list[ir.Node]:
    return [n for n in ir.traversal.RecursiveGraphIterator(model.graph)
            if n.op_type == "BatchNormalization" and n.domain in ("", "ai.onnx")]


def fold(model: ir.Model, tracker: Tracker) -> None:
    tracker.register(TITLE)
    before = _batch_norms(model)
    if not before:
        return
    rules = rule_set()
    try:
        while rules.apply_to_model(model):
            common_passes.RemoveUnusedNodesPass()(model)
    except (OSError, ValueError):  # weights in external data that cannot be read here
        pass
    remaining = set(_batch_norms(model))
    for node in before:
        if node in remaining:
            producer = node.inputs[0].producer() if node.inputs[0] is not None else None
            before_op = producer.op_type if producer is not None else "a graph input"
            tracker.checked(TITLE, node, f"after {before_op}: no Conv/ConvTranspose/Gemm with "
                                         "constant weights and statistics to fold it into, or "
                                         "training outputs in use")
        else:
            tracker.checked(TITLE, node, None)
            tracker.fused(TITLE, node)

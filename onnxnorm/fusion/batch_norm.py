"""Inference BatchNormalization folded into the Conv, ConvTranspose or Gemm before it, with
onnxscript's own rules (their checks: constant weights and statistics, the BatchNormalization
the only user of the layer's output, inference mode), and into a MatMul with a 2-D output
(features on axis 1, as BatchNorm1d after a Linear exports) with :class:`FoldIntoMatMul`."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules.common import (
    fuse_batchnorm_into_conv_rule,
    fuse_batchnorm_into_conv_transpose_rule,
    fuse_batchnorm_into_gemm_rule,
)

from onnxnorm.fusion.report import Tracker

TITLE = "BatchNormalization folded into Conv/ConvTranspose/Gemm (onnxscript rule) or MatMul"


def _constant(value: ir.Value) -> ir.TensorProtocol:
    """The tensor of a value that ``check`` found constant."""
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        raise ValueError(f"{value.name} is not a constant")
    return tensor


class FoldIntoMatMul(pattern.RewriteRuleClassBase):
    """``BatchNormalization(MatMul(x, W))`` with a 2-D output [N, C] (BatchNorm1d after a
    Linear): the per-feature factor s = gamma / sqrt(var + eps) scales W's columns and the
    shift becomes an Add: ``MatMul(x, W * s) + (beta - mean * s)`` (float32 arithmetic, as the
    Conv folding)."""

    def pattern(self, op, x, w, gamma, beta, mean, var):
        return op.BatchNormalization(
            op.MatMul(x, w, _outputs=["product"]), gamma, beta, mean, var, _outputs=["y"]
        )

    # onnxscript calls check(context, **bindings), as its docs write a rule's check; its base
    # class declares check(op, *args, **kwargs)
    def check(self, context, x, w, gamma, beta, mean, var, product, y, **_):  # type: ignore[override]
        result = pattern.MatchResult()
        node = y.producer()
        if (
            node.attributes.get("training_mode") is not None
            and node.attributes["training_mode"].value
        ):
            return result.fail("training mode")
        if len(node.outputs) > 1 and any(v.uses() for v in node.outputs[1:]):
            return result.fail("running statistics are used")
        for value in (w, gamma, beta, mean, var):
            if value.is_graph_input() or ir.convenience.get_const_tensor(value) is None:
                return result.fail(f"{value.name} is not a constant")
        if len(product.uses()) != 1 or any(u is not product.producer() for u, _ in w.uses()):
            return result.fail("the MatMul's output or weight is used elsewhere")
        shape = product.shape
        weight = _constant(w)
        if shape is None or shape.rank() != 2 or len(weight.shape) != 2:
            return result.fail(
                "BatchNormalization's channel axis 1 is the MatMul's feature "
                "axis only for a 2-D product of a 2-D weight"
            )
        return result

    def rewrite(self, op, x, w, gamma, beta, mean, var, y, **_):
        import numpy as np

        node = y.producer()
        eps = node.attributes["epsilon"].value if "epsilon" in node.attributes else 1e-5
        values = [_constant(v).numpy().astype(np.float64) for v in (w, gamma, beta, mean, var)]
        weight, g, b, m, v = values
        factor = g / np.sqrt(v + eps)
        dtype = _constant(w).numpy().dtype
        new_w = ir.tensor((weight * factor[None, :]).astype(dtype))
        new_b = ir.tensor((b - m * factor).astype(dtype))
        product = op.MatMul(x, op.initializer(new_w, name=f"{w.name}_bn"))
        return op.Add(product, op.initializer(new_b, name=f"{w.name}_bn_shift"))


def rule_set() -> pattern.RewriteRuleSet:
    return pattern.RewriteRuleSet(
        [
            fuse_batchnorm_into_conv_rule,
            fuse_batchnorm_into_conv_transpose_rule,
            fuse_batchnorm_into_gemm_rule,
            FoldIntoMatMul().rule(),
        ]
    )


def _batch_norms(model: ir.Model) -> list[ir.Node]:
    return [
        n
        for n in ir.traversal.RecursiveGraphIterator(model.graph)
        if n.op_type == "BatchNormalization" and n.domain in ("", "ai.onnx")
    ]


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
            tracker.checked(
                TITLE,
                node,
                f"after {before_op}: no Conv/ConvTranspose/Gemm, or "
                "MatMul with a 2-D product, with constant weights and "
                "statistics to fold it into, or training outputs in use",
            )
        else:
            tracker.checked(TITLE, node, None)
            tracker.fused(TITLE, node)

"""Rules that turn an RMSNorm, decomposed or as another op, into one ``onnxnorm::RMSNorm``."""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxnorm.fusion._base import (DATA_TYPES, FLOAT, FusionRule, Rejected, attribute,
                                   check_scale, constant, dtype, epsilon, scalar)
from onnxnorm.fusion.report import Tracker


def _same_type(x_type: ir.DataType, **values: ir.Value) -> None:
    if x_type not in DATA_TYPES:
        raise Rejected(f"X is {x_type.name}; onnxnorm takes {sorted(t.name for t in DATA_TYPES)}")
    for what, value in values.items():
        if dtype(value, what) != x_type:
            raise Rejected(f"{what} is {dtype(value, what).name}, X is {x_type.name}")


def _check_last_axis_mean(node: ir.Node, x: ir.Value) -> None:
    """The ReduceMean must keep its dims and reduce over X's last axis alone."""
    if attribute(node, "keepdims", 1) != 1:
        raise Rejected(f"ReduceMean {node.name!r} has keepdims=0")
    axes_input = node.inputs[1] if len(node.inputs) > 1 else None
    if axes_input is not None:
        axes = [int(a) for a in constant(axes_input, "the ReduceMean axes").reshape(-1)]
    else:
        axes = list(attribute(node, "axes", None) or [])
    rank = x.shape.rank() if x.shape is not None else None
    if not axes:
        if attribute(node, "noop_with_empty_axes", 0):
            raise Rejected(f"ReduceMean {node.name!r} has no axes and noop_with_empty_axes=1")
        if rank is None:
            raise Rejected(f"ReduceMean {node.name!r} reduces over all axes of X of unknown rank")
        axes = list(range(rank))
    if rank is None:
        last = axes == [-1]
    else:
        last = len(axes) == 1 and -rank <= axes[0] < rank and axes[0] % rank == rank - 1
    if not last:
        raise Rejected(f"ReduceMean {node.name!r} reduces over axes {axes}, "
                       "not over the last axis only")


class DecomposedRMSNorm(FusionRule):
    """``x / sqrt(mean(x^2, -1) + eps) * Scale`` as exporters spell it.

    The square is ``Pow(x, 2)`` or ``Mul(x, x)``; the division ``Div(x, rms)``,
    ``Mul(x, Reciprocal(rms))`` or ``Mul(x, Div(1, rms))``; every Add and Mul in either operand
    order (the rule set commutes them). With ``cast``, X is cast to float32 before the statistics
    and the normalized value back to X's type before the scale: rounding order A.
    """

    title = "RMSNorm (llama pattern)"
    fused_op = "RMSNorm"

    def __init__(self, tracker: Tracker, cast: bool) -> None:
        super().__init__(tracker, "RMSNormLlamaCast" if cast else "RMSNormLlama")
        self.cast = cast

    def pattern(self, op, x, scale, eps, two, one):
        xf = op.Cast(x, _outputs=["xf"]) if self.cast else x
        square = pattern.OrValue([op.Pow(xf, two), op.Mul(xf, xf)])
        mean = op.ReduceMean(square, _allow_other_inputs=True, _outputs=["mean"])
        rms = op.Sqrt(op.Add(mean, eps))
        inverse = pattern.OrValue([op.Reciprocal(rms), op.Div(one, rms)])
        normalized = pattern.OrValue([op.Div(xf, rms), op.Mul(xf, inverse)])
        if self.cast:
            normalized = op.Cast(normalized, _outputs=["rounded"])
        return op.Mul(normalized, scale, _outputs=["y"])

    def inspect(self, context, x, scale, eps, mean, y, two=None, one=None, **bindings
                ) -> dict[str, Any]:
        x_type = dtype(x, "X")
        stats = dtype(bindings["xf"], "the cast X") if self.cast else x_type
        if stats != FLOAT:
            raise Rejected(f"the statistics are computed in {stats.name}; "
                           "onnxnorm computes them in FLOAT")
        rounded = {"the normalized value": bindings["rounded"]} if self.cast else {}
        _same_type(x_type, Scale=scale, Y=y, **rounded)
        if two is not None and scalar(two, "the Pow exponent") != 2:
            raise Rejected(f"the Pow exponent is {scalar(two, 'the Pow exponent')}, not 2")
        if one is not None and scalar(one, "the reciprocal's numerator") != 1:
            raise Rejected(f"the reciprocal's numerator is {scalar(one, 'the numerator')}, not 1")
        _check_last_axis_mean(mean.producer(), x)
        value = epsilon(scalar(eps, "epsilon"))
        check_scale(scale, x, -1)
        return {"axis": -1, "epsilon": value, "cast_before_scale": int(self.cast and x_type != FLOAT)}


class StandardRMSNorm(FusionRule):
    """ONNX's ``RMSNormalization`` (opset 23): the same math in rounding order A, statistics in
    ``stash_type``."""

    title = "RMSNorm (ONNX RMSNormalization)"
    fused_op = "RMSNorm"

    def __init__(self, tracker: Tracker) -> None:
        super().__init__(tracker, "RMSNormalization")

    def pattern(self, op, x, scale):
        return op.RMSNormalization(x, scale, _outputs=["y"])

    def inspect(self, context, x, scale, y, **_) -> dict[str, Any]:
        node = y.producer()
        stash = attribute(node, "stash_type", 1)
        if stash != FLOAT:
            raise Rejected(f"stash_type is {ir.DataType(stash).name}; "
                           "onnxnorm computes the statistics in FLOAT")
        x_type = dtype(x, "X")
        _same_type(x_type, Scale=scale, Y=y)
        axis = attribute(node, "axis", -1)
        rank = x.shape.rank() if x.shape is not None else None
        if rank is not None and not -rank <= axis < rank:
            raise Rejected(f"axis {axis} is out of range for X of rank {rank}")
        value = epsilon(attribute(node, "epsilon", 1e-5))
        check_scale(scale, x, axis)
        return {"axis": axis, "epsilon": value, "cast_before_scale": int(x_type != FLOAT)}


def rule_families(tracker: Tracker) -> list[pattern.RewriteRule]:
    return [DecomposedRMSNorm.rule(tracker, cast=False), DecomposedRMSNorm.rule(tracker, cast=True),
            StandardRMSNorm.rule(tracker)]

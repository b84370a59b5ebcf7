"""The checks the fusion rules share: the element types a node takes, the axis a mean runs
over, a weight that fits X, and the pattern of a square (``Pow(v, 2)`` or ``Mul(v, v)``)."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxnorm.fusion._base import (
    DATA_TYPES,
    FLOAT,
    NotThisPattern,
    Rejected,
    attribute,
    dtype,
    int_values,
)


def check_type(x_type: ir.DataType, **values: ir.Value) -> None:
    if x_type not in DATA_TYPES:
        raise Rejected(f"X is {x_type.name}; onnxnorm takes {sorted(t.name for t in DATA_TYPES)}")
    for what, value in values.items():
        if dtype(value, what) != x_type:
            raise Rejected(f"{what} is {dtype(value, what).name}, X is {x_type.name}")


def check_mixed(x_type: ir.DataType, y: ir.Value, **weights: ir.Value | None) -> bool:
    """Whether a single norm op is the mixed form (X float16 or bfloat16, Y and its weights
    float32: ONNX Runtime's LayerNormalization and SimplifiedLayerNormalization, which compute
    in float32 and give Y in Scale's type, unrounded), which onnxnorm's LayerNorm and RMSNorm
    take as they are; else checks that Y and the weights have X's type."""
    present = {what: value for what, value in weights.items() if value is not None}
    if x_type in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16) and dtype(y, "Y") == FLOAT:
        for what, value in present.items():
            if dtype(value, what) != FLOAT:
                raise Rejected(
                    f"Y is FLOAT, X is {x_type.name} and {what} is "
                    f"{dtype(value, what).name}: a float32 Y takes float32 weights"
                )
        return True
    check_type(x_type, Y=y, **present)
    return False


def mean_axis(node: ir.Node, x: ir.Value, rank: int | None = None) -> int:
    """The first normalized axis, negative, of a ReduceMean (or the ReduceSum of an L2 norm)
    over the trailing axes [axis, rank) of X that keeps its dims (``rank``: X's where the caller
    knows it better than X's shape, a 2-D view). The axes may be computed from X's rank, as
    ONNX's function bodies do."""
    op = node.op_type
    if attribute(node, "keepdims", 1) != 1:
        raise Rejected(f"{op} {node.name!r} has keepdims=0")
    axes_input = node.inputs[1] if len(node.inputs) > 1 else None
    if axes_input is not None:
        axes = [int(a) for a in int_values(axes_input, f"the {op} axes").reshape(-1)]
    else:
        axes = list(attribute(node, "axes", None) or [])
    if rank is None and x.shape is not None:
        rank = x.shape.rank()
    if not axes:
        if attribute(node, "noop_with_empty_axes", 0):
            raise Rejected(f"{op} {node.name!r} has no axes and noop_with_empty_axes=1")
        if rank is None:
            raise Rejected(f"{op} {node.name!r} reduces over all axes of X of unknown rank")
        axes = list(range(rank))
    if rank is None:
        # negative axes need no rank: [-k, ..., -1] in any order
        negative = sorted(axes)
        if negative == list(range(-len(axes), 0)):
            return negative[0]
    elif all(-rank <= a < rank for a in axes):
        trailing = sorted(a % rank for a in axes)
        if trailing == list(range(rank - len(axes), rank)):
            return -len(axes)
    raise Rejected(
        f"{op} {node.name!r} reduces over axes {axes}, not over the trailing axes [axis, rank) of X"
    )


def check_weight(value: ir.Value, x: ir.Value, what: str, axis: int | None = None) -> None:
    """A Scale/Bias must be a weight: a constant, or a value of lower rank than X (a residual
    stream or any other activation of X's full shape is never taken for one). With ``axis``,
    the norm's: a norm over all of X (ONNX's axis-0 test cases) takes a value of X's very
    shape, all dims known, as its weight, since there the weight spans every element."""
    if ir.convenience.get_const_tensor(value) is not None:
        return
    x_shape, shape = x.shape, value.shape
    if x_shape is not None and shape is not None and shape.rank() < x_shape.rank():
        return
    if (
        axis is not None
        and x_shape is not None
        and shape is not None
        and axis in (0, -x_shape.rank())
        and shape.rank() == x_shape.rank()
        and x_shape.is_static()
        and list(shape.dims) == list(x_shape.dims)
    ):
        return
    raise NotThisPattern(f"{what} ({value.name!r}) is neither a constant nor of lower rank than X")


# ---------------------------------------------------------------------------------------------
# core rules


def square(op, v, two):
    return pattern.OrValue([op.Pow(v, two), op.Mul(v, v)])


__all__ = ["check_mixed", "check_type", "check_weight", "mean_axis", "square"]

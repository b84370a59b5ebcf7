"""LayerNorm as other tools spell it out: ONNX's own function body of LayerNormalization (what
onnx's function expansion and the tools that inline functions write) and the form tf2onnx
writes for Keras' LayerNormalization. Each computes the same function as onnxnorm's LayerNorm
in another arrangement of float32 arithmetic, which the report notes.

(ONNX's function body of RMSNormalization needs no rule of its own: it is the decomposed RMSNorm
of ``norms.RMSCore`` with axes computed from X's rank, which ``checks.mean_axis`` evaluates.)
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxnorm.fusion._base import (
    FLOAT,
    FusionRule,
    Rejected,
    Replacement,
    attribute,
    check_scale,
    dead,
    dtype,
    epsilon,
    int_values,
    scalar,
    statistics_type,
)
from onnxnorm.fusion.checks import check_type, check_weight, mean_axis, square

#: the report's note on the one-pass variance of ONNX's function body
ONE_PASS = (
    "the original computes the variance in one pass, E[x^2] - E[x]^2 (ONNX's function "
    "body of LayerNormalization); onnxnorm computes it in two passes, E[(x - mean)^2], "
    "which is more accurate for rows far from zero"
)
#: the report's note on TensorFlow's arrangement
FOLDED = (
    "the original folds Scale into 1 / sqrt(var + eps) and computes x * s + (Bias - "
    "mean * s) (TensorFlow's batch_normalization); onnxnorm computes (x - mean) / "
    "sqrt(var + eps) * Scale + Bias: the same function, rounded differently"
)


def _notes(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _axis(x: ir.Value, axis: int, what: str) -> int:
    """``axis`` of X made negative (the fused op's axis then holds for any rank)."""
    rank = x.shape.rank() if x.shape is not None else None
    if rank is None:
        if axis < 0:
            return axis
        raise Rejected(f"{what} {axis} with X ({x.name!r}) of unknown rank")
    if not -rank <= axis < rank:
        raise Rejected(f"{what} {axis} is out of range for X of rank {rank}")
    return axis - rank if axis >= 0 else axis


def _flatten_axis(node: ir.Node, x: ir.Value) -> int:
    """The axis of the Flatten of X, or of the Reshape to [rows, cols] that constant folding makes
    of it (onnxscript's optimizer): the last axis whose trailing dims hold cols elements."""
    if node.op_type == "Flatten":
        return _axis(x, attribute(node, "axis", 1), "Flatten axis")
    target = [int(d) for d in int_values(node.inputs[1], "the shape of the 2-D view of X")]
    dims = list(x.shape.dims) if x.shape is not None else []
    if len(target) == 2 and target[1] > 0 and target[0] != 0:
        for k in range(len(dims) - 1, -1, -1):
            trailing = [d for d in dims[k:] if isinstance(d, int)]
            if len(trailing) != len(dims) - k:
                break
            prefix = [d for d in dims[:k] if isinstance(d, int)]
            if np.prod(trailing, dtype=np.int64) == target[1] and (
                target[0] == -1
                or (len(prefix) == k and np.prod(prefix, dtype=np.int64) == target[0])
            ):
                return k - len(dims)
    raise Rejected(
        f"X is reshaped to {target}, which is not X flattened at one of its axes "
        f"(X's shape {[str(d) for d in dims] if dims else '?'})"
    )


def _check_flat_weight(weight: ir.Value, x: ir.Value, axis: int, what: str) -> None:
    """The function body multiplies the normalized [rows, cols] view of X by ``Flatten(W, 0)``,
    which lines W's elements up with the normalized dims whatever W's shape; the fused op
    broadcasts W over X itself, so W's dims must be X's normalized dims (leading 1s aside)."""
    if weight.shape is None:
        raise Rejected(f"the shape of {what} ({weight.name!r}) is unknown")
    dims = list(weight.shape.dims)
    while len(dims) > -axis and dims[0] == 1:
        dims.pop(0)
    if len(dims) != -axis:
        raise Rejected(
            f"{what} of shape {weight.shape} does not have X's {-axis} normalized "
            "dim(s): the function body flattens it, the fused op broadcasts it over X"
        )
    if -axis == 1:
        check_scale(weight, x, axis)  # one normalized dim: the original's Mul fixes its size
        return
    if x.shape is None:
        raise Rejected(f"the shape of X ({x.name!r}) is unknown")
    normalized = list(x.shape.dims)[axis:]
    same = all(
        d == n and (isinstance(d, int) or d.value is not None) for d, n in zip(dims, normalized)
    )
    if not same:
        raise Rejected(
            f"cannot prove that {what} of shape {weight.shape} has X's normalized dims "
            f"{list(x.shape.dims)[axis:]}: the function body flattens both, the fused "
            "op broadcasts it over X"
        )


def _flat_weight(flat: ir.Value, x: ir.Value, axis: int, what: str) -> ir.Value:
    """The weight behind the body's ``Flatten(W, 0)``; a [1, n] constant where a constant
    folding ran before (for one normalized dim it broadcasts over X as W does)."""
    node = flat.producer()
    if node is not None and node.op_type == "Flatten" and node.domain in ("", "ai.onnx"):
        if attribute(node, "axis", 1) != 0:
            raise Rejected(f"{what} is flattened at axis {attribute(node, 'axis', 1)}, not 0")
        weight = node.inputs[0]
        if weight is None:
            raise Rejected(f"{what} is missing")
        _check_flat_weight(weight, x, axis, what)
        return weight
    check_weight(flat, x, what)
    if -axis > 1:
        raise Rejected(
            f"{what} ({flat.name!r}) is already flattened (a constant folding ran) "
            f"and X is normalized over {-axis} dims: the fused op needs {what} in "
            "those dims; fuse before folding constants"
        )
    check_scale(flat, x, axis)
    return flat


def _outside_uses(value: ir.Value, nodes) -> list[ir.Node]:
    return [u for u in value.consumers() if u not in nodes and not dead(u)]


class ExpandedLayerNorm(FusionRule):
    """ONNX's function body of LayerNormalization (opset 17): X flattened to [rows, cols] at
    ``axis``, cast to ``stash_type``, the mean and E[x^2] - E[x]^2 over each row, the normalized
    value cast back to X's type, times ``Flatten(Scale, 0)``, plus ``Flatten(B, 0)`` (an
    Identity without B), reshaped to X's shape. The match is anchored on that Flatten/Reshape
    pair: the reduction over the flattened row is the one over X's dims [axis, rank)."""

    title = "LayerNorm (ONNX LayerNormalization function body)"
    #: X's 2-D view may have other readers: its producer then stays for them
    shared = ("x2d",)

    def __init__(self, tracker, strict_precision: bool = False) -> None:
        super().__init__(tracker, "ExpandedLayerNormalization", strict_precision)

    def pattern(self, op, x, eps, scale2d, bias2d, shape, like, flat_shape):
        x2d = pattern.OrValue([op.Flatten(x), op.Reshape(x, flat_shape)], name="x2d")
        # (a tag: onnxscript 0.7's commute cannot clone an untagged backtracking OrValue)
        xu = pattern.OrValue([op.Cast(x2d), x2d], name="xu", tag_var="cast_in")
        mean = op.ReduceMean(xu, _allow_other_inputs=True, _outputs=["mean"])
        square_mean = op.ReduceMean(
            op.Mul(xu, xu), _allow_other_inputs=True, _outputs=["square_mean"]
        )
        std = op.Sqrt(op.Add(op.Sub(square_mean, op.Mul(mean, mean)), eps), _outputs=["std"])
        normalized = op.Div(op.Sub(xu, mean), std, _outputs=["normalized"])
        rounded = pattern.OrValue(
            [op.Cast(normalized), op.CastLike(normalized, like), normalized], name="rounded"
        )
        scaled = op.Mul(rounded, scale2d)
        biased = pattern.OrValue([op.Add(scaled, bias2d), op.Identity(scaled), scaled])
        return op.Reshape(biased, shape, _outputs=["y"])

    def inspect(
        self,
        context,
        x,
        x2d,
        xu,
        eps,
        mean,
        square_mean,
        std,
        rounded,
        scale2d,
        shape,
        y,
        bias2d=None,
        **_,
    ):
        nodes = set(context.nodes)
        used = [v for v in (mean, std) if _outside_uses(v, nodes) or v.is_graph_output()]
        if used:
            raise Rejected(
                f"the statistics ({', '.join(repr(v.name) for v in used)}) are used "
                "outside the norm (LayerNormalization's Mean / InvStdDev outputs); "
                "the fused op does not give them, and keeping their nodes beside it "
                "would compute the statistics twice"
            )
        x_type = dtype(x, "X")
        stats = dtype(xu, "the statistics")
        if xu is not x2d and stats != FLOAT:
            raise Rejected(
                f"stash_type is {stats.name}: the statistics are computed in "
                f"{stats.name}; onnxnorm computes them in FLOAT"
                + (
                    " and has no DOUBLE kernels: fusing would lose the original's precision"
                    if stats == ir.DataType.DOUBLE
                    else ""
                )
            )
        note = statistics_type(stats, self.strict_precision)
        axis = _flatten_axis(x2d.producer(), x)
        scale = _flat_weight(scale2d, x, axis, "Scale")
        bias = _flat_weight(bias2d, x, axis, "Bias") if bias2d is not None else None
        check_type(x_type, Y=y, Scale=scale, **({"Bias": bias} if bias is not None else {}))
        if dtype(rounded, "the normalized value") != x_type:
            raise Rejected(
                f"the normalized value is {dtype(rounded, 'it').name}, X is {x_type.name}"
            )
        for value in (mean, square_mean):
            if mean_axis(value.producer(), xu, rank=2) != -1:
                raise Rejected(
                    f"ReduceMean {value.producer().name!r} does not reduce the rows "
                    "of the flattened X"
                )
        self._check_shape(x, shape)
        return Replacement(
            "LayerNorm",
            {"X": x, "Scale": scale, "Bias": bias},
            {
                "axis": axis,
                "epsilon": epsilon(scalar(eps, "epsilon")),
                "cast_before_scale": int(x_type != FLOAT),
            },
            _notes(ONE_PASS, note),
        )

    @staticmethod
    def _check_shape(x: ir.Value, shape: ir.Value) -> None:
        """The Reshape must restore X's own shape: ``Shape(X)``, or X's static dims."""
        node = shape.producer()
        if node is not None and node.op_type == "Shape" and node.inputs[0] is x:
            if not node.attributes:
                return
            raise Rejected(f"the output is reshaped to a slice of X's shape ({node.name!r})")
        try:
            target = [int(d) for d in int_values(shape, "the output shape").reshape(-1)]
        except Rejected as e:
            raise Rejected(f"cannot prove that the output is reshaped to X's shape: {e}") from None
        dims = list(x.shape.dims) if x.shape is not None else None
        if dims != target:
            raise Rejected(
                f"the output is reshaped to {target}, not to X's shape "
                f"{[str(d) for d in dims] if dims is not None else '?'}"
            )


class KerasLayerNorm(FusionRule):
    """tf2onnx's Keras LayerNormalization (``tf.nn.moments`` then ``tf.nn.batch_normalization``;
    ONNX Runtime's optimizer calls it the TF LayerNorm): ``s = gamma / sqrt(var + eps)``
    (``Reciprocal(Sqrt)``, ``Pow(., -0.5)`` or ``Div(1, Sqrt)``), then ``x * s + (beta - mean *
    s)``; the variance of the squared difference ``(x - mean)^2`` (``Mul`` or ``Pow``)."""

    title = "LayerNorm (TensorFlow/Keras: scale folded into the reciprocal)"

    def __init__(self, tracker, strict_precision: bool = False) -> None:
        super().__init__(tracker, "KerasLayerNorm", strict_precision)

    def pattern(self, op, x, eps, gamma, beta, two, power, one):
        mean = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["mean"])
        var = op.ReduceMean(
            square(op, op.Sub(x, mean), two), _allow_other_inputs=True, _outputs=["var"]
        )
        shifted = op.Add(var, eps)
        inverse = pattern.OrValue(
            [op.Reciprocal(op.Sqrt(shifted)), op.Pow(shifted, power), op.Div(one, op.Sqrt(shifted))]
        )
        s = op.Mul(inverse, gamma)
        return op.Add(op.Mul(x, s), op.Sub(beta, op.Mul(mean, s)), _outputs=["y"])

    def inspect(
        self, context, x, eps, gamma, beta, mean, var, y, two=None, power=None, one=None, **_
    ):
        x_type = dtype(x, "X")
        note = statistics_type(x_type, self.strict_precision)
        if two is not None and scalar(two, "the Pow exponent") != 2:
            raise Rejected(f"the Pow exponent is {scalar(two, 'the Pow exponent')}, not 2")
        if power is not None and scalar(power, "the Pow exponent") != -0.5:
            raise Rejected(
                f"the exponent of var + eps is {scalar(power, 'the exponent')}, not -0.5"
            )
        if one is not None and scalar(one, "the reciprocal's numerator") != 1:
            raise Rejected(f"the reciprocal's numerator is {scalar(one, 'the numerator')}, not 1")
        axis = mean_axis(var.producer(), x)
        if mean_axis(mean.producer(), x) != axis:
            raise Rejected("the mean and the variance reduce over different axes")
        check_weight(gamma, x, "gamma")
        check_weight(beta, x, "beta")
        check_type(x_type, Scale=gamma, Bias=beta, Y=y)
        check_scale(gamma, x, axis)
        check_scale(beta, x, axis)
        return Replacement(
            "LayerNorm",
            {"X": x, "Scale": gamma, "Bias": beta},
            {"axis": axis, "epsilon": epsilon(scalar(eps, "epsilon")), "cast_before_scale": 0},
            _notes(FOLDED, note),
        )


def standard_rules(tracker, strict_precision: bool = False) -> list[pattern.RewriteRule]:
    return [
        ExpandedLayerNorm.rule(tracker, strict_precision=strict_precision),
        KerasLayerNorm.rule(tracker, strict_precision=strict_precision),
    ]

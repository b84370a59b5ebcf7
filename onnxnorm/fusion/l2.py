"""Rules for the L2 norm ``x / sqrt(sum(x^2) + eps)`` (FLA's ``l2norm``, the q/k norm of gated
delta-rule attention). They run in the stage of the gated norms: ``gated.gated_rules`` lists
them with its own.

:class:`L2Core` finds the norm's core in each of the divisions of ``norms.FORMS`` and each way
of summing the squares (:data:`SUMS`); ``absorb.CastAbsorb`` then takes the casts around it, as
for the other norms. The same with the mean is an RMSNorm (``norms.RMSCore``), and a sum of
squares scaled before epsilon by the count of the values is their mean, an RMSNorm too, and by
another factor a near miss of both (:class:`ScaledSum`). ONNX's
``LpNormalization`` is reported and left as it is (:class:`LpNormalization`): it has no epsilon.
"""

from __future__ import annotations

import numpy as np
from onnxscript.rewriter import pattern

from onnxnorm.fusion._base import (
    FLOAT,
    FusionRule,
    NotThisPattern,
    Rejected,
    Replacement,
    attribute,
    constant,
    dtype,
    epsilon,
    scalar,
)
from onnxnorm.fusion.absorb import CastAbsorb
from onnxnorm.fusion.checks import square
from onnxnorm.fusion.norms import FORMS, core_checks, divide
from onnxnorm.fusion.report import Tracker

#: how an L2 norm sums the squares: ``ReduceSum`` of ``Mul(x, x)`` / ``Pow(x, 2)``; the same
#: with the squares cast to float32 and the sum back to X's type (PyTorch's dynamo exporter,
#: which sums half-precision values in float32); ``ReduceSumSquare``
SUMS = ("sum", "widened", "sumsquare")


def _sum_of_squares(op, x, two, how: str):
    """The pattern of the sum of the squares of ``x``, summed as ``how`` says (:data:`SUMS`)."""
    if how == "sumsquare":
        return op.ReduceSumSquare(x, _allow_other_inputs=True, _outputs=["total"])
    squares = square(op, x, two)
    if how == "widened":
        squares = op.Cast(squares, _outputs=["wide"])
    total = op.ReduceSum(squares, _allow_other_inputs=True, _outputs=["total"])
    return op.Cast(total, _outputs=["narrow"]) if how == "widened" else total


class L2Core(FusionRule):
    """``x / sqrt(sum(x^2) + eps)`` over trailing axes, divided as ``form`` says
    (``norms.FORMS``), the squares summed as ``sum`` says (:data:`SUMS`)."""

    title = "L2Norm (decomposed)"

    def __init__(
        self, tracker: Tracker, form: str, sum: str, strict_precision: bool = False
    ) -> None:
        self.form, self.sum = form, sum
        name = f"L2Core{form.capitalize()}{sum.capitalize()}"
        super().__init__(tracker, name, strict_precision)

    def pattern(self, op, x, eps, two, one, half):
        return divide(
            op, x, op.Add(_sum_of_squares(op, x, two, self.sum), eps), one, half, self.form
        )

    def inspect(self, context, x, eps, total, two=None, one=None, half=None, **bindings):
        note, axis = core_checks(x, total.producer(), two, one, half, self.strict_precision)
        if self.sum == "widened":
            t = dtype(x, "X")
            if (
                dtype(bindings["wide"], "the squares") != FLOAT
                or dtype(bindings["narrow"], "the sum") != t
            ):
                raise Rejected(
                    f"the squares are not summed in float32 and rounded back to X's {t.name}"
                )
        return Replacement(
            "L2Norm", {"X": x}, {"axis": axis, "epsilon": epsilon(scalar(eps, "epsilon"))}, note
        )


class ScaledSum(FusionRule):
    """``x / sqrt(sum(x^2) * k + eps)`` (or ``sum / k``): the sum of squares scaled before
    epsilon is added. Scaled by the count of the values summed (divided by n, or multiplied by
    1/n as float32 rounds it) it is their mean, spelled with ``ReduceSum`` or
    ``ReduceSumSquare``: an RMSNorm. By any other factor it is a near miss of both L2Norm's
    sum + epsilon and RMSNorm's mean, reported."""

    title = "RMSNorm (the mean as a scaled sum of squares)"

    def __init__(
        self, tracker: Tracker, form: str, sum: str, strict_precision: bool = False
    ) -> None:
        self.form, self.sum = form, sum
        super().__init__(
            tracker, f"ScaledSum{form.capitalize()}{sum.capitalize()}", strict_precision
        )

    def pattern(self, op, x, eps, two, one, half, k):
        total = _sum_of_squares(op, x, two, self.sum)
        scaled = pattern.OrValue([op.Div(total, k), op.Mul(total, k)], tag_var="how")
        return divide(op, x, op.Add(scaled, eps), one, half, self.form)

    def inspect(self, context, x, eps, total, k, how=None, two=None, one=None, half=None, **_):
        note, axis = core_checks(x, total.producer(), two, one, half, self.strict_precision)
        try:
            factor = scalar(k, "the factor")
        except Rejected:
            # TorchScript divides by x.shape[-1] as the graph computes it: Cast(Gather(Shape))
            if how == 0 and axis == -1 and _last_dim_of(k, x):
                factor = None
            else:
                raise NotThisPattern(f"{k.name!r} is not a constant") from None
        count = _count(x, axis)
        if factor is None or (
            count is not None
            and (
                (how == 0 and factor == count)
                or (how == 1 and np.float32(factor) == np.float32(1) / np.float32(count))
            )
        ):
            return Replacement(
                "RMSNorm",
                {"X": x},
                {"axis": axis, "epsilon": epsilon(scalar(eps, "epsilon")), "cast_before_scale": 0},
                note,
            )
        verb = "divided by" if how == 0 else "multiplied by"
        counted = (
            f" of {count} values" if count is not None else " of values X's shape does not count"
        )
        raise Rejected(
            f"the sum of squares{counted} is {verb} {factor:g} before epsilon is added: not "
            "L2Norm's sum + epsilon, and not their mean (an RMSNorm)"
        )


def _last_dim_of(k, x) -> bool:
    """Whether ``k`` is X's last dim as the graph reads it off X's shape (``Cast(Gather(Shape(X),
    -1))``, or ``Shape(X, start=-1)`` squeezed or not; X, or X cast): then dividing by it is
    the mean over the last axis, whatever that dim is."""
    node = k.producer()
    while node is not None and node.op_type in ("Cast", "Squeeze", "Reshape", "Identity"):
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    if node is None:
        return False
    if node.op_type == "Gather":
        try:
            values = constant(node.inputs[1], "the index").reshape(-1)
        except Rejected:
            return False
        shape = node.inputs[0].producer()
        rank = len(x.shape) if x.shape is not None else None
        last = values.size == 1 and (values[0] == -1 or values[0] == (rank or 0) - 1)
        if not last or shape is None or shape.op_type != "Shape" or shape.attributes.get("start"):
            return False
    elif node.op_type == "Shape":
        start = node.attributes.get("start")
        if start is None or start.as_int() != -1:
            return False
        shape = node
    else:
        return False
    source = shape.inputs[0]
    while source is not None and source is not x and source.producer() is not None:
        producer = source.producer()
        if producer.op_type != "Cast":
            break
        source = producer.inputs[0]
    return source is x or _same_through_cast(source, x)


def _same_through_cast(a, b) -> bool:
    """Whether ``b`` is ``a`` cast (one value, read in another type)."""
    producer = b.producer() if b is not None else None
    return producer is not None and producer.op_type == "Cast" and producer.inputs[0] is a


def _count(x, axis: int) -> int | None:
    """How many values of X a row normalized from ``axis`` (negative) on holds; None where its
    dims are not all known."""
    if x.shape is None:
        return None
    dims = list(x.shape)[axis:]
    if not all(isinstance(d, int) for d in dims):
        return None
    return int(np.prod(dims))


class LpNormalization(FusionRule):
    """ONNX ``LpNormalization``, which onnxruntime-genai writes for Qwen3.5's q/k L2 norm: found
    and left as it is. It divides by the norm without an epsilon, and for an all-zero row gives
    0 in ONNX Runtime where the division (ONNX's reference, L2Norm with epsilon 0) gives NaN."""

    title = "L2Norm (ONNX LpNormalization)"

    def __init__(self, tracker: Tracker) -> None:
        super().__init__(tracker, "LpNormalization")

    def pattern(self, op, x):
        return op.LpNormalization(x, _outputs=["y"])

    def inspect(self, context, x, y, **_):
        p = attribute(y.producer(), "p", 2)
        if p != 2:
            raise Rejected(f"p = {p}: not an L2 norm")
        raise Rejected(
            "LpNormalization has no epsilon and gives 0 for an all-zero row in ONNX Runtime, "
            "where L2Norm (epsilon 0) gives NaN, as the division does: no onnxnorm op "
            "computes it exactly"
        )


def l2_rules(tracker: Tracker, strict_precision: bool = False) -> list[pattern.RewriteRule]:
    """The L2 norm's rules: ``LpNormalization`` reported, the near misses and the cores in every
    form, then the casts around an ``L2Norm`` absorbed. ``strict_precision``: an L2 norm whose
    statistics the original computes in float16 or bfloat16 stays as it is."""
    rules = [LpNormalization.rule(tracker)]
    for form in FORMS:
        rules += [
            L2Core.rule(tracker, form=form, sum=total, strict_precision=strict_precision)
            for total in SUMS
        ]
    return rules + [CastAbsorb.rule(tracker, op_name="L2Norm")]


def scaled_sum_rules(tracker: Tracker, strict_precision: bool = False) -> list[pattern.RewriteRule]:
    """:class:`ScaledSum` in every form: RMSNorms, so they run in the norms' stage (where the
    weight and the casts around an RMSNorm are absorbed), before the L2 cores."""
    return [
        ScaledSum.rule(tracker, form=form, sum=total, strict_precision=strict_precision)
        for form in FORMS
        for total in ("sum", "sumsquare")
    ]

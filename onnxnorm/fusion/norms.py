"""Rules that turn a norm, decomposed or as a single op of another domain, into one onnxnorm
``LayerNorm`` or ``RMSNorm`` node: the norms stage of the pipeline, gathered by
:func:`norm_rules`.

Decomposed norms are found in two steps, which together cover the spellings PyTorch's
exporters write for every model family (Llama, Gemma, T5, Cohere, ...):

1. a *core* rule (this module) finds the statistics and the normalization, computed in float32
   (``x / sqrt(mean(x^2) + eps)``; ``(x - mean) / sqrt(mean((x - mean)^2) + eps)``), and
   writes an onnxnorm node without Scale or Bias; a core computed in double writes the norm
   that ``absorb.in_double`` says;
2. the *absorb* rules (``absorb.py``) grow that node by the Mul, Add and Casts after it, each
   fixing the rounding order it proves.

The single ops of ONNX and ONNX Runtime have a rule each (``norm_ops.py``), and the spellings
of other tools theirs (``standard.py``). The pipeline applies these rules until nothing changes.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxnorm.fusion._base import (
    FusionRule,
    Rejected,
    Replacement,
    dtype,
    epsilon,
    scalar,
    statistics_type,
)
from onnxnorm.fusion.absorb import (
    DOUBLE,
    BiasAbsorb,
    CastAbsorb,
    DoubleAbsorb,
    ScaleAbsorb,
    in_double,
    rewrite_in_double,
)
from onnxnorm.fusion.checks import mean_axis, square
from onnxnorm.fusion.norm_ops import (
    MsSkipNorm,
    SimplifiedLayerNorm,
    StandardLayerNorm,
    StandardRMSNorm,
)
from onnxnorm.fusion.report import Tracker
from onnxnorm.ops import catalogue

#: how a core rule divides by the root of the statistic plus epsilon, ``v``: ``Div(x, Sqrt(v))``,
#: ``Mul(x, Reciprocal(Sqrt(v)))`` or ``Mul(x, Div(1, Sqrt(v)))``, ``Mul(x, Pow(v, -0.5))``
#: (Gemma 3n's ``torch.pow(mean_squared, -0.5)``)
FORMS = ("div", "mul", "pow")


def divide(op, x, v, one, half, form: str):
    """The pattern of ``x`` divided by the root of ``v`` as ``form`` (:data:`FORMS`) says."""
    if form == "div":
        return op.Div(x, op.Sqrt(v), _outputs=["y"])
    if form == "pow":
        return op.Mul(x, op.Pow(v, half), _outputs=["y"])
    d = op.Sqrt(v)
    return op.Mul(x, pattern.OrValue([op.Reciprocal(d), op.Div(one, d)]), _outputs=["y"])


def check_root(one: ir.Value | None, half: ir.Value | None) -> None:
    """The constants of a :func:`divide`: the reciprocal's numerator 1, the Pow exponent -0.5."""
    if one is not None and scalar(one, "the reciprocal's numerator") != 1:
        raise Rejected(f"the reciprocal's numerator is {scalar(one, 'the numerator')}, not 1")
    if half is not None and scalar(half, "the Pow exponent") != -0.5:
        raise Rejected(
            f"the root is Pow(., {scalar(half, 'the Pow exponent')}), not Pow(., -0.5): "
            "not the reciprocal square root"
        )


class _Core(FusionRule):
    """The statistics and the normalization of a decomposed ``op_name``, in float32 (or in
    double: :func:`in_double`), divided as ``form`` says (:data:`FORMS`)."""

    op_name: str

    def __init__(
        self, tracker: Tracker, form: str, strict_precision: bool = False, eps: bool = True
    ) -> None:
        self.title = f"{self.op_name} (decomposed)"
        name = f"{self.op_name}Core{form.capitalize()}{'' if eps else 'NoEpsilon'}"
        super().__init__(tracker, name, strict_precision)
        self.form, self.eps = form, eps

    def divide(self, op, x, v, one, half, eps):
        """``x`` divided by the root of ``v + eps``; of ``v`` alone where the exporter dropped
        the Add of a tiny epsilon (the dynamo exporter does): a norm with epsilon 0."""
        return divide(op, x, op.Add(v, eps) if self.eps else v, one, half, self.form)

    def checked(self, x: ir.Value, y: ir.Value, axis: int, eps: ir.Value | None) -> Replacement:
        """The node of a match of output ``y`` whose statistics start at ``axis``."""
        if dtype(x, "X") == DOUBLE:
            return in_double(self.op_name, x, y, axis, self.strict_precision, self.epsilon(eps))
        note = statistics_type(dtype(x, "X"), self.strict_precision)
        attrs = {"axis": axis, "epsilon": self.epsilon(eps), "cast_before_scale": 0}
        return Replacement(self.op_name, {"X": x}, attrs, note)

    def epsilon(self, eps: ir.Value | None) -> float:
        return epsilon(scalar(eps, "epsilon")) if self.eps and eps is not None else 0.0

    def rewrite(self, op, y, total=None, **bindings):
        return rewrite_in_double(self, op, y, total, **bindings)


class RMSCore(_Core):
    """``x / sqrt(mean(x^2, -1) + eps)``: ``Pow(x, 2)`` or ``Mul(x, x)``."""

    op_name = "RMSNorm"

    def pattern(self, op, x, eps, two, one, half):
        mean = op.ReduceMean(square(op, x, two), _allow_other_inputs=True, _outputs=["mean"])
        return self.divide(op, x, mean, one, half, eps)

    def inspect(self, context, x, y, mean, eps=None, two=None, one=None, half=None, **_):
        return self.checked(x, y, core_shape(x, mean.producer(), two, one, half), eps)


class LayerCore(_Core):
    """``(x - mean) / sqrt(mean((x - mean)^2, -1) + eps)``, with the same spellings of the square
    as :class:`RMSCore`."""

    op_name = "LayerNorm"

    def pattern(self, op, x, eps, two, one, half):
        mu = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["mu"])
        centred = op.Sub(x, mu)
        var = op.ReduceMean(square(op, centred, two), _allow_other_inputs=True, _outputs=["mean"])
        return self.divide(op, centred, var, one, half, eps)

    def inspect(self, context, x, y, mean, mu, eps=None, two=None, one=None, half=None, **_):
        axis = core_shape(x, mean.producer(), two, one, half)
        if mean_axis(mu.producer(), x) != axis:
            raise Rejected("the mean and the variance reduce over different axes")
        return self.checked(x, y, axis, eps)


def core_checks(x, mean_node, two, one, half, strict: bool) -> tuple[str, int]:
    """The checks every core rule makes; returns the report's note on the statistics' type and
    the first normalized axis."""
    note = statistics_type(dtype(x, "X"), strict)
    return note, core_shape(x, mean_node, two, one, half)


def core_shape(x, mean_node, two, one, half) -> int:
    """The exponent and root checks of a core rule; returns the first normalized axis."""
    if two is not None and scalar(two, "the Pow exponent") != 2:
        raise Rejected(f"the Pow exponent is {scalar(two, 'the Pow exponent')}, not 2")
    check_root(one, half)
    return mean_axis(mean_node, x)


def norm_rules(tracker: Tracker, strict_precision: bool = False) -> list[pattern.RewriteRule]:
    """Stage 1: every norm becomes an onnxnorm LayerNorm/RMSNorm (apply to a fixpoint).
    ``strict_precision``: leave norms whose statistics the original computes in float16 or
    bfloat16 as they are (by default they are fused, with float32 statistics, and noted)."""
    from onnxnorm.fusion.standard import standard_rules

    strict = strict_precision
    rules = [
        *standard_rules(tracker, strict),
        StandardLayerNorm.rule(tracker, strict_precision=strict),
        StandardRMSNorm.rule(tracker, strict_precision=strict),
        SimplifiedLayerNorm.rule(tracker, strict_precision=strict),
        *(
            MsSkipNorm.rule(tracker, layer=layer, n_out=n)
            for layer in (True, False)
            for n in (4, 1)
        ),
    ]
    for form in FORMS:
        # LayerNorm first: RMSNorm's pattern also matches the centred half of a LayerNorm
        rules += [
            core.rule(tracker, form=form, strict_precision=strict, eps=eps)
            for eps in (True, False)
            for core in (LayerCore, RMSCore)
        ]
    for name in ("RMSNorm", "LayerNorm"):
        # only an op with a scale_offset takes Mul(norm, w + c) as Scale w and offset c; for
        # the others the plain Mul rule takes w + c as Scale
        offsets = (True, False) if "scale_offset" in catalogue.get(name).defaults else (False,)
        rules += [ScaleAbsorb.rule(tracker, op_name=name, offset=offset) for offset in offsets]
        rules += [BiasAbsorb.rule(tracker, op_name=name), CastAbsorb.rule(tracker, op_name=name)]
        steps = ["offset", "scale", "bias", "cast"] if offsets[0] else ["scale", "bias", "cast"]
        rules += [DoubleAbsorb.rule(tracker, op_name=name, what=what) for what in steps]
    return rules

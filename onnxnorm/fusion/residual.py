"""Residual fusion: the Add before a norm becomes a Skip op, a norm -> add -> norm becomes a
Sandwich op, and a sublayer's bias Add before a Skip op becomes its XBias.

These rules match onnxnorm nodes written by the norm rules (``norms.py``), so they see every
norm spelling at once. A Skip or Sandwich op always gets its Sum output; the pipeline drops it
afterwards where nothing uses it (Post-Norm).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxnorm.fusion._base import (
    FLOAT,
    FusionRule,
    NotThisPattern,
    Rejected,
    Replacement,
    check_scale,
    dtype,
    scalar,
)
from onnxnorm.fusion.checks import check_type, check_weight
from onnxnorm.fusion.report import Tracker
from onnxnorm.ops import catalogue

#: ``value.meta`` key of the shape ORT's symbolic inference gave a value
#: (``passes.symbolic_shapes``)
SYMBOLIC_SHAPE = "onnxnorm.symbolic_shape"


def _dim(d) -> str:
    return str(d) if isinstance(d, int) or d.value is not None else "unknown"


def symbolic(value: ir.Value | None) -> ir.Shape | None:
    """The shape ORT's symbolic inference gave ``value`` (``passes.symbolic_shapes``); for an
    output of an onnxnorm node written since, the shape of that node's X, which its Y and Sum
    have."""
    while value is not None:
        if SYMBOLIC_SHAPE in value.meta:
            return value.meta[SYMBOLIC_SHAPE]
        node = value.producer()
        if node is None or node.domain != catalogue.DOMAIN:
            return None
        value = node.inputs[0]
    return None


def _compare(dims_a: list, dims_b: list, what: str, op: str = "Add") -> str | None:
    """None when the dims prove the shapes equal; else why not. Raises where they prove that
    the ``op`` (the node that meets the two) broadcasts."""
    if len(dims_a) != len(dims_b):
        raise Rejected(
            f"{what} differ in rank ({len(dims_a)} and {len(dims_b)}): the {op} broadcasts"
        )
    for i, (da, db) in enumerate(zip(dims_a, dims_b)):
        if isinstance(da, int) and isinstance(db, int) and da != db:
            raise Rejected(f"{what} differ in shape (dim {i}: {da} and {db}): the {op} broadcasts")
    for i, (da, db) in enumerate(zip(dims_a, dims_b)):
        if isinstance(da, int) and isinstance(db, int):
            continue
        if isinstance(da, ir.SymbolicDim) and da.value is not None and da == db:
            continue
        shapes = f"[{', '.join(map(_dim, dims_a))}] and [{', '.join(map(_dim, dims_b))}]"
        if 1 in (da, db):
            return (
                f"{what} may broadcast: dim {i} is 1 in one and {_dim(db if da == 1 else da)}"
                f" in the other ({shapes})"
            )
        return (
            f"cannot prove that {what} have the same shape: dim {i} is {_dim(da)} and "
            f"{_dim(db)} ({shapes})"
        )
    return None


def same_shape(a: ir.Value, b: ir.Value, what: str, op: str = "Add") -> None:
    """Proves that an Add (``op``) of ``a`` and ``b`` does not broadcast, or says exactly why
    not. Dims are equal when they are equal integers or the same symbol of one inference:
    onnx's (the values' shapes) or ORT's symbolic inference (which never merges two dims that
    an op broadcasts, see ``fusion._ort_symbolic``)."""
    reasons = []
    for dims_a, dims_b in ((a.shape, b.shape), (symbolic(a), symbolic(b))):
        if dims_a is not None and dims_b is not None:
            reason = _compare(list(dims_a.dims), list(dims_b.dims), what, op)
            if reason is None:
                return
            reasons.append(reason)
    if not reasons:
        unknown = " and ".join(repr(v.name) for v in (a, b) if v.shape is None)
        raise Rejected(f"the shapes of {what} are unknown ({unknown})")
    raise Rejected(reasons[-1])


class _SkipRule(FusionRule):
    """What the Skip rules share: the Skip op that replaces the norm of a residual add."""

    op_name: str
    deep: bool

    def skip_op(self, a, b, total, y, alpha=None) -> Replacement:
        """The Skip op of ``Norm(a + b)`` (DeepNorm: ``Norm(alpha * a + b)``)."""
        if (
            self.deep
            and alpha.producer() is not None
            and ir.convenience.get_const_tensor(alpha) is None
        ):
            # a Mul by an activation (a dynamically quantized MatMul's scale), not DeepNorm
            raise NotThisPattern(f"alpha ({alpha.name!r}) is not a constant")
        norm = Replacement.of(y.producer())
        attrs = norm.attributes
        t = dtype(total, "the sum")
        check_type(t, a=a, b=b)
        same_shape(a, b, "the residual add's operands")
        if self.deep:
            value = scalar(alpha, "alpha")
            check_type(t, alpha=alpha)
            if t != FLOAT:
                raise Rejected(
                    f"DeepNorm in {t.name}: the original rounds alpha * residual before the add"
                )
            attrs["alpha"] = value
            x, residual = b, a
        elif len(a.uses()) > 1 and len(b.uses()) == 1:
            x, residual = b, a  # a is the residual stream, b the sublayer's output
        else:
            x, residual = a, b
        return Replacement(f"Skip{self.op_name}", dict(norm.inputs, X=x, Residual=residual), attrs)


class SkipFusion(_SkipRule):
    """``Norm(a + b)`` -> ``SkipNorm(X, Residual)`` (Pre-Norm keeps the sum as Sum, Post-Norm
    drops it); with ``deep``, ``Norm(alpha * r + f)`` -> ``SkipNorm(f, r, alpha)`` (DeepNorm).
    An Add in X's type is rounded once, as the catalogue's Sum is, so this is exact; DeepNorm's
    Mul rounds alpha * r first, so it is fused in float32 only, where the catalogue's function
    body computes the same two float32 operations."""

    def __init__(self, tracker: Tracker, op_name: str, deep: bool) -> None:
        self.op_name, self.deep = op_name, deep
        self.title = (
            f"Skip{op_name} ({'DeepNorm: alpha * residual + x' if deep else 'residual add'})"
        )
        super().__init__(tracker, f"Skip{op_name}{'Deep' if deep else ''}")

    def pattern(self, op, a, b, alpha):
        first = op.Mul(a, alpha, _outputs=["scaled"]) if self.deep else a
        total = op.Add(first, b, _outputs=["total"])
        y = getattr(op, self.op_name)(
            total, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["y"]
        )
        return y, total

    def inspect(self, context, a, b, total, y, alpha=None, **_):
        return self.skip_op(a, b, total, y, alpha)


class CastSkipFusion(_SkipRule):
    """``Norm(Cast(a + b))``: a residual add whose sum is cast before the norm (float16 graphs
    that keep their norms in float32 without casting the output back, whose input/output casts
    ``absorb.CastAbsorb`` would take). A Skip op adds, normalizes and gives Y and Sum in X's
    type, so it is the original only where the Cast keeps the type; elsewhere the report says
    why not (without this rule such an add would be passed over in silence)."""

    def __init__(self, tracker: Tracker, op_name: str) -> None:
        self.op_name, self.deep = op_name, False
        self.title = f"Skip{op_name} (residual add cast before the norm)"
        super().__init__(tracker, f"Skip{op_name}Cast")

    def pattern(self, op, a, b):
        total = op.Add(a, b, _outputs=["total"])
        y = getattr(op, self.op_name)(
            op.Cast(total, _outputs=["cast"]),
            _domain=catalogue.DOMAIN,
            _allow_other_inputs=True,
            _outputs=["y"],
        )
        return y, total

    def inspect(self, context, a, b, total, cast, y, **_):
        t, norm_type = dtype(total, "the sum"), dtype(cast, "the norm's input")
        same_shape(a, b, "the residual add's operands")
        if t == norm_type:  # a Cast to the type it has (``rules()`` without the pipeline)
            return self.skip_op(a, b, total, y)
        if t.itemsize < norm_type.itemsize:
            why = (
                f"the Skip op would give Y in {t.name}, where the original's norm returns it "
                f"in {norm_type.name}; in {norm_type.name} it would not round the sum to "
                f"{t.name} as the original does"
            )
        else:
            why = (
                f"a Skip op in {norm_type.name} would round the operands to {norm_type.name} "
                f"before adding them, where the original rounds their {t.name} sum"
            )
        raise Rejected(
            f"the residual add runs in {t.name} and its sum is cast to "
            f"{norm_type.name} for the norm: {why}"
        )


def _matters(attrs: dict, inputs: dict, t: ir.DataType) -> bool:
    """Whether a norm's rounding order changes its result."""
    return t != FLOAT and (
        inputs.get("Scale") is not None
        or inputs.get("Bias") is not None
        or bool(attrs.get("scale_offset"))
    )


class SandwichFusion(FusionRule):
    """``Norm_b(r + Norm_a(x))`` -> ``SandwichNorm(x, r, ...)`` (Gemma 2/3, Sandwich-LN); both
    norms must share axis, epsilon, scale offset and rounding order."""

    def __init__(self, tracker: Tracker, op_name: str) -> None:
        self.op_name = op_name
        self.title = f"Sandwich{op_name} (norm -> residual add -> norm)"
        super().__init__(tracker, f"Sandwich{op_name}")

    def pattern(self, op, x, r):
        inner = getattr(op, self.op_name)(
            x, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["inner"]
        )
        total = op.Add(r, inner, _outputs=["total"])
        y = getattr(op, self.op_name)(
            total, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["y"]
        )
        return y, total

    def inspect(self, context, x, r, inner, total, y, **_):
        return self.sandwich(x, r, inner, total, Replacement.of(y.producer()))

    def sandwich(self, x, r, inner, total, outer_norm: Replacement) -> Replacement:
        if len(inner.uses()) > 1 or inner.is_graph_output():
            raise NotThisPattern(
                "the inner norm's output is used elsewhere: Post-Norm, no sandwich"
            )
        inner_norm = Replacement.of(inner.producer())
        a, b = inner_norm.attributes, outer_norm.attributes
        ia, ib = inner_norm.inputs, outer_norm.inputs
        t = dtype(x, "X")
        check_type(t, Residual=r, Sum=total)
        same_shape(x, r, "the sublayer output and the residual")
        for name in ("axis", "scale_offset"):
            if name in a and a[name] != b[name]:
                raise Rejected(f"the two norms differ in {name}: {a[name]} and {b[name]}")
        if abs(a["epsilon"] - b["epsilon"]) > 1e-6 * max(a["epsilon"], b["epsilon"]):
            raise Rejected(f"the two norms differ in epsilon: {a['epsilon']} and {b['epsilon']}")
        order = b["cast_before_scale"]
        if _matters(a, ia, t) and _matters(b, ib, t) and a["cast_before_scale"] != order:
            raise Rejected("the two norms round in different orders")
        if _matters(a, ia, t) and not _matters(b, ib, t):
            order = a["cast_before_scale"]
        attrs = {
            k: v for k, v in b.items() if k in catalogue.get(f"Sandwich{self.op_name}").defaults
        }
        attrs["cast_before_scale"] = order
        return Replacement(
            f"Sandwich{self.op_name}",
            {
                "X": x,
                "Residual": r,
                "InnerScale": ia["Scale"],
                "InnerBias": ia["Bias"],
                "Scale": ib["Scale"],
                "Bias": ib["Bias"],
            },
            attrs,
        )


class SandwichFromSkip(SandwichFusion):
    """``SkipNorm(r, Norm_a(x))`` (either operand) -> ``SandwichNorm(x, r, ...)``: the same
    sandwich where the residual add and the outer norm already are one Skip op (model builders
    write Gemma 2's post-sublayer norm as a norm followed by SkipSimplifiedLayerNormalization).
    The Skip op's Sum is ``r + round(Norm_a(x))`` rounded once, as the Sandwich op's is."""

    def __init__(self, tracker: Tracker, op_name: str, inner_is_x: bool) -> None:
        self.op_name, self.inner_is_x = op_name, inner_is_x
        self.title = f"Sandwich{op_name} (norm -> residual add -> norm)"
        FusionRule.__init__(self, tracker, f"Sandwich{op_name}FromSkip{'X' if inner_is_x else 'R'}")

    def pattern(self, op, x, r):
        inner = getattr(op, self.op_name)(
            x, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["inner"]
        )
        args = (inner, r) if self.inner_is_x else (r, inner)
        y, total = getattr(op, f"Skip{self.op_name}")(
            *args, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["y", "total"]
        )
        return y, total

    def inspect(self, context, x, r, inner, total, y, **_):
        skip = Replacement.of(y.producer())
        if skip.inputs["XBias"] is not None:
            raise Rejected(
                "the Skip op also adds a sublayer bias (XBias), which the Sandwich op does not take"
            )
        if skip.attributes["alpha"] != 1:
            raise Rejected(f"the Skip op scales the residual by alpha {skip.attributes['alpha']}")
        return self.sandwich(x, r, inner, total, skip)


class XBiasAbsorb(FusionRule):
    """``SkipNorm(m + bias, r)`` -> ``SkipNorm(m, r, XBias=bias)``: the sublayer's bias joins
    the sum (float32 only: in float16 the original rounds m + bias before the residual add)."""

    def __init__(self, tracker: Tracker, op_name: str, on_residual: bool) -> None:
        self.op_name, self.on_residual = op_name, on_residual
        self.title = f"{op_name} sublayer bias absorbed (XBias)"
        super().__init__(tracker, f"{op_name}XBias{'R' if on_residual else ''}")

    def pattern(self, op, m, bias, other):
        biased = op.Add(m, bias, _outputs=["biased"])
        args = (other, biased) if self.on_residual else (biased, other)
        y, total = getattr(op, self.op_name)(
            *args, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["y", "total"]
        )
        return y, total

    def inspect(self, context, m, bias, other, y, **_):
        check_weight(bias, m, "the sublayer bias")
        skip = Replacement.of(y.producer())
        attrs = skip.attributes
        if skip.inputs["XBias"] is not None:
            raise Rejected("the Skip op already has an XBias")
        if self.on_residual and attrs["alpha"] != 1:
            raise Rejected("the bias is on the residual scaled by alpha")
        t = dtype(m, "X")
        if t != FLOAT:
            raise Rejected(f"{t.name}: the original rounds X + bias before the residual add")
        check_type(t, bias=bias, Residual=other)
        check_scale(bias, m, -1)
        same_shape(m, other, "X and the residual")
        return Replacement(self.op_name, dict(skip.inputs, X=m, Residual=other, XBias=bias), attrs)


def sandwich_rules(tracker: Tracker) -> list[pattern.RewriteRule]:
    return [SandwichFusion.rule(tracker, op_name=name) for name in ("RMSNorm", "LayerNorm")] + [
        SandwichFromSkip.rule(tracker, op_name=name, inner_is_x=side)
        for name in ("RMSNorm", "LayerNorm")
        for side in (False, True)
    ]


def skip_rules(tracker: Tracker) -> list[pattern.RewriteRule]:
    return [
        SkipFusion.rule(tracker, op_name=name, deep=deep)
        for deep in (True, False)
        for name in ("RMSNorm", "LayerNorm")
    ] + [CastSkipFusion.rule(tracker, op_name=name) for name in ("RMSNorm", "LayerNorm")]


def xbias_rules(tracker: Tracker) -> list[pattern.RewriteRule]:
    return [
        XBiasAbsorb.rule(tracker, op_name=name, on_residual=side)
        for name in ("SkipRMSNorm", "SkipLayerNorm")
        for side in (False, True)
    ]

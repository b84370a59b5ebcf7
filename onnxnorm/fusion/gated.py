"""Rules for the gated RMSNorm of hybrid and linear-attention LLMs.

A gated norm multiplies by the gate's activation, computed in float32 from float32(gate):

- after the norm (``norm_before_gate = 1``): Qwen3-Next and Qwen3.5 (SiLU; the norm scaled in
  X's type, order A), Kimi Linear (sigmoid; float32 throughout, order B), Falcon-H1 by its flag;
- before it (``norm_before_gate = 0``), on float32(X), the product not rounded: Mamba2,
  Nemotron-H, Bamba, Zamba2 and GraniteMoeHybrid (normalized in groups: a Reshape to
  ``[..., groups, group_size]`` around the statistics), Falcon-H1 by its flag.

As for LayerNorm and RMSNorm (``norms.py``, ``absorb.py``), the norm's core is found first,
then grown. These rules start from the ``RMSNorm`` nodes the norm stage wrote (core, Scale and
casts absorbed):

1. :class:`GroupAbsorb`: ``Reshape(RMSNorm(Reshape(z, [..., g])), z's shape)`` becomes a
   ``GatedRMSNorm`` of z with ``group_size = g`` (a Scale over ``[groups, g]`` as one row), the
   reshapes' targets proved over symbolic dims where ``Shape`` nodes compute them; reshaped to
   another shape, the op of z reshaped to it (a per-head tensor viewed as whole rows);
2. :class:`GateFirst`: ``norm(X * act(G))`` takes the gate before the norm;
   :class:`GateAfter`: ``norm(X) * act(G)`` after it, also in the half-precision spelling
   ``Cast(Cast(norm(X), float32) * act(Cast(G, float32)), X's type)`` (order A);
3. :class:`GatedCasts`: ``Cast(GatedRMSNorm(Cast(X, float32), ..., Cast(G, float32)), X's
   type)`` becomes the op of X and G (order B), as ``absorb.CastAbsorb`` does for the norms;
4. :class:`GatedScale`: ``Mul(GatedRMSNorm(...), w)`` becomes its Scale where the op scales
   there: no gate, or the gate before the norm (order A in half precision).

The activation is recognised by ``activations.activation`` whatever nodes the exporter wrote
for it and is never part of a match: where another node reads it, it stays computed for that
reader. Single ops of other tools: ONNX Runtime's ``com.microsoft GatedRMSNorm``
(:class:`MsGatedRMSNorm`).

The stage also holds the L2 norm's rules (``l2.py``): :func:`gated_rules` lists both.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxnorm.fusion._base import (
    FLOAT,
    FusionRule,
    NotThisPattern,
    Rejected,
    Replacement,
    attribute,
    check_scale,
    dtype,
    epsilon,
    int_values,
    scalar,
)

# ``X as X``: names of this module before activations.py and l2.py, importable from here as before
from onnxnorm.fusion.activations import (
    ACTIVATIONS as ACTIVATIONS,
    MS_ACTIVATIONS,
    OTHER_ACTIVATIONS as OTHER_ACTIVATIONS,
    OTHER_MS_ACTIVATIONS as OTHER_MS_ACTIVATIONS,
    SIGMOID as SIGMOID,
    SILU as SILU,
    Activation as Activation,
    activation,
    gate_of,
    is_standard,
)
from onnxnorm.fusion.checks import check_type, check_weight
from onnxnorm.fusion.l2 import (
    SUMS as SUMS,
    L2Core as L2Core,
    LpNormalization as LpNormalization,
    ScaledSum as ScaledSum,
    l2_rules,
)
from onnxnorm.fusion.ort_gated import MS_DOMAIN
from onnxnorm.fusion.report import Tracker
from onnxnorm.fusion.residual import SYMBOLIC_SHAPE, same_shape, symbolic
from onnxnorm.fusion.symbolic_shapes import Shapes, show
from onnxnorm.ops import catalogue

GATED = "GatedRMSNorm"
_HALF = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def as_gated(node: ir.Node) -> Replacement:
    """An onnxnorm RMSNorm or GatedRMSNorm without a gate, as a GatedRMSNorm to grow."""
    norm = Replacement.of(node)
    attrs = dict(norm.attributes)
    if norm.op == GATED:
        if norm.inputs.get("Gate") is not None:
            raise Rejected("the norm has a gate already")
        return norm
    if norm.inputs.get("Bias") is not None:
        raise Rejected("the norm adds a Bias, which GatedRMSNorm does not take")
    if attrs.pop("y_float32", 0):
        raise Rejected("the norm gives a float32 Y of a half-precision X")
    defaults = catalogue.get(GATED).defaults
    attrs = {**defaults, **{k: v for k, v in attrs.items() if k in defaults}}
    return Replacement(GATED, {"X": norm.inputs["X"], "Scale": norm.inputs.get("Scale")}, attrs)


def _cast_source(value: ir.Value, t: ir.DataType) -> ir.Value | None:
    """``v`` where ``value`` is ``Cast(v, FLOAT)`` and v is of type ``t``."""
    node = value.producer()
    if is_standard(node) and node.op_type == "Cast" and node.inputs and node.inputs[0] is not None:
        source = node.inputs[0]
        if source.dtype == t and dtype(value, "the cast") == FLOAT:
            return source
    return None


# ---------------------------------------------------------------------------------------------
# the gate


class GateAfter(FusionRule):
    """``norm(X) * act(G)`` (float32) or, in half precision, ``Cast(Cast(norm(X), float32) *
    act(Cast(G, float32)), X's type)`` (``cast``): a GatedRMSNorm with ``norm_before_gate =
    1``. The half-precision form rounds the norm's output before the gate: the op's order A
    (a norm that scales in float32 and rounds, order B, would round twice: a near miss)."""

    title = "GatedRMSNorm (norm, then gate)"

    def __init__(self, tracker: Tracker, op_name: str, cast: bool) -> None:
        self.op_name, self.cast = op_name, cast
        super().__init__(tracker, f"GateAfter{op_name}{'Cast' if cast else ''}")

    def pattern(self, op, x, a):
        norm = getattr(op, self.op_name)(
            x, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["norm"]
        )
        if not self.cast:
            return op.Mul(norm, a, _outputs=["y"])
        widened = op.Cast(norm, _outputs=["widened"])
        return op.Cast(op.Mul(widened, a, _outputs=["gated"]), _outputs=["y"])

    def inspect(self, context, x, a, norm, y, widened=None, **_):
        act = gate_of(a, x)
        base = as_gated(norm.producer())
        t = dtype(x, "X")
        attrs = dict(base.attributes, activation=act.kind, norm_before_gate=1)
        gate = act.gate
        if self.cast:
            if t not in _HALF or dtype(widened, "the widened norm") != FLOAT:
                raise NotThisPattern("no half-precision norm widened to float32")
            check_type(t, Y=y)
            source = _cast_source(act.gate, t)
            if source is None:
                raise Rejected(
                    f"the gate ({act.gate.name!r}) is not X's {t.name} cast to float32; "
                    "GatedRMSNorm takes the gate in X's type"
                )
            gate = source
            scaled = base.inputs.get("Scale") is not None or attrs["scale_offset"]
            if scaled and not attrs["cast_before_scale"]:
                raise Rejected(
                    "the norm scales in float32 and rounds (order B), then the gate multiplies "
                    "in float32 and rounds again; GatedRMSNorm rounds once in order B"
                )
            attrs["cast_before_scale"] = 1
        elif t != FLOAT:
            raise Rejected(
                f"the gate multiplies the norm in {t.name}; GatedRMSNorm multiplies it in "
                "float32 and rounds once"
            )
        return Replacement(GATED, {**base.inputs, "Gate": gate}, attrs)


class GateFirst(FusionRule):
    """``norm(X * act(G))``: a GatedRMSNorm with ``norm_before_gate = 0``, the product in float32
    and not rounded (Mamba2's ``hidden_states * silu(gate.to(float32))``). The product may be
    read elsewhere: it stays computed for that reader."""

    title = "GatedRMSNorm (gate, then norm)"
    shared = ("product",)

    def __init__(self, tracker: Tracker, op_name: str) -> None:
        self.op_name = op_name
        super().__init__(tracker, f"GateFirst{op_name}")

    def pattern(self, op, p, q):
        product = op.Mul(p, q, _outputs=["product"])
        return getattr(op, self.op_name)(
            product, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["y"]
        )

    def inspect(self, context, p, q, product, y, **_):
        act = gate_of(q, p)
        base = as_gated(y.producer())
        t = dtype(product, "X * act(gate)")
        if t != FLOAT:
            raise Rejected(
                f"X * act(gate) is computed in {t.name}; GatedRMSNorm multiplies in float32 "
                "without rounding"
            )
        attrs = dict(base.attributes, activation=act.kind, norm_before_gate=0)
        return Replacement(GATED, {**base.inputs, "X": p, "Gate": act.gate}, attrs)


# ---------------------------------------------------------------------------------------------
# groups, casts and scale


class GroupAbsorb(FusionRule):
    """``Reshape(RMSNorm(Reshape(z, [..., g])), shape)``: the RMS statistics of each run of g
    values (Mamba2's ``view(*prefix, groups, group_size)``, Falcon-H1's ``view(batch, seq,
    n_groups, dim // n_groups)``). Any reshape whose last dim g divides the rows groups the same
    values, so that is what is proved: the norm over the view's last axis, g static, the
    reshape after the norm back to z's shape, and g a divisor of z's last dim (or, where that
    dim is not static, the view splitting it into (groups, g) after z's own leading dims: the
    reshape then proves the division). With dynamic shapes the two reshapes' targets are
    computed from ``Shape`` nodes: they are evaluated over symbolic dims
    (:class:`onnxnorm.fusion.symbolic_shapes.Shapes`).

    Where the reshape after the norm gives another shape than z's (the exporter's optimizer
    merged ``scan_output.view(batch, seq, -1)`` of a per-head tensor into the grouped view, as
    in Falcon-H1's dynamo export), the norm is that of z reshaped to the output's shape: a new
    ``Reshape`` of z is its X, and g must divide the output's last dim. Not where z is the gate's
    product (the gate before the norm), which such a Reshape would keep outside the op.

    A Scale of the view ([g], or [groups, g] over one row) stays the op's Scale."""

    title = "GatedRMSNorm (groups: Reshape around the norm)"
    shared = ("view",)

    def __init__(self, tracker: Tracker) -> None:
        super().__init__(tracker, "GatedRMSNormGroups")
        #: (root, target, allowzero, shape) of the Reshape that gives the accepted match its X
        self._reshape_x: tuple[ir.Node, ir.Value | np.ndarray, int, ir.Shape | None] | None = None

    def forget(self) -> None:
        super().forget()
        self._reshape_x = None

    def pattern(self, op, z, s1, s2):
        view = op.Reshape(z, s1, _outputs=["view"])
        norm = op.RMSNorm(
            view, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["norm"]
        )
        return op.Reshape(norm, s2, _outputs=["y"])

    def inspect(self, context, z, view, norm, y, s1, s2, **_):
        self._reshape_x = None
        if not _gated_nearby(z, y):
            raise NotThisPattern("no gate next to the norm: a per-head norm between reshapes")
        base = as_gated(norm.producer())
        attrs = dict(base.attributes)
        shapes = Shapes()
        view_dims = shapes.view(z, view, s1)
        rank = view.shape.rank() if view.shape is not None else None
        if rank is None and view_dims is not None:
            rank = len(view_dims)
        if rank is None or attrs["axis"] not in (-1, rank - 1):
            raise Rejected(
                f"the norm of the grouped view normalizes from axis {attrs['axis']}, not over "
                "its last axis alone"
            )
        size = view.shape.dims[-1] if view.shape is not None else None
        if not isinstance(size, int) and view_dims and not view_dims[-1][1]:
            size = view_dims[-1][0]
        if not isinstance(size, int) or size <= 0:
            raise Rejected(f"the group size (the view's last dim, {_dim(size)}) is not static")
        why = _not_same_dims(z, y) and _not_restored(z, view, s2)
        if why:
            why = shapes.not_restored(z, view, y, s2, why)
        rows = z
        if why:
            if _gate_product(z):
                raise Rejected(f"the reshape after the norm does not restore X's shape: {why}")
            rows = y
            target, allowzero = shapes.x_target(view, norm, y, s2)
            self._reshape_x = (context.root, target, allowzero, shapes.named(y))
        width = _last_dim(rows)
        if width is None and rows is y and shapes.back is not None and not shapes.back[-1][1]:
            width = shapes.back[-1][0]
        if width is None and rows is y:
            raise Rejected(
                f"the output's last dim is not static: groups of {size} are not proved to lie "
                "within its rows"
            )
        if width is None and not shapes.splits(z, view_dims, size):
            shown = f" [{', '.join(map(show, view_dims))}]" if view_dims else ""
            raise Rejected(
                f"X's last dim is not static and the view{shown} does not split it into groups "
                f"of {size} after X's leading dims"
            )
        if width is not None and width % size:
            raise Rejected(
                f"groups of {size} (the reshape's last dim) do not divide X's last dim {width}: "
                "a group would span two rows"
            )
        flatten: tuple[str, ...] = ()
        scale = base.inputs.get("Scale")
        if scale is not None:
            dims = list(scale.shape.dims) if scale.shape is not None else None
            while dims and len(dims) > 1 and dims[0] == 1:
                dims.pop(0)
            if dims is None or not all(isinstance(d, int) for d in dims):
                raise Rejected(f"the shape of Scale ({scale.name!r}) is not static")
            if len(dims) == 2 and dims[0] * dims[1] == width and dims[1] == size:
                flatten = ("Scale",)  # [groups, g]: one row of z
            elif dims != [size]:
                raise Rejected(
                    f"Scale of shape {dims} over groups of {size} does not map onto X's rows "
                    f"of {_dim(width)}"
                )
        attrs["group_size"] = 0 if size == width else size
        attrs["axis"] = -1
        return Replacement(GATED, {**base.inputs, "X": z}, attrs, flatten=flatten)

    def rewrite(self, op, y, total=None, **rest):
        reshape, self._reshape_x = self._reshape_x, None
        if reshape is not None and self._accepted is not None and self._accepted[0] is reshape[0]:
            root, new = self._accepted
            target = reshape[1]
            if isinstance(target, np.ndarray):
                target = op.Constant(value=ir.tensor(target))
            x = op.Reshape(new.inputs["X"], target, **({"allowzero": 1} if reshape[2] else {}))
            x.type, x.shape = y.type, reshape[3]
            if SYMBOLIC_SHAPE in y.meta:
                x.meta[SYMBOLIC_SHAPE] = y.meta[SYMBOLIC_SHAPE]
            self._accepted = (root, dataclasses.replace(new, inputs={**new.inputs, "X": x}))
        return super().rewrite(op, y, total, **rest)


def _gate_product(z: ir.Value) -> bool:
    """Whether ``z`` is a product with an activation: the gate before the norm."""
    node = z.producer()
    return (
        is_standard(node)
        and node.op_type == "Mul"
        and any(v is not None and activation(v) is not None for v in node.inputs)
    )


def _last_dim(value: ir.Value) -> int | None:
    """The last dim of ``value`` where an inference made it static."""
    for shape in (value.shape, symbolic(value)):
        if shape is not None and shape.rank() and isinstance(shape.dims[-1], int):
            return shape.dims[-1]
    return None


def _gated_nearby(z: ir.Value, y: ir.Value) -> bool:
    """Whether a grouped norm of ``z`` with output ``y`` is gated: z is a product with an
    activation (the gate first), or y reaches a Mul by an activation through casts and weights
    (the gate after). A Q/K norm over the heads, which model builders write between two
    reshapes, is not: it stays an RMSNorm."""
    if _gate_product(z):
        return True
    frontier = [y]
    for _ in range(3):
        following: list[ir.Value] = []
        for value in frontier:
            for user in value.consumers():
                if not is_standard(user):
                    continue
                others = [v for v in user.inputs if v is not value and v is not None]
                if user.op_type == "Mul" and any(activation(v) is not None for v in others):
                    return True
                if user.op_type in ("Cast", "Mul"):
                    following.extend(user.outputs)
        frontier = following
    return False


class GatedCasts(FusionRule):
    """``Cast(GatedRMSNorm(Cast(X, float32), Scale, Cast(G, float32)), X's type)``: the op of X
    and G, in float32 and rounded once (order B). The casts may be read elsewhere."""

    title = "GatedRMSNorm input/output casts absorbed"
    shared = ("xf",)

    def __init__(self, tracker: Tracker) -> None:
        super().__init__(tracker, "GatedRMSNormCasts")

    def pattern(self, op, x):
        xf = op.Cast(x, _outputs=["xf"])
        norm = op.GatedRMSNorm(
            xf, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["norm"]
        )
        return op.Cast(norm, _outputs=["y"])

    def inspect(self, context, x, xf, norm, y, **_):
        base = Replacement.of(norm.producer())
        t = dtype(x, "X")
        if dtype(xf, "the cast X") != FLOAT:
            raise Rejected("the inner Cast is not to FLOAT")
        if t not in _HALF:
            raise NotThisPattern(f"X is {t.name}")
        check_type(t, Y=y)
        gate = base.inputs.get("Gate")
        if gate is not None:
            source = _cast_source(gate, t)
            if source is None:
                raise Rejected(
                    f"the gate ({gate.name!r}) is computed in FLOAT, not cast from X's "
                    f"{t.name}; GatedRMSNorm takes the gate in X's type"
                )
            gate = source
        scale = base.inputs.get("Scale")
        if scale is not None and dtype(scale, "Scale") not in (FLOAT, t):
            raise Rejected("Scale is neither FLOAT nor X's type")
        attrs = dict(base.attributes, cast_before_scale=0)
        return Replacement(GATED, {**base.inputs, "X": x, "Gate": gate}, attrs)


class GatedScale(FusionRule):
    """``Mul(GatedRMSNorm(...), w)`` (``Mul(..., w + c)`` with ``offset``) becomes its Scale
    (and scale offset) where the op scales there: without a gate, or with the gate before the
    norm. In float16/bfloat16 the Mul runs after the rounding: order A."""

    def __init__(self, tracker: Tracker, offset: bool) -> None:
        self.offset = offset
        self.title = f"GatedRMSNorm scale{' + offset' if offset else ''} absorbed"
        super().__init__(tracker, f"GatedRMSNormScale{'Offset' if offset else ''}")

    def pattern(self, op, x, scale, c):
        norm = op.GatedRMSNorm(
            x, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["norm"]
        )
        factor = op.Add(scale, c) if self.offset else scale
        return op.Mul(norm, factor, _outputs=["y"])

    def inspect(self, context, x, scale, norm, y, c=None, **_):
        base = Replacement.of(norm.producer())
        attrs = dict(base.attributes)
        check_weight(scale, x, "Scale", attrs["axis"])
        if base.inputs.get("Scale") is not None or attrs["scale_offset"]:
            raise NotThisPattern("the norm already has a Scale")
        if base.inputs.get("Gate") is not None and attrs["norm_before_gate"]:
            raise Rejected(
                "the weight multiplies after the gate; GatedRMSNorm scales the normalized value, "
                "then gates it"
            )
        t = dtype(x, "X")
        check_type(t, Scale=scale, Y=y)
        check_scale(scale, x, attrs["axis"])
        if self.offset:
            attrs["scale_offset"] = scalar(c, "the scale offset")
            if dtype(c, "the scale offset") != t:
                raise Rejected("the scale offset is not of X's type")
        attrs["cast_before_scale"] = int(t != FLOAT)
        return Replacement(GATED, {**base.inputs, "Scale": scale}, attrs)


# ---------------------------------------------------------------------------------------------
# single ops of other tools


class MsGatedRMSNorm(FusionRule):
    """ONNX Runtime's ``com.microsoft GatedRMSNorm(X, scale [C], gate)``: the RMS statistics of
    each run of C values, times scale, times the activation of gate, all in float32 and rounded
    once (order B, the gate after the norm)."""

    title = "GatedRMSNorm (ORT com.microsoft GatedRMSNorm)"

    def __init__(self, tracker: Tracker) -> None:
        super().__init__(tracker, "MsGatedRMSNorm")

    def pattern(self, op, x, scale, gate):
        return op.GatedRMSNorm(x, scale, gate, _domain=MS_DOMAIN, _outputs=["y"])

    def inspect(self, context, x, scale, gate, y, **_):
        node = y.producer()
        t = dtype(x, "X")
        check_type(t, Scale=scale, Gate=gate, Y=y)
        name = str(attribute(node, "activation", "silu"))
        if name not in MS_ACTIVATIONS:
            raise Rejected(f"activation {name!r}; GatedRMSNorm takes silu, swish or sigmoid")
        dims = _dims(scale)
        if dims is None or len(dims) != 1 or not isinstance(dims[0], int):
            raise Rejected(f"scale ({scale.name!r}) is not 1-D of a static length")
        size = dims[0]
        width = x.shape.dims[-1] if x.shape is not None and x.shape.rank() else None
        if isinstance(width, int) and width % size:
            raise Rejected(f"scale of length {size} does not divide X's last dim {width}")
        same_shape(gate, x, "the gate and X", "GatedRMSNorm")
        return Replacement(
            GATED,
            {"X": x, "Scale": scale, "Gate": gate},
            {
                "axis": -1,
                "epsilon": epsilon(float(attribute(node, "epsilon", 1e-5))),
                "cast_before_scale": 0,
                "group_size": 0 if size == width else size,
                "activation": MS_ACTIVATIONS[name],
                "norm_before_gate": 1,
            },
        )


def _dims(value: ir.Value) -> list | None:
    return list(value.shape.dims) if value.shape is not None else None


def _dim(d) -> str:
    if d is None:
        return "unknown"
    return str(d) if isinstance(d, int) else (d.value or "unknown")


def _not_same_dims(a: ir.Value, b: ir.Value) -> str:
    """ "" where the shapes of ``a`` and ``b`` are proved equal (equal integers, or one symbol of
    one inference: onnx's or ORT's symbolic), else why not."""
    reasons = []
    for shape_a, shape_b in ((a.shape, b.shape), (symbolic(a), symbolic(b))):
        if shape_a is None or shape_b is None:
            continue
        dims_a, dims_b = list(shape_a.dims), list(shape_b.dims)
        if len(dims_a) == len(dims_b) and all(
            (isinstance(da, int) and da == db)
            or (isinstance(da, ir.SymbolicDim) and da.value is not None and da == db)
            for da, db in zip(dims_a, dims_b)
        ):
            return ""
        reasons.append(
            f"X is [{', '.join(map(_dim, dims_a))}], the output [{', '.join(map(_dim, dims_b))}]"
        )
    return reasons[0] if reasons else "the shapes are unknown"


def _not_restored(z: ir.Value, view: ir.Value, shape: ir.Value) -> str:
    """ "" where the Reshape of ``view`` by ``shape`` (a small integer computation on static
    dims, as TorchScript writes it) gives z's static shape, else why not."""
    dims = _dims(z)
    source = _dims(view)
    if dims is None or not all(isinstance(d, int) for d in dims):
        return "X's shape is not static"
    try:
        target = [int(d) for d in int_values(shape, "the reshape's shape").reshape(-1)]
    except Rejected as e:
        return str(e)
    for i, d in enumerate(target):
        if d == 0 and source is not None and i < len(source) and isinstance(source[i], int):
            target[i] = source[i]  # allowzero = 0: the input's dim
    if target.count(-1) == 1 and source is not None and all(isinstance(d, int) for d in source):
        known = int(np.prod([d for d in target if d != -1]))
        target[target.index(-1)] = int(np.prod(source)) // known if known else -1
    if target != dims:
        return f"X is {dims}, the reshape gives {target}"
    return ""


def gated_rules(tracker: Tracker, strict_precision: bool = False) -> list[pattern.RewriteRule]:
    """The gated and L2 norms (apply to a fixpoint after the norm stage, whose RMSNorm nodes
    they start from). ``strict_precision``: an L2 norm whose statistics the original computes
    in float16 or bfloat16 stays as it is."""
    rules = [MsGatedRMSNorm.rule(tracker), *l2_rules(tracker, strict_precision)]
    rules += [GroupAbsorb.rule(tracker)]
    for name in ("RMSNorm", GATED):
        rules += [GateFirst.rule(tracker, op_name=name)]
        rules += [GateAfter.rule(tracker, op_name=name, cast=cast) for cast in (False, True)]
    rules += [GatedCasts.rule(tracker)]
    rules += [GatedScale.rule(tracker, offset=offset) for offset in (True, False)]
    return rules

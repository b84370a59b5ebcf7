"""The rotary op that a Q/K norm and its rotary become (``rotary.py`` finds the norm then the
rotary, ``rotary_first.py`` the rotary then the norm): its inputs and attributes, from the
onnxnorm norm node and the rotary's angles, and the Sin it reads, negated where the model
rotates by minus the angle (nanochat's ``rotate_half``, ``cat(x2, -x1)``): the rotation by -a is
the one by a with sin negated, and negating a float is exact, so the fused node computes what
the model does, bit for bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from onnxnorm.fusion._base import (
    FusionRule,
    Rejected,
    Replacement,
    attribute,
    constant,
    dtype,
)
from onnxnorm.ops import catalogue


@dataclasses.dataclass(frozen=True)
class Rotary:
    """What a match's decomposed rotary gives the op: the per-token angles (and the views that
    fit folded ones, by input name), the head axis they broadcast over, the form (interleaved
    pairs or halves; ``negated``: by minus the angle), the values rotated of each head and the
    nodes that compute the angles and the partner."""

    cos: ir.Value
    sin: ir.Value
    views: dict[str, tuple]
    head_axis: int
    interleaved: int
    negated: bool
    rotary_dim: int
    nodes: set[ir.Node]


@dataclasses.dataclass(frozen=True)
class RotaryReplacement(Replacement):
    """A rotary op's replacement; ``negate_sin``: the node reads minus the Sin given, which
    :class:`RotaryRule`'s rewrite writes."""

    negate_sin: bool = False


def replacement(
    op: str, norm: ir.Node, q: ir.Value, rotary: Rotary, head: int, in_float32: bool, **layout
) -> RotaryReplacement:
    """The rotary op ``op`` of the onnxnorm ``norm`` (its weights, epsilon and rounding) reading
    Q ``q``, of heads of ``head`` values, and ``rotary``'s angles; ``in_float32``: the model
    rotates in float32 and rounds once; ``layout``: the attributes of the layout and order."""
    x = norm.inputs[0] if norm.inputs else None
    rank = x.shape.rank() if x is not None and x.shape is not None else None
    if rank is None:
        raise Rejected("the rank of the norm's X is unknown")
    if attribute(norm, "axis", -1) % rank != rank - 1:
        raise Rejected("the norm spans more than the last axis")
    if attribute(norm, "y_float32", 0):
        raise Rejected("the norm has a float32 output")
    names = [p.name for p in catalogue.get(norm.op_type).inputs]
    given = dict(zip(names, norm.inputs))
    if op == "RMSNormRotary" and given.get("Bias") is not None:
        raise Rejected("the RMSNorm adds a Bias, which RMSNormRotary has not")
    t = dtype(q, "the rotated tensor")
    inputs: dict[str, ir.Value | None] = {"Q": q, "Cos": rotary.cos, "Sin": rotary.sin}
    if op != "L2NormRotary":
        inputs["QScale"] = given.get("Scale")
    if op == "LayerNormRotary":
        inputs["QBias"] = given.get("Bias")
    attributes = {
        "epsilon": attribute(norm, "epsilon", 1e-5),
        **layout,
        "rotary_dim": 0 if rotary.rotary_dim == head else rotary.rotary_dim,
        "interleaved": rotary.interleaved,
        # eager PyTorch rounds each step in the model's type; in float32 both are one
        "rotary_in_t": int(t != ir.DataType.FLOAT and not in_float32),
    }
    if op != "L2NormRotary":
        attributes["cast_before_scale"] = attribute(norm, "cast_before_scale", 0)
    if op == "RMSNormRotary":
        attributes["scale_offset"] = attribute(norm, "scale_offset", 0.0)
    return RotaryReplacement(
        op, inputs, attributes, outputs=1, reshape=rotary.views, negate_sin=rotary.negated
    )


def negated(op, sin: ir.Value, graph: ir.Graph | None) -> ir.Value:
    """Minus ``sin``: the input of a Neg; constant angles negated, as an initializer (one per
    angles: Q's node and K's read the same, so that they pair); else a new Neg node."""
    producer = sin.producer()
    if producer is not None and producer.op_type == "Neg" and producer.domain == "":
        source = producer.inputs[0]
        if source is not None:
            return source
    try:
        values = -constant(sin, "sin")
    except Rejected:
        values = None
    if values is not None and graph is not None:
        name = f"{sin.name}/negated"
        known = graph.initializers.get(name)
        if known is None:
            tensor = ir.tensor(values, name=name)
            known = ir.Value(name=name, type=sin.type, shape=ir.Shape(values.shape))
            known.const_value = tensor
            graph.register_initializer(known)
            return known
        if known.const_value is not None and np.array_equal(known.const_value.numpy(), values):
            return known
    value = op.Neg(sin)
    value.type, value.shape = sin.type, sin.shape
    return value


class RotaryRule(FusionRule):
    """A rule whose match becomes a rotary op: the rewrite gives the node minus Sin where the
    match rotates by minus the angle."""

    def rewrite(self, op, y, total=None, **bindings):
        if self._accepted is not None:
            root, new = self._accepted
            sin = new.inputs.get("Sin")
            if isinstance(new, RotaryReplacement) and new.negate_sin and sin is not None:
                inputs = {**new.inputs, "Sin": negated(op, sin, root.graph)}
                self._accepted = (root, dataclasses.replace(new, inputs=inputs, negate_sin=False))
        return super().rewrite(op, y, total, **bindings)


def transposes(node: ir.Node | None) -> bool:
    """A Transpose of the two middle axes: [batch, seq, heads, head] <-> [batch, heads, ...]."""
    return (
        node is not None
        and node.op_type == "Transpose"
        and node.domain == ""
        and list(attribute(node, "perm", [])) == [0, 2, 1, 3]
    )


def narrows(node: ir.Node, t: ir.DataType) -> bool:
    """A Cast of a float32 value to the narrower ``t``: the rounding back of a rotation computed
    in float32."""
    data = node.inputs[0] if node.inputs else None
    return (
        t in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
        and attribute(node, "to", None) == t
        and data is not None
        and data.dtype == ir.DataType.FLOAT
    )

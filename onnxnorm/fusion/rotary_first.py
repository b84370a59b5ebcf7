"""Q/K rotary, then norm (Llama 4, nanochat): the rotary embedding of Q or K and an onnxnorm
RMSNorm, LayerNorm or L2Norm node over each of its heads after it become one
``RMSNormRotary``, ``LayerNormRotary`` or ``L2NormRotary`` node with ``rotary_first = 1``
(``rotary_op.py`` writes it); ``rotary_pair.pair`` then makes a layer's Q and K one node.

Rooted at the norm: its X is ``x * cos + partner(x) * sin``, or the Concat of that sum and the
rest of each head for a partial rotary, analysed as ``rotary.py`` analyses the rotary after a
norm (the partner's index map, the angles, a rotation in float32 between Casts, whose Cast back
to the norm's type is taken). A Transpose of the heads between the rotary and the norm, or one
before the rotary that the rotary alone reads (nanochat's), is taken too: ``layout = 2``.

What is not matched yet: a norm over the whole token, and the Transpose after the norm (Llama
4's stays a node of its own); a rotary whose sum or products are read outside it (reported).
"""

from __future__ import annotations

import onnx_ir as ir

from onnxnorm.fusion._base import NotThisPattern, Rejected, Replacement, dtype
from onnxnorm.fusion.report import Tracker
from onnxnorm.fusion.rotary import (
    ROTARY_OF,
    axis_of,
    halves,
    index_map,
    input_of,
    last_dim,
    match_rotary,
    rank_of,
    turn,
    unwidened,
    users_inside,
)
from onnxnorm.fusion.rotary_op import RotaryRule, narrows, replacement, transposes
from onnxnorm.ops import catalogue


def _terms(add: ir.Node) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value, ir.Value]:
    """(x, rotated, cos, partner, sin) of the sum ``x * cos + partner * sin``, its terms and
    factors in either order, ``partner`` a rearrangement of ``rotated`` (x, or the tensor x
    widens to float32) that rotates; NotThisPattern for any other sum."""
    factors: list[tuple[ir.Value, ir.Value]] = []
    for value in add.inputs:
        node = value.producer() if value is not None else None
        if node is None or node.op_type != "Mul" or node.domain != "" or len(node.inputs) != 2:
            raise NotThisPattern("not a sum of two products")
        a, b = node.inputs
        if a is None or b is None:
            raise NotThisPattern("a Mul without its inputs")
        factors.append((a, b))
    if len(factors) != 2:
        raise NotThisPattern("not a sum of two products")
    for first, second in (factors, factors[::-1]):
        for x, cos in (first, first[::-1]):
            for partner, sin in (second, second[::-1]):
                for rotated in dict.fromkeys((x, unwidened(x))):
                    try:
                        turn(*index_map(partner, rotated))
                    except Rejected:
                        continue
                    return x, rotated, cos, partner, sin
    raise NotThisPattern("the sum before the norm is no rotation")


class RotaryNorm(RotaryRule):
    """Rotary first (Llama 4, nanochat): the norm of ``x * cos + partner(x) * sin`` (or of
    its partial form), through a Transpose of the heads between the two or before the rotary
    and through the Cast back of a rotation in float32, with ``rotary_first = 1``."""

    title = "Q/K rotary, then norm"

    def __init__(self, tracker: Tracker, op_name: str) -> None:
        self.op_name = op_name
        super().__init__(tracker, f"Rotary{op_name}")

    def pattern(self, op, x):
        norm = getattr(op, self.op_name)
        return norm(x, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["y"])

    def inspect(self, context, x, **_) -> Replacement:
        norm = context.root
        t = dtype(x, "the norm's X")
        value, between, narrowing = x, None, None
        while (node := value.producer()) is not None and node.domain == "":
            if node.op_type == "Transpose" and between is None:
                between = node
            elif node.op_type == "Cast" and narrowing is None and narrows(node, t):
                narrowing = node
            else:
                break
            value = input_of(node)
        inside = {norm} | {n for n in (between, narrowing) if n is not None}
        computed = [v for n in (between, narrowing) if n is not None for v in n.outputs]
        concat, add = None, value.producer()
        if add is not None and add.op_type == "Concat" and add.domain == "":
            concat, add = add, input_of(add).producer()
        if add is None or add.op_type != "Add" or add.domain != "":
            raise NotThisPattern("no rotary before the norm")
        term, rotated, cos, partner, sin = _terms(add)
        products = [n for n in (input_of(add, i).producer() for i in (0, 1)) if n is not None]
        inside |= {add, *products}
        computed += [add.outputs[0]] + [p.outputs[0] for p in products]
        base = term
        if concat is not None:
            if len(concat.inputs) != 2 or concat.inputs[0] is not add.outputs[0]:
                raise NotThisPattern("a Concat of more than a rotated part and the rest")
            base = halves(term, input_of(concat, 1))
            if axis_of(concat, concat.outputs[0]) != rank_of(base, "a head") - 1:
                raise NotThisPattern("a Concat of another axis")
            inside |= {concat, term.producer(), input_of(concat, 1).producer()}
            computed += [concat.outputs[0], term, input_of(concat, 1)]
        q = base
        if narrowing is not None:  # the rotation in float32 of a narrower Q, rounded back
            q = unwidened(base)
            if q is base:
                raise Rejected("the rotation in float32 is not of a tensor of the norm's type")
            inside.add(base.producer())
            computed.append(base)
        if dtype(q, "the rotated tensor") != t:
            raise Rejected("the rotated tensor is not of the norm's type")
        if rank_of(q, "the rotated tensor") != 4:
            raise NotThisPattern("not a 4-D tensor of heads")
        if between is not None and not transposes(between):
            raise Rejected("the Transpose between the rotary and the norm is not [0, 2, 1, 3]")
        known = 2 if between is not None else None
        rotary = match_rotary(rotated, cos, sin, partner, known, t, narrowing is not None)
        if between is not None and rotary.head_axis != 2:
            raise Rejected("the angles broadcast over another axis than the transposed heads")
        inside |= rotary.nodes
        # the Transpose to [batch, heads, seq, head] before the rotary (nanochat), where the
        # rotary alone reads its output
        before = q.producer()
        if (
            before is not None
            and between is None
            and rotary.head_axis == 1
            and transposes(before)
            and not q.is_graph_output()
            and all(user in inside for user in q.consumers())
        ):
            inside.add(before)
            q = input_of(before)
        else:
            before = None
        users_inside(computed, inside)
        taken = between is not None or before is not None
        layout = 2 if taken else (1 if rotary.head_axis == 1 else 0)
        head = last_dim(base, "a head")
        op = ROTARY_OF[self.op_name]
        return replacement(
            op, norm, q, rotary, head, narrowing is not None, layout=layout, rotary_first=1
        )


def rotary_first_rules(tracker: Tracker) -> list:
    """One rule per norm op (in ``ROTARY_OF``'s order): the rotary before it."""
    return [RotaryNorm.rule(tracker, op_name=name) for name in ROTARY_OF]

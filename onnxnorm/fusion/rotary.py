"""Q/K norm, then rotary: a per-head norm (an onnxnorm RMSNorm, LayerNorm or L2Norm node, after
the norms stage) and the rotary embedding after it become one ``RMSNormRotary``,
``LayerNormRotary`` or ``L2NormRotary`` node (``rotary_op.py`` writes it); then the node of a
layer's Q and the node of its K, rotated by the same angles in the same order, become one node
with both (``rotary_pair.pair``). The analysis of a rotary is here as well, public, for
``rotary_first.py`` (the rotary, then the norm).

The rotary is matched as the models compute it, ``x * cos + partner(x) * sin`` (for a partial
rotary, the Concat of that sum and the rest of each head), where ``partner(x)`` is any chain of
Slice, Split, Neg, Concat, Unsqueeze and Reshape on x's last axis (:func:`index_map` evaluates
it): ``rotate_half`` (``cat(-x2, x1)``) is the half-split form, ``stack(-x[1::2],
x[::2]).flatten`` the interleaved one, whatever ops an exporter spells them with; minus either
(nanochat's ``cat(x2, -x1)``) is the rotation by minus the angle, which the node computes with
Sin negated (:func:`turn`). ``cos`` and ``sin`` are the per-token angles unsqueezed at the head
axis (the axis tells the layout; :func:`match_rotary`); a rotation computed in float32 on a
float16/bfloat16 Q is taken with the Casts around it (``rotary_in_t = 0``).

The rules here are rooted at the Add, the Concat, or the Cast back: the norm before is taken
whole, through the Transpose to [batch, heads, seq, head] a model writes between its norm and
its rotary (``layout = 2``), and through the view of a norm over the whole projection (OLMo 2:
``per_head = 0``).

What is not matched yet: a rotary whose sum or products are read outside it (reported).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxnorm.fusion import symbolic_shapes
from onnxnorm.fusion._base import (
    NotThisPattern,
    Rejected,
    Replacement,
    attribute,
    constant,
    dtype,
    int_values,
)
from onnxnorm.fusion.report import Tracker
from onnxnorm.fusion.residual import symbolic
from onnxnorm.fusion.rotary_op import (
    Rotary,
    RotaryRule,
    replacement,
    transposes,
)
from onnxnorm.ops import catalogue

#: the norm op -> its rotary op
ROTARY_OF = {"RMSNorm": "RMSNormRotary", "LayerNorm": "LayerNormRotary", "L2Norm": "L2NormRotary"}
#: the depth of a partner chain the evaluation follows
_DEPTH = 12


def rank_of(value: ir.Value, what: str) -> int:
    if value.shape is None:
        raise Rejected(f"the rank of {what} ({value.name!r}) is unknown")
    return value.shape.rank()


def last_dim(value: ir.Value, what: str) -> int:
    # onnx's inference, else ORT's symbolic one (TorchScript's reshapes computed from shapes)
    for shape in (value.shape, symbolic(value)):
        dims = list(shape.dims) if shape is not None else []
        if dims and isinstance(dims[-1], int):
            return dims[-1]
    raise Rejected(f"the last dim of {what} ({value.name!r}) is not static")


def axis_of(node: ir.Node, value: ir.Value, default: int = 0) -> int:
    axis = attribute(node, "axis", default)
    rank = rank_of(value, "a rotary operand")
    return axis % rank


def index_map(
    value: ir.Value, source: ir.Value, depth: int = _DEPTH
) -> tuple[np.ndarray, np.ndarray]:
    """(index, sign) of each value of ``value``'s trailing axes in terms of ``source``'s last
    axis: value[..., i] = sign[i] * source[..., index[i]] (arrays of the trailing axes' shape,
    one axis, or two inside an interleaved stack); NotThisPattern where ``value`` is not such
    a rearrangement of ``source``."""
    if value is source:
        n = last_dim(source, "the rotated tensor")
        return np.arange(n), np.ones(n, np.int64)
    node = value.producer()
    if node is None or depth == 0 or node.domain not in ("", "ai.onnx"):
        raise NotThisPattern("not a rearrangement of the rotated tensor")
    op = node.op_type
    data = node.inputs[0] if node.inputs else None
    if data is None:  # (a Constant: no rearrangement of anything)
        raise NotThisPattern(f"{op} without input")
    rank = rank_of(value, "a rotary operand")
    if op == "Identity" or (op == "Cast" and _widens(node)):
        return index_map(data, source, depth - 1)
    if op == "Neg":
        index, sign = index_map(data, source, depth - 1)
        return index, -sign
    if op == "Concat":
        parts = [index_map(v, source, depth - 1) for v in node.inputs if v is not None]
        inner = parts[0][0].ndim
        if axis_of(node, value) != rank - 1 or any(p[0].ndim != inner for p in parts):
            raise NotThisPattern("a Concat across another axis")
        return (
            np.concatenate([p[0] for p in parts], axis=-1),
            np.concatenate([p[1] for p in parts], axis=-1),
        )
    if op in ("Slice", "Split"):
        index, sign = index_map(data, source, depth - 1)
        if index.ndim != 1:
            raise NotThisPattern(f"a {op} inside a stack")
        part = _sliced(node, value, rank, len(index))
        return index[part], sign[part]
    if op == "Unsqueeze":
        index, sign = index_map(data, source, depth - 1)
        axes = attribute(node, "axes", None)
        if axes is None and len(node.inputs) > 1:
            axes = int_values(node.inputs[1], "Unsqueeze's axes").reshape(-1).tolist()
        if index.ndim != 1 or [a % rank for a in axes or []] != [rank - 1]:
            raise NotThisPattern("an Unsqueeze of another axis")
        return index[:, None], sign[:, None]
    if op in ("Reshape", "Flatten"):
        index, sign = index_map(data, source, depth - 1)
        if index.ndim != 2 or rank_of(data, "a rotary operand") != rank + 1:
            raise NotThisPattern("a Reshape of other axes")
        if last_dim(value, "a rotary operand") != index.size:
            raise NotThisPattern("a Reshape of other axes")
        return index.reshape(-1), sign.reshape(-1)
    if op == "Mul":
        other = node.inputs[1]
        try:
            factor = constant(other, "a factor")
        except Rejected:
            raise NotThisPattern("a product with a variable") from None
        if factor.size != 1 or float(factor.reshape(-1)[0]) not in (1.0, -1.0):
            raise NotThisPattern("a product with a factor other than +-1")
        index, sign = index_map(data, source, depth - 1)
        return index, sign * int(factor.reshape(-1)[0])
    raise NotThisPattern(f"a {op} in the rotation's partner")


def _widens(node: ir.Node) -> bool:
    """A Cast to float32 of a float16, bfloat16 or float32 value: exact."""
    data = node.inputs[0]
    exact = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.FLOAT)
    return (
        attribute(node, "to", None) == ir.DataType.FLOAT
        and data is not None
        and data.dtype in exact
    )


def unwidened(value: ir.Value) -> ir.Value:
    """``value`` before an exact Cast to float32 (itself where there is none)."""
    node = value.producer()
    if node is not None and node.op_type == "Cast" and node.domain == "" and _widens(node):
        return input_of(node)
    return value


def input_of(node: ir.Node, index: int = 0) -> ir.Value:
    """An input a match needs (NotThisPattern where the node leaves it out)."""
    value = node.inputs[index] if index < len(node.inputs) else None
    if value is None:
        raise NotThisPattern(f"{node.op_type} without input {index}")
    return value


def _ints(value: ir.Value, what: str) -> np.ndarray:
    """The integers of a small computation on constants and shapes, 1-D: where the shapes read
    are not all static (TorchScript's ``x.shape[-1] // 2`` of a tensor with dynamic batch and
    sequence dims), evaluated over symbolic dims; each element must come out an integer."""
    try:
        return int_values(value, what).reshape(-1)
    except Rejected:
        terms, _ = symbolic_shapes.Shapes().evaluate(value)
    if any(dims for _, dims in terms):
        raise Rejected(f"{what} ({value.name!r}) depends on dims that are not static")
    return np.array([coefficient for coefficient, _ in terms], np.int64)


def _sliced(node: ir.Node, value: ir.Value, rank: int, size: int) -> slice:
    """The slice of the last axis that a Slice or a Split output ``value`` takes."""
    if node.op_type == "Split":
        axis = axis_of(node, value)
        if axis != rank - 1:
            raise NotThisPattern("a Split of another axis")
        outputs = list(node.outputs)
        sizes = attribute(node, "split", None)
        if sizes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
            sizes = _ints(node.inputs[1], "Split's sizes").tolist()
        if sizes is None:
            if size % len(outputs):
                raise NotThisPattern("an uneven Split")
            sizes = [size // len(outputs)] * len(outputs)
        start = sum(sizes[: outputs.index(value)])
        return slice(start, start + sizes[outputs.index(value)])
    starts, ends = (_ints(input_of(node, i), "Slice's bounds") for i in (1, 2))
    axes = (
        _ints(node.inputs[3], "Slice's axes")
        if len(node.inputs) > 3 and node.inputs[3] is not None
        else np.arange(len(starts))
    )
    steps = (
        _ints(node.inputs[4], "Slice's steps")
        if len(node.inputs) > 4 and node.inputs[4] is not None
        else np.ones(len(starts), np.int64)
    )
    if len(axes) != 1 or int(axes[0]) % rank != rank - 1:
        raise NotThisPattern("a Slice of another axis")
    start, end, step = (int(v[0]) for v in (starts, ends, steps))
    return slice(*slice(start, end, step).indices(size))


def rotation_kind(index: np.ndarray, sign: np.ndarray) -> int:
    """``interleaved`` (0 or 1) of a partner's index map; NotThisPattern for any other."""
    n = len(index)
    half = n // 2
    if index.ndim != 1 or n % 2:
        raise NotThisPattern("a partner of odd length")
    positions = np.arange(n)
    if (index == (positions + half) % n).all() and (
        sign == np.where(positions < half, -1, 1)
    ).all():
        return 0
    pairs = positions ^ 1
    if (index == pairs).all() and (sign == np.where(positions % 2 == 0, -1, 1)).all():
        return 1
    if (index == (positions + half) % n).all() and (
        sign == np.where(positions < half, 1, -1)
    ).all():
        raise Rejected(
            "the rotation turns the other way (partner cat(x2, -x1)): sin would be negated"
        )
    raise NotThisPattern("a partner that is no rotation")


def _angles(
    operand: ir.Value, what: str, x: ir.Value, head_axis: int | None
) -> tuple[ir.Value, int, tuple | None]:
    """The per-token angles [batch or 1, seq, dim] under ``operand`` (the factor of the rotated
    tensor ``x``), the head axis they broadcast over, and the shape a Reshape must give them
    (None: they are the Unsqueeze's input, as they are): an Unsqueeze at the head axis, or a
    4-D tensor with a 1 there (a constant an exporter folded); ``head_axis``: the axis where
    the layout says the heads are (None: not known, the one where x has more than one)."""
    rank = rank_of(x, "the rotated tensor")
    node = operand.producer()
    if node is not None and node.op_type == "Unsqueeze" and node.domain in ("", "ai.onnx"):
        axes = attribute(node, "axes", None)
        if axes is None and len(node.inputs) > 1:
            axes = int_values(node.inputs[1], f"{what}'s Unsqueeze axes").reshape(-1).tolist()
        angles = node.inputs[0]
        if angles is None or len(axes or []) != 1 or rank_of(angles, what) != 3:
            raise Rejected(f"{what} is not [batch, seq, dim] angles unsqueezed at one axis")
        return angles, axes[0] % rank, None
    dims = list(operand.shape.dims) if operand.shape is not None else []
    x_dims = list(x.shape.dims) if x.shape is not None else []
    if len(dims) != 4 or len(x_dims) != 4:
        raise Rejected(f"{what} ({operand.name!r}) is not angles broadcast over the heads")
    # the head axis: where the angles have 1 and the other axis (the sequence) is x's
    heads = [
        a
        for a in (1, 2)
        if dims[a] == 1 and dims[3 - a] == x_dims[3 - a] and (head_axis is None or a == head_axis)
    ][:1]
    if len(heads) != 1 or not isinstance(dims[3], int):
        raise Rejected(f"{what} ({operand.name!r}) does not tell the head axis")
    return operand, heads[0], (0, -1, dims[3]) if heads[0] == 1 else (0, 0, dims[3])


def users_inside(values: list[ir.Value], nodes: set[ir.Node], rotary: str = "rotary") -> None:
    """Rejected unless every one of ``values`` is read only by ``nodes`` (the norm and its
    ``rotary``, which the fused node replaces) and is no graph output."""
    for value in values:
        if value.is_graph_output():
            raise Rejected(f"{value.name!r} is a graph output")
        for user in value.consumers():
            if user not in nodes:
                raise Rejected(
                    f"{value.name!r} is also used by {user.op_type} node {user.name!r}, "
                    f"outside the norm and its {rotary}"
                )


def _chain(value: ir.Value, stop: ir.Value) -> set[ir.Node]:
    """The nodes between ``stop`` and ``value`` (the partner's rearrangement)."""
    found: set[ir.Node] = set()
    pending = [value]
    while pending:
        current = pending.pop()
        if current is stop:
            continue
        node = current.producer()
        if node is None or node in found:
            continue
        found.add(node)
        pending.extend(v for v in node.inputs if v is not None)
    return found


def turn(index: np.ndarray, sign: np.ndarray) -> tuple[int, bool]:
    """(interleaved, negated) of a partner's index map: ``negated`` where the partner is minus
    a rotation's (``cat(x2, -x1)``, nanochat's: the rotation by minus the angle, which is the
    op's with Sin negated, exactly, as negating a float is); NotThisPattern for any other."""
    try:
        return rotation_kind(index, sign), False
    except Rejected:
        return rotation_kind(index, -sign), True


def match_rotary(
    rotated: ir.Value,
    cos: ir.Value,
    sin: ir.Value,
    partner: ir.Value,
    head_axis: int | None,
    t: ir.DataType,
    in_float32: bool,
) -> Rotary:
    """The rotary ``rotated * cos + partner * sin`` of a tensor of type ``t`` (``in_float32``:
    computed in float32 from it); ``head_axis``: where the layout says the heads are (None:
    not known)."""
    interleaved, negated = turn(*index_map(partner, rotated))
    cos_angles, axis, cos_view = _angles(cos, "cos", rotated, head_axis)
    sin_angles, sin_axis, sin_view = _angles(sin, "sin", rotated, head_axis)
    if axis != sin_axis or axis not in (1, 2):
        raise Rejected("cos and sin are unsqueezed at different axes, or not at a head axis")
    nodes = {n for n in (cos.producer(), sin.producer()) if n is not None}
    if in_float32:  # angles of Q's type cast to float32 are Q's type's angles
        cos_angles, sin_angles = unwidened(cos_angles), unwidened(sin_angles)
    allowed = (t, ir.DataType.FLOAT) if in_float32 else (t,)
    if dtype(cos_angles, "cos") not in allowed or dtype(sin_angles, "sin") not in allowed:
        raise Rejected("cos and sin are not of the rotated tensor's type")
    if cos_angles.shape != sin_angles.shape or cos_view != sin_view:
        raise Rejected("cos and sin differ in shape")
    rotary_dim = last_dim(rotated, "the rotated values")
    if last_dim(cos_angles, "cos") != rotary_dim:
        raise Rejected("cos is not one angle per rotated value")
    views = {name: v for name, v in (("Cos", cos_view), ("Sin", sin_view)) if v is not None}
    nodes |= _chain(partner, rotated)
    return Rotary(cos_angles, sin_angles, views, axis, interleaved, negated, rotary_dim, nodes)


def halves(x: ir.Value, rest: ir.Value) -> ir.Value:
    """The heads whose leading values ``x`` and whose other values ``rest`` are (the two parts
    of a partial rotary)."""
    slices = [x.producer(), rest.producer()]
    if any(node is None or node.op_type not in ("Slice", "Split") for node in slices):
        raise NotThisPattern("not the two parts of a head")
    first_node, second_node = (node for node in slices if node is not None)
    base = input_of(first_node)
    if second_node.inputs[0] is not base:
        raise NotThisPattern("the two parts are of different tensors")
    head = last_dim(base, "a head")
    rank = rank_of(base, "the rotated tensor")
    first = _sliced(first_node, x, rank, head)
    second = _sliced(second_node, rest, rank, head)
    if (
        (first.start, first.step, second.step) != (0, 1, 1)
        or second.start != first.stop
        or second.stop != head
    ):
        raise Rejected("the rotated part and the rest do not split each head in two")
    return base


class _NormRotary(RotaryRule):
    """The base of the rules: the norm under the rotated tensor, the angles, the layout; a
    rotation by minus the angle becomes the op's of minus Sin."""

    title = "Q/K norm and rotary"

    def _replacement(
        self,
        root: ir.Node,
        rotated: ir.Value,
        base: ir.Value,
        cos: ir.Value,
        sin: ir.Value,
        partner: ir.Value,
        inside: set[ir.Node],
        in_float32: bool = False,
    ) -> Replacement:
        """The node of a match: ``rotated`` is the tensor the partner rearranges (a head, or its
        leading part), ``base`` the whole heads; ``in_float32``: the rotation is computed in
        float32 from them (the Casts around it in the match)."""
        if rank_of(base, "the rotated tensor") != 4:
            raise NotThisPattern("not a 4-D tensor of heads")
        # the norm, through the transpose before the rotary (layout 2: the heads on axis 1)
        norm_out, transposed, known = base, None, None
        producer = base.producer()
        if producer is not None and producer.op_type == "Transpose" and producer.domain == "":
            if not transposes(producer):
                raise Rejected("the Transpose before the rotary is not [0, 2, 1, 3]")
            transposed, norm_out, known = producer, input_of(producer), 1
        read = [norm_out]  # what the norm computes, read by the match alone
        norm = norm_out.producer()
        head_size, per_head = 0, 1
        if (
            norm is not None
            and norm.op_type == "Reshape"
            and norm.domain == ""
            and transposed is not None
        ):
            # OLMo 2: the norm over the whole projection [b, s, h * d], then the view to heads
            inside.add(norm)
            norm_out = input_of(norm)
            norm = norm_out.producer()
            head_size = last_dim(base, "a head")
            if (
                rank_of(norm_out, "the norm's output") != 3
                or last_dim(norm_out, "the norm's output") % head_size
            ):
                raise Rejected(
                    "the view before the rotary does not split the norm's rows into heads"
                )
            per_head = 0
            read.append(norm_out)
        if norm is None or norm.domain != catalogue.DOMAIN or norm.op_type not in ROTARY_OF:
            raise NotThisPattern("no onnxnorm norm before the rotary")
        t = dtype(rotated, "the rotated tensor")
        rotary = match_rotary(rotated, cos, sin, partner, known, t, in_float32)
        if transposed is not None and rotary.head_axis != 1:
            raise Rejected("the angles broadcast over another axis than the transposed heads")
        layout = 2 if transposed is not None else (1 if rotary.head_axis == 1 else 0)
        inside |= rotary.nodes | {root, norm} | ({transposed} if transposed is not None else set())
        users_inside(read + ([base] if transposed is not None else []), inside)
        return replacement(
            ROTARY_OF[norm.op_type],
            norm,
            input_of(norm),
            rotary,
            last_dim(base, "a head"),
            in_float32,
            layout=layout,
            head_size=head_size,
            per_head=per_head,
        )


class NormRotary(_NormRotary):
    """``x * cos + partner(x) * sin`` over the whole head, x the norm's output."""

    def pattern(self, op, x, cos, partner, sin):
        return op.Add(op.Mul(x, cos), op.Mul(partner, sin), _outputs=["y"])

    def inspect(self, context, x, cos, partner, sin, **_) -> Replacement:
        producer = x.producer()
        if producer is not None and producer.op_type in ("Slice", "Split"):
            raise NotThisPattern("a partial rotary: the Concat after it is the match")
        return self._replacement(context.root, x, x, cos, sin, partner, set(context.nodes))


class PartialNormRotary(_NormRotary):
    """A partial rotary: the rotated leading values of each head, then the rest, concatenated."""

    def pattern(self, op, x, cos, partner, sin, rest):
        rotated = op.Add(op.Mul(x, cos), op.Mul(partner, sin))
        return op.Concat(rotated, rest, _outputs=["y"])

    def inspect(self, context, x, cos, partner, sin, rest, **_) -> Replacement:
        base = halves(x, rest)
        if axis_of(context.root, context.output_values[0]) != rank_of(base, "a head") - 1:
            raise NotThisPattern("a Concat of another axis")
        inside = set(context.nodes) | {x.producer(), rest.producer()}
        return self._replacement(context.root, x, base, cos, sin, partner, inside)


class FloatNormRotary(_NormRotary):
    """The rotation in float32 of a float16/bfloat16 norm's output: ``Cast(x * cos + partner *
    sin)`` back to its type, x the output cast to float32 (OLMo 2, Cohere)."""

    def pattern(self, op, x, cos, partner, sin):
        return op.Cast(op.Add(op.Mul(x, cos), op.Mul(partner, sin)), _outputs=["y"])

    def inspect(self, context, x, cos, partner, sin, **_) -> Replacement:
        widening = x.producer()
        if widening is None or widening.op_type != "Cast" or not _widens(widening):
            raise NotThisPattern("no float32 rotation of a narrower tensor")
        base = widening.inputs[0]
        t = dtype(base, "the rotated tensor")
        if t == ir.DataType.FLOAT or attribute(context.root, "to", None) != t:
            raise NotThisPattern("not rounded back to the rotated tensor's type")
        inside = set(context.nodes) | {widening}
        return self._replacement(
            context.root, base, base, cos, sin, partner, inside, in_float32=True
        )


def rotary_rules(tracker: Tracker) -> list:
    """The norm-first rules (the rotary-first ones: ``rotary_first.rotary_first_rules``)."""
    return [
        NormRotary.rule(tracker, "NormRotary"),
        PartialNormRotary.rule(tracker, "PartialNormRotary"),
        FloatNormRotary.rule(tracker, "FloatNormRotary"),
    ]

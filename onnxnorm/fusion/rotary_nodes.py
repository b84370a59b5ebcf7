"""Q/K norm and a RotaryEmbedding node: an onnxnorm norm (after the norms stage) and ONNX
Runtime's (com.microsoft) or ONNX's (opset 23) ``RotaryEmbedding`` after it become one
``RMSNormRotary`` / ``LayerNormRotary`` / ``L2NormRotary`` node; ``rotary_pair.pair`` then makes
a layer's Q and K one node.

Taken between the two: a Reshape (onnxruntime-genai's model builder normalizes [batch, seq *
heads, head] rows and views them as [batch, seq, heads * head]; the lowering views [b, s, h, d]
rows so), the Transpose [0, 2, 1, 3] to [batch, heads, seq, head] (layout 2), Identity, and in
the rules rooted at the Cast back, the Cast of a float16/bfloat16 value to float32 for a
rotation in float32. A reshape keeps the values' order: the norm's rows are the heads (or, not
in layout 1, the tokens: ``per_head = 0``) of the rotated tensor, which the fused op reads as Q
with the RotaryEmbedding input's shape: 3-D [batch, seq, heads * head] (layout 0, head_size) or
[batch, heads, seq, head] (layout 1; 2 through the Transpose).

ONNX Runtime's CPU kernels of both ops rotate float16 in float32 and round once (``rotary_in_t
= 0``; its CUDA kernel, read not measured, computes in the half type) with caches of one angle
per pair: [max_position, rotary_dim / 2] gathered by position ids [batch, seq], or ONNX's per
token [batch, seq, rotary_dim / 2] without them. Left, with the reason: ``scale`` other than
1, ``is_packed_batching``, position ids of one element (ONNX Runtime's offset added to each
token's index), caches of another width, a head size the attributes leave unclear, a norm
whose rows are neither the heads nor the tokens.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnxnorm.fusion._base import (
    FusionRule,
    NotThisPattern,
    Rejected,
    Replacement,
    attribute,
    dtype,
    int_values,
)
from onnxnorm.fusion.norm_ops import all_equal
from onnxnorm.fusion.ort_gated import MS_DOMAIN
from onnxnorm.fusion.report import Tracker
from onnxnorm.fusion.rotary import ROTARY_OF, users_inside
from onnxnorm.ops import catalogue

_STANDARD = ("", "ai.onnx")
_HALF = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
#: the domains of the RotaryEmbedding ops the rules take: ONNX Runtime's and ONNX's
ROPE_DOMAINS = (MS_DOMAIN, "")


def _dims(value: ir.Value | None) -> list:
    return list(value.shape.dims) if value is not None and value.shape is not None else []


def _view_shape(view: ir.Node) -> tuple[int, ...]:
    """The target of a Reshape (0 copies the input's dim)."""
    shape = int_values(view.inputs[1], "the Reshape's shape").reshape(-1)
    if attribute(view, "allowzero", 0) and (shape == 0).any():
        raise Rejected(f"the Reshape {view.name!r} has allowzero = 1")
    return tuple(int(d) for d in shape)


def _last_dim(value: ir.Value | None, depth: int = 8) -> int | None:
    """The static last dim of ``value``, where shape inference left it unknown read through
    the views before it (a Reshape to [0, 0, -1] of [b, s, heads, head] rows: heads * head)."""
    dims = _dims(value)
    if dims and isinstance(dims[-1], int):
        return dims[-1]
    node = value.producer() if value is not None else None
    if node is None or node.domain not in _STANDARD or depth == 0 or not dims:
        return None
    if node.op_type in ("Cast", "Identity"):
        return _last_dim(node.inputs[0], depth - 1)
    if node.op_type != "Reshape":
        return None
    try:
        shape = _view_shape(node)
    except Rejected:
        return None
    inner = _dims(node.inputs[0])
    if shape[-1] > 0:
        return shape[-1]
    if shape[-1] == 0:
        return _last_dim(node.inputs[0], depth - 1) if len(inner) == len(shape) else None
    # -1: what the other dims leave of the input's values (the copied dims cancel out)
    rest = [d for i, d in enumerate(inner) if not (i < len(shape) - 1 and shape[i] == 0)]
    fixed = int(np.prod([d for d in shape[:-1] if d > 0], dtype=np.int64))
    if inner and all(isinstance(d, int) for d in rest) and fixed > 0:
        total = int(np.prod(rest, dtype=np.int64))
        return total // fixed if total % fixed == 0 else None
    return None


def _copies_alike(shape: tuple[int, ...], source: ir.Node) -> bool:
    """Whether reshaping the input of Reshape ``source`` to ``shape`` gives what reshaping its
    output does: the dims ``shape`` copies (its 0s) are ones ``source`` copied."""
    try:
        inner = _view_shape(source)
    except Rejected:
        return False
    return all(i < len(inner) and inner[i] == 0 for i, d in enumerate(shape) if d == 0)


def _keeps(value: ir.Value, shape: tuple[int, ...]) -> bool:
    """Whether reshaping ``value`` to ``shape`` leaves it as it is: each dim copied (0) or the
    same static size, but for one -1, which then is the one left."""
    dims = _dims(value)
    if value.shape is None or len(dims) != len(shape) or list(shape).count(-1) > 1:
        return False
    return all(s in (0, -1) or (isinstance(d, int) and s == d) for s, d in zip(shape, dims))


def _narrowed(value: ir.Value) -> ir.Value | None:
    """The float16/bfloat16 value of which ``value`` is an exact Cast to float32 (None: none)."""
    node = value.producer()
    if node is None or node.op_type != "Cast" or node.domain not in _STANDARD:
        return None
    data = node.inputs[0]
    widens = attribute(node, "to", None) == ir.DataType.FLOAT
    return data if widens and data is not None and data.dtype in _HALF else None


def _check_weight(weight, head, heads, layout) -> None:
    """A weight of one head, or of each head: the norm's rows take the rows of a weight
    of [heads, head] in turn, the heads of a token's (layouts 0 and 2, not 1)."""
    if weight is None:
        return
    dims = _dims(weight)
    if weight.shape is None or not all(isinstance(d, int) for d in dims):
        raise Rejected(f"the shape of the norm's weight ({weight.name!r}) is not static")
    size = int(np.prod(dims, dtype=np.int64))
    if size == head or (size == head * (heads or 0) and layout != 1):
        return
    raise Rejected(
        f"the norm's weight of shape {dims} is not one head's nor the heads' in the order "
        "of the rotated tensor"
    )


class NormRope(FusionRule):
    """A norm and the RotaryEmbedding of ``domain`` after it; ``widened``: the rotation in
    float32 on a float16/bfloat16 norm's output, cast back (the root: that Cast)."""

    title = "Q/K norm and RotaryEmbedding"

    def __init__(self, tracker: Tracker, domain: str, widened: bool) -> None:
        self.domain, self.widened = domain, widened
        kind = ("Float" if widened else "") + ("Ort" if domain else "Onnx")
        super().__init__(tracker, f"{kind}NormRope")

    def pattern(self, op, x):
        if not self.widened:
            return op.RotaryEmbedding(
                x, _domain=self.domain, _allow_other_inputs=True, _outputs=["y"]
            )
        rope = op.RotaryEmbedding(x, _domain=self.domain, _allow_other_inputs=True)
        return op.Cast(rope, _outputs=["y"])

    def inspect(self, context, x, **_) -> Replacement:
        root = context.root
        rope = root.inputs[0].producer() if self.widened else root
        inside = set(context.nodes)
        # the views between the norm and the rotation, nearest the rotation first
        value, cast, transpose, view, chain = x, None, None, None, []
        while (node := value.producer()) is not None and node.domain in _STANDARD:
            if node.op_type == "Identity":
                chain.append(node)
            elif self.widened and cast is None and _narrowed(value) is not None:
                cast = node
            elif node.op_type == "Transpose" and transpose is None and view is None:
                transpose = node
            elif node.op_type == "Reshape" and view is None:
                view = node
            else:
                break
            value = node.inputs[0]
        norm = value.producer()
        if norm is None or norm.domain != catalogue.DOMAIN or norm.op_type not in ROTARY_OF:
            raise NotThisPattern("no onnxnorm norm before the RotaryEmbedding")
        if self.widened and (cast is None or attribute(root, "to", None) != value.dtype):
            raise NotThisPattern("not a float32 rotation of a narrower tensor, cast back")
        chain += [n for n in (cast, transpose, view) if n is not None]
        inside |= {norm, *chain}
        users_inside([value] + [n.outputs[0] for n in chain], inside, "RotaryEmbedding")
        return self._replacement(rope, x, norm, transpose, view)

    def _replacement(self, rope, x, norm, transpose, view) -> Replacement:
        """The node: ``x`` the RotaryEmbedding's input, ``norm`` the norm before it, through
        ``transpose`` and ``view`` (None: not there)."""
        if (scale := attribute(rope, "scale", 1.0)) != 1.0:
            raise Rejected(f"RotaryEmbedding's scale is {scale}; the fused op has no scale")
        if attribute(rope, "is_packed_batching", 0):
            raise Rejected("is_packed_batching = 1: sequences packed into one row of tokens")
        cos, sin, positions = self._angles(rope)
        rank = len(_dims(x))
        if rank not in (3, 4):
            raise Rejected(f"RotaryEmbedding's input ({x.name!r}) is not 3-D or 4-D")
        if rank == 3 and transpose is not None:
            raise Rejected("a Transpose before a 3-D RotaryEmbedding input")
        if transpose is not None and list(attribute(transpose, "perm", [])) != [0, 2, 1, 3]:
            raise Rejected("the Transpose before the RotaryEmbedding is not [0, 2, 1, 3]")
        head, heads, rotary_dim = self._head(rope, x, cos, rank)
        layout = 0 if rank == 3 else 2 if transpose is not None else 1
        # Q: the norm's input (or the tensor it views) in the shape of the rotated rows
        q, reshape = norm.inputs[0], {}
        if view is not None:
            shape = _view_shape(view)
            source = q.producer()
            if (
                source is not None
                and source.op_type == "Reshape"
                and source.domain in _STANDARD
                and _copies_alike(shape, source)
            ):
                q = source.inputs[0]  # (the projection the norm's rows are a view of)
            if not _keeps(q, shape):
                reshape = {"Q": shape}
        given = Replacement.of(norm)
        if given.attributes.get("y_float32"):
            raise Rejected("the norm before the RotaryEmbedding has a float32 output")
        # the norm's rows: each block of ``width`` consecutive values
        spanned = _dims(norm.inputs[0])[given.attributes["axis"] :]
        if not spanned or not all(isinstance(d, int) for d in spanned):
            raise Rejected("the dims the norm before the RotaryEmbedding spans are not static")
        width = int(np.prod(spanned))
        per_head = int(width == head)
        if not per_head and (layout == 1 or heads is None or width != heads * head):
            raise Rejected(
                f"the norm's rows of {width} values are neither the heads ({head} values) nor "
                "the tokens of the RotaryEmbedding's input"
            )
        t = dtype(norm.inputs[0], "the norm's input")
        # float32 caches cast from Q's type: the same values
        narrow_cos, narrow_sin = _narrowed(cos), _narrowed(sin)
        if self.widened and narrow_cos is not None and narrow_sin is not None:
            cos, sin = (narrow_cos, narrow_sin) if narrow_cos.dtype == t else (cos, sin)
        if dtype(cos, "cos_cache") not in (t, ir.DataType.FLOAT) or cos.dtype != sin.dtype:
            raise Rejected("cos_cache and sin_cache are not both of Q's type or float32")
        op, weights = ROTARY_OF[norm.op_type], given.inputs
        for name in ("Scale", "Bias"):
            _check_weight(weights.get(name), head, heads, layout)
        inputs = {"Q": q, "Cos": cos, "Sin": sin, "PositionIds": positions}
        scale = weights.get("Scale")
        # (a weight of ones, or the lowering's unit ConstantOfShape, changes no rounding order)
        if op != "L2NormRotary" and not (scale is not None and all_equal(scale, 1)):
            inputs["QScale"] = scale
        if op == "LayerNormRotary":
            inputs["QBias"] = weights.get("Bias")
        attributes = {
            "epsilon": given.attributes["epsilon"],
            "layout": layout,
            "head_size": head if layout == 0 else 0,
            "per_head": per_head,
            "rotary_dim": 0 if rotary_dim == head else rotary_dim,
            "interleaved": int(attribute(rope, "interleaved", 0)),
            # ONNX Runtime's CPU kernels compute float16 in float32 and round once
            "rotary_in_t": 0,
        }
        for name in ("cast_before_scale", "scale_offset"):
            if name in given.attributes:
                attributes[name] = given.attributes[name]
        return Replacement(op, inputs, attributes, outputs=1, reshape=reshape)

    def _angles(self, rope: ir.Node) -> tuple[ir.Value, ir.Value, ir.Value | None]:
        """cos_cache, sin_cache and the position ids, in the forms the fused op takes."""
        args = list(rope.inputs) + [None] * 4
        if self.domain == MS_DOMAIN:
            positions, cos, sin = args[1], args[2], args[3]
        else:
            cos, sin, positions = args[1], args[2], args[3]
        if cos is None or sin is None or (self.domain == MS_DOMAIN and positions is None):
            raise Rejected("the RotaryEmbedding lacks an input")
        want = 2 if positions is not None else 3
        if len(_dims(cos)) != want or _dims(cos)[-1:] != _dims(sin)[-1:]:
            form = "[max_position, C] with position ids" if want == 2 else "per token [b, s, C]"
            raise Rejected(f"cos_cache and sin_cache are not {form}")
        if positions is not None:
            if positions.shape is None or len(_dims(positions)) != 2:
                raise Rejected(
                    f"position_ids of shape {positions.shape} are not [batch, seq] (one element "
                    "is ONNX Runtime's offset added to each token's index)"
                )
            if positions.dtype != ir.DataType.INT64:
                raise Rejected("position_ids are not int64")
        return cos, sin, positions

    def _head(self, rope: ir.Node, x: ir.Value, cos: ir.Value, rank: int):
        """(head size, head count or None, rotary_dim) as the RotaryEmbedding reads its input
        ``x``; Rejected where its attributes and caches leave them unclear."""
        ms = self.domain == MS_DOMAIN
        num_heads = attribute(rope, "num_heads", 0)
        given = attribute(rope, "rotary_embedding_dim", 0)
        pairs, last = _last_dim(cos), _last_dim(x)
        if pairs is None or last is None:
            raise Rejected("the last dim of RotaryEmbedding's input or cos_cache is not static")
        if rank == 4:
            head = last
            count = _dims(x)[1]
            heads = count if isinstance(count, int) else None
            if ms and (num_heads or given) and (heads is None or num_heads != heads):
                raise Rejected(f"num_heads {num_heads} is not the input's heads ({count})")
            if ms and not given and 2 * pairs != head:
                raise Rejected(
                    f"ONNX Runtime takes the head size from cos_cache ({2 * pairs}), and the "
                    f"heads are of {head} values"
                )
        else:
            hidden = last
            if ms and not given:
                head = 2 * pairs
                heads = num_heads or hidden // head
            elif not num_heads:
                raise Rejected("a 3-D RotaryEmbedding input without num_heads")
            else:
                head, heads = hidden // num_heads, num_heads
            if head * heads != hidden:
                raise Rejected(f"{heads} heads of {head} values do not fill {hidden}")
        rotary_dim = given or head
        if rotary_dim % 2 or rotary_dim > head:
            raise Rejected(f"rotary_embedding_dim {rotary_dim} is odd or above the head {head}")
        if pairs != rotary_dim // 2:
            raise Rejected(
                f"cos_cache holds {pairs} angles per position, not rotary_embedding_dim / 2 = "
                f"{rotary_dim // 2}"
            )
        return head, heads, rotary_dim


def rope_node_rules(tracker: Tracker) -> list:
    return [
        NormRope.rule(tracker, domain, widened)
        for widened in (False, True)
        for domain in ROPE_DOMAINS
    ]

"""The ONNX function bodies of the rotary ops (``catalogue.ROTARY_OPS``: RMSNormRotary,
LayerNormRotary, L2NormRotary): ``function_proto`` writes the body of one op's overload
(``onnxnorm.ops.overloads``) in standard ops of one opset; ``functions.function_proto`` hands
the rotary ops to it.

The body takes Q (and K) to rows of heads, [batch, seq, heads, head_size] (layout 1: [batch,
heads, seq, head_size], as it is; 3-D: reshaped by head_size), normalizes them with the norm
bodies' own arithmetic (``bodies.normalize`` over the head, or over the token for per_head = 0,
and ``bodies.scale_and_shift``, the weights reshaped to [1 or heads, head_size]), rotates them,
in either order (``rotaryfirst``), and writes them back in the output's layout (layout 2: a
Transpose to [batch, heads, seq, head_size]).

The rotation:

- each token's angles are Cos and Sin gathered by PositionIds (axis 0), or Cos and Sin as they
  are (per token, [batch or 1, seq, C]); the body reads C from Cos's shape and repeats each
  angle rotary_dim / C times (1 or 2: a Tile) to one per rotated value: half-split, the whole
  row repeated (concat(c, c)); interleaved, each angle repeated in place ([.., C, 1] tiled to
  [.., C, 2]). The angles are then [batch or 1, seq, 1, R], broadcast over the heads (layout 1:
  [batch or 1, 1, seq, R]);
- each value's partner: the R rotated values reshaped to [.., 2, R / 2] (half-split) or
  [.., R / 2, 2] (interleaved), the two slices of that axis stacked as (-second, first) and
  reshaped back: rotate_half's concat(-x2, x1), or (-x[2j + 1], x[2j]);
- out = x * cos + partner * sin on the first rotary_dim values (``rotary<n>``: Slice, and
  Concat with the rest of the head; else the whole head).

All arithmetic is float32, as in the norm bodies, and every value handed from one step to the
next is rounded to Q's type as the catalogue says: the norm's output (in order A after each of
its steps, in order B once), and the rotation's, computed in float32 and rounded once
(rotary_in_t = 0), or (``rotaryint``) with the angles, each product and the sum rounded to Q's
type, which equals computing them in Q's type (float32 holds twice float16's and bfloat16's
precision plus two bits) without the float16 / bfloat16 kernels ONNX Runtime's CPU provider
lacks.

The body uses Cast, Reshape, Flatten, Slice, Concat, Transpose, Gather, Tile, Shape, Div, Mul,
Add, Sub, Neg, Sqrt, ReduceMean / ReduceSumSquare and Constant: all in opset 7, with the rules
of later opsets (Slice's inputs from 10, Constant's value_float from 12, CastLike from 15,
ReduceMean's axes input from 18, LayerNormalization from 17 and RMSNormalization from 23)
written by ``opsets.OpsetWriter`` and ``bodies.normalize`` as for the norm ops. So a body is
written at every opset from 7, bfloat16 from 13 (Cast-13); ``bodies.body_problem`` says why
where not.
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnxnorm.ops import catalogue
from onnxnorm.ops.bodies import Body, body_problem, normalize, scale_and_shift
from onnxnorm.ops.overloads import input_part, number_part, parse_overload

_INT64_MAX = 2**63 - 1
#: [batch, seq, heads, head_size] <-> [batch, heads, seq, head_size]
_SWAP = [0, 2, 1, 3]


class _Rotary:
    """Writes one rotary op's body into ``b``: the rows of Q and K, their norm and rotation,
    from the overload's ``parts``."""

    def __init__(self, b: Body, spec: catalogue.OpSpec, parts: set[str]):
        self.b, self.spec, self.parts = b, spec, parts
        self.present = {name for name in spec.optional_inputs if input_part(name) in parts}
        self.layout = number_part(parts, "layout")
        self.head_size = number_part(parts, "headsize")
        self.rotary_dim = number_part(parts, "rotary")
        self.interleaved = "interleaved" in parts
        self.in_t = "rotaryint" in parts
        self.offset = b.attr("scale_offset") if "offset" in parts else None

    def rows(self, name: str) -> str:
        """Input ``name`` (Q or K) in float32 as [batch, seq, heads, head_size] (layout 1:
        [batch, heads, seq, head_size]); a 3-D one reshaped by head_size."""
        x = self.b.float32(name)
        if self.head_size:
            x = self.b("Reshape", x, self.b.ints([0, 0, -1, self.head_size]))
        return x

    def angles(self, q_rows: str) -> tuple[str, str]:
        """cos and sin of each token's angles in float32, one per rotated value: [batch or 1,
        seq, 1, R] (layout 1: [batch or 1, 1, seq, R]), R the rotated values of ``q_rows``
        (rotary_dim, else head_size); rounded to Q's type with rotary_in_t = 1."""
        b = self.b
        width = b.ints([self.rotary_dim]) if self.rotary_dim else b.shape(q_rows, 3)
        repeats = b("Div", width, b.shape("Cos", -1))  # 1 (one angle per value) or 2 (per pair)
        out = []
        for name in ("Cos", "Sin"):
            value = name
            if "PositionIds" in self.present:
                value = b("Gather", value, "PositionIds", axis=0)
            value = b.float32(value)
            if self.interleaved:  # each pair's angle twice in place
                value = b("Reshape", value, b.ints([0, 0, -1, 1]))
                value = b("Tile", value, b("Concat", b.ints([1, 1, 1]), repeats, axis=0))
            else:  # the row twice: concat(c, c)
                value = b("Tile", value, b("Concat", b.ints([1, 1]), repeats, axis=0))
            value = b("Reshape", value, b.ints([0, 0, 1, -1]))
            if self.layout == 1:
                value = b("Transpose", value, perm=_SWAP)
            out.append(b.round(value) if self.in_t else value)
        return out[0], out[1]

    def rotate(self, x: str, cos: str, sin: str) -> str:
        """``x`` (float32 rows, values of Q's type) with its first rotary_dim values rotated:
        x * cos + partner * sin, rounded to Q's type (rotary_in_t = 1: each product and the
        sum), the rest of each head unchanged."""
        b = self.b
        head = b.slice(x, [0], [self.rotary_dim], [3]) if self.rotary_dim else x
        axis = 4 if self.interleaved else 3
        pairs = b(
            "Reshape", head, b.ints([0, 0, 0, -1, 2] if self.interleaved else [0, 0, 0, 2, -1])
        )
        first, second = b.slice(pairs, [0], [1], [axis]), b.slice(pairs, [1], [2], [axis])
        partner = b("Reshape", b("Concat", b("Neg", second), first, axis=axis), b.shape(head))
        products = [b("Mul", head, cos), b("Mul", partner, sin)]
        if self.in_t:
            products = [b.round(p) for p in products]
        rotated = b.round(b("Add", *products))
        if self.rotary_dim:
            rest = b.slice(x, [self.rotary_dim], [_INT64_MAX], [3])
            rotated = b("Concat", rotated, rest, axis=3)
        return rotated

    def norm(self, x: str, name: str) -> str:
        """``x`` (float32 rows) normalized over each head (per_head = 0: each token) with the
        weights of input ``name`` (Q or K), rounded to Q's type (in order A after each step)."""
        b = self.b
        normalized = normalize(b, self.spec, x, 2 if "pertoken" in self.parts else 3)
        # the weights as [1 or heads, head_size] (layout 1: [1 or heads, 1, head_size])
        dims = b("Concat", b.ints([-1, 1] if self.layout == 1 else [-1]), b.shape(x, 3), axis=0)
        scale, bias = (
            b("Reshape", name + w, dims) if name + w in self.present else None
            for w in ("Scale", "Bias")
        )
        y = scale_and_shift(b, normalized, scale, bias, self.offset, "a" in self.parts)
        return b.round(y)

    def output(self, y: str, name: str) -> None:
        """``y`` (float32 rows) as input ``name``'s output, of Q's type, in the output's
        layout: layout 2 transposed to [batch, heads, seq, head_size], a 3-D one of layout 0
        reshaped back."""
        b = self.b
        if self.layout == 2:
            y = b("Transpose", y, perm=_SWAP)
        elif self.head_size:
            y = b("Reshape", y, b.shape(name))
        b.to_x(y, out=name + "Out")


def function_proto(op: str, variant: str, opset: int) -> onnx.FunctionProto:
    """The body of the rotary op ``op`` for the overload ``variant`` in standard opset
    ``opset`` (below MIN_OPSET the overload names Q's type, below REF_OPSET the epsilon and
    scale offset: ``onnxnorm.ops.overloads``). A ValueError says why where the opset cannot
    hold it (``body_problem``)."""
    spec = catalogue.get(op)
    parts, x_type, values = parse_overload(spec, variant, opset)
    problem = body_problem(op, opset, x_type)
    if problem:
        raise ValueError(f"no {op} body for overload {variant!r}: {problem}")
    rotary = _Rotary(Body(opset, x_type, values, x="Q"), spec, parts)
    names = ["Q", "K"] if "K" in rotary.present else ["Q"]
    rows = {name: rotary.rows(name) for name in names}
    cos, sin = rotary.angles(rows["Q"])
    for name in names:
        if "rotaryfirst" in parts:
            y = rotary.norm(rotary.rotate(rows[name], cos, sin), name)
        else:
            y = rotary.rotate(rotary.norm(rows[name], name), cos, sin)
        rotary.output(y, name)

    defaults = [
        helper.make_attribute(a.name, float(a.default) if a.kind == "float" else a.default)
        for a in spec.attributes
    ]
    return helper.make_function(
        catalogue.DOMAIN,
        op,
        [p.name for p in spec.inputs],
        [name + "Out" for name in names],
        rotary.b.nodes,
        [helper.make_opsetid("", opset)],
        attribute_protos=defaults,
        doc_string=f"{spec.summary} {spec.formula}",
        overload=variant,
    )

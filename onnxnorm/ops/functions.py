"""ONNX function bodies of the catalogue ops, and attaching them to models.

A node of an onnxnorm op carries, next to its op type, a function *overload* naming its variant:
which optional inputs it has and its rounding order (``scale_bias_a``, ``scale``, ``none`` ...).
The model holds one model-local function per (op, overload) in use, written in standard ops of
the model's own opset (onnx and ONNX Runtime refuse a body importing another version), any from
opset 7: LayerNormalization from opset 17, RMSNormalization from opset 23, and a decomposition
otherwise. Function overloads need IR version 10, which ONNX Runtime (1.32, measured) loads
with every opset from 7.

Below some opsets the decomposition lacks an op it is written with, and the body has to know
more than the overload names from 15 on (those names are a public contract and stay as they are):

- below 15 there is no CastLike (nor Shape's ``start``, which becomes Shape and Slice): the body
  casts to X's element type by name, so the overload ends in it, ``f32``, ``f16`` or ``bf16``
  (``scale_a_f16``);
- below 12 Constant has no ``value_float``, so a reference to the node's attributes cannot
  become a tensor: the body holds the node's attribute values, and the overload names them after
  the type, ``axis<i>``, ``eps<v>``, ``alpha<v>`` (Skip ops), with ``offset<v>`` for ``offset``,
  each number the shortest text that reads back as the same float32
  (``scale_offset1_a_f16_axis-1_eps1e-06``). Nodes that differ in a value get a body each,
  where the norms of one model nearly always share theirs. Baked values are exact and plain to
  read; the alternative, a value computed from an op that takes a float attribute (LeakyRelu of
  -1 is exactly -alpha), would put an op of unrelated meaning into every body and rest on each
  runtime computing it exactly. (Flatten takes a negative axis from opset 11; below it the body
  reshapes to [-1, <dims from axis>] first.)

bfloat16 needs opset 13 (Cast-13 added it), the quantized ops opset 10 (QuantizeLinear) or 11
(DynamicQuantizeLinear), and a float8 zero point opset 19. Where a body cannot be written
(``body_problem`` says why), ``attach_functions`` leaves the node without one, as the ``fused``
target does: it runs with the onnxnorm library only, and a Note says so.

ONNX Runtime runs the onnxnorm kernel for a node with a body when the onnxnorm library is
registered, and inlines the function body when it is not, so the same file runs everywhere.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxnorm.ops import catalogue

#: The oldest standard opset bodies are written in (Add and Mul broadcast as numpy from 7).
OLDEST_OPSET = 7
#: From this opset the bodies cast with CastLike and the overload names carry no type (module
#: docstring); also the opset a model that imports no standard opset is given.
MIN_OPSET = 15
#: From this opset Constant takes ``value_float``, so a body refers to the node's attributes;
#: below it the values are in the overload name.
REF_OPSET = 12
#: Cast-13 added bfloat16.
BFLOAT16_MIN_OPSET = 13
#: The standard opset of the quantizer a quantized op's body ends in (QuantizeLinear-10,
#: DynamicQuantizeLinear-11).
QUANTIZE_MIN_OPSET = {"static": 10, "dynamic": 11}
#: IR version 10 introduced function overloads.
MIN_IR_VERSION = 10
#: The standard opset from which QuantizeLinear quantizes to float8 (QuantizeLinear-19): the
#: least a model needs whose static quantized nodes have a float8e4m3fn zero point, as their
#: bodies (and their lowered form) end in that QuantizeLinear.
FLOAT8_MIN_OPSET = 19
#: The names of the standard domain in opset imports ("ai.onnx" is an alias of "").
DEFAULT_DOMAINS = ("", "ai.onnx")
#: What a node becomes whose body cannot be written (``Note.emitted``).
WITHOUT_BODY = "onnxnorm node without a function body (runs with the onnxnorm library only)"

_FLOAT = TensorProto.FLOAT
_ATTR_TYPES = {"int": onnx.AttributeProto.INT, "float": onnx.AttributeProto.FLOAT}
_ATTRIBUTE_KINDS = {a.name: a.kind for spec in catalogue.OPS.values() for a in spec.attributes}
#: X's element type in an overload name below MIN_OPSET
_TYPE_NAMES = {TensorProto.FLOAT: "f32", TensorProto.FLOAT16: "f16", TensorProto.BFLOAT16: "bf16"}
#: the prefixes of the attribute values in an overload name below REF_OPSET
_VALUE_NAMES = {"axis": "axis", "epsilon": "eps", "alpha": "alpha", "scale_offset": "offset"}
_VALUE_PART = re.compile(r"(axis|eps|alpha|offset)([-+0-9.e]+)")
_INT64_MAX = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class Note:
    """What one onnxnorm node became (a lowering, or a node left without a body) and why."""

    node: str
    op: str
    emitted: str
    reason: str = ""

    def __str__(self) -> str:
        reason = f": {self.reason}" if self.reason else ""
        return f"{self.node} ({self.op}) -> {self.emitted}{reason}"


class Ref:
    """A reference to one of the function's own attributes."""

    def __init__(self, name: str):
        self.name = name


class OpsetWriter:
    """Constants, shapes and slices in the standard ops of one opset: the one place for each
    opset rule, shared by the function bodies and the lowering (``onnxnorm.fusion.lowering``).
    A subclass sets ``opset`` and defines ``__call__(op, *inputs, out=None, **attributes)``,
    which adds a node and returns its output."""

    opset: int

    def __call__(self, op: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        raise NotImplementedError

    def scalar(self, value: float | Ref) -> str:
        """A float32 scalar; a Ref (to a function's attribute) needs REF_OPSET."""
        if self.opset >= REF_OPSET:
            return self("Constant", value_float=value)
        return self("Constant", value=helper.make_tensor("value", _FLOAT, [], [float(value)]))

    def ints(self, values: list[int]) -> str:
        """A 1-D int64 tensor of small values (Constant takes int64 from opset 9; below it they
        go through float32, exactly)."""
        if self.opset >= REF_OPSET:
            return self("Constant", value_ints=values)
        if self.opset >= 9:
            return self(
                "Constant",
                value=helper.make_tensor("value", TensorProto.INT64, [len(values)], values),
            )
        floats = self("Constant", value=helper.make_tensor("value", _FLOAT, [len(values)], values))
        return self("Cast", floats, to=TensorProto.INT64)

    def slice(self, value: str, starts: list[int], ends: list[int], axes: list[int]) -> str:
        """Slice, whose bounds are attributes below opset 10 and inputs from it."""
        if self.opset < 10:
            return self("Slice", value, starts=starts, ends=ends, axes=axes)
        return self("Slice", value, self.ints(starts), self.ints(ends), self.ints(axes))

    def shape(self, value: str, start: int = 0) -> str:
        """The shape of ``value`` from dimension ``start`` on (negative: from the back); Shape
        takes ``start`` from opset 15, below it Slice cuts it."""
        if not start:
            return self("Shape", value)
        if self.opset >= MIN_OPSET:
            return self("Shape", value, start=start)
        return self.slice(self("Shape", value), [start], [_INT64_MAX], [0])

    def ones(self, value: str, axis: int, count: int | None = None) -> str:
        """float32 ones of the shape of ``value`` from ``axis`` on: a unit Scale. ConstantOfShape
        from opset 9; below it a Tile of ones of ``count`` dims (the dims from ``axis`` on),
        which the caller must know there."""
        dims = self.shape(value, axis)
        if self.opset >= 9:
            return self(
                "ConstantOfShape", dims, value=helper.make_tensor("one", _FLOAT, [1], [1.0])
            )
        if count is None:
            raise ValueError(f"opset {self.opset} has no ConstantOfShape: ones need their rank")
        one = self("Constant", value=helper.make_tensor("one", _FLOAT, [1] * count, [1.0]))
        return self("Tile", one, dims)

    def reduce_mean(self, value: str, axis: int = 1) -> str:
        """Mean over ``axis`` (>= 0), keepdims (the axes an input from opset 18)."""
        return self._reduce("ReduceMean", value, axis)

    def reduce_sum_square(self, value: str, axis: int = 1) -> str:
        """Sum of squares over ``axis`` (>= 0), keepdims."""
        return self._reduce("ReduceSumSquare", value, axis)

    def _reduce(self, op: str, value: str, axis: int) -> str:
        if self.opset >= 18:
            return self(op, value, self.ints([axis]), keepdims=1)
        return self(op, value, axes=[axis], keepdims=1)


class _Body(OpsetWriter):
    """Collects the nodes of one function body; each call adds a node and returns its output.
    ``x_type``: X's element type (below MIN_OPSET); ``values``: the node's attribute values
    (below REF_OPSET, else None: the body refers to its attributes)."""

    def __init__(self, opset: int, x_type: int | None = None, values: dict[str, Any] | None = None):
        self.opset, self.x_type, self.values = opset, x_type, values
        self.nodes: list[onnx.NodeProto] = []

    def __call__(self, op: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        name = out or f"_t{len(self.nodes)}"
        node = helper.make_node(
            op, list(inputs), [name], **{k: v for k, v in attrs.items() if not isinstance(v, Ref)}
        )
        for key, value in attrs.items():
            if isinstance(value, Ref):
                node.attribute.append(
                    helper.make_attribute_ref(
                        key, _ATTR_TYPES[_ATTRIBUTE_KINDS[value.name]], ref_attr_name=value.name
                    )
                )
        self.nodes.append(node)
        return name

    def attr(self, name: str) -> Any:
        """The node's attribute ``name``: a reference, or below REF_OPSET its value."""
        return Ref(name) if self.values is None else self.values[name]

    def float32(self, value: str) -> str:
        return self("Cast", value, to=_FLOAT)

    def to_x(self, value: str, out: str | None = None) -> str:
        """``value`` cast to X's type: CastLike from MIN_OPSET, else Cast to the type named."""
        if self.opset >= MIN_OPSET:
            return self("CastLike", value, "X", out=out)
        return self("Cast", value, to=self.x_type, out=out)

    def round(self, value: str) -> str:
        """``value`` rounded to X's type, kept in float32."""
        return self.float32(self.to_x(value))


def _part(name: str) -> str:
    """An input's name in an overload: "Y_zero_point" -> "yzeropoint" ("_" joins the parts)."""
    return name.lower().replace("_", "")


def _number(value: float) -> str:
    """``value`` as float32 in the shortest text that reads back as the same float32."""
    text = str(np.float32(value))
    return text[:-2] if text.endswith(".0") else text


def overload(
    spec: catalogue.OpSpec,
    present: Iterable[str],
    cast_before_scale: int,
    scale_offset: float = 0.0,
    with_sum: bool = True,
    with_float: bool = False,
    opset: int = MIN_OPSET,
    x_type: int | None = None,
    attrs: dict[str, Any] | None = None,
    y_float32: bool = False,
) -> str:
    """The function overload naming a node's variant: its optional inputs, whether it has a
    scale offset, its rounding order (``a`` for order A) and, for ops with a Residual, whether
    the node leaves out its Sum output (``nosum``: ORT cannot type a call to a function that
    has more outputs than the call). A quantized op's body has its optional Y_float output
    (and every output before it) when the node has it (``float``), else ends before it. A
    float32 Y (attribute ``y_float32``, the mixed form of LayerNorm and RMSNorm) is
    ``yfloat32``.

    Below MIN_OPSET the name ends in X's element type ``x_type``, below REF_OPSET also in the
    node's attribute values (``attrs``, defaults for those absent): see the module docstring."""
    present = set(present)
    parts = [_part(name) for name in spec.optional_inputs if name in present] or ["none"]
    if scale_offset:
        parts += ["offset" if opset >= REF_OPSET else f"offset{_number(scale_offset)}"]
    parts += ["a"] if cast_before_scale else []
    if spec.gated:
        parts += _gated_parts({**spec.defaults, **(attrs or {})}, "Gate" in present)
    parts += ["yfloat32"] if y_float32 else []
    if spec.quantize != "none" and with_float:
        parts += ["float"]
    else:
        parts += ["nosum"] if spec.has_residual and not with_sum else []
    if opset < MIN_OPSET:
        if x_type not in _TYPE_NAMES:
            raise ValueError(
                f"below opset {MIN_OPSET} an overload names X's element type (float, "
                f"float16 or bfloat16), got {_type_name(x_type)}"
            )
        parts.append(_TYPE_NAMES[x_type])
    if opset < REF_OPSET:
        values = {**spec.defaults, **(attrs or {})}
        parts += [f"axis{int(values['axis'])}", f"eps{_number(values['epsilon'])}"]
        parts += [f"alpha{_number(values['alpha'])}"] if "alpha" in values else []
    return "_".join(parts)


def _gated_parts(values: dict[str, Any], gated: bool) -> list[str]:
    """The parts that give a GatedRMSNorm body its shape: ``group<n>`` for its group size,
    and with a Gate ``sigmoid`` for that activation (SiLU has no part) and ``gatefirst`` for
    norm_before_gate = 0."""
    parts = [f"group{int(values['group_size'])}"] if values["group_size"] else []
    if gated:
        parts += ["sigmoid"] if values["activation"] == 1 else []
        parts += ["gatefirst"] if values["norm_before_gate"] == 0 else []
    return parts


_GROUP_PART = re.compile(r"group([0-9]+)")


def _group_size(parts: set[str]) -> int:
    """The group size an overload names (0: none)."""
    for part in parts:
        match = _GROUP_PART.fullmatch(part)
        if match:
            return int(match[1])
    return 0


def _parse(
    spec: catalogue.OpSpec, variant: str, opset: int
) -> tuple[set[str], int | None, dict[str, Any] | None]:
    """An overload's parts (the value parts as their bare names: ``offset``), X's element type
    it names (below MIN_OPSET) and the attribute values it holds (below REF_OPSET, else None)."""
    parts: set[str] = set()
    x_type, values = None, {}
    names = {name: key for key, name in _VALUE_NAMES.items()}
    types = {name: t for t, name in _TYPE_NAMES.items()}
    for part in variant.split("_"):
        match = _VALUE_PART.fullmatch(part)
        if part in types:
            x_type = types[part]
        elif match:
            key = names[match[1]]
            values[key] = int(match[2]) if key == "axis" else float(match[2])
            parts.add(match[1])
        else:
            parts.add(part)
    if opset < MIN_OPSET and x_type is None:
        raise ValueError(
            f"overload {variant!r} names no element type of X (f32, f16 or bf16), "
            f"which a body below opset {MIN_OPSET} needs (it has no CastLike)"
        )
    if opset >= REF_OPSET:
        return parts, x_type, None
    needed = [
        a.name
        for a in spec.attributes
        if a.name in _VALUE_NAMES and (a.name != "scale_offset" or "offset" in parts)
    ]
    missing = [_VALUE_NAMES[name] for name in needed if name not in values]
    if missing:
        raise ValueError(
            f"overload {variant!r} names no {', '.join(missing)} value, which a body "
            f"below opset {REF_OPSET} holds (Constant has no value_float there)"
        )
    return parts, x_type, {**spec.defaults, **values}


def _body_outputs(spec: catalogue.OpSpec, parts: set[str]) -> list[str]:
    """The outputs of the body of an overload (its ``parts``)."""
    outputs = [p.name for p in spec.outputs]
    if spec.quantize != "none" and "float" not in parts:
        outputs.remove("Y_float")
    if "nosum" in parts:
        outputs.remove("Sum")
    return outputs


def scale_and_shift(
    b,
    y: str,
    scale: str | None,
    bias: str | None,
    offset: float | Ref | None,
    order_a: bool,
    round_last: bool = True,
) -> str:
    """The catalogue's arithmetic after the normalization, where the rounding order shows:
    ``y`` (the normalized value, float32) times Scale plus ``offset`` (scale_offset; None:
    none), plus Bias, in float32, the result in float32. Order A (``order_a``) rounds every
    value to X's type after each step, operands included, but the sum with Bias where
    ``round_last`` is false (the mixed form's float32 Y); order B leaves the one rounding at
    the end to the caller.

    ``b`` writes the nodes (here into a function body, in ``onnxnorm.fusion.lowering`` into a
    graph), an OpsetWriter: ``b(op, *inputs, **attributes)`` adds a node and returns its
    output, ``b.scalar(v)`` a float32 scalar, and ``b.float32(v)`` a cast to float32 and
    ``b.round(v)`` a float32 value rounded to X's type and back.
    """

    def rounded(value: str) -> str:
        return b.round(value) if order_a else value

    y = rounded(y)
    factor = rounded(b.float32(scale)) if scale else None
    if offset is not None:
        offset = rounded(b.scalar(offset))
        factor = rounded(b("Add", factor or b.scalar(1.0), offset))
    if factor:
        y = rounded(b("Mul", y, factor))
    if bias:
        y = b("Add", y, rounded(b.float32(bias)))
        y = rounded(y) if round_last else y
    return y


def _rows(b: _Body, zf: str) -> str:
    """``zf`` flattened to [rows, cols] at the node's axis."""
    axis = b.attr("axis")
    if isinstance(axis, int) and axis < 0 and b.opset < 11:
        # Flatten takes a negative axis from opset 11: to [-1, <dims from axis>] first
        dims = b("Concat", b.ints([-1]), b.shape(zf, axis), axis=0)
        return b("Flatten", b("Reshape", zf, dims), axis=1)
    return b("Flatten", zf, axis=axis)


def _rms_of_rows(b: _Body, rows: str, axis: int, total: bool = False) -> str:
    """``rows`` divided by the root of the mean (``total``: the sum) of their squares over
    ``axis`` plus epsilon, in float32."""
    if total:
        squares = b.reduce_sum_square(rows, axis)
    else:
        squares = b.reduce_mean(b("Mul", rows, rows), axis)
    return b("Div", rows, b("Sqrt", b("Add", squares, b.scalar(b.attr("epsilon")))))


def _gated_body(b: _Body, parts: set[str], present: set[str], order_a: bool, offset) -> None:
    """GatedRMSNorm's Y: the gate's activation in float32 (Sigmoid, or SiLU as g * Sigmoid(g)),
    multiplied into float32(X) before the statistics (``gatefirst``, not rounded) or into the
    scaled result after them; groups of ``group<n>`` values as a third axis of the rows, whose
    Scale ([n] or the whole extent) is reshaped to [-1, n] to meet them."""
    act = None
    if "Gate" in present:
        g = b.float32("Gate")
        act = b("Sigmoid", g) if "sigmoid" in parts else b("Mul", g, b("Sigmoid", g))
    zf = b.float32("X")
    if act is not None and "gatefirst" in parts:
        zf = b("Mul", zf, act)
    group = _group_size(parts)
    scale = "Scale" if "Scale" in present else None
    rows = _rows(b, zf)
    if group:
        normalized = _rms_of_rows(b, b("Reshape", rows, b.ints([0, -1, group])), 2)
        if scale:
            scale = b("Reshape", scale, b.ints([-1, group]))
        y = scale_and_shift(b, normalized, scale, None, offset, order_a)
        y = b("Reshape", y, b.shape(zf))
    else:
        normalized = b("Reshape", _rms_of_rows(b, rows, 1), b.shape(zf))
        y = scale_and_shift(b, normalized, scale, None, offset, order_a)
    if act is not None and "gatefirst" not in parts:
        y = b("Mul", y, act)
    b.to_x(y, out="Y")


def _normalize(b: _Body, spec: catalogue.OpSpec, z: str) -> str:
    """``z`` normalized over [axis, rank) in float32, without any scale.

    The rows are flattened to [rows, cols]. For LayerNorm each row is first shifted by its
    first element: the result is the same (LayerNorm ignores a constant shift) but a row with
    a large mean and a small spread (mean 1e4, std 1e-2) keeps its digits, where ORT's
    LayerNormalization kernel alone loses them.
    """
    zf = b("Cast", z, to=_FLOAT)
    rows = _rows(b, zf)
    if spec.norm == "layer":
        rows = b("Sub", rows, b.slice(rows, [0], [1], [1]))
    if (spec.norm == "layer" and b.opset >= 17) or (spec.norm == "rms" and b.opset >= 23):
        op = "LayerNormalization" if spec.norm == "layer" else "RMSNormalization"
        normalized = b(op, rows, b.ones(rows, 1), axis=-1, epsilon=b.attr("epsilon"))
    else:
        if spec.norm == "layer":
            rows = b("Sub", rows, b.reduce_mean(rows))
        normalized = _rms_of_rows(b, rows, 1)
    return b("Reshape", normalized, b.shape(zf))


def function_proto(op: str, variant: str, opset: int) -> onnx.FunctionProto:
    """The body of ``op`` for the overload ``variant`` in standard opset ``opset`` (below
    MIN_OPSET the overload names X's type, below REF_OPSET the attribute values: the module
    docstring). A ValueError says why where the opset cannot hold it (``body_problem``).

    All arithmetic is float32. Order A rounds to X's type after the normalization and after
    each later step; float32 carries more than twice the precision of float16 and bfloat16
    plus two bits, so one float32 operation rounded to X's type equals that operation done in
    X's type. The body thus needs no float16/bfloat16 arithmetic kernels, which ORT's CPU
    provider lacks for bfloat16.
    """
    spec = catalogue.get(op)
    parts, x_type, values = _parse(spec, variant, opset)
    problem = body_problem(op, opset, x_type)
    if problem:
        raise ValueError(f"no {op} body for overload {variant!r}: {problem}")
    order_a = "a" in parts
    present = {name for name in spec.optional_inputs if _part(name) in parts}
    b = _Body(opset, x_type, values)
    inputs = [p.name for p in spec.inputs]
    offset = b.attr("scale_offset") if "offset" in parts else None

    def norm(z: str, scale: str, bias: str, out: str | None = None, mixed: bool = False) -> str:
        """The norm of ``z`` with the inputs ``scale`` and ``bias`` when present, in X's type
        (``mixed``: in float32, without the last rounding to X's type)."""
        y = scale_and_shift(
            b,
            _normalize(b, spec, z),
            scale if scale in present else None,
            bias if bias in present else None,
            offset,
            order_a,
            round_last=not mixed,
        )
        return b("Identity", y, out=out) if mixed else b.to_x(y, out=out)

    outputs = _body_outputs(spec, parts)
    if spec.gated:
        _gated_body(b, parts, present, order_a, offset)
    elif spec.norm == "l2":
        zf = b.float32("X")
        b.to_x(b("Reshape", _rms_of_rows(b, _rows(b, zf), 1, total=True), b.shape(zf)), out="Y")
    else:
        z = "X"
        if spec.residual == "skip":
            total = b(
                "Add", b("Mul", b.float32("Residual"), b.scalar(b.attr("alpha"))), b.float32("X")
            )
            if "XBias" in present:
                total = b("Add", total, b.float32("XBias"))
            z = b.to_x(total, out="Sum")
        elif spec.residual == "sandwich":
            inner = b.float32(norm("X", "InnerScale", "InnerBias"))
            z = b.to_x(b("Add", b.float32("Residual"), inner), out="Sum")
        if spec.quantize == "none":
            norm(z, "Scale", "Bias", out="Y", mixed="yfloat32" in parts)
        else:
            _quantize(
                b,
                spec,
                norm(z, "Scale", "Bias", out="Y_float" if "Y_float" in outputs else None),
                "Y_zero_point" in present,
            )

    defaults = [
        helper.make_attribute(a.name, float(a.default) if a.kind == "float" else a.default)
        for a in spec.attributes
    ]
    return helper.make_function(
        catalogue.DOMAIN,
        op,
        inputs,
        outputs,
        b.nodes,
        [helper.make_opsetid("", opset)],
        attribute_protos=defaults,
        doc_string=f"{spec.summary} {spec.formula}",
        overload=variant,
    )


def _quantize(b: _Body, spec: catalogue.OpSpec, y: str, with_zero_point: bool) -> None:
    """Y (and for dynamic quantization Y_scale, Y_zero_point) from the norm's output ``y`` in
    X's type: QuantizeLinear or DynamicQuantizeLinear of y in float32, as the unfused graph
    quantizes it (DynamicQuantizeLinear takes float32 only, so a float16 / bfloat16 graph casts
    before it; QuantizeLinear computes y / scale in float32 for every input type). The scale and
    zero point are reshaped to scalars: per-tensor quantization whatever the opset's axis rule.
    From MIN_OPSET the zero point goes through float32 for that (exact for uint8, int8 and
    float8e4m3fn) and back with CastLike: ONNX Runtime's CPU Reshape below opset 21 has no
    float8 kernel, while Cast and CastLike have one from opset 19, which a float8 zero point
    needs anyway (``body_problem``). Below MIN_OPSET (no CastLike, and no float8 either)
    it is reshaped as it is."""
    yf = b.float32(y)
    if spec.quantize == "dynamic":
        b.nodes.append(
            helper.make_node("DynamicQuantizeLinear", [yf], ["Y", "Y_scale", "Y_zero_point"])
        )
        return
    scalar = b("Constant", value=helper.make_tensor("scalar_shape", TensorProto.INT64, [0], []))
    inputs = [yf, b("Reshape", b.float32("Y_scale"), scalar)]
    if with_zero_point and b.opset >= MIN_OPSET:
        zero_point = b("Reshape", b.float32("Y_zero_point"), scalar)
        inputs.append(b("CastLike", zero_point, "Y_zero_point"))
    elif with_zero_point:
        inputs.append(b("Reshape", "Y_zero_point", scalar))
    b("QuantizeLinear", *inputs, out="Y")


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from all_graphs(g)


def onnxnorm_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every onnxnorm node of the model's graphs (subgraphs included)."""
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if node.domain == catalogue.DOMAIN:
                yield node


def model_opset(model: onnx.ModelProto, domain: str = "") -> int | None:
    """The version of ``domain`` the model imports (None: none); "" and "ai.onnx" are one."""
    domains = DEFAULT_DOMAINS if domain in DEFAULT_DOMAINS else (domain,)
    for imp in model.opset_import:
        if imp.domain in domains:
            return imp.version
    return None


def node_variant(node: onnx.NodeProto, opset: int = MIN_OPSET, x_type: int | None = None) -> str:
    """The overload of ``node`` in a model of standard opset ``opset`` whose X has element type
    ``x_type`` (needed below MIN_OPSET)."""
    spec = catalogue.get(node.op_type)
    names = [p.name for p in spec.inputs]
    present = [names[i] for i, value in enumerate(node.input) if value and i < len(names)]
    attrs = {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}

    def has(output: str) -> bool:
        index = spec.output_index(output)
        return index is not None and len(node.output) > index and bool(node.output[index])

    return overload(
        spec,
        present,
        attrs.get("cast_before_scale", 0),
        attrs.get("scale_offset", 0.0),
        has("Sum"),
        has("Y_float"),
        opset,
        x_type,
        {k: v for k, v in attrs.items() if k in spec.defaults},
        bool(attrs.get("y_float32", 0)),
    )


def _set_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    domains = DEFAULT_DOMAINS if domain in DEFAULT_DOMAINS else (domain,)
    for imp in model.opset_import:
        if imp.domain in domains:
            imp.version = version
            return
    model.opset_import.append(helper.make_opsetid(domain, version))


def _declared(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, list]]:
    """Element type and dims of every value the model declares: graph inputs, outputs and
    value_info, initializers and Constant outputs (subgraphs included)."""
    types: dict[str, int] = {}
    dims: dict[str, list] = {}
    for graph in all_graphs(model.graph):
        for info in list(graph.input) + list(graph.output) + list(graph.value_info):
            t = info.type.tensor_type
            if t.elem_type:
                types[info.name] = t.elem_type
            if t.HasField("shape"):
                dims[info.name] = [
                    d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim
                ]
        for init in graph.initializer:
            types[init.name] = init.data_type
            dims[init.name] = list(init.dims)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
                for attr in node.attribute:
                    if attr.name == "value":
                        types[node.output[0]] = attr.t.data_type
                        dims[node.output[0]] = list(attr.t.dims)
    return types, dims


def value_types(
    model: onnx.ModelProto, wanted: Iterable[str] = (), known: Sequence[onnx.TensorProto] = ()
) -> tuple[dict[str, int], dict[str, list]]:
    """Element type and dims of the values of ``model`` (a dims entry: a list of ints, None where
    a dim is not a number): those it declares (``_declared``) and ``known`` (weights kept apart
    from it), and, where a name of ``wanted`` is neither, those onnx shape inference finds (the
    exporters and the fuse pipeline write value_info; other tools may not)."""
    types, dims = _declared(model)
    for tensor in known:
        types[tensor.name], dims[tensor.name] = tensor.data_type, list(tensor.dims)
    if any(name and name not in types for name in wanted):
        try:
            inferred_types, inferred_dims = _declared(onnx.shape_inference.infer_shapes(model))
        except Exception:  # noqa: BLE001 - a type still unknown is left to the caller
            return types, dims
        types, dims = {**inferred_types, **types}, {**inferred_dims, **dims}
    return types, dims


def _quantized_type(node: onnx.NodeProto, types: dict[str, int]) -> int | None:
    """The element type a static quantized node quantizes to: its Y_zero_point's (uint8 when
    absent), else its Y's where that is declared; None where neither is known."""
    index = [p.name for p in catalogue.get(node.op_type).inputs].index("Y_zero_point")
    if index >= len(node.input) or not node.input[index]:
        return TensorProto.UINT8
    found = types.get(node.input[index])
    if found is None and node.output and node.output[0]:
        found = types.get(node.output[0])
    return found


def _zero_point(node: onnx.NodeProto) -> str:
    """The Y_zero_point input of a static quantized node ("" when absent)."""
    index = [p.name for p in catalogue.get(node.op_type).inputs].index("Y_zero_point")
    return node.input[index] if index < len(node.input) else ""


def _static(node: onnx.NodeProto) -> bool:
    return node.op_type in catalogue.OPS and catalogue.get(node.op_type).quantize == "static"


def _float8_reason(opset: int) -> str:
    """Why a node that quantizes to float8 has no body in a model of standard opset ``opset``
    (below FLOAT8_MIN_OPSET)."""
    return (
        f"quantizes to float8e4m3fn (its Y_zero_point's type), which needs ONNX opset >= "
        f"{FLOAT8_MIN_OPSET} (QuantizeLinear-19 added float8); the model imports opset "
        f"{opset}: convert the model to opset {FLOAT8_MIN_OPSET} or newer "
        "(onnxnorm fuse --upgrade-opset does, with onnx.version_converter)"
    )


def _type_name(elem_type: int | None) -> str:
    return "unknown" if elem_type is None else TensorProto.DataType.Name(elem_type).lower()


def body_problem(op: str, opset: int, x_type: int | None, q_type: int | None = None) -> str | None:
    """Why no function body of ``op`` can be written in standard opset ``opset`` for an X of
    element type ``x_type`` (None: not known) and, for a static quantized op, a Y of ``q_type``
    (None: not known), in words a user can act on; None where one can."""
    spec = catalogue.get(op)

    def convert(needed: int) -> str:
        return (
            f"the model imports opset {opset}: convert the model to opset {needed} or newer "
            "(onnxnorm fuse --upgrade-opset does, with onnx.version_converter)"
        )

    if opset < OLDEST_OPSET:
        return f"onnxnorm writes function bodies in ONNX opset {OLDEST_OPSET} or newer; " + convert(
            OLDEST_OPSET
        )
    needed = QUANTIZE_MIN_OPSET.get(spec.quantize, 0)
    if opset < needed:
        quantizer = "QuantizeLinear" if spec.quantize == "static" else "DynamicQuantizeLinear"
        return f"its body ends in {quantizer}, which ONNX has from opset {needed}; " + convert(
            needed
        )
    if x_type == TensorProto.BFLOAT16 and opset < BFLOAT16_MIN_OPSET:
        return (
            f"X is bfloat16, which ONNX casts to from opset {BFLOAT16_MIN_OPSET} on (Cast-13); "
            + convert(BFLOAT16_MIN_OPSET)
        )
    if opset < MIN_OPSET and x_type is None:
        return (
            f"the element type of X is not declared and shape inference does not find it; a "
            f"body below opset {MIN_OPSET} (no CastLike) must name it: declare X's type "
            f"(value_info) or convert the model to opset {MIN_OPSET} or newer"
        )
    if opset < MIN_OPSET and x_type not in _TYPE_NAMES:
        return f"X is {_type_name(x_type)}, not float, float16 or bfloat16"
    if (
        spec.quantize == "static"
        and q_type == TensorProto.FLOAT8E4M3FN
        and opset < FLOAT8_MIN_OPSET
    ):
        return _float8_reason(opset)
    return None


def node_types(
    model: onnx.ModelProto,
    nodes: list[onnx.NodeProto],
    opset: int,
    known: Sequence[onnx.TensorProto] = (),
    all_x: bool = False,
) -> tuple[dict[str, int], dict[str, list]]:
    """``value_types`` of ``model``, inferring what the onnxnorm ``nodes`` need in opset
    ``opset`` where the model does not declare it: X's type below MIN_OPSET (or ``all_x``), a
    static quantized node's zero point below FLOAT8_MIN_OPSET."""
    wanted = [n.input[0] for n in nodes if n.input and (all_x or opset < MIN_OPSET)]
    if opset < FLOAT8_MIN_OPSET:
        wanted += [_zero_point(n) for n in nodes if _static(n)]
    return value_types(model, wanted, known)


def node_problem(node: onnx.NodeProto, opset: int, types: dict[str, int]) -> str | None:
    """``body_problem`` for ``node`` with the element types ``types`` (``value_types``)."""
    q_type = _quantized_type(node, types) if _static(node) else None
    return body_problem(
        node.op_type, opset, types.get(node.input[0]) if node.input else None, q_type
    )


def attach_functions(model: onnx.ModelProto, notes: list[Note] | None = None) -> onnx.ModelProto:
    """Gives every onnxnorm node its overload and the model the matching function bodies
    (in place; returns the model). Existing onnxnorm functions are replaced.

    A node whose body the model's opset cannot hold (``body_problem``: bfloat16 below opset
    13, a float8 zero point below 19 ...) keeps no overload and gets no body: it runs with the
    onnxnorm library only, as a node of the ``fused`` target; ``notes`` receives a Note for each
    such node saying why. Nothing here raises for the opset."""
    opset = model_opset(model) or MIN_OPSET
    nodes = list(onnxnorm_nodes(model))
    types = node_types(model, nodes, opset)[0]
    wanted: dict[tuple[str, str], None] = {}
    for node in nodes:
        problem = node_problem(node, opset, types)
        if problem:
            node.overload = ""
            if notes is not None:
                notes.append(Note(node.name or node.op_type, node.op_type, WITHOUT_BODY, problem))
            continue
        node.overload = node_variant(node, opset, types.get(node.input[0]))
        wanted[(node.op_type, node.overload)] = None
    keep = [f for f in model.functions if f.domain != catalogue.DOMAIN]
    del model.functions[:]
    model.functions.extend(keep)
    model.functions.extend(function_proto(op, variant, opset) for op, variant in wanted)
    if nodes:
        _set_opset(model, catalogue.DOMAIN, catalogue.VERSION)
    if wanted:
        model.ir_version = max(model.ir_version, MIN_IR_VERSION)
        if model_opset(model) is None:
            _set_opset(model, "", MIN_OPSET)
    return model


def strip_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Removes the onnxnorm function bodies (the ``fused`` target: the library is required)."""
    for node in onnxnorm_nodes(model):
        node.overload = ""
    keep = [f for f in model.functions if f.domain != catalogue.DOMAIN]
    del model.functions[:]
    model.functions.extend(keep)
    return model

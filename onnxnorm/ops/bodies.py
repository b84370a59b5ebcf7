"""The ONNX function bodies of the catalogue ops: ``function_proto`` writes the body of one op's
overload (``onnxnorm.ops.overloads``) in standard ops of one opset; the rotary ops'
(``catalogue.ROTARY_OPS``) are written by ``onnxnorm.ops.rotary_bodies`` with the helpers here
(``functions.function_proto`` picks the one of an op).

A body is written in standard ops of the model's own opset (onnx and ONNX Runtime refuse a body
importing another version), any from opset 7: LayerNormalization from opset 17,
RMSNormalization from opset 23, and a decomposition otherwise. Below opset 15 it casts to X's
element type by name, below 12 it holds the node's attribute values (the overload names both).
Flatten takes a negative axis from opset 11; below it the body reshapes to
[-1, <dims from axis>] first.

bfloat16 needs opset 13 (Cast-13 added it), the quantized ops opset 10 (QuantizeLinear) or 11
(DynamicQuantizeLinear), and a float8 zero point opset 19. Where a body cannot be written
``body_problem`` says why, in words a user can act on.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import TensorProto, helper

from onnxnorm.ops import catalogue
from onnxnorm.ops.opsets import (
    BFLOAT16_MIN_OPSET,
    FLOAT8_MIN_OPSET,
    MIN_OPSET,
    OLDEST_OPSET,
    QUANTIZE_MIN_OPSET,
    OpsetWriter,
    Ref,
)
from onnxnorm.ops.overloads import X_TYPE_NAMES, group_size, input_part, parse_overload, type_name

_FLOAT = TensorProto.FLOAT
_ATTR_TYPES = {"int": onnx.AttributeProto.INT, "float": onnx.AttributeProto.FLOAT}
_ATTRIBUTE_KINDS = {
    a.name: a.kind
    for spec in (*catalogue.OPS.values(), *catalogue.ROTARY_OPS.values())
    for a in spec.attributes
}


class Body(OpsetWriter):
    """Collects the nodes of one function body; each call adds a node and returns its output.
    ``x_type``: X's element type (below MIN_OPSET); ``values``: the node's attribute values
    (below REF_OPSET, else None: the body refers to its attributes); ``x``: the name of the
    input whose type the body's results take (X; Q for the rotary ops)."""

    def __init__(
        self,
        opset: int,
        x_type: int | None = None,
        values: dict[str, Any] | None = None,
        x: str = "X",
    ):
        self.opset, self.x_type, self.values, self.x = opset, x_type, values, x
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
            return self("CastLike", value, self.x, out=out)
        return self("Cast", value, to=self.x_type, out=out)

    def round(self, value: str) -> str:
        """``value`` rounded to X's type, kept in float32."""
        return self.float32(self.to_x(value))


def _float8_reason(opset: int) -> str:
    """Why a node that quantizes to float8 has no body in a model of standard opset ``opset``
    (below FLOAT8_MIN_OPSET)."""
    return (
        f"quantizes to float8e4m3fn (its Y_zero_point's type), which needs ONNX opset >= "
        f"{FLOAT8_MIN_OPSET} (QuantizeLinear-19 added float8); the model imports opset "
        f"{opset}: convert the model to opset {FLOAT8_MIN_OPSET} or newer "
        "(onnxnorm fuse --upgrade-opset does, with onnx.version_converter)"
    )


def body_problem(op: str, opset: int, x_type: int | None, q_type: int | None = None) -> str | None:
    """Why no function body of ``op`` can be written in standard opset ``opset`` for an X of
    element type ``x_type`` (None: not known) and, for a static quantized op, a Y of ``q_type``
    (None: not known), in words a user can act on; None where one can. (The rotary ops' X is
    their Q.)"""
    spec = catalogue.get(op)
    x = spec.inputs[0].name

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
            f"{x} is bfloat16, which ONNX casts to from opset {BFLOAT16_MIN_OPSET} on (Cast-13); "
            + convert(BFLOAT16_MIN_OPSET)
        )
    if opset < MIN_OPSET and x_type is None:
        return (
            f"the element type of {x} is not declared and shape inference does not find it; a "
            f"body below opset {MIN_OPSET} (no CastLike) must name it: declare {x}'s type "
            f"(value_info) or convert the model to opset {MIN_OPSET} or newer"
        )
    if opset < MIN_OPSET and x_type not in X_TYPE_NAMES:
        return f"{x} is {type_name(x_type)}, not float, float16 or bfloat16"
    if (
        spec.quantize == "static"
        and q_type == TensorProto.FLOAT8E4M3FN
        and opset < FLOAT8_MIN_OPSET
    ):
        return _float8_reason(opset)
    return None


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
        shift = rounded(b.scalar(offset))
        factor = rounded(b("Add", factor or b.scalar(1.0), shift))
    if factor:
        y = rounded(b("Mul", y, factor))
    if bias:
        y = b("Add", y, rounded(b.float32(bias)))
        y = rounded(y) if round_last else y
    return y


def _rows(b: Body, zf: str, axis: int | None = None) -> str:
    """``zf`` flattened to [rows, cols] at ``axis`` (None: the node's axis)."""
    axis = b.attr("axis") if axis is None else axis
    if isinstance(axis, int) and axis < 0 and b.opset < 11:
        # Flatten takes a negative axis from opset 11: to [-1, <dims from axis>] first
        dims = b("Concat", b.ints([-1]), b.shape(zf, axis), axis=0)
        return b("Flatten", b("Reshape", zf, dims), axis=1)
    return b("Flatten", zf, axis=axis)


def _rms_of_rows(b: Body, rows: str, axis: int, total: bool = False) -> str:
    """``rows`` divided by the root of the mean (``total``: the sum) of their squares over
    ``axis`` plus epsilon, in float32."""
    if total:
        squares = b.reduce_sum_square(rows, axis)
    else:
        squares = b.reduce_mean(b("Mul", rows, rows), axis)
    return b("Div", rows, b("Sqrt", b("Add", squares, b.scalar(b.attr("epsilon")))))


def _gated_body(b: Body, parts: set[str], present: set[str], order_a: bool, offset) -> None:
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
    group = group_size(parts)
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


def normalize(b: Body, spec: catalogue.OpSpec, z: str, axis: int | None = None) -> str:
    """``z`` normalized over [axis, rank) in float32, without any scale (``axis`` None: the
    node's axis). An L2 norm divides by the root of the sum of squares.

    The rows are flattened to [rows, cols]. For LayerNorm each row is first shifted by its
    first element: the result is the same (LayerNorm ignores a constant shift) but a row with
    a large mean and a small spread (mean 1e4, std 1e-2) keeps its digits, where ORT's
    LayerNormalization kernel alone loses them.
    """
    zf = b("Cast", z, to=_FLOAT)
    rows = _rows(b, zf, axis)
    if spec.norm == "l2":
        return b("Reshape", _rms_of_rows(b, rows, 1, total=True), b.shape(zf))
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
    MIN_OPSET the overload names X's type, below REF_OPSET the attribute values:
    ``onnxnorm.ops.overloads``). A ValueError says why where the opset cannot hold it
    (``body_problem``).

    All arithmetic is float32. Order A rounds to X's type after the normalization and after
    each later step; float32 carries more than twice the precision of float16 and bfloat16
    plus two bits, so one float32 operation rounded to X's type equals that operation done in
    X's type. The body thus needs no float16/bfloat16 arithmetic kernels, which ORT's CPU
    provider lacks for bfloat16.
    """
    spec = catalogue.get(op)
    if spec.rotary:
        raise ValueError(f"{op}: a rotary op's body is onnxnorm.ops.rotary_bodies'")
    parts, x_type, values = parse_overload(spec, variant, opset)
    problem = body_problem(op, opset, x_type)
    if problem:
        raise ValueError(f"no {op} body for overload {variant!r}: {problem}")
    order_a = "a" in parts
    present = {name for name in spec.optional_inputs if input_part(name) in parts}
    b = Body(opset, x_type, values)
    inputs = [p.name for p in spec.inputs]
    offset = b.attr("scale_offset") if "offset" in parts else None

    def norm(z: str, scale: str, bias: str, out: str | None = None, mixed: bool = False) -> str:
        """The norm of ``z`` with the inputs ``scale`` and ``bias`` when present, in X's type
        (``mixed``: in float32, without the last rounding to X's type)."""
        y = scale_and_shift(
            b,
            normalize(b, spec, z),
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


def _quantize(b: Body, spec: catalogue.OpSpec, y: str, with_zero_point: bool) -> None:
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

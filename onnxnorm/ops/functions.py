"""ONNX function bodies of the catalogue ops, and attaching them to models.

A node of an onnxnorm op carries, next to its op type, a function *overload* naming its variant:
which optional inputs it has and its rounding order (``scale_bias_a``, ``scale``, ``none`` ...).
The model holds one model-local function per (op, overload) in use, written in standard ops of
the model's own opset: LayerNormalization from opset 17, RMSNormalization from opset 23, and a
decomposition otherwise (opset 15 at least: the bodies use CastLike and Shape(start)).

ONNX Runtime runs the onnxnorm kernel for such a node when the onnxnorm library is registered,
and inlines the function body when it is not, so the same file runs everywhere.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import onnx
from onnx import TensorProto, helper

from onnxnorm.ops import catalogue

MIN_OPSET = 15
#: IR version 10 introduced function overloads.
MIN_IR_VERSION = 10
#: The standard opset from which QuantizeLinear quantizes to float8 (QuantizeLinear-19): the
#: least a model needs whose static quantized nodes have a float8e4m3fn zero point, as their
#: bodies (and their lowered form) end in that QuantizeLinear.
FLOAT8_MIN_OPSET = 19

_FLOAT = TensorProto.FLOAT
_ATTR_TYPES = {"int": onnx.AttributeProto.INT, "float": onnx.AttributeProto.FLOAT}
_ATTRIBUTE_KINDS = {a.name: a.kind for spec in catalogue.OPS.values() for a in spec.attributes}


class Ref:
    """A reference to one of the function's own attributes."""

    def __init__(self, name: str):
        self.name = name


class _Body:
    """Collects the nodes of one function body; each call adds a node and returns its output."""

    def __init__(self, opset: int):
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []

    def __call__(self, op: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        name = out or f"_t{len(self.nodes)}"
        node = helper.make_node(op, list(inputs), [name],
                                **{k: v for k, v in attrs.items() if not isinstance(v, Ref)})
        for key, value in attrs.items():
            if isinstance(value, Ref):
                node.attribute.append(helper.make_attribute_ref(
                    key, _ATTR_TYPES[_ATTRIBUTE_KINDS[value.name]], ref_attr_name=value.name))
        self.nodes.append(node)
        return name

    def const(self, **value: Any) -> str:
        return self("Constant", **value)

    def float32(self, value: str) -> str:
        return self("Cast", value, to=_FLOAT)

    def round(self, value: str) -> str:
        """``value`` rounded to X's type, kept in float32."""
        return self("Cast", self("CastLike", value, "X"), to=_FLOAT)

    def reduce_mean(self, value: str) -> str:
        """Mean over axis 1 of a 2-D tensor, keepdims."""
        if self.opset >= 18:
            return self("ReduceMean", value, self.const(value_ints=[1]), keepdims=1)
        return self("ReduceMean", value, axes=[1], keepdims=1)


def _part(name: str) -> str:
    """An input's name in an overload: "Y_zero_point" -> "yzeropoint" ("_" joins the parts)."""
    return name.lower().replace("_", "")


def overload(spec: catalogue.OpSpec, present: Iterable[str], cast_before_scale: int,
             scale_offset: float = 0.0, with_sum: bool = True, with_float: bool = False) -> str:
    """The function overload naming a node's variant: its optional inputs, whether it has a
    scale offset, its rounding order (``a`` for order A) and, for ops with a Residual, whether
    the node leaves out its Sum output (``nosum``: ORT cannot type a call to a function that
    has more outputs than the call). A quantized op's body has its optional Y_float output
    (and every output before it) when the node has it (``float``), else ends before it."""
    present = set(present)
    parts = [_part(name) for name in spec.optional_inputs if name in present] or ["none"]
    parts += ["offset"] if scale_offset else []
    parts += ["a"] if cast_before_scale else []
    if spec.quantize != "none" and with_float:
        parts += ["float"]
    else:
        parts += ["nosum"] if spec.has_residual and not with_sum else []
    return "_".join(parts)


def _body_outputs(spec: catalogue.OpSpec, parts: set[str]) -> list[str]:
    """The outputs of the body of an overload (its ``parts``)."""
    outputs = [p.name for p in spec.outputs]
    if spec.quantize != "none" and "float" not in parts:
        outputs.remove("Y_float")
    if "nosum" in parts:
        outputs.remove("Sum")
    return outputs


def scale_and_shift(b, y: str, scale: str | None, bias: str | None, offset: float | Ref | None,
                    order_a: bool) -> str:
    """The catalogue's arithmetic after the normalization, where the rounding order shows:
    ``y`` (the normalized value, float32) times Scale plus ``offset`` (scale_offset; None:
    none), plus Bias, in float32, the result in float32. Order A (``order_a``) rounds every
    value to X's type after each step, operands included; order B leaves the one rounding at
    the end to the caller.

    ``b`` writes the nodes (here into a function body, in ``onnxnorm.fusion.lowering`` into a
    graph): ``b(op, *inputs, **attributes)`` adds a node and returns its output,
    ``b.const(value_float=v)`` a float32 scalar, ``b.float32(v)`` a cast to float32 and
    ``b.round(v)`` a float32 value rounded to X's type and back.
    """
    def rounded(value: str) -> str:
        return b.round(value) if order_a else value

    y = rounded(y)
    factor = rounded(b.float32(scale)) if scale else None
    if offset is not None:
        offset = rounded(b.const(value_float=offset))
        factor = rounded(b("Add", factor or b.const(value_float=1.0), offset))
    if factor:
        y = rounded(b("Mul", y, factor))
    if bias:
        y = rounded(b("Add", y, rounded(b.float32(bias))))
    return y


def _normalize(b: _Body, spec: catalogue.OpSpec, z: str) -> str:
    """``z`` normalized over [axis, rank) in float32, without any scale.

    The rows are flattened to [rows, cols]. For LayerNorm each row is first shifted by its
    first element: the result is the same (LayerNorm ignores a constant shift) but a row with
    a large mean and a small spread (mean 1e4, std 1e-2) keeps its digits, where ORT's
    LayerNormalization kernel alone loses them.
    """
    zf = b("Cast", z, to=_FLOAT)
    rows = b("Flatten", zf, axis=Ref("axis"))
    if spec.norm == "layer":
        first = b("Slice", rows, b.const(value_ints=[0]), b.const(value_ints=[1]),
                  b.const(value_ints=[1]))
        rows = b("Sub", rows, first)
    if (spec.norm == "layer" and b.opset >= 17) or (spec.norm == "rms" and b.opset >= 23):
        ones = b("ConstantOfShape", b("Shape", rows, start=1),
                 value=helper.make_tensor("one", _FLOAT, [1], [1.0]))
        op = "LayerNormalization" if spec.norm == "layer" else "RMSNormalization"
        normalized = b(op, rows, ones, axis=-1, epsilon=Ref("epsilon"))
    else:
        if spec.norm == "layer":
            rows = b("Sub", rows, b.reduce_mean(rows))
        mean_square = b.reduce_mean(b("Mul", rows, rows))
        eps = b.const(value_float=Ref("epsilon"))
        normalized = b("Div", rows, b("Sqrt", b("Add", mean_square, eps)))
    return b("Reshape", normalized, b("Shape", zf))


def function_proto(op: str, variant: str, opset: int) -> onnx.FunctionProto:
    """The body of ``op`` for the overload ``variant`` in standard opset ``opset``.

    All arithmetic is float32. Order A rounds to X's type after the normalization and after
    each later step; float32 carries more than twice the precision of float16 and bfloat16
    plus two bits, so one float32 operation rounded to X's type equals that operation done in
    X's type. The body thus needs no float16/bfloat16 arithmetic kernels, which ORT's CPU
    provider lacks for bfloat16.
    """
    spec = catalogue.get(op)
    if opset < MIN_OPSET:
        raise ValueError(f"onnxnorm function bodies need opset >= {MIN_OPSET}, the model has {opset}")
    parts = set(variant.split("_"))
    order_a = "a" in parts
    present = {name for name in spec.optional_inputs if _part(name) in parts}
    b = _Body(opset)
    inputs = [p.name for p in spec.inputs]
    offset = Ref("scale_offset") if "offset" in parts else None

    def norm(z: str, scale: str, bias: str, out: str | None = None) -> str:
        """The norm of ``z`` with the inputs ``scale`` and ``bias`` when present, in X's type."""
        y = scale_and_shift(b, _normalize(b, spec, z), scale if scale in present else None,
                            bias if bias in present else None, offset, order_a)
        return b("CastLike", y, "X", out=out)

    z = "X"
    if spec.residual == "skip":
        total = b("Add", b("Mul", b.float32("Residual"), b.const(value_float=Ref("alpha"))),
                  b.float32("X"))
        if "XBias" in present:
            total = b("Add", total, b.float32("XBias"))
        z = b("CastLike", total, "X", out="Sum")
    elif spec.residual == "sandwich":
        inner = b.float32(norm("X", "InnerScale", "InnerBias"))
        z = b("CastLike", b("Add", b.float32("Residual"), inner), "X", out="Sum")
    outputs = _body_outputs(spec, parts)
    if spec.quantize == "none":
        norm(z, "Scale", "Bias", out="Y")
    else:
        _quantize(b, spec, norm(z, "Scale", "Bias", out="Y_float" if "Y_float" in outputs else None),
                  "Y_zero_point" in present)

    defaults = [helper.make_attribute(a.name, float(a.default) if a.kind == "float" else a.default)
                for a in spec.attributes]
    return helper.make_function(
        catalogue.DOMAIN, op, inputs, outputs, b.nodes,
        [helper.make_opsetid("", opset)], attribute_protos=defaults,
        doc_string=f"{spec.summary} {spec.formula}", overload=variant,
    )


def _quantize(b: _Body, spec: catalogue.OpSpec, y: str, with_zero_point: bool) -> None:
    """Y (and for dynamic quantization Y_scale, Y_zero_point) from the norm's output ``y`` in
    X's type: QuantizeLinear or DynamicQuantizeLinear of y in float32, as the unfused graph
    quantizes it (DynamicQuantizeLinear takes float32 only, so a float16 / bfloat16 graph casts
    before it; QuantizeLinear computes y / scale in float32 for every input type). The scale and
    zero point are reshaped to scalars: per-tensor quantization whatever the opset's axis rule.
    The zero point goes through float32 for that (exact for uint8, int8 and float8e4m3fn) and
    back with CastLike: ONNX Runtime's CPU Reshape below opset 21 has no float8 kernel, while
    Cast and CastLike have one from opset 19, which a float8 zero point needs anyway
    (``check_float8_opset``)."""
    yf = b.float32(y)
    if spec.quantize == "dynamic":
        b.nodes.append(helper.make_node("DynamicQuantizeLinear", [yf],
                                        ["Y", "Y_scale", "Y_zero_point"]))
        return
    scalar = b.const(value=helper.make_tensor("scalar_shape", TensorProto.INT64, [0], []))
    inputs = [yf, b("Reshape", b.float32("Y_scale"), scalar)]
    if with_zero_point:
        zero_point = b("Reshape", b.float32("Y_zero_point"), scalar)
        inputs.append(b("CastLike", zero_point, "Y_zero_point"))
    b("QuantizeLinear", *inputs, out="Y")


def _all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_graphs(g)


def onnxnorm_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every onnxnorm node of the model's graphs (subgraphs included)."""
    for graph in _all_graphs(model.graph):
        for node in graph.node:
            if node.domain == catalogue.DOMAIN:
                yield node


def model_opset(model: onnx.ModelProto, domain: str = "") -> int | None:
    for imp in model.opset_import:
        if imp.domain == domain:
            return imp.version
    return None


def node_variant(node: onnx.NodeProto) -> str:
    spec = catalogue.get(node.op_type)
    names = [p.name for p in spec.inputs]
    present = [names[i] for i, value in enumerate(node.input) if value and i < len(names)]
    attrs = {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}

    def has(output: str) -> bool:
        index = spec.output_index(output)
        return index is not None and len(node.output) > index and bool(node.output[index])

    return overload(spec, present, attrs.get("cast_before_scale", 0), attrs.get("scale_offset", 0.0),
                    has("Sum"), has("Y_float"))


def _set_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    for imp in model.opset_import:
        if imp.domain == domain:
            imp.version = version
            return
    model.opset_import.append(helper.make_opsetid(domain, version))


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """The element type of every value the model declares: graph inputs, outputs and
    value_info, initializers and Constant outputs (subgraphs included)."""
    types: dict[str, int] = {}
    for graph in _all_graphs(model.graph):
        for info in list(graph.input) + list(graph.output) + list(graph.value_info):
            if info.type.tensor_type.elem_type:
                types[info.name] = info.type.tensor_type.elem_type
        for init in graph.initializer:
            types[init.name] = init.data_type
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                for attr in node.attribute:
                    if attr.name == "value":
                        types[node.output[0]] = attr.t.data_type
    return types


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


def check_float8_opset(model: onnx.ModelProto, opset: int | None = None,
                       known: dict[str, int] | None = None) -> None:
    """Raises ValueError when a static quantized node of ``model`` quantizes to float8 (its
    Y_zero_point is float8e4m3fn) and the model's standard opset (or ``opset``) is below
    FLOAT8_MIN_OPSET: its function body, and its lowering, end in a QuantizeLinear of that type,
    which ONNX has from opset 19 on. The standard opset of a body is the model's own (onnx and
    ONNX Runtime refuse a model-local function that imports another), so the body cannot take a
    newer one by itself. ``known``: element types of values the model does not hold (weights
    kept apart from it)."""
    opset = opset if opset is not None else (model_opset(model) or MIN_OPSET)
    if opset >= FLOAT8_MIN_OPSET:
        return
    nodes = [n for n in onnxnorm_nodes(model) if n.op_type in catalogue.OPS
             and catalogue.get(n.op_type).quantize == "static"]
    if not nodes:
        return
    types = {**(known or {}), **_elem_types(model)}
    if any(_quantized_type(n, types) is None for n in nodes):
        try:  # the onnxnorm schemas give Y the zero point's type
            types.update(_elem_types(onnx.shape_inference.infer_shapes(model)))
        except Exception:  # noqa: BLE001 - a type still unknown is left to the runtime
            pass
    for node in nodes:
        if _quantized_type(node, types) == TensorProto.FLOAT8E4M3FN:
            raise ValueError(_float8_opset_message(node, opset))


def _float8_opset_message(node: onnx.NodeProto, opset: int) -> str:
    """The error for a node that quantizes to float8 in a model of standard opset ``opset`` (below
    FLOAT8_MIN_OPSET)."""
    name = f" {node.name!r}" if node.name else ""
    return (f"{node.op_type} node{name} quantizes to float8e4m3fn (its Y_zero_point's type), "
            f"which needs ONNX opset >= {FLOAT8_MIN_OPSET} (QuantizeLinear-19 added float8); the "
            f"model imports opset {opset}: convert the model to opset {FLOAT8_MIN_OPSET} or newer "
            "(onnx.version_converter)")


def attach_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Gives every onnxnorm node its overload and the model the matching function bodies
    (in place; returns the model). Existing onnxnorm functions are replaced. A node that
    quantizes to float8 needs standard opset 19 or newer (``check_float8_opset``)."""
    opset = model_opset(model) or MIN_OPSET
    check_float8_opset(model, opset)
    wanted: dict[tuple[str, str], None] = {}
    for node in onnxnorm_nodes(model):
        node.overload = node_variant(node)
        wanted[(node.op_type, node.overload)] = None
    keep = [f for f in model.functions if f.domain != catalogue.DOMAIN]
    del model.functions[:]
    model.functions.extend(keep)
    model.functions.extend(function_proto(op, variant, opset) for op, variant in wanted)
    if wanted:
        _set_opset(model, catalogue.DOMAIN, catalogue.VERSION)
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

"""Quantized models: norms followed by a quantizer become one quantized op; norms that a static
quantizer cut into pieces are reported with why they are not fused.

``fuse_quantizers``: a fused LayerNorm / RMSNorm / SkipLayerNorm / SkipRMSNorm whose output goes
straight into a QuantizeLinear (static quantization; the DequantizeLinear after it stays) or,
after a Cast to float32 in a float16 / bfloat16 graph, into a DynamicQuantizeLinear (dynamic
quantization) becomes the catalogue's quantized form of the norm, which computes exactly that
pair (docs/design.md). The quantizer's zero point (UINT8, INT8 or FLOAT8E4M3FN) gives the fused
op's Y type; a QuantizeLinear to float8 with ``saturate = 0`` stays as it is (the fused op always
saturates), with the reason in the report.

ONNX Runtime's static quantization in QDQ format, asked to quantize every op it can, puts a
QuantizeLinear/DequantizeLinear pair after the norm's ReduceMean and Add and stores epsilon and
the Pow exponent as quantized constants behind a DequantizeLinear. The statistics are then
rounded to the quantizer's steps between ReduceMean, Add and Sqrt, which no fused norm computes,
so no rule matches: this pass finds such norms after the rules ran and reports each one under
its core rule with the reason, instead of the report's plain "no norm pattern". Q/DQ pairs
around a norm (on its input and output, as MatMul-only quantization writes them) do not stop
fusion: the norm between them is fused, the QuantizeLinear after it joins it, and the
DequantizeLinear nodes stay as they are.
"""

from __future__ import annotations

from typing import TypeGuard

import onnx_ir as ir

from onnxnorm.fusion._base import FLOAT, Rejected, attribute
from onnxnorm.fusion.report import Tracker
from onnxnorm.ops import catalogue

_QDQ = ("QuantizeLinear", "DequantizeLinear")


def _op(node: ir.Node | None, *types: str) -> TypeGuard[ir.Node]:
    return (
        node is not None
        and node.domain in ("", "ai.onnx", "com.microsoft")
        and node.op_type in types
    )


def _producer(value: ir.Value | None) -> ir.Node | None:
    return value.producer() if value is not None else None


def _through_qdq(value: ir.Value | None, places: list[str], where: str) -> ir.Value | None:
    """The value behind a DequantizeLinear(QuantizeLinear(v)) pair (``where`` recorded in
    ``places``), or ``value`` itself."""
    producer = _producer(value)
    if _op(producer, "DequantizeLinear"):
        inner = _producer(producer.inputs[0])
        places.append(where)
        if _op(inner, "QuantizeLinear"):
            return inner.inputs[0]
        return producer.inputs[0]  # a quantized constant: its integer tensor
    return value


def _norm_kind(sqrt: ir.Node) -> tuple[str, list[str]] | None:
    """("RMSNorm" or "LayerNorm", where Q/DQ pairs sit) for a Sqrt that ends a norm's
    statistics cut by Q/DQ pairs; None when it is no such norm."""
    places: list[str] = []
    add = _producer(_through_qdq(sqrt.inputs[0], places, "after Add"))
    if not _op(add, "Add"):
        return None
    for i, operand in enumerate(add.inputs[:2]):
        before = len(places)
        mean = _producer(_through_qdq(operand, places, "after ReduceMean"))
        if not _op(mean, "ReduceMean"):
            del places[before:]
            continue
        _through_qdq(add.inputs[1 - i], places, "on epsilon")
        square = _producer(_through_qdq(mean.inputs[0], places, "after Pow"))
        if _op(square, "Pow"):
            _through_qdq(square.inputs[1], places, "on the Pow exponent")
            base = square.inputs[0]
        elif _op(square, "Mul") and square.inputs[0] is square.inputs[1]:
            base = square.inputs[0]
        else:
            return None
        if not places:
            return None  # no pair inside: the rules saw it, and said why if it did not fuse
        centred = _producer(_through_qdq(base, places, "on the squared value"))
        kind = "LayerNorm" if _op(centred, "Sub") else "RMSNorm"
        return kind, places
    return None


def report_quantized_norms(model: ir.Model, tracker: Tracker) -> int:
    """Reports every norm whose statistics Q/DQ pairs cut, under its core rule; returns how
    many it found."""
    count = 0
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if not _op(node, "Sqrt"):
            continue
        found = _norm_kind(node)
        if found is None:
            continue
        kind, places = found
        tracker.register(f"{kind} (decomposed)")
        tracker.checked(
            f"{kind} (decomposed)",
            node,
            (
                "QuantizeLinear/DequantizeLinear pairs inside the norm ("
                + ", ".join(dict.fromkeys(places))
                + "): the original rounds its statistics to "
                "the quantizer's steps between ReduceMean, Add and Sqrt, which no fused norm "
                "computes; quantize with the norm's ops left out (op_types_to_quantize without "
                "ReduceMean, Add, Pow, Sqrt, or their nodes in nodes_to_exclude) to fuse it"
            ),
        )
        count += 1
    return count


# ---------------------------------------------------------------------------------------------
# A norm followed by its quantizer: one quantized onnxnorm op

_FLOAT_OPS_WITH_QUANTIZED_FORMS = {
    (spec.base, spec.quantize): name for name, spec in catalogue.QUANTIZED_OPS.items()
}
_QUANT_TYPES = frozenset(ir.DataType[t[len("tensor(") : -1].upper()] for t in catalogue.QUANT_TYPES)
_QUANT_TYPE_NAMES = ", ".join(t[len("tensor(") : -1].upper() for t in catalogue.QUANT_TYPES)
#: why a QuantizeLinear to float8 with saturate = 0 stays as it is
_NO_SATURATE = (
    "QuantizeLinear to FLOAT8E4M3FN with saturate = 0: the fused op always saturates (to +-448, "
    "QuantizeLinear's default saturate = 1), and without saturation ONNX Runtime's CPU "
    "conversion departs from the ONNX specification (values in [480, 496) become 448 there, "
    "NaN in the specification), so no fused kernel could match both"
)


def _one_element(value: ir.Value, what: str) -> None:
    """``value`` must hold one element (a scalar or a 1-D tensor of one): per-tensor."""
    shape = value.shape
    if shape is None:
        raise Rejected(f"the shape of {what} ({value.name!r}) is unknown")
    dims = list(shape.dims)
    if len(dims) > 1 or any(d != 1 for d in dims):
        raise Rejected(
            f"{what} of shape {list(dims)} is not per tensor: the fused op quantizes "
            "per tensor only"
        )


def _quantized_source(quantizer: ir.Node) -> tuple[ir.Node, ir.Node | None] | None:
    """(the onnxnorm norm whose Y the quantizer reads, the Cast to float32 between them or None),
    or None when the quantizer reads no such norm."""
    value = quantizer.inputs[0] if quantizer.inputs else None
    if value is None:
        return None
    cast = None
    producer = value.producer()
    if _op(producer, "Cast") and producer.domain in ("", "ai.onnx"):
        to = producer.attributes.get("to")
        if to is None or to.value != ir.DataType.FLOAT:
            return None
        cast, value = producer, producer.inputs[0]
        producer = value.producer() if value is not None else None
    if (
        producer is None
        or producer.domain != catalogue.DOMAIN
        or not producer.outputs
        or producer.outputs[0] is not value
    ):
        return None
    quantize = "static" if quantizer.op_type == "QuantizeLinear" else "dynamic"
    if (producer.op_type, quantize) not in _FLOAT_OPS_WITH_QUANTIZED_FORMS:
        return None
    return producer, cast


def _inspect(quantizer: ir.Node, norm: ir.Node, cast: ir.Node | None) -> list[ir.Value | None]:
    """The quantizer's inputs that the fused op takes (Y_scale, Y_zero_point), or raises
    Rejected when the pair is not the fused op's semantics."""
    x_type = norm.inputs[0].dtype if norm.inputs and norm.inputs[0] is not None else None
    if x_type is None:
        raise Rejected("the element type of the norm's X is unknown; run shape inference first")
    flag = norm.attributes.get("y_float32")
    if flag is not None and flag.value == 1:
        raise Rejected(
            "the norm gives a float32 Y of a 16-bit X (y_float32 = 1); the quantized ops "
            "quantize Y in X's type"
        )
    if quantizer.op_type == "DynamicQuantizeLinear":
        if x_type != FLOAT and cast is None:
            raise Rejected(f"DynamicQuantizeLinear of a {x_type.name} value")
        return []
    if cast is not None and x_type != FLOAT:
        raise Rejected(
            f"QuantizeLinear takes the {x_type.name} norm's output cast to FLOAT: the "
            "fused op's Y_scale has X's type"
        )
    if attribute(quantizer, "block_size", 0):
        raise Rejected("blocked quantization (block_size): the fused op quantizes per tensor")
    scale = quantizer.inputs[1] if len(quantizer.inputs) > 1 else None
    zero_point = quantizer.inputs[2] if len(quantizer.inputs) > 2 else None
    if scale is None:
        raise Rejected("QuantizeLinear without y_scale")
    if scale.dtype != x_type:
        raise Rejected(
            f"y_scale of type {scale.dtype.name if scale.dtype else 'unknown'} for a "
            f"{x_type.name} norm: the fused op's Y_scale has X's type"
        )
    _one_element(scale, "y_scale")
    q_type = ir.DataType.UINT8
    if zero_point is not None:
        given = zero_point.dtype
        if given is None or given not in _QUANT_TYPES:
            raise Rejected(
                f"y_zero_point of type {given.name if given else 'unknown'}: the "
                f"fused op quantizes to {_QUANT_TYPE_NAMES}"
            )
        q_type = given
        _one_element(zero_point, "y_zero_point")
    if q_type == ir.DataType.FLOAT8E4M3FN and not attribute(quantizer, "saturate", 1):
        raise Rejected(_NO_SATURATE)
    output_dtype = attribute(quantizer, "output_dtype", 0)
    if output_dtype and ir.DataType(output_dtype) != q_type:
        raise Rejected(
            f"output_dtype {ir.DataType(output_dtype).name}: the fused op quantizes "
            f"to its zero point's type {q_type.name}"
        )
    return [scale, zero_point]


def _used_outside(value: ir.Value, nodes: set[ir.Node]) -> bool:
    return value.is_graph_output() or any(user not in nodes for user in value.consumers())


def fuse_quantizers(model: ir.Model, tracker: Tracker) -> int:
    """Turns each onnxnorm LayerNorm / RMSNorm / SkipLayerNorm / SkipRMSNorm followed by a
    QuantizeLinear (static QDQ: the DequantizeLinear after it stays) or a DynamicQuantizeLinear
    (after a Cast to float32 in a float16 / bfloat16 graph) into the quantized op. Where the
    norm's float output has other readers (or is a graph output) the fused op gives it as
    Y_float, and its Sum takes the norm's; a Cast with other readers stays and reads Y_float.
    Returns how many it fused."""
    count = 0
    for graph in model.graphs():
        for quantizer in list(graph):
            if quantizer.graph is not graph or not _op(
                quantizer, "QuantizeLinear", "DynamicQuantizeLinear"
            ):
                continue
            if quantizer.domain not in ("", "ai.onnx"):
                continue
            found = _quantized_source(quantizer)
            if found is None:
                continue
            norm, cast = found
            quantize = "static" if quantizer.op_type == "QuantizeLinear" else "dynamic"
            title = f"{norm.op_type} + {quantizer.op_type}"
            tracker.register(title)
            if norm.graph is not graph or (cast is not None and cast.graph is not graph):
                tracker.checked(title, quantizer, "the norm is in another graph")
                continue
            try:
                quant_inputs = _inspect(quantizer, norm, cast)
            except Rejected as e:
                tracker.checked(title, quantizer, str(e))
                continue
            tracker.checked(title, quantizer, None)
            _rewrite(
                graph,
                quantizer,
                norm,
                cast,
                _FLOAT_OPS_WITH_QUANTIZED_FORMS[(norm.op_type, quantize)],
                quant_inputs,
            )
            tracker.fused(title, quantizer)
            count += 1
    return count


def _rewrite(
    graph: ir.Graph,
    quantizer: ir.Node,
    norm: ir.Node,
    cast: ir.Node | None,
    op: str,
    quant_inputs: list[ir.Value | None],
) -> None:
    spec = catalogue.get(op)
    base = catalogue.get(norm.op_type)
    inputs = list(norm.inputs) + [None] * (len(base.inputs) - len(norm.inputs)) + quant_inputs
    while inputs and inputs[-1] is None:
        inputs.pop()
    name = f"{norm.name}/{op}" if norm.name else None
    fused = ir.Node(
        catalogue.DOMAIN,
        op,
        inputs,
        # (the norm's attributes the quantized op has: not y_float32, 0 here)
        attributes=[
            ir.Attr(a.name, a.type, a.value)
            for a in norm.attributes.values()
            if a.name in spec.defaults
        ],
        num_outputs=len(spec.outputs),
        name=name,
    )
    removed = {quantizer, norm}
    if cast is not None and not _used_outside(cast.outputs[0], {quantizer}):
        removed.add(cast)
    old_values, new_values = list(quantizer.outputs), list(fused.outputs[: len(quantizer.outputs)])
    y = norm.outputs[0]
    y_float = spec.output_index("Y_float")
    if y_float is None:  # (every quantized op of the catalogue gives it)
        raise ValueError(f"{op} has no Y_float output")
    if _used_outside(y, removed):
        old_values.append(y)
        new_values.append(fused.outputs[y_float])
    total = spec.output_index("Sum")
    if total is not None and len(norm.outputs) > 1 and norm.outputs[1] is not None:
        old_values.append(norm.outputs[1])
        new_values.append(fused.outputs[total])
    base_name = quantizer.outputs[0].name or name or op
    for index, value in enumerate(fused.outputs):
        # outputs nothing reads get names (unique: after the quantizer's output) and types too;
        # the pipeline drops the unused ones
        value.name = f"{base_name}/{spec.outputs[index].name}"
        if spec.outputs[index].type_var == "T":
            value.type, value.shape = y.type, y.shape
    ir.convenience.replace_nodes_and_values(
        graph,
        norm,
        [n for n in (norm, cast, quantizer) if n in removed],
        [fused],
        old_values,
        new_values,
    )

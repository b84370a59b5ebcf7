"""Norms that a static quantizer cut into pieces: why they are not fused.

ONNX Runtime's static quantization in QDQ format, asked to quantize every op it can, puts a
QuantizeLinear/DequantizeLinear pair after the norm's ReduceMean and Add and stores epsilon and
the Pow exponent as quantized constants behind a DequantizeLinear. The statistics are then
rounded to the quantizer's steps between ReduceMean, Add and Sqrt, which no fused norm computes,
so no rule matches: this pass finds such norms after the rules ran and reports each one under
its core rule with the reason, instead of the report's plain "no norm pattern". Q/DQ pairs
around a norm (on its input and output, as MatMul-only quantization writes them) do not stop
fusion: the norm between them is fused and the pairs stay as they are.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxnorm.fusion.report import Tracker

_QDQ = ("QuantizeLinear", "DequantizeLinear")


def _op(node: ir.Node | None, *types: str) -> bool:
    return node is not None and node.domain in ("", "ai.onnx", "com.microsoft") and node.op_type in types


def _through_qdq(value: ir.Value | None, places: list[str], where: str) -> ir.Value | None:
    """The value behind a DequantizeLinear(QuantizeLinear(v)) pair (``where`` recorded in
    ``places``), or ``value`` itself."""
    producer = value.producer() if value is not None else None
    if _op(producer, "DequantizeLinear"):
        inner = producer.inputs[0].producer() if producer.inputs[0] is not None else None
        places.append(where)
        if _op(inner, "QuantizeLinear"):
            return inner.inputs[0]
        return producer.inputs[0]  # a quantized constant: its integer tensor
    return value


def _norm_kind(sqrt: ir.Node) -> tuple[str, list[str]] | None:
    """("RMSNorm" or "LayerNorm", where Q/DQ pairs sit) for a Sqrt that ends a norm's
    statistics cut by Q/DQ pairs; None when it is no such norm."""
    places: list[str] = []
    add = _through_qdq(sqrt.inputs[0], places, "after Add").producer()
    if not _op(add, "Add"):
        return None
    for i, operand in enumerate(add.inputs[:2]):
        before = len(places)
        mean = _through_qdq(operand, places, "after ReduceMean").producer()
        if not _op(mean, "ReduceMean"):
            del places[before:]
            continue
        _through_qdq(add.inputs[1 - i], places, "on epsilon")
        square = _through_qdq(mean.inputs[0], places, "after Pow").producer()
        if _op(square, "Pow"):
            _through_qdq(square.inputs[1], places, "on the Pow exponent")
            base = square.inputs[0]
        elif _op(square, "Mul") and square.inputs[0] is square.inputs[1]:
            base = square.inputs[0]
        else:
            return None
        if not places:
            return None  # no pair inside: the rules saw it, and said why if it did not fuse
        centred = _through_qdq(base, places, "on the squared value").producer()
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
        tracker.checked(f"{kind} (decomposed)", node, (
            "QuantizeLinear/DequantizeLinear pairs inside the norm ("
            + ", ".join(dict.fromkeys(places)) + "): the original rounds its statistics to "
            "the quantizer's steps between ReduceMean, Add and Sqrt, which no fused norm "
            "computes; quantize with the norm's ops left out (op_types_to_quantize without "
            "ReduceMean, Add, Pow, Sqrt, or their nodes in nodes_to_exclude) to fuse it"))
        count += 1
    return count

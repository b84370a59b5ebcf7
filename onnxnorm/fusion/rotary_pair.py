"""Q and K of one attention layer in one rotary node: after the rotary stage (``rotary.py``) each
of a layer's Q and K has a rotary node of its own; :func:`pair` makes the two one node with Q
and K, where they project the same hidden state with the same angles and attributes."""

from __future__ import annotations

import onnx_ir as ir

from onnxnorm.fusion._base import Rejected, attribute, int_values
from onnxnorm.fusion.report import Tracker
from onnxnorm.fusion.rotary import ROTARY_OF
from onnxnorm.ops import catalogue

#: the report's title of the pairing
PAIRED = "Q/K norm and rotary: Q and K in one node"
#: the ops a projection's output passes through before its norm (a view, a chunk, a bias)
_VIEWS = {
    "Reshape",
    "Transpose",
    "Slice",
    "Split",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Add",
    "Cast",
}


def _is_constant(value: ir.Value) -> bool:
    """An initializer or a Constant's output, through Identity nodes (TorchScript shares an
    initializer between equal weights so)."""
    while True:
        node = value.producer()
        if node is None:
            return value.const_value is not None and not value.is_graph_input()
        if node.op_type == "Constant":
            return True
        if node.op_type != "Identity" or node.inputs[0] is None:
            return False
        value = node.inputs[0]


#: the projections (domain, op) whose input 0 is the hidden state: ONNX's, and ONNX Runtime's
#: quantized ones (onnxruntime-genai's int4 models project with MatMulNBits)
_PROJECTIONS = {
    ("", "MatMul"),
    ("", "Gemm"),
    ("com.microsoft", "MatMulNBits"),
    ("com.microsoft", "DynamicQuantizeMatMul"),
    ("com.microsoft", "MatMulIntegerToFloat"),
}


def _source(value: ir.Value | None, depth: int = 8) -> ir.Value | None:
    """The input of the projection (``_PROJECTIONS``) ``value`` is a view of: Q and K of one
    attention layer project the same hidden state."""
    while value is not None and depth:
        node = value.producer()
        if node is None:
            return None
        domain = "" if node.domain == "ai.onnx" else node.domain
        if (domain, node.op_type) in _PROJECTIONS:
            return node.inputs[0]
        if domain != "" or node.op_type not in _VIEWS:
            return None
        value, depth = node.inputs[0], depth - 1
        if node.op_type == "Add":  # a projection's bias: the operand that is no constant
            variable = [v for v in node.inputs if v is not None and not _is_constant(v)]
            value = variable[0] if len(variable) == 1 else None
    return None


def _angle_source(value: ir.Value | None) -> object:
    """The angles a rotary node reads: the same tensor under the view the rule gave each node
    of folded constant angles is the same angles, and so is the same tensor negated by the Neg
    the rule gave each node of a rotation by minus the angle."""
    node = value.producer() if value is not None else None
    if node is not None and node.op_type == "Neg" and node.domain == "":
        return ("Neg", _angle_source(node.inputs[0]))
    if node is not None and node.op_type == "Reshape" and node.domain == "":
        try:
            shape = tuple(int_values(node.inputs[1], "a view's shape").reshape(-1).tolist())
        except Rejected:
            return value
        return (node.inputs[0], shape)
    return value


def _key(node: ir.Node) -> tuple | None:
    """What two rotary nodes of Q alone must share to become one node of Q and K: the op, the
    angles (the same values), the attributes, and the hidden state both project."""
    if node.domain != catalogue.DOMAIN or node.op_type not in ROTARY_OF.values():
        return None
    if len(node.outputs) != 1 or (len(node.inputs) > 1 and node.inputs[1] is not None):
        return None
    spec = catalogue.get(node.op_type)
    names = [p.name for p in spec.inputs]
    given = dict(zip(names, node.inputs))
    source = _source(given.get("Q"))
    if source is None:
        return None
    # every attribute, given or by its default: rotary_first among them, so that a rotary-first
    # node never pairs with a norm-first one
    attributes = tuple(sorted((k, repr(attribute(node, k, d))) for k, d in spec.defaults.items()))
    angles = tuple(_angle_source(given.get(n)) for n in ("Cos", "Sin", "PositionIds"))
    return (node.op_type, source, angles, attributes)


def pair(model: ir.Model, tracker: Tracker) -> int:
    """Each two rotary nodes of Q alone that project the same hidden state with the same angles
    and attributes (a layer's Q and K) become one node with both, placed where the later one
    was; the number of nodes made."""
    tracker.register(PAIRED)
    made = 0
    for graph in model.graphs():
        groups: dict[tuple, list[ir.Node]] = {}
        for node in graph:
            key = _key(node)
            if key is not None:
                groups.setdefault(key, []).append(node)
        for nodes in groups.values():
            if len(nodes) != 2:
                continue
            q, k = nodes
            spec = catalogue.get(q.op_type)
            names = [p.name for p in spec.inputs]
            inputs = {**dict(zip(names, q.inputs))}
            for name, value in zip(names, k.inputs):
                if name == "Q":
                    inputs["K"] = value
                elif name in ("QScale", "QBias"):
                    inputs["K" + name[1:]] = value
            values = [inputs.get(name) for name in names]
            while values[-1] is None:
                values.pop()
            both = ir.Node(
                catalogue.DOMAIN,
                q.op_type,
                values,
                attributes=list(q.attributes.values()),
                num_outputs=2,
                name=f"{q.name}+K" if q.name else None,
            )
            for new, old in zip(both.outputs, (q.outputs[0], k.outputs[0])):
                new.type, new.shape = old.type, old.shape
            ir.convenience.replace_nodes_and_values(
                graph, k, [q, k], [both], [q.outputs[0], k.outputs[0]], list(both.outputs)
            )
            tracker.checked(PAIRED, both, None)
            tracker.fused(PAIRED, both)
            made += 1
    return made

"""Whether the rotary stage may fuse anything in a model, read off its ``onnx.ModelProto``
without preparing it (onnx's and ONNX Runtime's shape inference, CSE, the IR), which costs
~150 ms on an 8-layer decoder: :func:`onnxnorm.export` asks before each rotary stage
(``pipeline.fuse_rotary``), and most exports have norms and a rotary but no Q/K norm.

The answer may be a false yes (the stage then prepares, finds nothing and says so), never a
false no: each condition below is one that every rule of the stage needs, argued where it is
written.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from onnxnorm.fusion import rotary, rotary_nodes
from onnxnorm.ops import catalogue

#: the ops a rule of the stage takes between a Q/K norm and its rotary (the Transpose to
#: [batch, heads, seq, head], a Reshape of the heads, the Casts around a rotation in float32,
#: Identity) and the views around them that the preparation may fold away
VIEWS = frozenset({"Transpose", "Reshape", "Cast", "Identity", "Flatten", "Squeeze", "Unsqueeze"})
#: the ops a rotary starts with, reading its input (the products by cos and sin, the partner's
#: chain: ``rotary.index_map``'s ops), and the RotaryEmbedding nodes of either domain
STARTS = frozenset({"Mul", "Slice", "Split", "Neg", "Concat", "RotaryEmbedding"})


def may_fuse_rotary(model: onnx.ModelProto) -> bool:
    """Whether :func:`~onnxnorm.fusion.pipeline.fuse_rotary` may fuse anything in ``model``:
    False only where what every rule of the stage rotary and the pairing after it need is
    missing. One of these is needed:

    1. two onnxnorm rotary nodes of Q alone (K not given), which the pairing
       (``rotary_pair.pair``) can make one node of Q and K with nothing else fused;
    2. an onnxnorm norm the rotary rules can take (``rotary.ROTARY_OF``: RMSNorm, LayerNorm,
       L2Norm; every rule of the stage starts or ends at one, and the stage runs no norms stage
       that could write it), and with it a rotary of one of these forms:

       - computed by the model's own nodes, before or after the norm (``rotary.py``,
         ``rotary_first.py``): ``x * cos + partner(x) * sin`` is an Add of two Muls; its
         partner is a rotation, which has values of x of both signs, and of the ops the
         partner's chain may hold only a Concat joins values of different signs (the others
         keep one sign for all the values they pass); the parts it joins are parts of x,
         which only a Slice or a Split cuts (the others keep the number of values, and a
         Concat of whole copies of x has more values than x): an Add, a Mul, a Concat and a
         Slice or a Split;
       - a RotaryEmbedding node of ONNX or ONNX Runtime (``rotary_nodes.ROPE_DOMAINS``);

       and the two meet: the norm's output reaches an op a rotary starts with, or its input
       comes from the last op of a rotary (the Add of two Muls, a Concat of a partial rotary
       with such an Add among its inputs, a RotaryEmbedding node; not a residual Add),
       through :data:`VIEWS` alone (the rules take only views between the two). A norm in a
       local function or a subgraph is taken as meeting a rotary (the preparation inlines
       functions; subgraphs are not followed here).
    """
    ops: set[tuple[str, str]] = set()
    q_alone = 0
    rotary_ops = set(rotary.ROTARY_OF.values())
    for node in _every_node(model):
        domain = "" if node.domain == "ai.onnx" else node.domain
        ops.add((domain, node.op_type))
        alone = len(node.input) < 2 or not node.input[1]
        if domain == catalogue.DOMAIN and node.op_type in rotary_ops and alone:
            q_alone += 1
    if q_alone >= 2:
        return True
    if not any((catalogue.DOMAIN, norm) in ops for norm in rotary.ROTARY_OF):
        return False
    computed = {("", "Add"), ("", "Mul"), ("", "Concat")} <= ops and bool(
        {("", "Slice"), ("", "Split")} & ops
    )
    nodes = any((domain, "RotaryEmbedding") in ops for domain in rotary_nodes.ROPE_DOMAINS)
    return (computed or nodes) and _a_norm_meets_a_rotary(model)


def _is_norm(node: onnx.NodeProto) -> bool:
    return node.domain == catalogue.DOMAIN and node.op_type in rotary.ROTARY_OF


def _rotary_op(node: onnx.NodeProto, ops: frozenset[str]) -> bool:
    domain = "" if node.domain == "ai.onnx" else node.domain
    if node.op_type == "RotaryEmbedding":
        return domain in rotary_nodes.ROPE_DOMAINS
    return domain == "" and node.op_type in ops


def _is_view(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in VIEWS


def _ends_a_rotary(node: onnx.NodeProto | None, producer: dict[str, onnx.NodeProto]) -> bool:
    """Whether ``node`` (found before a norm through views) may be the last op of a rotary."""
    while node is not None and _is_view(node):
        node = producer.get(node.input[0]) if node.input else None
    if node is None:
        return False
    if _rotary_op(node, frozenset({"RotaryEmbedding"})):
        return True
    if node.domain not in ("", "ai.onnx"):
        return False
    parts = [producer.get(name) for name in node.input]
    if node.op_type == "Add":
        return all(
            p is not None and p.op_type == "Mul" and p.domain in ("", "ai.onnx") for p in parts
        )
    if node.op_type == "Concat":
        return any(
            p is not None and p.op_type != "Concat" and _ends_a_rotary(p, producer) for p in parts
        )
    return False


def _a_norm_meets_a_rotary(model: onnx.ModelProto) -> bool:
    """Whether a norm of ``rotary.ROTARY_OF`` meets a rotary's first or last op through views
    (see :func:`may_fuse_rotary`)."""
    elsewhere = [function.node for function in model.functions]
    elsewhere += [graph.node for node in _every_node(model) for graph in _subgraphs(node)]
    if any(_is_norm(node) for nodes in elsewhere for node in nodes):
        return True
    producer: dict[str, onnx.NodeProto] = {}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.output:
            producer[name] = node
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for norm in filter(_is_norm, model.graph.node):
        # after the norm: every value its output reaches through views
        pending, seen = list(norm.output[:1]), set()
        while pending:
            name = pending.pop()
            for node in consumers.get(name, ()):
                if _rotary_op(node, STARTS):
                    return True
                if _is_view(node) and node.output[0] not in seen:
                    seen.add(node.output[0])
                    pending.append(node.output[0])
        # before it: the op its input comes from through views
        if norm.input and _ends_a_rotary(producer.get(norm.input[0]), producer):
            return True
    return False


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _every_node(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """The nodes of ``model``'s graph, of its local functions, and of their subgraphs."""
    pending = [model.graph.node, *(function.node for function in model.functions)]
    while pending:
        for node in pending.pop():
            yield node
            pending.extend(graph.node for graph in _subgraphs(node))

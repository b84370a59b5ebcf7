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
#: chain: ``rotary.index_map``'s ops), besides the RotaryEmbedding nodes of either domain
STARTS = frozenset({"Mul", "Slice", "Split", "Neg", "Concat"})


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
    q_alone = norms = 0
    rotary_ops = set(rotary.ROTARY_OF.values())
    for node in _every_node(model):
        ops.add((_domain(node), node.op_type))
        alone = len(node.input) < 2 or not node.input[1]
        if _domain(node) == catalogue.DOMAIN and node.op_type in rotary_ops and alone:
            q_alone += 1
        norms += _is_norm(node)
    if q_alone >= 2:
        return True
    if not norms:
        return False
    computed = {("", "Add"), ("", "Mul"), ("", "Concat")} <= ops and bool(
        {("", "Slice"), ("", "Split")} & ops
    )
    nodes = any((domain, "RotaryEmbedding") in ops for domain in rotary_nodes.ROPE_DOMAINS)
    return (computed or nodes) and _a_norm_meets_a_rotary(model, norms)


def _domain(node: onnx.NodeProto) -> str:
    return "" if node.domain == "ai.onnx" else node.domain


def _is_norm(node: onnx.NodeProto) -> bool:
    return node.domain == catalogue.DOMAIN and node.op_type in rotary.ROTARY_OF


def _is_rope(node: onnx.NodeProto) -> bool:
    return node.op_type == "RotaryEmbedding" and _domain(node) in rotary_nodes.ROPE_DOMAINS


def _is_onnx(node: onnx.NodeProto, ops: frozenset[str]) -> bool:
    return _domain(node) == "" and node.op_type in ops


def _ends_a_rotary(node: onnx.NodeProto | None, producer: dict[str, onnx.NodeProto]) -> bool:
    """Whether ``node`` (found before a norm through views) may be the last op of a rotary."""
    while node is not None and _is_onnx(node, VIEWS):
        node = producer.get(node.input[0]) if node.input else None
    if node is None:
        return False
    if _is_rope(node):
        return True
    parts = [producer.get(name) for name in node.input]
    if _is_onnx(node, frozenset({"Add"})):
        return all(p is not None and _is_onnx(p, frozenset({"Mul"})) for p in parts)
    if _is_onnx(node, frozenset({"Concat"})):
        return any(
            p is not None and p.op_type != "Concat" and _ends_a_rotary(p, producer) for p in parts
        )
    return False


def _a_norm_meets_a_rotary(model: onnx.ModelProto, norms: int) -> bool:
    """Whether a norm of ``rotary.ROTARY_OF`` (``norms`` of them in the model) meets a rotary's
    first or last op through views (see :func:`may_fuse_rotary`)."""
    if sum(map(_is_norm, model.graph.node)) < norms:
        return True  # a norm in a local function or a subgraph
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
                if _is_rope(node) or _is_onnx(node, STARTS):
                    return True
                if _is_onnx(node, VIEWS) and node.output and node.output[0] not in seen:
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

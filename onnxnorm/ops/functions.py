"""ONNX functions of the catalogue ops in models: walking a model's graphs, and giving its onnxnorm
nodes their function bodies (``attach_functions``) or taking them away (``strip_functions``).

The model holds one model-local function per (op, overload) in use: the overload names the
node's variant (``onnxnorm.ops.overloads``), the body is written in standard ops of the model's
own opset (``onnxnorm.ops.bodies``, any opset from 7; the rules of each opset are in
``onnxnorm.ops.opsets``). Function overloads need IR version 10, which ONNX Runtime (1.32,
measured) loads with every opset from 7. Where a body cannot be written (``body_problem`` says
why), ``attach_functions`` leaves the node without one, as the ``fused`` target does: it runs
with the onnxnorm library only, and a Note says so.

ONNX Runtime runs the onnxnorm kernel for a node with a body when the onnxnorm library is
registered, and inlines the function body when it is not, so the same file runs everywhere.

The names of those three modules that were first defined here stay importable from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import onnx
from onnx import TensorProto

from onnxnorm.ops import bodies, catalogue, rotary_bodies
from onnxnorm.ops.bodies import body_problem, scale_and_shift
from onnxnorm.ops.opsets import (
    BFLOAT16_MIN_OPSET,
    DEFAULT_DOMAINS,
    FLOAT8_MIN_OPSET,
    MIN_IR_VERSION,
    MIN_OPSET,
    OLDEST_OPSET,
    QUANTIZE_MIN_OPSET,
    REF_OPSET,
    OpsetWriter,
    Ref,
    model_opset,
    set_opset,
)
from onnxnorm.ops.overloads import node_variant, overload

__all__ = [
    "BFLOAT16_MIN_OPSET",
    "DEFAULT_DOMAINS",
    "FLOAT8_MIN_OPSET",
    "MIN_IR_VERSION",
    "MIN_OPSET",
    "OLDEST_OPSET",
    "QUANTIZE_MIN_OPSET",
    "REF_OPSET",
    "WITHOUT_BODY",
    "Note",
    "OpsetWriter",
    "Ref",
    "all_graphs",
    "attach_functions",
    "body_problem",
    "function_proto",
    "model_opset",
    "node_problem",
    "node_types",
    "node_variant",
    "onnxnorm_nodes",
    "overload",
    "scale_and_shift",
    "set_opset",
    "strip_functions",
    "value_types",
]


def function_proto(op: str, variant: str, opset: int) -> onnx.FunctionProto:
    """The body of ``op``'s overload ``variant`` in standard opset ``opset``: a norm op's
    (``bodies.function_proto``) or a rotary op's (``rotary_bodies.function_proto``)."""
    if catalogue.get(op).rotary:
        return rotary_bodies.function_proto(op, variant, opset)
    return bodies.function_proto(op, variant, opset)


#: What a node becomes whose body cannot be written (``Note.emitted``).
WITHOUT_BODY = "onnxnorm node without a function body (runs with the onnxnorm library only)"


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


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph below it (those of If, Loop, Scan ... at any depth)."""
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
    _drop_onnxnorm_functions(model)
    model.functions.extend(function_proto(op, variant, opset) for op, variant in wanted)
    if nodes:
        set_opset(model, catalogue.DOMAIN, catalogue.VERSION)
    if wanted:
        model.ir_version = max(model.ir_version, MIN_IR_VERSION)
        if model_opset(model) is None:
            set_opset(model, "", MIN_OPSET)
    return model


def strip_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Removes the onnxnorm function bodies (the ``fused`` target: the library is required)."""
    for node in onnxnorm_nodes(model):
        node.overload = ""
    _drop_onnxnorm_functions(model)
    return model


def _drop_onnxnorm_functions(model: onnx.ModelProto) -> None:
    """Removes the model's onnxnorm functions, keeping the others in their order."""
    keep = [f for f in model.functions if f.domain != catalogue.DOMAIN]
    del model.functions[:]
    model.functions.extend(keep)

"""The passes around the rules: what the pipeline does to a model before the rules see it (one
name per value, types and shapes from onnx's and ONNX Runtime's inference, no-op Casts gone) and
to the fused model after (unused optional outputs dropped). :func:`onnxnorm.fusion.pipeline.fuse_ir`
runs them in order."""

from __future__ import annotations

import contextlib
import functools
import logging

import onnx
import onnx_ir as ir

from onnxnorm.fusion import residual
from onnxnorm.fusion._ort_symbolic import infer_symbolic
from onnxnorm.ops import catalogue


def unique_value_names(model: ir.Model) -> int:
    """Renames the values of subgraphs whose names another graph of the model also defines
    (the two branches of Optimum's merged decoders, an If, define the same names), so that
    each name means one value in the whole model; returns how many were renamed. onnx's shape
    inference propagates data by name across sibling graphs: with names shared, it writes the
    shape of one branch's value into the other branch's value of that name, a model ONNX
    Runtime then refuses ("Incompatible dimensions"), and the rules, which check shapes, miss
    norms and adds there. The main graph keeps its names; a subgraph's inputs and outputs are
    positional, so renaming them changes nothing a caller sees."""
    graphs = [model.graph, *model.graph.subgraphs()]

    def defined(graph: ir.Graph):
        yield from graph.inputs
        yield from graph.initializers.values()
        for node in graph:
            yield from node.outputs

    taken = {value.name for graph in graphs for value in defined(graph) if value.name}
    seen: set[str] = set()
    renamed = 0
    for graph in graphs:
        for value in list(defined(graph)):
            if not value.name:
                continue
            if value.name in seen and graph is not model.graph:
                index = 1
                while f"{value.name}_{index}" in taken:
                    index += 1
                value.name = f"{value.name}_{index}"
                taken.add(value.name)
                renamed += 1
            seen.add(value.name)
    return renamed


def remove_noop_casts(model: ir.Model) -> int:
    """Casts to the type their input already has (TorchScript writes them around norms) are
    bypassed, so that the value they copy is seen as one."""
    count = 0
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or not node.inputs:
            continue
        source, out = node.inputs[0], node.outputs[0]
        to = node.attributes.get("to")
        if (
            source is None
            or source.dtype is None
            or to is None
            or to.is_ref()
            or ir.DataType(to.value) != source.dtype
            or out.is_graph_output()
        ):
            continue
        out.replace_all_uses_with(source)
        count += 1
    return count


@contextlib.contextmanager
def quiet(logger: str, level: int):
    """The logger ``logger`` at ``level`` for the block: what a library logs there the pass
    reports in its own words (a rule's skip), not as a log line or a traceback."""
    log = logging.getLogger(logger)
    before = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(before)


@functools.cache
def sequence_outputs(op_type: str, version: int | None) -> tuple[bool, ...]:
    """For each output of the ONNX op: whether its type can only be a sequence or an optional
    (SplitToSequence's, SequenceConstruct's, Optional's, ...); () for an op onnx does not know.
    Asked once per op and version, however many nodes a model has."""
    try:
        schema = onnx.defs.get_schema(op_type, version or onnx.defs.onnx_opset_version(), "")
    except onnx.defs.SchemaError:
        return ()
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    return tuple(
        all(t.startswith(("seq(", "optional(")) for t in allowed.get(o.type_str, [o.type_str]))
        for o in schema.outputs
    )


def untype_sequences(model: ir.Model) -> None:
    """onnx-ir's ShapeInferencePass merges a value that onnx infers as a sequence (the output of
    SplitToSequence, ...) into the model as a tensor of its element type, and a model written
    so does not load in ONNX Runtime ("does not match expected type (seq(tensor(float)))").
    Each output of an op whose outputs can only be sequences or optionals gets its type back
    to unknown here, as the exporter left it; ONNX Runtime infers it on load."""
    imports = model.opset_imports
    for graph in model.graphs():
        for node in graph:
            if node.domain not in ("", "ai.onnx"):
                continue
            kinds = sequence_outputs(node.op_type, node.version or imports.get(""))
            for output, sequence in zip(node.outputs, kinds):
                if sequence and isinstance(output.type, ir.TensorType):
                    output.type = None
                    output.shape = None


def symbolic_shapes(model: ir.Model) -> bool:
    """ONNX Runtime's symbolic shape inference (``_ort_symbolic``), which proves dims equal
    where onnx's own inference leaves them unknown (TorchScript exports), run on a copy without
    the weights. Each value keeps onnx's shape and gets ORT's in
    ``value.meta[residual.SYMBOLIC_SHAPE]``:
    the two name their dims each in its own way, so a proof compares two shapes of one source.
    Where onnx has no shape at all the value takes ORT's, its dims renamed ``ort:<name>``.
    Best effort: False when it fails."""
    try:
        from onnx_ir.passes.common import _c_api_utils

        # "unsupported broadcast": reported by the rules instead
        with quiet("_onnxnorm_symbolic_shape_infer", logging.ERROR):
            inferred = ir.serde.deserialize_model(_c_api_utils.call_onnx_api(infer_symbolic, model))
    except Exception:  # noqa: BLE001 - unknown ops, odd graphs: keep onnx's shapes
        return False
    for graph, other in zip(model.graphs(), inferred.graphs()):
        theirs = ir.convenience.create_value_mapping(other)
        for name, value in ir.convenience.create_value_mapping(graph).items():
            found = theirs.get(name)
            if found is None or found.shape is None:
                continue
            # onnx's names for dims it cannot name are fresh per call: not a proof here
            dims = [
                None if isinstance(d, ir.SymbolicDim) and (d.value or "").startswith("unk__") else d
                for d in found.shape.dims
            ]
            value.meta[residual.SYMBOLIC_SHAPE] = ir.Shape(dims)
            if value.shape is None:
                value.shape = ir.Shape(
                    [
                        f"ort:{d.value}"
                        if isinstance(d, ir.SymbolicDim) and d.value is not None
                        else d
                        for d in dims
                    ]
                )
            if value.dtype is None and found.dtype is not None:
                value.dtype = found.dtype
    return True


def drop_unused_sums(model: onnx.ModelProto, outputs: tuple[str, ...] = ("Sum",)) -> None:
    """Removes the Sum output of Skip/Sandwich nodes where nothing reads it (Post-Norm); with
    ``outputs``, those optional outputs instead (a quantized op's Y_float)."""
    from onnxnorm.ops.functions import all_graphs

    used: set[str] = set()
    for graph in all_graphs(model.graph):
        used.update(o.name for o in graph.output)
        for node in graph.node:
            used.update(node.input)
            for attr in node.attribute:  # subgraphs read outer values by name
                for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                    for inner in all_graphs(g):
                        for n in inner.node:
                            used.update(n.input)
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if node.domain != catalogue.DOMAIN:
                continue
            spec = catalogue.get(node.op_type)
            for name in outputs:
                index = spec.output_index(name)
                if (
                    index is not None
                    and index < len(node.output)
                    and node.output[index] not in used
                ):
                    node.output[index] = ""
            while node.output and not node.output[-1]:
                del node.output[-1]

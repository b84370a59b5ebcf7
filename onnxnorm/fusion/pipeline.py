"""The fuse pipeline: ONNX model in, model with onnxnorm nodes and a report out.

Stages, each applied until nothing changes:

1. norms: every norm (decomposed, or a single op of ONNX or ONNX Runtime) becomes an onnxnorm
   LayerNorm/RMSNorm node with its Scale, Bias, scale offset and rounding order (``norms.py``);
   gated: those RMSNorm nodes with a gate and groups around them become GatedRMSNorm nodes, and
   L2 norms L2Norm nodes (``gated.py``);
2. sandwich: norm -> residual add -> norm becomes a Sandwich op (``residual.py``);
3. skip: the residual add (DeepNorm: with its alpha Mul) before a norm becomes a Skip op;
4. xbias: the sublayer's bias Add before a Skip op becomes its XBias;
5. a LayerNorm/RMSNorm (or Skip) op and the QuantizeLinear or DynamicQuantizeLinear after it
   become the op's quantized form (``quantized.py``);
6. BatchNormalization folded into the Conv/Gemm before it (``batch_norm.py``);

then the nodes the rewrites left unused are removed, unused Sum outputs dropped, and the
onnxnorm nodes lowered to the target (``lowering.py``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern

from onnxnorm import targets
from onnxnorm.errors import OutputDoesNotLoad, first_line
from onnxnorm.fusion import batch_norm, gated, norms, quantized, residual
from onnxnorm.fusion._onnxscript_private import root_op
from onnxnorm.fusion._ort_symbolic import infer_symbolic
from onnxnorm.fusion.lowering import lower_with_notes
from onnxnorm.fusion.report import FusionReport, Tracker
from onnxnorm.ops import catalogue
from onnxnorm.targets import TARGETS

__all__ = ["TARGETS", "fuse", "fuse_ir", "rules", "stages"]


def stages(
    tracker: Tracker, strict_precision: bool = False
) -> list[tuple[str, pattern.RewriteRuleSet]]:
    """The rule sets of the pipeline, in order (each is applied until nothing changes)."""
    return [
        (
            "norms",
            pattern.RewriteRuleSet(norms.norm_rules(tracker, strict_precision), commute=True),
        ),
        (
            "gated",
            pattern.RewriteRuleSet(gated.gated_rules(tracker, strict_precision), commute=True),
        ),
        ("sandwich", pattern.RewriteRuleSet(residual.sandwich_rules(tracker), commute=True)),
        ("skip", pattern.RewriteRuleSet(residual.skip_rules(tracker), commute=True)),
        ("xbias", pattern.RewriteRuleSet(residual.xbias_rules(tracker), commute=True)),
    ]


def rules(tracker: Tracker | None = None, strict_precision: bool = False) -> pattern.RewriteRuleSet:
    """Every onnxnorm fusion rule as one onnxscript rule set (commuted variants included), for
    other pipelines (Olive, Optimum, torch.onnx's optimizer). Apply it repeatedly until it
    returns 0 (norms grow one absorbed Mul/Add/Cast per application), with
    ``RemoveUnusedNodesPass`` in between; :func:`fuse_ir` does exactly that, stage by stage.

    Pass a :class:`Tracker` to learn what the rules found, fused and skipped
    (``tracker.report()``). ``strict_precision``: see :func:`fuse`.
    """
    tracker = tracker or Tracker()
    return pattern.RewriteRuleSet(
        norms.norm_rules(tracker, strict_precision)
        + gated.gated_rules(tracker, strict_precision)
        + residual.sandwich_rules(tracker)
        + residual.skip_rules(tracker)
        + residual.xbias_rules(tracker),
        commute=True,
    )


class _Driver:
    """Applies a rule set like ``RewriteRuleSet.apply_to_model``, but tries at each node only
    the rules whose pattern is rooted at that node's op type (most nodes of a model root no
    pattern), which makes the pass several times faster on large models."""

    def __init__(self, rule_set: pattern.RewriteRuleSet):
        self.rules = [(rule, root_op(rule)) for rule in rule_set.rules]
        self._for_op: dict[tuple[str, str], list] = {}

    def candidates(self, domain: str, op_type: str) -> list:
        """The rules that may be rooted at a node of this op, in the rule set's order."""
        key = (domain, op_type)
        if key not in self._for_op:
            self._for_op[key] = [
                rule for rule, ident in self.rules if ident is None or ident == key
            ]
        return self._for_op[key]

    def _graph(self, model: ir.Model, graph) -> int:
        count = 0
        for node in graph:
            domain = "" if node.domain == "ai.onnx" else node.domain
            for rule in self.candidates(domain, node.op_type):
                delta = rule.try_rewrite(model, graph, node)
                if delta is None:
                    continue
                ir.convenience.replace_nodes_and_values(
                    graph, node, [], delta.new_nodes, delta.match.outputs, delta.new_outputs
                )
                count += 1
                break
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    count += self._graph(model, attr.value)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for sub in attr.value:
                        count += self._graph(model, sub)
        return count

    def apply(self, model: ir.Model) -> int:
        count = self._graph(model, model.graph)
        for function in list(model.functions.values()):
            count += self._graph(model, function)
        if count:
            # the matched nodes are dead now; gone first, they leave their names to the new
            common_passes.RemoveUnusedNodesPass()(model)
            common_passes.NameFixPass()(model)
        return count


def _fixpoint(model: ir.Model, driver: _Driver, limit: int = 20) -> None:
    for _ in range(limit):
        if not driver.apply(model):
            return


def count_norms(model: ir.Model | onnx.ModelProto) -> tuple[int, int]:
    """(norm instances, residual adds absorbed) in onnxnorm nodes: a Sandwich op holds two
    norms and one add, a Skip op one norm and one add."""
    if isinstance(model, onnx.ModelProto):
        from onnxnorm.ops.functions import onnxnorm_nodes

        op_types = [n.op_type for n in onnxnorm_nodes(model)]
    else:
        op_types = [
            n.op_type
            for n in ir.traversal.RecursiveGraphIterator(model.graph)
            if n.domain == catalogue.DOMAIN
        ]
    held = [catalogue.NORM_OPS.get((catalogue.DOMAIN, t), (0, 0)) for t in op_types]
    return sum(n for n, _ in held), sum(a for _, a in held)


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
def _quiet(logger: str, level: int):
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
def _sequence_outputs(op_type: str, version: int | None) -> tuple[bool, ...]:
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
            kinds = _sequence_outputs(node.op_type, node.version or imports.get(""))
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
        with _quiet("_onnxnorm_symbolic_shape_infer", logging.ERROR):
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


def fuse_ir(
    model: ir.Model,
    tracker: Tracker | None = None,
    progress: Callable[[str], None] | None = None,
    strict_precision: bool = False,
) -> Tracker:
    """Runs every stage on ``model`` in place; returns the tracker."""
    tracker = tracker or Tracker()
    # one value per name, or shape inference mixes up the branches of an If
    unique_value_names(model)
    # the checks need element types and shapes, which exporters do not always write out (where
    # onnx's inference fails, the rules say which type or shape they missed: no traceback)
    with _quiet(common_passes.ShapeInferencePass.__module__, logging.CRITICAL):
        common_passes.ShapeInferencePass(strict_mode=False)(model)
    untype_sequences(model)
    symbolic_shapes(model)
    # exporters cast one value to float32 twice; the rules want one value per computation
    remove_noop_casts(model)
    common_passes.CommonSubexpressionEliminationPass()(model)
    for name, rule_set in stages(tracker, strict_precision):
        if progress:
            progress(name)
        _fixpoint(model, _Driver(rule_set))
    if progress:
        progress("quantize")
    quantized.fuse_quantizers(model, tracker)
    quantized.report_quantized_norms(model, tracker)
    batch_norm.fold(model, tracker)
    ir.passes.PassManager(
        [
            common_passes.RemoveUnusedNodesPass(),
            common_passes.RemoveUnusedFunctionsPass(),
            common_passes.RemoveUnusedOpsetsPass(),
            common_passes.TopologicalSortPass(),
        ]
    )(model)
    return tracker


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


def _add_stand_in(graph: onnx.GraphProto, tensor: onnx.TensorProto) -> None:
    """An initializer of ``tensor``'s name, type and shape whose data is nowhere (an external
    reference to no file): what reads the graph sees the weight, nothing reads its bytes."""
    stand_in = graph.initializer.add()
    stand_in.name, stand_in.data_type = tensor.name, tensor.data_type
    stand_in.dims.extend(tensor.dims)
    stand_in.data_location = onnx.TensorProto.EXTERNAL
    entry = stand_in.external_data.add()
    entry.key, entry.value = "location", "onnxnorm-stand-in"


def _deserialize_apart(
    model: onnx.ModelProto, base_dir: str | None, repairs=()
) -> tuple[ir.Model, dict[str, onnx.TensorProto]]:
    """The IR of ``model`` built from a copy of everything but its weights (onnx_ir would
    otherwise write into the protos it wraps, e.g. naming a Constant's tensor); the weights,
    initializers of 1 KiB or more and external-data references, are wrapped where they are,
    read only where a rule needs their values. ``repairs`` (``_validate.check_model``'s) are
    made in the copy."""
    from onnx import external_data_helper

    from onnxnorm._io import SMALL_TENSOR, weightless_shell
    from onnxnorm._validate import apply_repairs, dropped_initializers

    shell = weightless_shell(model)
    apply_repairs(shell, list(repairs), main_initializers=False)
    dropped = dropped_initializers(list(repairs))
    originals: dict[str, onnx.TensorProto] = {}
    for index, tensor in enumerate(model.graph.initializer):
        if index in dropped:
            continue
        if tensor.ByteSize() >= SMALL_TENSOR or external_data_helper.uses_external_data(tensor):
            _add_stand_in(shell.graph, tensor)
            originals[tensor.name] = tensor
        else:
            shell.graph.initializer.add().CopyFrom(tensor)
    graph = ir.serde.deserialize_model(shell)
    for name, tensor in originals.items():
        graph.graph.initializers[name].const_value = ir.serde.deserialize_tensor(
            tensor, base_dir or ""
        )
    return graph, originals


def _serialize_detached(
    model: ir.Model, originals: dict[str, onnx.TensorProto]
) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """Serializes ``model`` without copying its weights: initializers that still hold one of
    the input's ``originals`` (unchanged weights held inline) are left out of the proto and
    returned, by reference, beside it."""
    detached: list[onnx.TensorProto] = []
    removed = []
    for name, value in list(model.graph.initializers.items()):
        tensor = value.const_value
        if isinstance(tensor, ir.serde.TensorProtoTensor) and originals.get(name) is tensor.raw:
            detached.append(tensor.raw)
            removed.append(value)
            model.graph.initializers.pop(name)
    try:
        proto = ir.serde.serialize_model(model)
    finally:
        for value in removed:
            model.graph.register_initializer(value)
    return proto, detached


def _check(model: onnx.ModelProto, base_dir: str | None) -> list:
    """Refuses a broken or hostile model (``onnxnorm._validate``) before any weight is read;
    returns the repairs that mend what ONNX Runtime tolerates."""
    from onnxnorm._validate import ModelProblem, check_external_data, check_model
    from onnxnorm.errors import OnnxNormError

    try:
        check_external_data(model, base_dir or ".")
        return check_model(model, base_dir or ".")
    except ModelProblem as problem:
        raise OnnxNormError(str(problem)) from None


def upgrade_opset(
    model: onnx.ModelProto, weights: list[onnx.TensorProto]
) -> tuple[onnx.ModelProto, str]:
    """``model`` converted by onnx's version converter to the oldest standard opset at which
    every onnxnorm node has a function body (bfloat16 needs 13, a quantizer 10 or 11, float8
    19: ``functions.body_problem``), and the report's line on it; ``model`` and "" where no
    node needs it. ``weights``: the model's initializers kept apart from it, which the
    converter sees as stand-ins without data (no weight is read) and which keep their names.
    Where the converter fails, the model is kept as it is and the line says why."""
    from onnxnorm.ops import functions

    opset = functions.model_opset(model)
    nodes = list(functions.onnxnorm_nodes(model))
    if opset is None or not nodes:
        return model, ""
    types = functions.node_types(model, nodes, opset, weights, all_x=True)[0]
    if all(functions.node_problem(n, opset, types) is None for n in nodes):
        return model, ""
    newest = onnx.defs.onnx_opset_version()
    target = next(
        (
            v
            for v in range(opset + 1, newest + 1)
            if all(functions.node_problem(n, v, types) is None for n in nodes)
        ),
        None,
    )
    if target is None:
        return model, (
            f"no opset up to {newest} gives every onnxnorm node a body; the model keeps its opset"
        )
    shell = onnx.ModelProto()
    shell.CopyFrom(model)
    names = {t.name for t in weights}
    for tensor in weights:
        _add_stand_in(shell.graph, tensor)
    try:
        from onnx import version_converter

        converted = version_converter.convert_version(shell, target)
    except Exception as error:  # noqa: BLE001 - the converter's own words go in the report
        return model, (
            f"onnx's version converter could not take the model "
            f"from opset {opset} to {target} ({first_line(error)}); the model keeps "
            "its opset"
        )
    kept = [t for t in converted.graph.initializer if t.name not in names]
    del converted.graph.initializer[:]
    converted.graph.initializer.extend(kept)
    return converted, (
        f"ONNX opset {opset} -> {target} (onnx's version converter), the oldest "
        "where every onnxnorm node has a function body"
    )


def fuse_detached(
    model: onnx.ModelProto,
    target: str = "function",
    base_dir: str | None = None,
    strict_precision: bool = False,
    upgrade: bool = False,
) -> tuple[onnx.ModelProto, list[onnx.TensorProto], FusionReport]:
    """:func:`fuse` for large models: returns the fused model without the input's unchanged
    weights, and those weights (the input's own TensorProtos, not copies) to be written beside
    it (``onnxnorm._io.save_model(..., extra=weights)``). Tensors stored as external data stay
    references into ``base_dir`` and are read only where a rule needs their values."""
    targets.check(target, "fusion target")
    repairs = _check(model, base_dir)
    graph, originals = _deserialize_apart(model, base_dir, repairs)
    before = count_norms(graph)
    tracker = fuse_ir(graph, strict_precision=strict_precision)
    after = count_norms(graph)
    fused, weights = _serialize_detached(graph, originals)
    del graph
    if target != "function":
        # ORT cannot infer the types of a function call that leaves out an optional output,
        # so the function target keeps Sum, used or not
        drop_unused_sums(fused)
    # a quantized op's Y_float where nothing reads it: its overload's body ends before it
    drop_unused_sums(fused, ("Y_float",))
    upgraded = ""
    if upgrade and target != "fused":
        fused, upgraded = upgrade_opset(fused, weights)
    lowered, notes = lower_with_notes(fused, target, weights)
    report = tracker.report()
    report.norms = after[0] - before[0]
    report.residual_adds = after[1] - before[1]
    report.target = target
    report.lowering = [str(n) for n in notes if n.reason]
    report.repairs = [r.line for r in repairs]
    report.upgrade = upgraded
    report.load_check = _check_loads(model, lowered, weights)
    return lowered, weights, report


def _check_loads(
    model: onnx.ModelProto, lowered: onnx.ModelProto, weights: list[onnx.TensorProto]
) -> str:
    """Proves that ONNX Runtime loads the fused model, before anything is written, without
    reading a weight (``verify.load_problem``); raises :class:`OutputDoesNotLoad` when it does
    not although the input does. Returns "" when it loads, else the report's note on why the
    check could not tell (the input does not load that way either)."""
    from onnxnorm.fusion.verify import load_problem

    problem = load_problem(lowered, weights)
    if problem is None:
        return ""
    before = load_problem(model)
    if before is None:
        raise OutputDoesNotLoad(
            f"the fused model does not load in ONNX Runtime, although the input does: {problem}"
        )
    return (
        f"not checked that ONNX Runtime loads the output: it does not load the input "
        f"either ({before})"
    )


def fuse(
    model: onnx.ModelProto,
    target: str = "function",
    base_dir: str | None = None,
    strict_precision: bool = False,
    upgrade: bool = False,
) -> tuple[onnx.ModelProto, FusionReport]:
    """Rewrites the norms of ``model`` into onnxnorm ops; ``model`` is left as is.

    ``target``: a name of :data:`onnxnorm.targets.TARGETS` (how each is written:
    ``lowering.py``). ``base_dir``: where the model's external data lies, if it has any.
    ``strict_precision``: a norm whose statistics the original computes in float16 or
    bfloat16 (float16 conversions of float32 models) is left as it is, with the reason; by
    default it is fused, computing them in float32 as onnxnorm's ops do, and the report notes
    it. ``upgrade``: where the model's opset cannot hold a node's function body (bfloat16
    below opset 13, ...), convert the model to the oldest opset that can with onnx's version
    converter (:func:`upgrade_opset`); by default such a node is written without a body (it
    needs the onnxnorm library) and the report says why.
    """
    fused, weights, report = fuse_detached(model, target, base_dir, strict_precision, upgrade)
    fused.graph.initializer.extend(weights)
    return fused, report

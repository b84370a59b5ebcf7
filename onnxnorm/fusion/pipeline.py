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
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern

from onnxnorm import targets
from onnxnorm._validate import Repair, check
from onnxnorm.errors import OutputDoesNotLoad
from onnxnorm.fusion import batch_norm, detached, gated, l2, norms, passes, quantized, residual
from onnxnorm.fusion._onnxscript_private import root_op
from onnxnorm.fusion.detached import upgrade_opset
from onnxnorm.fusion.lowering import lower_with_notes
from onnxnorm.fusion.report import FusionReport, Tracker
from onnxnorm.ops import catalogue
from onnxnorm.targets import TARGETS

__all__ = ["TARGETS", "Detached", "Fused", "fuse", "fuse_detached", "fuse_ir", "rules", "stages"]


class Fused(NamedTuple):
    """What :func:`fuse` returns (a tuple, as before it had names)."""

    model: onnx.ModelProto
    report: FusionReport


class Detached(NamedTuple):
    """What :func:`fuse_detached` returns: the fused model without the input's unchanged
    weights, those weights (the input's own TensorProtos), and the report."""

    model: onnx.ModelProto
    weights: list[onnx.TensorProto]
    report: FusionReport


def stages(
    tracker: Tracker, strict_precision: bool = False
) -> list[tuple[str, pattern.RewriteRuleSet]]:
    """The rule sets of the pipeline, in order (each is applied until nothing changes)."""
    return [
        (
            "norms",
            pattern.RewriteRuleSet(
                norms.norm_rules(tracker, strict_precision)
                + l2.scaled_sum_rules(tracker, strict_precision),
                commute=True,
            ),
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
        + l2.scaled_sum_rules(tracker, strict_precision)
        + gated.gated_rules(tracker, strict_precision)
        + residual.sandwich_rules(tracker)
        + residual.skip_rules(tracker)
        + residual.xbias_rules(tracker),
        commute=True,
    )


class Driver:
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


class _Relay(Tracker):
    """The tracker the cached rules (:func:`_drivers`) report to: it keeps the titles they
    registered when they were built, and the rules themselves, and passes what they find to
    the tracker of the run."""

    def __init__(self) -> None:
        super().__init__()
        self.titles: list[str] = []
        self.rules: list = []
        self.target = Tracker()

    def register(self, title: str) -> None:
        self.titles.append(title)

    def adopt(self, rule: object) -> None:
        self.rules.append(rule)

    def checked(self, title: str, root: ir.Node, reason: str | None) -> None:
        self.target.checked(title, root, reason)

    def fused(self, title: str, root: ir.Node, note: str = "") -> None:
        self.target.fused(title, root, note)


class _Built(threading.local):
    """The stages' rules and drivers, built once per thread and strictness: building them (the
    patterns and their commuted variants) took 0.06 to 0.2 s of every run, most of a small
    model's. Per thread, because a rule keeps the match it accepted until it rewrites it."""

    def __init__(self) -> None:
        self.drivers: dict[bool, tuple[_Relay, list[tuple[str, Driver]]]] = {}


_BUILT = _Built()


@contextlib.contextmanager
def _drivers(tracker: Tracker, strict_precision: bool) -> Iterator[list[tuple[str, Driver]]]:
    """The stages' drivers, their rules reporting to ``tracker`` (registered in it in the
    order :func:`stages` builds them); what a rule kept of a match is dropped at the end."""
    if strict_precision not in _BUILT.drivers:
        relay = _Relay()
        built = [(name, Driver(rules)) for name, rules in stages(relay, strict_precision)]
        _BUILT.drivers[strict_precision] = (relay, built)
    relay, built = _BUILT.drivers[strict_precision]
    relay.target = tracker
    for title in relay.titles:
        tracker.register(title)
    try:
        yield built
    finally:
        relay.target = Tracker()
        for rule in relay.rules:
            rule.forget()


def _fixpoint(model: ir.Model, driver: Driver, limit: int = 20) -> None:
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


def fuse_ir(
    model: ir.Model,
    tracker: Tracker | None = None,
    progress: Callable[[str], None] | None = None,
    strict_precision: bool = False,
) -> Tracker:
    """Runs every stage on ``model`` in place; returns the tracker."""
    tracker = tracker or Tracker()
    # one value per name, or shape inference mixes up the branches of an If
    passes.unique_value_names(model)
    # the checks need element types and shapes, which exporters do not always write out (where
    # onnx's inference fails, the rules say which type or shape they missed: no traceback)
    with passes.quiet(common_passes.ShapeInferencePass.__module__, logging.CRITICAL):
        common_passes.ShapeInferencePass(strict_mode=False)(model)
    passes.untype_sequences(model)
    passes.symbolic_shapes(model)
    # exporters cast one value to float32 twice; the rules want one value per computation
    passes.remove_noop_casts(model)
    common_passes.CommonSubexpressionEliminationPass()(model)
    with _drivers(tracker, strict_precision) as drivers:
        for name, driver in drivers:
            if progress:
                progress(name)
            _fixpoint(model, driver)
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


def fuse_detached(
    model: onnx.ModelProto,
    target: str = "function",
    base_dir: str | None = None,
    strict_precision: bool = False,
    upgrade: bool = False,
    *,
    repairs: Sequence[Repair] | None = None,
    runtime: str | None = None,
) -> Detached:
    """:func:`fuse` for large models: returns the fused model without the input's unchanged
    weights, and those weights (the input's own TensorProtos, not copies) to be written beside
    it (``onnxnorm._io.save_model(..., extra=weights)``). Tensors stored as external data stay
    references into ``base_dir`` and are read only where a rule needs their values.

    ``model`` is checked first (``onnxnorm._validate.check``: refused when broken or hostile,
    before any weight is read), unless the caller did so at its own door and passes the
    ``repairs`` that check returned (:func:`onnxnorm._io.open_model` does)."""
    targets.check(target, "fusion target")
    if runtime is not None:
        targets.check_runtime(runtime)
    if repairs is None:
        repairs = check(model, base_dir or ".")
    repairs = list(repairs)
    graph, originals = detached.deserialize_apart(model, base_dir, repairs)
    before = count_norms(graph)
    tracker = fuse_ir(graph, strict_precision=strict_precision)
    after = count_norms(graph)
    fused, weights = detached.serialize_detached(graph, originals)
    del graph
    if target != "function" if runtime is None else not targets.RUNTIMES[runtime].keeps_ops:
        # ORT cannot infer the types of a function call that leaves out an optional output,
        # so the function target keeps Sum, used or not
        passes.drop_unused_sums(fused)
    # a quantized op's Y_float where nothing reads it: its overload's body ends before it
    passes.drop_unused_sums(fused, ("Y_float",))
    upgraded = ""
    if upgrade and (target != "fused" or runtime is not None):
        fused, upgraded = upgrade_opset(fused, weights)
    lowered, notes = lower_with_notes(fused, target, weights, runtime)
    report = tracker.report()
    report.norms = after[0] - before[0]
    report.residual_adds = after[1] - before[1]
    report.target = target
    report.runtime = runtime
    report.lowering = [str(n) for n in notes if n.reason]
    report.repairs = [r.line for r in repairs]
    report.upgrade = upgraded
    report.load_check = _check_loads(model, lowered, weights)
    return Detached(lowered, weights, report)


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
    *,
    runtime: str | None = None,
) -> Fused:
    """Rewrites the norms of ``model`` into onnxnorm ops; ``model`` is left as is.

    ``target``: a name of :data:`onnxnorm.targets.TARGETS` (how each is written:
    ``lowering.py``). ``base_dir``: where the model's external data lies, if it has any.
    ``strict_precision``: a norm whose statistics the original computes in float16 or
    bfloat16 (float16 conversions of float32 models) is left as it is, with the reason; by
    default it is fused, computing them in float32 as onnxnorm's ops do, and the report notes
    it. ``upgrade``: where the model's opset cannot hold a node's function body (bfloat16
    below opset 13, ...), convert the model to the oldest opset that can with onnx's version
    converter (:func:`upgrade_opset`); by default such a node is written without a body (it
    needs the onnxnorm library) and the report says why. ``runtime``: a name of
    :data:`onnxnorm.targets.RUNTIMES` (``--for``): each norm written in the form that runtime
    runs best, in place of ``target``.
    """
    fused, weights, report = fuse_detached(
        model, target, base_dir, strict_precision, upgrade, runtime=runtime
    )
    fused.graph.initializer.extend(weights)
    return Fused(fused, report)

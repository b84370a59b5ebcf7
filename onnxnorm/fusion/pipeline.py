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
import contextvars
import gc
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
from onnxnorm.fusion import (
    batch_norm,
    detached,
    driver,
    gated,
    l2,
    norms,
    passes,
    quantized,
    residual,
    rotary,
    rotary_first,
    rotary_gqa,
    rotary_nodes,
    rotary_pair,
)
from onnxnorm.fusion.detached import upgrade_opset
from onnxnorm.fusion.lowering import lower_with_notes
from onnxnorm.fusion.report import FusionReport, Tracker
from onnxnorm.fusion.rotary_scan import may_fuse_rotary
from onnxnorm.ops import catalogue
from onnxnorm.targets import TARGETS

__all__ = [
    "STAGES",
    "TARGETS",
    "Detached",
    "Fused",
    "fuse",
    "fuse_detached",
    "fuse_ir",
    "fuse_rotary",
    "may_fuse_rotary",
    "rules",
    "stage_rules",
    "stages",
    "without_stages",
]

#: the stages :func:`without_stages` leaves out of the runs in its context
_LEFT_OUT: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "onnxnorm_stages_left_out", default=frozenset()
)


@contextlib.contextmanager
def without_stages(*names: str) -> Iterator[None]:
    """Within the context, every fusion (:func:`fuse`, :func:`fuse_ir`, the CLI's) runs without
    the stages ``names`` (of :data:`STAGES`; "rotary" also leaves Q and K unpaired): what a
    stage gains is measured against the same pass without it (``onnxnorm bench e2e``'s
    ``onnxnorm-fused-norotary``)."""
    unknown = sorted(set(names) - set(STAGES))
    if unknown:
        raise ValueError(f"no fusion stage {unknown}; the stages are {sorted(STAGES)}")
    token = _LEFT_OUT.set(_LEFT_OUT.get() | frozenset(names))
    try:
        yield
    finally:
        _LEFT_OUT.reset(token)


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


#: the names of the stages :func:`stage_rules` builds, in its order: what :func:`without_stages`
#: checks names against without building every rule
STAGES = ("norms", "gated", "rotary", "sandwich", "skip", "xbias")


def stage_rules(tracker: Tracker, strict_precision: bool = False) -> list[tuple[str, list]]:
    """The pipeline's stages in order, each with its rules (uncommuted: the driver commutes a
    rule once a graph may match it)."""
    return [
        (
            "norms",
            norms.norm_rules(tracker, strict_precision)
            + l2.scaled_sum_rules(tracker, strict_precision),
        ),
        ("gated", gated.gated_rules(tracker, strict_precision)),
        (
            "rotary",
            rotary.rotary_rules(tracker)
            + rotary_first.rotary_first_rules(tracker)
            + rotary_nodes.rope_node_rules(tracker),
        ),
        ("sandwich", residual.sandwich_rules(tracker)),
        ("skip", residual.skip_rules(tracker)),
        ("xbias", residual.xbias_rules(tracker)),
    ]


def stages(
    tracker: Tracker, strict_precision: bool = False
) -> list[tuple[str, pattern.RewriteRuleSet]]:
    """The rule sets of the pipeline, in order (each is applied until nothing changes)."""
    return [
        (name, pattern.RewriteRuleSet(rules, commute=True))
        for name, rules in stage_rules(tracker, strict_precision)
    ]


def rules(tracker: Tracker | None = None, strict_precision: bool = False) -> pattern.RewriteRuleSet:
    """Every onnxnorm fusion rule as one onnxscript rule set (commuted variants included), for
    other pipelines (Olive, Optimum, torch.onnx's optimizer). Apply it repeatedly until it
    returns 0 (norms grow one absorbed Mul/Add/Cast per application), with
    ``RemoveUnusedNodesPass`` in between; :func:`fuse_ir` does exactly that, stage by stage.

    Pass a :class:`Tracker` to learn what the rules found, fused and skipped
    (``tracker.report()``). ``strict_precision``: see :func:`fuse`.
    """
    every = [
        rule for _, found in stage_rules(tracker or Tracker(), strict_precision) for rule in found
    ]
    return pattern.RewriteRuleSet(every, commute=True)


def count_norms(model: ir.Model | onnx.ModelProto) -> tuple[int, int]:
    """(norm instances, residual adds absorbed) in onnxnorm nodes: a Sandwich op holds two
    norms and one add, a Skip op one norm and one add, a rotary op one norm per output."""
    if isinstance(model, onnx.ModelProto):
        from onnxnorm.ops.functions import onnxnorm_nodes

        nodes = [(n.op_type, sum(1 for o in n.output if o)) for n in onnxnorm_nodes(model)]
    else:
        nodes = [
            (n.op_type, sum(1 for o in n.outputs if o is not None))
            for n in ir.traversal.RecursiveGraphIterator(model.graph)
            if n.domain == catalogue.DOMAIN
        ]
    held = [catalogue.norms_held(catalogue.DOMAIN, op, outputs) for op, outputs in nodes]
    return sum(n for n, _ in held), sum(a for _, a in held)


def fuse_ir(
    model: ir.Model,
    tracker: Tracker | None = None,
    progress: Callable[[str], None] | None = None,
    strict_precision: bool = False,
) -> Tracker:
    """Runs every stage on ``model`` in place; returns the tracker."""
    tracker = tracker or Tracker()
    _prepare(model)
    with driver.drivers(stage_rules, tracker, strict_precision) as stage_drivers:
        left_out = _LEFT_OUT.get()
        for name, stage_driver in stage_drivers:
            if name in left_out:
                continue
            if progress:
                progress(name)
            stage_driver.fixpoint(model)
    if "rotary" not in left_out:
        rotary_pair.pair(model, tracker)
    rotary_gqa.report(model, tracker)
    if progress:
        progress("quantize")
    quantized.fuse_quantizers(model, tracker)
    quantized.report_quantized_norms(model, tracker)
    batch_norm.fold(model, tracker)
    _tidy(model)
    return tracker


def _prepare(model: ir.Model) -> None:
    """What the rules need of a graph before the stages run."""
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


def _tidy(model: ir.Model) -> None:
    """What the stages leave unused, removed; the nodes in order."""
    ir.passes.PassManager(
        [
            common_passes.RemoveUnusedNodesPass(),
            common_passes.RemoveUnusedFunctionsPass(),
            common_passes.RemoveUnusedOpsetsPass(),
            common_passes.TopologicalSortPass(),
        ]
    )(model)


def fuse_rotary(model: onnx.ModelProto) -> tuple[onnx.ModelProto, FusionReport]:
    """The stage rotary alone, then Q and K paired: each onnxnorm Q/K norm node and the rotary
    after it become one rotary op, nothing else changes. What :func:`onnxnorm.export` does to
    a model whose norms are onnxnorm modules and whose rotary is its own code (a transformers
    model after :func:`onnxnorm.convert`). Returns a new model and the report; where
    :func:`may_fuse_rotary` finds that nothing can fuse, ``model`` itself and an empty report,
    without preparing the graph (onnx's and ONNX Runtime's shape inference, CSE: ``_prepare``)
    or building the IR."""
    if not may_fuse_rotary(model):
        return model, Tracker().report()
    graph = ir.from_proto(model)
    tracker = Tracker()
    with _collector_paused():
        _prepare(graph)
        with driver.drivers(stage_rules, tracker, False) as stage_drivers:
            for name, stage_driver in stage_drivers:
                if name == "rotary":
                    stage_driver.fixpoint(graph)
        rotary_pair.pair(graph, tracker)
        _tidy(graph)
    return ir.to_proto(graph), tracker.report()


_PAUSED = threading.Lock()
_pausing = 0  # the runs that paused the collector and have not ended
_was_enabled = False


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a run builds and rewrites its graph:
    the run allocates many objects that live until it ends, and each full collection on the
    way walked all of them and everything imported before (on a small model, a third of the
    pass). The garbage a run leaves is collected once the collector runs again; concurrent
    runs share one pause, which the last of them ends."""
    global _pausing, _was_enabled
    with _PAUSED:
        if _pausing == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pausing += 1
    try:
        yield
    finally:
        with _PAUSED:
            _pausing -= 1
            if _pausing == 0 and _was_enabled:
                gc.enable()


@_collector_paused()
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

"""How the pass applies its rules: the stage driver and the rules kept from run to run.

A :class:`Driver` applies a list of rules as onnxscript's ``RewriteRuleSet(rules,
commute=True).apply_to_model`` would, with the same result, but does less work for it:

* at each node it tries only the rules whose pattern is rooted at that node's op type (most
  nodes of a model root no pattern), which makes the pass several times faster on large models;
* it builds a rule's commuted variants (onnxscript copies the pattern once per order of the
  inputs of its Add and Mul nodes: 4 to 16 copies a rule) only once the graph holds every op
  the pattern needs, when first needed. A graph without one of those ops has no match for the
  rule, so skipping it changes nothing; and a small model lacks the ops of most rules (it has
  no Sigmoid for the gated norms, no ReduceSumSquare, no onnxnorm op yet for the residual
  stages), which is where most of a small model's time went.

:func:`drivers` keeps each stage's rules and drivers per thread, from run to run: onnxscript's
patterns cost more to build than a small model costs to fuse.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from onnxnorm.fusion._onnxscript_private import required_ops, root_op
from onnxnorm.fusion.report import Tracker

Op = tuple[str, str]


class Entry(NamedTuple):
    """A rule as the driver holds it: the op its pattern is rooted at (None: any) and the ops
    the pattern needs."""

    rule: Any
    root: Op | None
    needs: frozenset[Op]


def _op(node: ir.Node) -> Op:
    return ("" if node.domain == "ai.onnx" else node.domain), node.op_type


def ops_of(model: ir.Model) -> set[Op]:
    """The ops of every node of ``model``: its graph, their subgraphs and its functions."""
    found = {_op(node) for node in ir.traversal.RecursiveGraphIterator(model.graph)}
    for function in model.functions.values():
        found |= {_op(node) for node in ir.traversal.RecursiveGraphIterator(function)}
    return found


class Driver:
    """Applies ``rules`` (see the module's docstring); ``commute``: match each Add and Mul of a
    pattern with its inputs in either order, as ``RewriteRuleSet(commute=True)`` does."""

    def __init__(self, rules: Sequence[Any], commute: bool = True) -> None:
        self.entries = [Entry(rule, root_op(rule), required_ops(rule)) for rule in rules]
        self.commute = commute
        self._variants: dict[int, list] = {}
        self._for_op: dict[Op, list] = {}
        self._present: set[Op] = set()

    def variants_built(self) -> int:
        """How many rules' commuted variants have been built so far."""
        return len(self._variants)

    def _variants_of(self, index: int) -> list:
        if index not in self._variants:
            rule = self.entries[index].rule
            self._variants[index] = list(rule.commute()) if self.commute else [rule]
        return self._variants[index]

    def candidates(self, domain: str, op_type: str) -> list:
        """The rules (commuted variants included) that may match at a node of this op in the
        graph being rewritten, in the order of ``rules``."""
        key = (domain, op_type)
        found = self._for_op.get(key)
        if found is None:
            found = []
            for index, entry in enumerate(self.entries):
                if entry.root not in (None, key) or not entry.needs <= self._present:
                    continue
                found.extend(self._variants_of(index))
            self._for_op[key] = found
        return found

    def _learn(self, nodes: Sequence[ir.Node]) -> None:
        """A rewrite brought ``nodes`` in: rules needing their ops may match from now on."""
        new = {_op(node) for node in nodes} - self._present
        if new:
            self._present |= new
            self._for_op.clear()

    def _graph(self, model: ir.Model, graph: ir.Graph | ir.Function) -> int:
        count = 0
        for node in graph:
            for rule in self.candidates(*_op(node)):
                delta = rule.try_rewrite(model, graph, node)
                if delta is None:
                    continue
                ir.convenience.replace_nodes_and_values(
                    graph, node, [], delta.new_nodes, delta.match.outputs, delta.new_outputs
                )
                self._learn(delta.new_nodes)
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
        """One sweep over ``model`` (its graph, subgraphs and functions); the number of
        rewrites."""
        self._present = ops_of(model)
        self._for_op.clear()
        count = self._graph(model, model.graph)
        for function in list(model.functions.values()):
            count += self._graph(model, function)
        if count:
            # the matched nodes are dead now; gone first, they leave their names to the new
            common_passes.RemoveUnusedNodesPass()(model)
            common_passes.NameFixPass()(model)
        return count

    def fixpoint(self, model: ir.Model, limit: int = 20) -> None:
        """Sweeps until a sweep rewrites nothing (at most ``limit`` sweeps)."""
        for _ in range(limit):
            if not self.apply(model):
                return


class _Relay(Tracker):
    """The tracker the cached rules (:func:`drivers`) report to: it keeps the titles they
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


#: the stages' rules, built for a tracker and a strictness: (stage name, rules) in order
StageRules = Callable[[Tracker, bool], list[tuple[str, list]]]


class _Built(threading.local):
    """The stages' drivers, built once per thread, rule builder and strictness. Per thread,
    because a rule keeps the match it accepted until it rewrites it."""

    def __init__(self) -> None:
        self.drivers: dict[tuple[StageRules, bool], tuple[_Relay, list[tuple[str, Driver]]]] = {}


_BUILT = _Built()


@contextlib.contextmanager
def drivers(
    build: StageRules, tracker: Tracker, strict_precision: bool
) -> Iterator[list[tuple[str, Driver]]]:
    """The drivers of the stages ``build`` makes, their rules reporting to ``tracker``
    (registered in it in the order ``build`` makes them); what a rule kept of a match is
    dropped at the end."""
    key = (build, strict_precision)
    if key not in _BUILT.drivers:
        relay = _Relay()
        made = [(name, Driver(rules)) for name, rules in build(relay, strict_precision)]
        _BUILT.drivers[key] = (relay, made)
    relay, made = _BUILT.drivers[key]
    relay.target = tracker
    for title in relay.titles:
        tracker.register(title)
    try:
        yield made
    finally:
        relay.target = Tracker()
        for rule in relay.rules:
            rule.forget()

"""The one private piece of onnxscript the pass reads: the pattern of a rewrite rule.

The pass's driver (``driver.Driver``) tries at each node only the rules whose pattern is
rooted at that node's op type, which makes it several times faster on large models than trying
every rule everywhere, and builds a rule's commuted variants only once the graph holds every op
its pattern needs (most models lack the ops of most rules). onnxscript has no public way to ask a
``RewriteRule`` for the op its pattern is rooted at or the ops it contains, so :func:`root_op`
and :func:`required_ops` read the rule's ``_target_pattern`` (a ``GraphPattern``:
``output_nodes[0]``, ``_outputs`` and their producers, each node's ``op_identifier()``, else
its ``domain`` and ``op`` value patterns). Read on onnxscript 0.7.1 and 0.7.2.

The public API that would replace it: a ``RewriteRule.root_op`` and ``RewriteRule.op_types`` (or
the pattern graph as a public attribute), or a rule set's own index of rules by op.

Where a future onnxscript changes this, :func:`root_op` answers None (the rule is tried at every
node) and :func:`required_ops` the empty set (the rule is built whatever the graph holds):
slower, never wrong; and :func:`check`, which the tests call on every supported version, fails
loudly.
"""

from __future__ import annotations

from typing import Any


def _pattern(rule: Any):
    return getattr(rule, "_target_pattern", None)


def root_op(rule: Any) -> tuple[str, str] | None:
    """(domain, op type) of the node a rule's pattern is rooted at; None when the pattern does
    not fix it, or when onnxscript no longer exposes the pattern the way this module reads it."""
    try:
        return _identity(_pattern(rule).output_nodes[0])
    except (AttributeError, IndexError, TypeError):
        return None


def _identity(node: Any) -> tuple[str, str] | None:
    ident = node.op_identifier()
    if ident is not None:
        domain, op = ident[0], ident[1]
    else:
        domain_pattern: Any = getattr(node, "domain", None)
        op_pattern: Any = getattr(node, "op", None)
        if not (hasattr(domain_pattern, "value") and hasattr(op_pattern, "value")):
            return None
        domain, op = domain_pattern.value(), op_pattern.value()
    if not isinstance(domain, str) or not isinstance(op, str):
        return None
    return ("" if domain == "ai.onnx" else domain), op


def required_ops(rule: Any) -> frozenset[tuple[str, str]]:
    """The (domain, op type) of every node a rule's pattern must match: the nodes reached from
    its outputs through node outputs alone (an ``OrValue``'s alternatives are not all needed);
    the empty set when onnxscript no longer exposes them the way this module reads them. A
    graph without one of these ops has no match for the rule."""
    try:
        pending = list(_pattern(rule)._outputs)
        seen: set[int] = set()
        found: set[tuple[str, str]] = set()
        while pending:
            value = pending.pop()
            if type(value).__name__ != "NodeOutputPattern":
                continue  # an input, a constant or a choice of alternatives
            node = value.producer()
            if id(node) in seen:
                continue
            seen.add(id(node))
            ident = _identity(node)
            if ident is not None:
                found.add(ident)
            pending.extend(v for v in node.inputs if v is not None)
    except (AttributeError, TypeError):
        return frozenset()
    return frozenset(found)


def check() -> None:
    """Raises AssertionError, naming the installed onnxscript, when :func:`root_op` cannot read
    the root of a plain rule's pattern any more."""
    import onnxscript
    from onnxscript.rewriter import pattern

    def target(op, x):
        return op.Relu(x)

    def replacement(op, x):
        return op.Identity(x)

    rule = pattern.RewriteRule(target, replacement)
    found = root_op(rule)
    assert found == ("", "Relu"), (
        f"onnxscript {onnxscript.__version__}: a rule's pattern root reads as {found!r}, not "
        "('', 'Relu'): onnxnorm/fusion/_onnxscript_private.py must follow onnxscript's change"
    )

    def chain(op, x, y):
        return op.Sqrt(op.Add(pattern.OrValue([op.Pow(x, y), op.Mul(x, x)]), y))

    needed = required_ops(pattern.RewriteRule(chain, replacement))
    assert needed == {("", "Sqrt"), ("", "Add")}, (
        f"onnxscript {onnxscript.__version__}: a pattern's required ops read as {needed!r}, not "
        "Sqrt and Add: onnxnorm/fusion/_onnxscript_private.py must follow onnxscript's change"
    )

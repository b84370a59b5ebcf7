"""The one private piece of onnxscript the pass reads: the pattern of a rewrite rule.

The pass's driver (``pipeline.Driver``) tries at each node only the rules whose pattern is
rooted at that node's op type, which makes it several times faster on large models than trying
every rule everywhere. onnxscript has no public way to ask a ``RewriteRule`` for the op its
pattern is rooted at, so :func:`root_op` reads the rule's ``_target_pattern`` (a
``GraphPattern``: ``output_nodes[0]``, its ``op_identifier()``, else the node's ``domain`` and
``op`` value patterns). Read on onnxscript 0.7.1 and 0.7.2.

The public API that would replace it: a ``RewriteRule.root_op`` (or the pattern graph as a public
attribute), or a rule set's own index of rules by root op.

Where a future onnxscript changes this, :func:`root_op` answers None (the rule is tried at every
node: slower, never wrong) and :func:`check`, which the tests call on every supported version,
fails loudly.
"""

from __future__ import annotations

from typing import Any


def _pattern(rule: Any):
    return getattr(rule, "_target_pattern", None)


def root_op(rule: Any) -> tuple[str, str] | None:
    """(domain, op type) of the node a rule's pattern is rooted at; None when the pattern does
    not fix it, or when onnxscript no longer exposes the pattern the way this module reads it."""
    pattern = _pattern(rule)
    try:
        root = pattern.output_nodes[0]
        ident = root.op_identifier()
    except (AttributeError, IndexError, TypeError):
        return None
    if ident is not None:
        return ident[0], ident[1]
    domain: Any = getattr(root, "domain", None)
    op: Any = getattr(root, "op", None)
    if hasattr(domain, "value") and hasattr(op, "value"):
        return domain.value(), op.value()
    return None


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

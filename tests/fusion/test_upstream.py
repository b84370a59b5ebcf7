"""The private pieces of onnxscript and ONNX Runtime that the pass relies on, one small module
each (onnxnorm/fusion/_onnxscript_private.py, _ort_symbolic.py, whose docstrings say what public
API would replace them): their checks fail loudly when the installed versions change them. The
same checks run at the declared minimum versions (tests/packaging/test_versions.py's CHECK, in
tests/packaging/test_install.py)."""

from __future__ import annotations

from onnxscript.rewriter import pattern

from onnxnorm.fusion import _onnxscript_private, _ort_symbolic
from onnxnorm.fusion.driver import Driver
from onnxnorm.fusion.pipeline import stage_rules
from onnxnorm.fusion.report import Tracker


def test_onnxscript_rule_roots_are_read():
    _onnxscript_private.check()


def test_every_onnxnorm_rule_has_a_fixed_root():
    """Each rule of the pass is tried only at nodes of its root op: none may fall back to every
    node (which would be correct, but slow on large models)."""
    for name, found in stage_rules(Tracker()):
        driver = Driver(found)
        unrooted = [entry.rule.name for entry in driver.entries if entry.root is None]
        assert not unrooted, (name, unrooted)


def test_a_rule_whose_pattern_cannot_be_read_is_tried_everywhere():
    class Opaque:
        pass

    assert _onnxscript_private.root_op(Opaque()) is None
    rule = pattern.RewriteRule(lambda op, x: op.Relu(x), lambda op, x: op.Identity(x))
    assert _onnxscript_private.root_op(rule) == ("", "Relu")


def test_ort_symbolic_inference_is_made_sound():
    _ort_symbolic.check()

"""Fusion: rewrite decomposed norms in exported ONNX models into onnxnorm ops.

``fuse(model, target)`` is the pipeline; ``rules()`` gives its rewrite rules as an onnxscript
``RewriteRuleSet`` for other pipelines.
"""

import onnxnorm.ops  # noqa: F401  (registers the onnxnorm schemas with onnx)
from onnxnorm.fusion.pipeline import TARGETS, fuse, rules
from onnxnorm.fusion.report import FusionReport, RuleReport, Skip, Tracker
from onnxnorm.fusion.rms_norm import DecomposedRMSNorm, StandardRMSNorm

__all__ = ["TARGETS", "DecomposedRMSNorm", "FusionReport", "RuleReport", "Skip",
           "StandardRMSNorm", "Tracker", "fuse", "rules"]

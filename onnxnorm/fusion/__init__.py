"""Fusion: rewrite norms in exported ONNX models into onnxnorm ops, and lower them to a target.

``fuse(model, target)`` is the pipeline; ``rules()`` gives its rewrite rules as an onnxscript
``RewriteRuleSet`` for other pipelines; ``lower(model, target)`` writes onnxnorm nodes for a
target (function, fused, ort, onnx); ``fuse_folder(src, dst)`` fuses every ONNX file of a
folder (an Optimum export) into a copy of it, each verified.
"""

import onnxnorm.ops  # noqa: F401  (registers the onnxnorm schemas with onnx)
from onnxnorm.fusion.folder import FolderReport, fuse_folder
from onnxnorm.fusion.lowering import lower
from onnxnorm.fusion.norms import (CastAbsorb, LayerCore, MsSkipNorm, RMSCore, ScaleAbsorb,
                                   SimplifiedLayerNorm, StandardLayerNorm, StandardRMSNorm)
from onnxnorm.fusion.pipeline import TARGETS, fuse, fuse_ir, rules
from onnxnorm.fusion.report import FusionReport, RuleReport, Skip, Tracker
from onnxnorm.fusion.residual import SandwichFusion, SkipFusion, XBiasAbsorb

__all__ = ["TARGETS", "CastAbsorb", "FolderReport", "FusionReport", "LayerCore", "MsSkipNorm",
           "RMSCore", "RuleReport", "SandwichFusion", "ScaleAbsorb", "SimplifiedLayerNorm",
           "Skip", "SkipFusion", "StandardLayerNorm", "StandardRMSNorm", "Tracker",
           "XBiasAbsorb", "fuse", "fuse_folder", "fuse_ir", "lower", "rules"]

"""Fusion: rewrite norms in exported ONNX models into onnxnorm ops, and lower them to a target.

``fuse(model, target)`` is the pipeline on a model in memory; ``fuse_file(src, dst)`` on a
model file, as ``onnxnorm fuse`` runs it (checked once at the door, weights never copied into
memory, optionally verified in ONNX Runtime); ``fuse_folder(src, dst)`` fuses every ONNX file
of a folder (an Optimum export) into a copy of it, each verified. ``rules()`` gives the rewrite
rules as an onnxscript ``RewriteRuleSet`` for other pipelines; ``lower(model, target)`` writes
onnxnorm nodes for a target (function, fused, ort, onnx).
"""

import onnxnorm.ops  # noqa: F401  (registers the onnxnorm schemas with onnx)
from onnxnorm import _lazy

#: public name -> the submodule that defines it, imported on first use: the commands whose
#: options are defined in this package (``onnxnorm fuse``, ``onnxnorm genai``) then print their
#: help without loading onnx-ir and onnxscript (a second of a call that does nothing else)
_WHERE = {
    "CastAbsorb": "absorb",
    "ScaleAbsorb": "absorb",
    "CannotVerify": "files",
    "FileResult": "files",
    "fuse_file": "files",
    "verify_file": "files",
    "FolderReport": "folder",
    "fuse_folder": "folder",
    "GateAfter": "gated",
    "GateFirst": "gated",
    "GatedCasts": "gated",
    "GatedScale": "gated",
    "GroupAbsorb": "gated",
    "MsGatedRMSNorm": "gated",
    "L2Core": "l2",
    "lower": "lowering",
    "MsSkipNorm": "norm_ops",
    "SimplifiedLayerNorm": "norm_ops",
    "StandardLayerNorm": "norm_ops",
    "StandardRMSNorm": "norm_ops",
    "LayerCore": "norms",
    "RMSCore": "norms",
    "Detached": "pipeline",
    "Fused": "pipeline",
    "OutputDoesNotLoad": "pipeline",
    "TARGETS": "pipeline",
    "fuse": "pipeline",
    "fuse_ir": "pipeline",
    "rules": "pipeline",
    "without_stages": "pipeline",
    "upgrade_opset": "detached",
    "FusionReport": "report",
    "RuleReport": "report",
    "Skip": "report",
    "Tracker": "report",
    "CastSkipFusion": "residual",
    "SandwichFusion": "residual",
    "SkipFusion": "residual",
    "XBiasAbsorb": "residual",
    "ExpandedLayerNorm": "standard",
    "KerasLayerNorm": "standard",
}


__getattr__, __dir__ = _lazy.names(__name__, _WHERE, globals())
__all__ = sorted(_WHERE)

"""The targets an onnxnorm model is written for, defined once: ``onnxnorm.export(mode=...)``
and ``onnxnorm export --mode``, ``onnxnorm.fusion.fuse(target=...)`` and ``onnxnorm fuse
--target`` take these names (how each is written: ``onnxnorm/fusion/lowering.py``). It
imports nothing at import time, so that registering a command that offers them stays cheap."""

#: target -> what a model written for it holds
TARGETS = {
    "function": "onnxnorm nodes with their ONNX function bodies, which any ONNX runtime runs",
    "fused": "onnxnorm nodes without bodies, for ONNX Runtime with the onnxnorm library",
    "ort": "ONNX Runtime's own norm ops where exact, else the nearest exact equivalent",
    "onnx": "standard ONNX ops only",
}
DEFAULT = "function"


def check(target: object, what: str = "target") -> str:
    """``target`` if it names a target, else :class:`onnxnorm.errors.UnknownTarget` (an
    OnnxNormError and a ValueError) in one line: the one check every entry point makes."""
    if target not in TARGETS:
        from onnxnorm.errors import UnknownTarget

        raise UnknownTarget(f"unknown {what} {target!r}; supported: {', '.join(TARGETS)}")
    return target


def help_text() -> str:
    """The targets and what they hold, in one line for a command-line option's help."""
    return "; ".join(
        f"{name}: {text}" + (" (default)" if name == DEFAULT else "")
        for name, text in TARGETS.items()
    )

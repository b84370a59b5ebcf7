"""onnxnorm: normalization layers of LLMs as first-class ONNX and ONNX Runtime ops.

    import onnxnorm
    onnxnorm.convert(model)                           # its norm modules become onnxnorm's
    onnxnorm.export(model, (x,), "model.onnx")       # one onnxnorm node per norm module
    session = onnxnorm.runtime.session("model.onnx")  # ORT with the fused kernels
"""

from onnxnorm._io import OnnxNormError

__version__ = "0.1.0"


def export(*args, **kwargs):
    """:func:`onnxnorm.nn.export.export` (imports torch on first use)."""
    from onnxnorm.nn.export import export as _export

    return _export(*args, **kwargs)


def convert(*args, **kwargs):
    """:func:`onnxnorm.nn.convert.convert`: replace a model's norm modules with onnxnorm's
    (imports torch on first use)."""
    from onnxnorm.nn.convert import convert as _convert

    return _convert(*args, **kwargs)


def __getattr__(name: str):
    import importlib

    if name in ("fusion", "nn", "ops", "runtime"):
        return importlib.import_module(f"onnxnorm.{name}")
    raise AttributeError(f"module 'onnxnorm' has no attribute {name!r}")


__all__ = ["OnnxNormError", "convert", "export", "__version__"]

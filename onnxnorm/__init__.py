"""onnxnorm: normalization layers of LLMs as first-class ONNX and ONNX Runtime ops.

    import onnxnorm
    onnxnorm.convert(model)                           # its norm modules become onnxnorm's
    onnxnorm.export(model, (x,), "model.onnx")       # one onnxnorm node per norm module
    norm = onnxnorm.GatedRMSNorm(128, group_size=16)  # also RMSNorm, LayerNorm, L2Norm
    session = onnxnorm.runtime.session("model.onnx")  # ORT with the fused kernels

ONNX Runtime is required (``pip install 'onnxnorm[cpu]'`` or ``'onnxnorm[gpu]'``); torch only
for :func:`export`, :func:`convert`, the norm modules and :mod:`onnxnorm.nn`
(``pip install 'onnxnorm[torch]'``).
"""

from onnxnorm._deps import require_runtime as _require_runtime

_require_runtime()

from onnxnorm import _lazy  # noqa: E402
from onnxnorm.errors import OnnxNormError  # noqa: E402

__version__ = "0.1.0"

# loaded on first use, so that ``import onnxnorm`` needs neither torch nor the fusion passes
__getattr__, __dir__ = _lazy.names(
    "onnxnorm",
    dict.fromkeys(("export", "convert", "RMSNorm", "LayerNorm", "GatedRMSNorm", "L2Norm"), "nn"),
    globals(),
    submodules=("errors", "fusion", "nn", "ops", "runtime"),
)


__all__ = [
    "GatedRMSNorm",
    "L2Norm",
    "LayerNorm",
    "OnnxNormError",
    "RMSNorm",
    "convert",
    "export",
    "__version__",
]

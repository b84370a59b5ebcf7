"""PyTorch side: norm modules, the Q/K norm and rotary of attention (``QKNormRotary``), residual
blocks fused with their norms, the catalogue ops as torch custom ops, conversion of existing
models, export, and the small reference decoders that ``onnxnorm export FAMILY`` builds
(``decoder``, ``families``).

Needs torch (``pip install 'onnxnorm[torch]'``). The names below are imported on first use, so
this package imports without torch, and without loading it (``onnxnorm export --help`` and
``onnxnorm.nn.families`` need no torch); without torch each name raises an ImportError that says
how to install it.
"""

from onnxnorm import _lazy

#: public name -> the submodule that defines it
_WHERE = {
    "TRANSLATION_TABLE": "functional",
    "call": "functional",
    "GatedRMSNorm": "modules",
    "L2Norm": "modules",
    "LayerNorm": "modules",
    "QKNormRotary": "rotary",
    "norm_rotary": "rotary",
    "RMSNorm": "modules",
    "convert": "converter",
    "export": "exporter",
    "DeepNormBlock": "residual",
    "DeepNormConstants": "residual",
    "PostNormBlock": "residual",
    "PreNormBlock": "residual",
    "ResidualStream": "residual",
    "SandwichBlock": "residual",
    "add_norm": "residual",
    "deepnorm_constants": "residual",
    "deepnorm_init_": "residual",
    "sandwich_norm": "residual",
}


def _needs_torch(name: str) -> None:
    from onnxnorm._deps import require

    require("torch", f"onnxnorm.nn.{name}")


__getattr__, __dir__ = _lazy.names(__name__, _WHERE, globals(), before=_needs_torch)
__all__ = sorted(_WHERE)

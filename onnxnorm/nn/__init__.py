"""PyTorch side: norm modules, residual blocks fused with their norms, the catalogue ops as torch
custom ops, conversion of existing models, export, and the small reference decoders that
``onnxnorm export FAMILY`` builds (``decoder``, ``families``).

Needs torch (``pip install 'onnxnorm[torch]'``). Without it, this package still imports (so that
``onnxnorm export --help`` and ``onnxnorm.nn.families`` work) and each name below raises an
ImportError that says how to install torch.
"""

from onnxnorm._deps import available as _available

_NAMES = ("DeepNormBlock", "DeepNormConstants", "LayerNorm", "PostNormBlock", "PreNormBlock",
          "RMSNorm", "ResidualStream", "SandwichBlock", "TRANSLATION_TABLE", "add_norm", "call",
          "convert", "deepnorm_constants", "deepnorm_init_", "export", "sandwich_norm")

if _available("torch"):
    from onnxnorm.nn.functional import TRANSLATION_TABLE, call
    from onnxnorm.nn.modules import LayerNorm, RMSNorm
    # the functions shadow their submodules' names: import them here, after the submodules load
    from onnxnorm.nn.convert import convert
    from onnxnorm.nn.export import export
    from onnxnorm.nn.residual import (DeepNormBlock, DeepNormConstants, PostNormBlock,
                                      PreNormBlock, ResidualStream, SandwichBlock, add_norm,
                                      deepnorm_constants, deepnorm_init_, sandwich_norm)
else:
    def __getattr__(name: str):
        if name in _NAMES:
            from onnxnorm._deps import require

            require("torch", f"onnxnorm.nn.{name}")
        raise AttributeError(f"module 'onnxnorm.nn' has no attribute {name!r}")

__all__ = list(_NAMES)

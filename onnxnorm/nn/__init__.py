"""PyTorch side: norm modules, residual blocks fused with their norms, the catalogue ops as torch
custom ops, conversion of existing models, export, and the small reference decoders that
``onnxnorm export FAMILY`` builds (``decoder``, ``families``).

Needs torch (``pip install 'onnxnorm[torch]'``). The names below are imported on first use, so
this package imports without torch, and without loading it (``onnxnorm export --help`` and
``onnxnorm.nn.families`` need no torch); without torch each name raises an ImportError that says
how to install it.
"""

#: public name -> the submodule that defines it
_WHERE = {
    "TRANSLATION_TABLE": "functional", "call": "functional",
    "LayerNorm": "modules", "RMSNorm": "modules",
    "convert": "converter",
    "export": "exporter",
    "DeepNormBlock": "residual", "DeepNormConstants": "residual", "PostNormBlock": "residual",
    "PreNormBlock": "residual", "ResidualStream": "residual", "SandwichBlock": "residual",
    "add_norm": "residual", "deepnorm_constants": "residual", "deepnorm_init_": "residual",
    "sandwich_norm": "residual",
}


def __getattr__(name: str):
    if name not in _WHERE:  # (a submodule's name: the import system loads it)
        raise AttributeError(f"module 'onnxnorm.nn' has no attribute {name!r}")
    import importlib

    from onnxnorm._deps import require

    require("torch", f"onnxnorm.nn.{name}")
    value = getattr(importlib.import_module(f"onnxnorm.nn.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


__all__ = sorted(_WHERE)

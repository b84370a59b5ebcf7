"""The norm weights of the tiny models: which modules are norms, what each adds to its weight,
and the one way their weights are randomized (:func:`randomize_norms`). Norm weights start at 1
(Gemma's ``1 + weight`` at 0), which would hide a wrong scale or offset."""

from __future__ import annotations

#: the scales :func:`randomize_norms` draws from: uniform in [LOW, LOW + WIDTH)
LOW, WIDTH = 0.6, 0.8


def is_norm(module) -> bool:
    """Whether ``module`` is a norm: its class name ends in "Norm" (torch's LayerNorm and
    RMSNorm, transformers' LlamaRMSNorm, T5LayerNorm, ..., onnxnorm's modules) or "NormGated"
    (the gated norms of hybrid models: Qwen3NextRMSNormGated, MambaRMSNormGated, ...)."""
    return type(module).__name__.endswith(("Norm", "NormGated"))


def scale_offset(module) -> float:
    """What the norm ``module`` adds to its weight before scaling: 1 for Gemma's norms (the
    families of :mod:`onnxnorm.nn.families` with a scale offset) and onnxnorm's norms built
    with ``scale_offset=1``, else 0."""
    offset = getattr(module, "scale_offset", None)  # onnxnorm.nn.RMSNorm
    if offset is None and type(module).__name__ == "DecomposedNorm":  # onnxnorm.nn.decoder's
        offset = module.offset
    if offset is None and type(module).__name__ in OFFSET_NORMS:
        offset = OFFSET_NORMS[type(module).__name__]
    if offset is None:
        from onnxnorm.nn import families

        offset = next(
            (f.scale_offset for f in families.FAMILIES if f.hf_norm_class == type(module).__name__),
            0.0,
        )
    return float(offset)


#: norm classes that scale by ``1 + weight`` beside those of :mod:`onnxnorm.nn.families`
OFFSET_NORMS = {"Qwen3_5RMSNorm": 1.0}


def randomize_norms(model, seed: int = 1):
    """Sets the parameters of every norm module of ``model`` (:func:`is_norm`, ``model`` itself
    included) to random values drawn from ``seed`` (not from torch's global generator), and
    returns ``model``. A weight gets the values that make the norm's scale uniform in
    [0.6, 1.4) (:data:`LOW`, :data:`WIDTH`): a norm that scales by ``1 + weight`` (Gemma's,
    :func:`scale_offset`) gets a weight uniform in [-0.4, 0.4). A bias is uniform in
    [-0.4, 0.4). The modules are visited in ``model.modules()`` order, each one's parameters in
    their own order."""
    from onnxnorm._deps import require

    torch = require("torch", "randomizing norm weights")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if not is_norm(module):
                continue
            offset = scale_offset(module)
            for name, parameter in module.named_parameters(recurse=False):
                shift = LOW - 1.0 if "bias" in name else LOW - offset
                drawn = torch.rand(parameter.shape, generator=generator) * WIDTH + shift
                parameter.copy_(drawn)
    return model


__all__ = ["LOW", "WIDTH", "is_norm", "randomize_norms", "scale_offset"]

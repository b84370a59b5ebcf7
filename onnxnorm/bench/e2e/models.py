"""The decoders ``onnxnorm bench e2e`` measures: a Llama-style and a Gemma-2-style model of
transformers, built from configs in code with seeded random weights (nothing is downloaded), and
their KV-cache exports (``torch.onnx.export(dynamo=True)``, and ``onnxnorm.export`` with the
norms fused). The models, their norm weights and the export come from
:mod:`onnxnorm.testing.hf`, at the sizes of :class:`~.config.Config`. torch and
transformers are imported on use."""

from __future__ import annotations

from onnxnorm.bench.e2e.config import Config


def hf_config(family: str, config: Config):
    """The transformers config of ``family`` ("llama", "gemma2") at ``config``'s sizes."""
    from onnxnorm.testing import hf

    extra = {}
    if family == "gemma2":
        # Gemma 2's local layers see a window larger than any sequence here, so every layer's
        # cache holds the whole sequence (the sandwich norms, soft-capping and the rest are
        # Gemma 2's)
        extra = dict(
            sliding_window=max(2048, 2 * config.max_length), query_pre_attn_scalar=config.head_dim
        )
    return hf.config(
        family,
        vocab=config.vocab,
        hidden=config.hidden,
        layers=config.layers,
        heads=config.heads,
        kv_heads=config.kv_heads,
        intermediate=config.intermediate,
        head_dim=config.head_dim,
        max_positions=max(2048, 2 * config.max_length),
        **hf.TOKEN_IDS,
        tie_word_embeddings=False,
        **extra,
    )


def hf_model(family: str, config: Config, dtype: str = "float32"):
    """``LlamaForCausalLM`` / ``Gemma2ForCausalLM`` with seeded random weights; the norm weights
    random too (:func:`onnxnorm.testing.hf.randomize_norms`: their initial ones, 1 or Gemma's
    0, would hide a wrong scale)."""
    import torch

    from onnxnorm.testing import hf

    return hf.model(hf_config(family, config)).to(getattr(torch, dtype))


def _limit(config: Config) -> int:
    """The longest past or new sequence an export takes (the total: twice that)."""
    return max(4096, 2 * config.max_length)


def export(model, config: Config):
    """The KV-cache decoder as ``torch.onnx.export(dynamo=True)`` writes it."""
    from onnxnorm.testing import hf

    return hf.export_with_cache(model, _limit(config))


def export_onnxnorm(model, config: Config):
    """The same through ``onnxnorm.export(mode="fused", convert=True)``."""
    import torch

    import onnxnorm
    from onnxnorm.testing import hf

    args, shapes, inputs, outputs = hf.cache_export_args(model, _limit(config))
    with torch.no_grad():
        return onnxnorm.export(
            hf.with_cache(model),
            args,
            mode="fused",
            convert=True,
            dynamic_shapes=shapes,
            input_names=inputs,
            output_names=outputs,
        )

"""Tiny configs for the model types that :data:`onnxnorm.testing.hf.FAMILIES` does not list: a
family that a transformers release adds (found by :mod:`onnxnorm.testing.hf.norms`) is built
without an entry of its own. The config class's defaults are a real model's; every size field
that a rule below names is made small by its name alone, and the per-layer mixers alternate.
Where that does not give a model that runs, :func:`config` says why
(:class:`~onnxnorm.testing.hf.norms.NotBuildable`) and a family of its own in ``FAMILIES`` is
the way on.
"""

from __future__ import annotations

import re
from typing import Any

from onnxnorm.testing.hf.norms import NotBuildable

#: (pattern on a config field's name, the small value an int field so named takes), first match
RULES: tuple[tuple[str, int], ...] = (
    (r"^(num_hidden_layers|num_layers|n_layer)$", 2),
    (r"^(hidden_size|d_model|n_embd)$", 32),
    (r"^vocab_size$", 96),
    (r"intermediate_size$|^d_ff$", 64),
    (r"num_(attention|key_value)_heads$|^n_head", 2),
    (r"head_dim$|head_size$|^d_kv$", 16),
    (r"num_(key_|value_)?heads$", 2),
    (r"num_(local_)?experts$|n_routed_experts$", 4),
    (r"experts_per_tok$", 2),
    (r"state_size$|d_state$", 8),
    (r"chunk_size$", 8),
    (r"rank$", 16),
    (r"max_position_embeddings$", 64),
    (r"conv_kernel(_size|_dim)?$", 4),
    (r"n_?groups$", 2),
)
#: the special tokens, inside a tiny vocabulary
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _mappings():
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    return (
        CONFIG_MAPPING,
        modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        modeling_auto.MODEL_MAPPING_NAMES,
    )


def text_model_type(model_type: str) -> str:
    """The model type of ``model_type``'s language model: ``<model_type>_text`` where a
    multimodal family has one with a causal LM, else ``model_type`` itself."""
    configs, causal, _ = _mappings()
    text = f"{model_type}_text"
    return text if text in configs and text in causal else model_type


def small_fields(defaults: dict[str, Any]) -> dict[str, Any]:
    """The fields of a config (its ``to_dict()``) that :data:`RULES` and :data:`TOKENS` make
    small, and the per-layer mixer list (``layer_types``) cut to two layers of different kinds."""
    fields: dict[str, Any] = {}
    for key, value in defaults.items():
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        for pattern, small in RULES:
            if re.search(pattern, key):
                fields[key] = small
                break
    fields.update({k: v for k, v in TOKENS.items() if k in defaults})
    kinds = defaults.get("layer_types")
    if isinstance(kinds, list) and kinds:
        distinct = list(dict.fromkeys(kinds))
        fields["layer_types"] = [distinct[i % len(distinct)] for i in range(2)]
    return fields


def config(model_type: str):
    """A tiny config of ``model_type``'s language model (:func:`text_model_type`);
    :class:`NotBuildable` where transformers has no causal LM for it or refuses the fields."""
    configs, causal, _ = _mappings()
    model_type = text_model_type(model_type)
    if model_type not in configs or model_type not in causal:
        raise NotBuildable(f"transformers has no causal language model for {model_type!r}")
    config_class = configs[model_type]
    try:
        return config_class(**small_fields(config_class().to_dict()))
    except Exception as error:  # noqa: BLE001 - the config's refusal is the reason
        raise NotBuildable(
            f"{config_class.__name__} refuses the small fields: {type(error).__name__}: "
            f"{' '.join(str(error).split())[:200]}"
        ) from None


def model_class(hf_config, kind: str) -> str:
    """The transformers class of ``hf_config``'s model: "causal" (with the LM head) or "base"."""
    _, causal, base = _mappings()
    table = causal if kind == "causal" else base
    return table[hf_config.model_type]


__all__ = ["RULES", "TOKENS", "config", "model_class", "small_fields", "text_model_type"]

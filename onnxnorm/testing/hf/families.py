"""The model families of the tiny Hugging Face models, and the models: :data:`FAMILIES` (the
transformers classes of each family, and what a tiny model of it needs), :func:`config` (a tiny
config of a family), :func:`model` (its model, seeded, norm weights random) and
:func:`short_chunks` (the linear-attention families' delta rules in short chunks, for a quick
export).

Each function imports what it uses (torch, transformers); importing this module loads neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from onnxnorm._deps import require
from onnxnorm.testing.hf import generic
from onnxnorm.testing.hf.weights import randomize_norms


@dataclasses.dataclass(frozen=True)
class Family:
    """The transformers classes of a model family, and what a tiny model of it needs."""

    config: str  # the config class
    causal: str  # the model with its LM head (logits)
    base: str  # the model without it (last_hidden_state)
    #: the config takes num_key_value_heads (grouped-query attention), its default a real model's
    grouped: bool = True
    #: the config's head_dim is a real model's unless given: give hidden // heads
    head_dim: bool = False
    #: (name, value) pairs of the config a tiny model of the family needs
    defaults: tuple[tuple[str, Any], ...] = ()
    #: the config's per-layer fields for a number of layers (a hybrid family's mix of attention
    #: and state-space or linear-attention layers), or None
    per_layer: Callable[[int], dict[str, Any]] | None = None


def _alternate(key: str, first: Any, second: Any) -> Callable[[int], dict[str, Any]]:
    """A per-layer field of ``first`` and ``second`` in turn (a hybrid's mixers)."""
    return lambda layers: {key: [first if i % 2 == 0 else second for i in range(layers)]}


def _layers(*fields: Callable[[int], dict[str, Any]]) -> Callable[[int], dict[str, Any]]:
    return lambda layers: {k: v for field in fields for k, v in field(layers).items()}


#: a tiny gated delta-rule attention (Qwen3-Next, Qwen3.5): 2 key and 4 value heads of 8
_DELTA_NET = (
    ("linear_key_head_dim", 8),
    ("linear_value_head_dim", 8),
    ("linear_num_key_heads", 2),
    ("linear_num_value_heads", 4),
)
#: a tiny Mamba2 mixer in Bamba's, Falcon-H1's and GraniteMoeHybrid's names: 8 heads of 8 (the
#: default expand 2 times hidden 32), 2 groups of 32 for its gated norm, state 8, chunks of 8
_MAMBA = (
    ("mamba_n_heads", 8),
    ("mamba_d_head", 8),
    ("mamba_n_groups", 2),
    ("mamba_d_state", 8),
    ("mamba_chunk_size", 8),
)
#: a tiny mixture of experts: 4 experts, 2 per token
_EXPERTS = (("num_experts_per_tok", 2),)


#: family -> its classes; the names are transformers' ``model_type`` spellings
FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaConfig", "LlamaForCausalLM", "LlamaModel"),
    "mistral": Family("MistralConfig", "MistralForCausalLM", "MistralModel"),
    "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM", "Qwen2Model"),
    "qwen3": Family("Qwen3Config", "Qwen3ForCausalLM", "Qwen3Model", head_dim=True),
    "gemma": Family("GemmaConfig", "GemmaForCausalLM", "GemmaModel", head_dim=True),
    "gemma2": Family("Gemma2Config", "Gemma2ForCausalLM", "Gemma2Model", head_dim=True),
    "gemma3": Family("Gemma3TextConfig", "Gemma3ForCausalLM", "Gemma3TextModel", head_dim=True),
    # its default padding id lies beyond a tiny vocabulary
    "phi3": Family("Phi3Config", "Phi3ForCausalLM", "Phi3Model", defaults=(("pad_token_id", 0),)),
    "phi": Family("PhiConfig", "PhiForCausalLM", "PhiModel"),
    "cohere": Family("CohereConfig", "CohereForCausalLM", "CohereModel"),
    "olmo": Family("OlmoConfig", "OlmoForCausalLM", "OlmoModel"),
    "olmo2": Family("Olmo2Config", "Olmo2ForCausalLM", "Olmo2Model"),
    "gpt2": Family("GPT2Config", "GPT2LMHeadModel", "GPT2Model", grouped=False),
    "gpt_neox": Family("GPTNeoXConfig", "GPTNeoXForCausalLM", "GPTNeoXModel", grouped=False),
    "bert": Family("BertConfig", "BertLMHeadModel", "BertModel", grouped=False),
    "t5": Family("T5Config", "T5ForConditionalGeneration", "T5Model", grouped=False),
    "bloom": Family("BloomConfig", "BloomForCausalLM", "BloomModel", grouped=False),
    "opt": Family("OPTConfig", "OPTForCausalLM", "OPTModel", grouped=False),
    "falcon": Family("FalconConfig", "FalconForCausalLM", "FalconModel", grouped=False),
    # hybrid and linear-attention families (their gated and L2 norms: docs/fusion.md), two layers
    # of different mixers in turn; the mixture-of-experts ones export with the batched_mm
    # experts (:func:`model`)
    "qwen3_next": Family(
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        "Qwen3NextModel",
        head_dim=True,
        defaults=(
            *_DELTA_NET,
            *_EXPERTS,
            ("num_experts", 4),
            ("moe_intermediate_size", 16),
            ("shared_expert_intermediate_size", 16),
        ),
        per_layer=_alternate("layer_types", "linear_attention", "full_attention"),
    ),
    "qwen3_5": Family(
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        "Qwen3_5TextModel",
        head_dim=True,
        defaults=_DELTA_NET,
        per_layer=_alternate("layer_types", "linear_attention", "full_attention"),
    ),
    "mamba2": Family(
        "Mamba2Config",
        "Mamba2ForCausalLM",
        "Mamba2Model",
        grouped=False,
        defaults=(
            ("num_heads", 8),
            ("head_dim", 8),
            ("state_size", 8),
            ("n_groups", 2),
            ("chunk_size", 8),
        ),
    ),
    "nemotron_h": Family(
        "NemotronHConfig",
        "NemotronHForCausalLM",
        "NemotronHModel",
        head_dim=True,
        defaults=(
            ("mamba_num_heads", 8),
            ("mamba_head_dim", 8),
            ("n_groups", 2),
            ("ssm_state_size", 8),
            ("chunk_size", 8),
        ),
        per_layer=_alternate("layers_block_type", "mamba", "attention"),
    ),
    "bamba": Family(
        "BambaConfig",
        "BambaForCausalLM",
        "BambaModel",
        defaults=_MAMBA,
        per_layer=lambda layers: {"attn_layer_indices": list(range(1, layers, 2))},
    ),
    "zamba2": Family(
        "Zamba2Config",
        "Zamba2ForCausalLM",
        "Zamba2Model",
        defaults=(
            ("mamba_d_state", 8),
            ("n_mamba_heads", 8),
            ("mamba_ngroups", 2),
            ("chunk_size", 8),
        ),
        per_layer=_alternate("layers_block_type", "mamba", "hybrid"),
    ),
    "granitemoehybrid": Family(
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        "GraniteMoeHybridModel",
        defaults=(*_MAMBA, *_EXPERTS, ("num_local_experts", 4), ("shared_intermediate_size", 64)),
        per_layer=_alternate("layer_types", "mamba", "attention"),
    ),
    # mamba_rms_norm: the mixer's output through its gated norm, the gate first
    "falcon_h1": Family(
        "FalconH1Config",
        "FalconH1ForCausalLM",
        "FalconH1Model",
        head_dim=True,
        defaults=(
            *_MAMBA,
            ("mamba_d_ssm", 64),
            ("mamba_rms_norm", True),
            ("mamba_norm_before_gate", False),
        ),
    ),
    # its default token ids lie beyond a tiny vocabulary
    "kimi_linear": Family(
        "KimiLinearConfig",
        "KimiLinearForCausalLM",
        "KimiLinearModel",
        defaults=(
            *_EXPERTS,
            ("num_local_experts", 4),
            ("n_shared_experts", 1),
            ("moe_intermediate_size", 16),
            ("kv_lora_rank", 16),
            ("q_lora_rank", None),
            ("qk_rope_head_dim", 8),
            ("qk_nope_head_dim", 8),
            ("v_head_dim", 16),
            ("linear_head_dim", 8),
            ("linear_num_heads", 4),
            ("pad_token_id", 0),
            ("bos_token_id", 1),
            ("eos_token_id", 2),
        ),
        per_layer=_layers(
            _alternate("layer_types", "linear_attention", "full_attention"),
            _alternate("mlp_layer_types", "dense", "sparse"),
        ),
    ),
    # Gemma 3n's text decoder (its norms: x * pow(mean(x^2) + eps, -0.5)); no layer shares
    # another's key/value cache
    "gemma3n": Family(
        "Gemma3nTextConfig",
        "Gemma3nForCausalLM",
        "Gemma3nTextModel",
        head_dim=True,
        defaults=(
            ("vocab_size_per_layer_input", 96),
            ("hidden_size_per_layer_input", 8),
            ("num_kv_shared_layers", 0),
            ("laurel_rank", 4),
            ("altup_num_inputs", 2),
            ("sliding_window", 8),
        ),
        per_layer=lambda layers: {
            "layer_types": [
                "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
            ],
            "activation_sparsity_pattern": [0.0] * layers,
        },
    ),
}


def config(
    family: str,
    *,
    vocab: int = 96,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int | None = None,
    intermediate: int = 64,
    head_dim: int | None = None,
    max_positions: int = 64,
    **overrides: Any,
):
    """The transformers config of a tiny model of ``family`` (a key of :data:`FAMILIES`): the
    sizes given under transformers' common names, then what the family needs, then
    ``overrides`` (any field of the config class, under its own name). ``kv_heads`` None: as
    many as ``heads`` where the config takes it (its default is a real model's);
    ``head_dim`` None: hidden // heads where the family's default is a real model's, else the
    family's."""
    transformers = require("transformers", "a tiny Hugging Face model")
    try:
        spec = FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}") from None
    fields: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_positions,
    }
    if kv_heads is not None or spec.grouped:
        fields["num_key_value_heads"] = kv_heads or heads
    if head_dim is not None or spec.head_dim:
        fields["head_dim"] = head_dim or hidden // heads
    fields.update(spec.defaults)
    if spec.per_layer is not None:
        fields.update(spec.per_layer(layers))
    fields.update(overrides)
    return getattr(transformers, spec.config)(**fields)


def family_of(hf_config) -> str:
    """The key of :data:`FAMILIES` whose config class ``hf_config`` is."""
    name = type(hf_config).__name__
    for key, spec in FAMILIES.items():
        if spec.config == name:
            return key
    raise ValueError(f"{name} is not the config of a family of onnxnorm.testing.hf.FAMILIES")


def model(
    hf_config,
    kind: str = "causal",
    *,
    seed: int = 0,
    attention: str | None = "eager",
    experts: str | None = "batched_mm",
    randomize: bool = True,
):
    """The model of ``hf_config`` in eval mode: ``kind`` "causal" (with the LM head), "base"
    (without), or the name of any transformers model class. Its weights are drawn after
    ``torch.manual_seed(seed)``; then (``randomize``) :func:`randomize_norms` with ``seed + 1``.
    ``attention``: the attention implementation set on the config (None: transformers'
    default); eager attention exports with every exporter. ``experts``: the experts
    implementation of a mixture-of-experts config (None: transformers' default, grouped_mm, a
    custom op that torch.onnx has no translation for); batched_mm exports with both exporters
    (eager's loop over the experts a batch hits is data-dependent for the dynamo exporter)."""
    transformers = require("transformers", "a tiny Hugging Face model")
    torch = require("torch", "a tiny Hugging Face model")
    if kind in ("causal", "base"):
        try:
            spec = FAMILIES[family_of(hf_config)]
            kind = spec.causal if kind == "causal" else spec.base
        except ValueError:  # a family FAMILIES does not list (generic.config's)
            kind = generic.model_class(hf_config, kind)
    if attention is not None:
        hf_config._attn_implementation = attention
    if experts is not None and hasattr(hf_config, "_experts_implementation"):
        hf_config._experts_implementation = experts
    torch.manual_seed(seed)
    built = getattr(transformers, kind)(hf_config).eval()
    if randomize:
        randomize_norms(built, seed + 1)
    return built


#: the chunked delta rules of the linear-attention families (their PyTorch reference, which the
#: exporters trace), by transformers module
_CHUNKED = {
    "qwen3_next": "torch_chunk_gated_delta_rule",
    "qwen3_5": "torch_chunk_gated_delta_rule",
    "kimi_linear": "chunk_kimi_delta_attention",
}


@contextlib.contextmanager
def short_chunks(size: int = 8):
    """Within the block, the chunked delta rules of Qwen3-Next, Qwen3.5 and Kimi Linear take
    chunks of ``size`` tokens instead of 64. The dynamo exporter unrolls their loop over a
    chunk's positions: with 8, a tiny Qwen3-Next exports in 9 s instead of 92 s. The result is
    the same up to float rounding (the chunks only order the sums)."""
    import functools

    require("transformers", "a linear-attention model")
    patched = []
    try:
        for module, name in _CHUNKED.items():
            try:
                source = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
            except ImportError:  # a transformers without that family
                continue
            original = getattr(source, name)
            setattr(source, name, functools.partial(original, chunk_size=size))
            patched.append((source, name, original))
        yield
    finally:
        for source, name, original in patched:
            setattr(source, name, original)

"""The norm configurations of LLM families, as data.

Each row says which norm a family uses and how: kind, placement, epsilon, scale offset, bias,
Q/K norm, embedding norm and the rounding order of its Hugging Face implementation in
float16/bfloat16. docs/norms.md renders this table (``tools/gen_norms_doc.py``) and
:func:`decoder_config` turns a row into a :class:`DecoderConfig` (which
:mod:`onnxnorm.nn.decoder` builds), so that the tests, the benchmarks and ``onnxnorm export
<family>`` can build a small decoder normalized the way the family is.

Epsilons are those of the families' published configs (the usual sizes; a few checkpoints
differ). "order A" rounds the normalized value to the input type before the scale (Llama, T5);
"order B" scales in float32 and rounds once (Gemma, Cohere, OLMo 2, and torch's own LayerNorm).

The hybrid families (``mixer``) add the norms of their linear mixers: Qwen3-Next's linear
attention has a gated RMSNorm on its output and L2Norms of its queries and keys, Mamba2's mixer a
grouped gated RMSNorm; the row's other fields describe the decoder's own norms. The decoder
built from such a row has simplified stand-ins for the linear-attention and state-space cores
(:mod:`onnxnorm.nn.decoder`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: the token mixers of onnxnorm.nn.decoder: softmax attention, Qwen3-Next's hybrid of gated
#: DeltaNet linear attention and attention, Mamba2's state-space mixer
MIXERS = ("attention", "gated_deltanet", "mamba2")


def _spelled(name: str) -> str:
    return "".join(c for c in name.lower() if c not in " .-_")


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    examples: str
    norm: str  # "rms" or "layer"
    position: str  # "pre", "post", "sandwich", "deepnorm", "reordered", "parallel"
    eps: float
    scale_offset: float = 0.0
    weight: bool = True
    bias: bool = False
    qk_norm: str = ""  # "" (none), "head" (over head_dim), "full" (over the whole projection)
    embedding_norm: bool = False
    order: str = "A"  # rounding order in float16/bfloat16
    hf_norm_class: str = ""
    note: str = ""
    #: the token mixer of onnxnorm.nn.decoder (a value of MIXERS)
    mixer: str = "attention"
    #: transformers' ``model_type`` where the name's spelling (lower case, no spaces, dots or
    #: dashes) is not it
    model_type: str = ""

    @property
    def key(self) -> str:
        """The family's one key, on the command line and in ``onnxnorm.testing.hf.FAMILIES``:
        transformers' ``model_type`` ("qwen3_next", "gpt_neox", "llama"), or the name in lower
        case without spaces, dots or dashes for a family transformers has no model of
        ("deepnet")."""
        return self.model_type or _spelled(self.name)


FAMILIES: tuple[Family, ...] = (
    Family(
        "Llama",
        "Llama 2, Llama 3",
        "rms",
        "pre",
        1e-5,
        order="A",
        hf_norm_class="LlamaRMSNorm",
        note="Llama 1 used eps 1e-6",
    ),
    Family(
        "Mistral",
        "Mistral 7B, Mixtral",
        "rms",
        "pre",
        1e-5,
        order="A",
        hf_norm_class="MistralRMSNorm",
    ),
    Family("Qwen2", "Qwen2, Qwen2.5", "rms", "pre", 1e-6, order="A", hf_norm_class="Qwen2RMSNorm"),
    Family(
        "Qwen3",
        "Qwen3",
        "rms",
        "pre",
        1e-6,
        qk_norm="head",
        order="A",
        hf_norm_class="Qwen3RMSNorm",
        note="RMSNorm of queries and keys over head_dim",
    ),
    Family(
        "Gemma",
        "Gemma 1",
        "rms",
        "pre",
        1e-6,
        scale_offset=1.0,
        order="B",
        hf_norm_class="GemmaRMSNorm",
        note="scale is (1 + weight), weight starts at 0",
    ),
    Family(
        "Gemma 2",
        "Gemma 2",
        "rms",
        "sandwich",
        1e-6,
        scale_offset=1.0,
        order="B",
        hf_norm_class="Gemma2RMSNorm",
        note="norms before and after each sublayer; logit soft-capping",
    ),
    Family(
        "Gemma 3",
        "Gemma 3",
        "rms",
        "sandwich",
        1e-6,
        scale_offset=1.0,
        qk_norm="head",
        order="B",
        hf_norm_class="Gemma3RMSNorm",
    ),
    Family("Phi-3", "Phi-3, Phi-3.5", "rms", "pre", 1e-5, order="A", hf_norm_class="Phi3RMSNorm"),
    Family(
        "GPT-2",
        "GPT-2",
        "layer",
        "pre",
        1e-5,
        bias=True,
        order="B",
        hf_norm_class="torch.nn.LayerNorm",
    ),
    Family(
        "GPT-NeoX",
        "GPT-NeoX-20B, Pythia",
        "layer",
        "parallel",
        1e-5,
        bias=True,
        order="B",
        hf_norm_class="torch.nn.LayerNorm",
        note="parallel residual: x + Attn(LN1(x)) + MLP(LN2(x))",
        model_type="gpt_neox",
    ),
    Family(
        "BERT",
        "BERT, RoBERTa",
        "layer",
        "post",
        1e-12,
        bias=True,
        embedding_norm=True,
        order="B",
        hf_norm_class="torch.nn.LayerNorm",
        note="encoder; the original Transformer's placement",
    ),
    Family(
        "T5",
        "T5, Flan-T5",
        "rms",
        "pre",
        1e-6,
        order="A",
        hf_norm_class="T5LayerNorm",
        note="called LayerNorm, computes RMSNorm",
    ),
    Family(
        "BLOOM",
        "BLOOM",
        "layer",
        "pre",
        1e-5,
        bias=True,
        embedding_norm=True,
        order="B",
        hf_norm_class="torch.nn.LayerNorm",
        note="LayerNorm right after the word embedding",
    ),
    Family(
        "OPT",
        "OPT",
        "layer",
        "pre",
        1e-5,
        bias=True,
        order="B",
        hf_norm_class="torch.nn.LayerNorm",
        note="OPT-350m is Post-Norm",
    ),
    Family(
        "Falcon",
        "Falcon 7B/40B",
        "layer",
        "parallel",
        1e-5,
        bias=True,
        order="B",
        hf_norm_class="torch.nn.LayerNorm",
        note="parallel attention and MLP; one LN (7B) or two (40B)",
    ),
    Family(
        "OLMo",
        "OLMo 1",
        "layer",
        "pre",
        1e-5,
        weight=False,
        order="B",
        hf_norm_class="OlmoLayerNorm",
        note="non-parametric LayerNorm: no weight, no bias",
    ),
    Family(
        "OLMo 2",
        "OLMo 2",
        "rms",
        "reordered",
        1e-6,
        qk_norm="full",
        order="B",
        hf_norm_class="Olmo2RMSNorm",
        note="norm of each sublayer's output before the residual add; Q/K norm over the "
        "whole projection",
    ),
    Family(
        "Cohere",
        "Command R, Command R+",
        "layer",
        "parallel",
        1e-5,
        qk_norm="head",
        order="B",
        hf_norm_class="CohereLayerNorm",
        note="LayerNorm without bias; parallel attention and MLP; per-head Q/K LayerNorm "
        "(weight [heads, head_dim]) in Command R+",
    ),
    Family(
        "DeepNet",
        "DeepNet (research)",
        "layer",
        "deepnorm",
        1e-5,
        bias=True,
        order="B",
        hf_norm_class="torch.nn.LayerNorm",
        note="LN(alpha * x + F(x)), beta-scaled init; arXiv:2203.00555",
    ),
    Family(
        "Qwen3-Next",
        "Qwen3-Next, Qwen3.5",
        "rms",
        "pre",
        1e-6,
        scale_offset=1.0,
        qk_norm="head",
        order="B",
        hf_norm_class="Qwen3NextRMSNorm",
        note="hybrid: 3 of 4 layers are linear attention (gated DeltaNet), their q and k through "
        "L2Norm, their output through a GatedRMSNorm over each value head "
        "(`Qwen3NextRMSNormGated`: norm, then SiLU gate; order A); attention layers with "
        "Q/K norm and an output gate",
        mixer="gated_deltanet",
        model_type="qwen3_next",
    ),
    Family(
        "Mamba2",
        "Mamba2, Codestral Mamba",
        "rms",
        "pre",
        1e-5,
        order="A",
        hf_norm_class="Mamba2RMSNorm",
        note="state-space mixer and no MLP in each layer; the mixer's output through a "
        "GatedRMSNorm in 8 groups, the SiLU gate first (`MambaRMSNormGated`; also "
        "Nemotron-H, Bamba, Zamba2, Granite 4)",
        mixer="mamba2",
    ),
)

BY_KEY = {family.key: family for family in FAMILIES}
#: every key without its underscores too: the spellings before the keys were transformers'
#: (``qwen3next``, ``gptneox``) keep working
_BY_SPELLING = {_spelled(key): family for key, family in BY_KEY.items()}


def get(name: str) -> Family:
    """The family of key ``name`` (any case; spaces, dots, dashes and underscores ignored)."""
    try:
        return _BY_SPELLING[_spelled(name)]
    except KeyError:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(BY_KEY)}") from None


# --- the reference decoder's configuration (torch-free: onnxnorm.nn.decoder builds it) ---

POSITIONS = ("pre", "post", "sandwich", "deepnorm", "reordered")
NORMS = ("rms", "layer")
IMPLS = ("onnxnorm", "decomposed")
#: the Q/K norms of the decoder's attention: none, over each head, over the whole projection
QK_NORMS = ("", "head", "full")


@dataclasses.dataclass
class DecoderConfig:
    hidden: int = 64
    heads: int = 4
    kv_heads: int | None = None  # grouped-query attention; None: as many as heads
    intermediate: int = 128
    layers: int = 2
    vocab: int | None = None  # None: the model takes hidden states; else token ids
    norm: str = "rms"  # "rms" or "layer"
    position: str = "pre"
    eps: float = 1e-6
    scale_offset: float = 0.0  # Gemma's (1 + weight); RMSNorm only
    cast_before_scale: int = 0  # rounding order: 1 = A (Llama, T5), 0 = B (Gemma, torch)
    weight: bool = True  # False: non-parametric norms (OLMo)
    bias: bool = False  # LayerNorm bias
    #: norms of the queries and keys: "head" (or True) over each head (Qwen3, Gemma 3), "full"
    #: over the whole projection (OLMo 2), "" (or False) none
    qk_norm: bool | str = False
    #: RoPE on the queries and keys after their norms; None: where there is a Q/K norm (the
    #: onnxnorm impl then exports the norm and the rotary as one rotary node)
    rotary: bool | None = None
    #: the rotation in float32 with float32 angles, rounded once (OLMo 2); else in the model's
    #: type, as eager PyTorch rounds it
    rotary_float32: bool = False
    embedding_norm: bool = False  # a norm right after the embedding (BLOOM, BERT)
    final_norm: bool | None = None  # None: yes for pre, sandwich and reordered
    impl: str = "onnxnorm"
    mixer: str = "attention"  # a value of MIXERS
    #: gated_deltanet: every n-th layer is softmax attention (Qwen3-Next: every 4th), and the
    #: head size of the linear attention's queries, keys and values (Qwen3-Next: 128)
    full_attention_interval: int = 2
    linear_head_dim: int = 128
    #: mamba2: the groups of the gated norm (and of B and C), and the state size; the mixer's
    #: inner size is ``intermediate`` (Mamba2's expand * hidden), with ``heads`` heads
    mamba_groups: int = 8
    mamba_state: int = 16
    conv_kernel: int = 4  # the causal depthwise convolution of both linear mixers

    def __post_init__(self) -> None:
        qk_norm: Any = self.qk_norm
        if isinstance(qk_norm, bool):
            qk_norm = "head" if qk_norm else ""
        if qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm must be one of {QK_NORMS} (or a bool), got {qk_norm!r}")
        self.qk_norm = qk_norm
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}, got {self.position!r}")
        if self.impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {self.impl!r}")
        if self.hidden % self.heads or self.heads % (self.kv_heads or self.heads):
            raise ValueError("hidden must be a multiple of heads, and heads of kv_heads")
        if self.scale_offset and self.norm != "rms":
            raise ValueError("scale_offset is for RMSNorm only")
        if self.bias and self.norm != "layer":
            raise ValueError("bias is for LayerNorm only")
        if self.mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {MIXERS}, got {self.mixer!r}")
        if self.mixer != "attention" and (self.norm != "rms" or self.position != "pre"):
            raise ValueError(f"mixer {self.mixer!r} is for Pre-Norm RMSNorm decoders")
        if (
            self.mixer == "gated_deltanet"
            and min(self.full_attention_interval, self.linear_head_dim) < 1
        ):
            raise ValueError("full_attention_interval and linear_head_dim must be >= 1")
        if self.mixer == "mamba2" and (
            self.mamba_groups < 1
            or self.intermediate % self.mamba_groups
            or self.intermediate % self.heads
        ):
            raise ValueError(
                "mamba2: intermediate (the mixer's inner size) must be a multiple of "
                "mamba_groups and of heads"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_kind(self, index: int) -> str:
        """What mixes the tokens in layer ``index``: "attention", "linear_attention" or
        "mamba2"."""
        if self.mixer == "mamba2":
            return "mamba2"
        if self.mixer == "gated_deltanet" and (index + 1) % self.full_attention_interval:
            return "linear_attention"
        return "attention"

    @property
    def has_rotary(self) -> bool:
        """Whether the attention rotates its queries and keys (RoPE)."""
        return bool(self.qk_norm) if self.rotary is None else self.rotary

    @property
    def has_final_norm(self) -> bool:
        if self.final_norm is not None:
            return self.final_norm
        return self.position in ("pre", "sandwich", "reordered")

    @property
    def deepnorm(self):
        """DeepNorm's alpha and beta for this decoder-only stack (arXiv:2203.00555)."""
        from onnxnorm.nn import deepnorm_constants

        return deepnorm_constants("decoder", decoder_layers=self.layers)["decoder"]


def decoder_config(family: Family | str, **overrides: Any) -> DecoderConfig:
    """A :class:`onnxnorm.nn.decoder.DecoderConfig` normalized the way ``family`` is (needs
    torch). Placements the decoder does not build (``parallel``) become ``pre`` with the same
    norms. A hybrid family's decoder gets the family's token mixer. The attention of a family
    with a Q/K norm has it ("head" or "full") and RoPE after it, rotated in float32 for the
    norm over the whole projection (OLMo 2 computes it so)."""
    if isinstance(family, str):
        family = get(family)
    position = "pre" if family.position == "parallel" else family.position
    fields: dict[str, Any] = dict(
        norm=family.norm,
        position=position,
        eps=family.eps,
        scale_offset=family.scale_offset,
        weight=family.weight,
        bias=family.bias and family.weight,
        qk_norm=family.qk_norm,
        rotary_float32=family.qk_norm == "full",
        embedding_norm=family.embedding_norm,
        cast_before_scale=1 if family.order == "A" else 0,
        mixer=family.mixer,
    )
    fields.update(overrides)
    return DecoderConfig(**fields)

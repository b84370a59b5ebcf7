"""A small configurable decoder: every norm placement and variant that LLM families use, for the
tests, the demo and the benchmarks.

    config = DecoderConfig(norm="rms", position="sandwich", scale_offset=1.0, qk_norm=True)
    model = build(config)                       # onnxnorm modules, residual adds fused
    plain = build(replace(config, impl="decomposed"))   # same weights, norms spelled out

``impl="onnxnorm"`` uses onnxnorm.nn modules and its residual helpers, so that each residual add
and the norm after it export as one node; ``impl="decomposed"`` writes the norms and adds as
plain torch math (what a Hugging Face export holds, and what ``onnxnorm fuse`` rewrites). The
two compute the same function with the same parameter names, and :func:`build` gives them the
same weights for the same seed.

Norm placements (``position``), each for the attention and the MLP sublayer of every layer:

* ``pre``: x + F(Norm(x)), with a final norm (Llama, GPT-2, ...);
* ``post``: Norm(x + F(x)) (BERT, the original Transformer);
* ``sandwich``: x + Norm_post(F(Norm_pre(x))), with a final norm (Gemma 2/3, CogView);
* ``deepnorm``: LN(alpha * x + F(x)), DeepNet's alpha and beta-scaled initialization;
* ``reordered``: x + Norm(F(x)), with a final norm (OLMo 2).

Token mixers (``mixer``), for the norms of hybrid LLMs:

* ``attention``: softmax attention in every layer (with a Q/K norm, RoPE after it: one rotary
  node of Q and K per layer in the onnxnorm impl);
* ``gated_deltanet``: Qwen3-Next's hybrid. Every ``full_attention_interval``-th layer is
  softmax attention with Q/K norms and an output gate, the others linear attention
  (:class:`GatedDeltaNet`) whose queries and keys go through L2Norm and whose output goes
  through a gated RMSNorm over each value head (norm, then SiLU of the gate; weight
  ``[linear_head_dim]``, group size ``linear_head_dim``);
* ``mamba2``: Mamba2's stack, one sublayer per layer (norm, :class:`Mamba2Mixer`, residual
  add; no MLP), the mixer's output through a gated RMSNorm in ``mamba_groups`` groups with the
  gate applied first.

The linear-attention and state-space cores are simplified stand-ins (see their classes): the
norms sit where the real models put them, with the real shapes, but the recurrences are not the
models' own, so the outputs are not those of a Qwen3-Next or Mamba2 checkpoint.

The decoder's norms in each impl and its decomposed residual stream are in ``decoder_norms.py``,
the token mixers in ``mixers.py``; this module assembles the layers and the model.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from onnxnorm.nn.decoder_norms import (
    DecomposedGatedNorm,
    DecomposedL2Norm,
    DecomposedNorm,
    DecomposedStream,
    make_gated_norm,
    make_l2_norm,
    make_norm,
)
from onnxnorm.nn.families import IMPLS, MIXERS, NORMS, POSITIONS, DecoderConfig
from onnxnorm.nn.mixers import (
    Attention,
    GatedDeltaNet,
    Mamba2Mixer,
    gated_linear_attention as gated_linear_attention,  # its home before mixers.py
)


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """A token mixer (attention, or linear attention in Qwen3-Next's hybrid) and an MLP
    sublayer with their norms at ``config.position``."""

    def __init__(self, config: DecoderConfig, index: int = 0):
        super().__init__()
        self.position = config.position
        pre = config.position in ("pre", "sandwich")
        post = config.position != "pre"
        self.input_layernorm = make_norm(config.hidden, config) if pre else None
        if config.layer_kind(index) == "linear_attention":
            self.linear_attn = GatedDeltaNet(config)
            self.mixer_name = "linear_attn"
        else:
            self.self_attn = Attention(config)
            self.mixer_name = "self_attn"
        self.post_attention_layernorm = make_norm(config.hidden, config) if post else None
        self.pre_feedforward_layernorm = make_norm(config.hidden, config) if pre else None
        self.mlp = MLP(config)
        self.post_feedforward_layernorm = make_norm(config.hidden, config) if post else None
        self.alpha = config.deepnorm.alpha if config.position == "deepnorm" else 1.0
        if config.position == "deepnorm":
            from onnxnorm.nn import deepnorm_init_

            a, m = self.mixer, self.mlp
            deepnorm_init_(
                [m.gate_proj, m.up_proj, m.down_proj, a.v_proj, a.o_proj],
                config.deepnorm.beta,
                unscaled=[a.q_proj, a.k_proj],
            )

    @property
    def mixer(self) -> nn.Module:
        """The token mixer: ``self_attn`` or ``linear_attn``."""
        return getattr(self, self.mixer_name)

    def _sublayer(
        self, stream: Any, pre: nn.Module | None, sublayer: nn.Module, post: nn.Module | None
    ) -> Any:
        if self.position in ("pre", "sandwich"):
            h, stream = stream.normalize(pre)
            return stream.add(sublayer(h), post)
        if self.position == "reordered":
            return stream.add(sublayer(stream.value()), post)
        return stream.post_norm(sublayer(stream.value()), post, self.alpha)

    def forward(self, stream: Any) -> Any:
        stream = self._sublayer(
            stream, self.input_layernorm, self.mixer, self.post_attention_layernorm
        )
        return self._sublayer(
            stream, self.pre_feedforward_layernorm, self.mlp, self.post_feedforward_layernorm
        )


class MambaLayer(nn.Module):
    """Mamba2's block: x + Mixer(Norm(x)), no MLP."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.norm = make_norm(config.hidden, config)
        self.mixer = Mamba2Mixer(config)

    def forward(self, stream: Any) -> Any:
        h, stream = stream.normalize(self.norm)
        return stream.add(self.mixer(h))


def make_layer(config: DecoderConfig, index: int) -> nn.Module:
    if config.layer_kind(index) == "mamba2":
        return MambaLayer(config)
    return DecoderLayer(config, index)


class Decoder(nn.Module):
    """Embedding (when ``vocab`` is set) and its norm, the layers, the final norm, the LM head."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab, config.hidden) if config.vocab else None
        self.embedding_norm = make_norm(config.hidden, config) if config.embedding_norm else None
        self.layers = nn.ModuleList(make_layer(config, i) for i in range(config.layers))
        self.norm = make_norm(config.hidden, config) if config.has_final_norm else None
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False) if config.vocab else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        if self.config.impl == "onnxnorm":
            from onnxnorm.nn import ResidualStream

            stream: Any = ResidualStream(x)
        else:
            stream = DecomposedStream(x)
        for layer in self.layers:
            stream = layer(stream)
        x = stream.finish(self.norm)
        return self.lm_head(x) if self.lm_head is not None else x

    def norm_modules(self) -> list[nn.Module]:
        kinds: tuple[type[nn.Module], ...] = (DecomposedNorm, DecomposedGatedNorm, DecomposedL2Norm)
        try:
            from onnxnorm.nn.modules import NORM_TYPES

            kinds += NORM_TYPES
        except ImportError:
            pass
        return [m for m in self.modules() if isinstance(m, kinds)]

    def count_norms(self) -> int:
        return len(self.norm_modules())

    def expected_nodes(self) -> collections.Counter:
        """The onnxnorm nodes that the export of the ``onnxnorm`` impl holds, by op type: one
        per norm, or per residual add fused with the norm after it, or per attention layer's
        Q/K norms with their rotary (``RMSNormRotary`` or ``LayerNormRotary`` of Q and K)."""
        c = self.config
        kind = "RMSNorm" if c.norm == "rms" else "LayerNorm"
        kinds = [c.layer_kind(i) for i in range(c.layers)]
        nodes: collections.Counter = collections.Counter()
        nodes[kind] += int(c.embedding_norm)
        if c.qk_norm and c.has_rotary:
            nodes[kind + "Rotary"] += kinds.count("attention")
        elif c.qk_norm:
            nodes[kind] += 2 * kinds.count("attention")
        # a gated norm in each linear-attention and Mamba2 layer, L2Norms of q and k in the first
        nodes["GatedRMSNorm"] += kinds.count("linear_attention") + kinds.count("mamba2")
        nodes["L2Norm"] += 2 * kinds.count("linear_attention")
        sublayers = 2 * c.layers - kinds.count("mamba2")  # a Mamba2 layer has no MLP
        if c.position == "pre":
            nodes[kind] += 1  # the first norm has no residual add before it
            nodes["Skip" + kind] += sublayers - 1 + int(c.has_final_norm)
        elif c.position == "sandwich":
            nodes[kind] += 1
            nodes["Sandwich" + kind] += sublayers - 1 + int(c.has_final_norm)
            nodes[kind] += int(not c.has_final_norm)  # the last post-norm, unfused
        elif c.position == "reordered":
            # each post-sublayer norm is added by itself; the last one fuses with the final norm
            nodes[kind] += sublayers - int(c.has_final_norm)
            nodes["Sandwich" + kind] += int(c.has_final_norm)
        else:
            nodes["Skip" + kind] += sublayers
            nodes[kind] += int(c.has_final_norm)
        return +nodes


def build(config: DecoderConfig | None = None, seed: int = 0) -> Decoder:
    """A decoder in eval mode with random weights, the norm weights and biases included (so that
    a wrong scale cannot pass a parity test); the same seed gives both impls the same weights."""
    config = config or DecoderConfig()
    torch.manual_seed(seed)
    model = Decoder(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, module in model.named_modules():
            if not name.rsplit(".", 1)[-1].endswith("norm"):
                continue
            # each norm's own offset: the gated norms of the hybrids have none
            offset = getattr(module, "scale_offset", getattr(module, "offset", 0.0))
            for parameter_name, parameter in module.named_parameters(recurse=False):
                noise = 0.1 * torch.randn(parameter.shape, generator=generator)
                parameter.copy_(1.0 - offset + noise if parameter_name == "weight" else noise)
    return model


def example_input(
    config: DecoderConfig,
    batch: int = 2,
    seq: int = 8,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> torch.Tensor:
    """Token ids (``vocab`` set) or hidden states for the model of ``config``."""
    generator = torch.Generator().manual_seed(seed)
    if config.vocab:
        return torch.randint(0, config.vocab, (batch, seq), generator=generator)
    return torch.randn(batch, seq, config.hidden, generator=generator).to(dtype)


def size_in_parameters(config: DecoderConfig) -> int:
    """The number of parameters of the model of ``config`` (without building it)."""
    with torch.device("meta"):
        return sum(p.numel() for p in Decoder(config).parameters())


__all__ = [
    "Decoder",
    "DecoderConfig",
    "DecomposedGatedNorm",
    "DecomposedL2Norm",
    "DecomposedNorm",
    "GatedDeltaNet",
    "IMPLS",
    "MIXERS",
    "Mamba2Mixer",
    "NORMS",
    "POSITIONS",
    "build",
    "example_input",
    "make_gated_norm",
    "make_l2_norm",
    "make_norm",
    "size_in_parameters",
]

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
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

POSITIONS = ("pre", "post", "sandwich", "deepnorm", "reordered")
NORMS = ("rms", "layer")
IMPLS = ("onnxnorm", "decomposed")


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
    qk_norm: bool = False  # norms of the queries and keys over head_dim (Qwen3, Gemma 3)
    embedding_norm: bool = False  # a norm right after the embedding (BLOOM, BERT)
    final_norm: bool | None = None  # None: yes for pre, sandwich and reordered
    impl: str = "onnxnorm"

    def __post_init__(self) -> None:
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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

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


class DecomposedNorm(nn.Module):
    """A norm spelled out in torch ops, as Hugging Face writes them: float32 statistics, then
    the scale in X's type after rounding (order A) or in float32 with one rounding (order B)."""

    def __init__(self, shape: int, config: DecoderConfig):
        super().__init__()
        self.layer = config.norm == "layer"
        self.eps = config.eps
        self.offset = config.scale_offset
        self.order_a = bool(config.cast_before_scale)
        self.weight = nn.Parameter(torch.ones(shape) - self.offset) if config.weight else None
        self.bias = nn.Parameter(torch.zeros(shape)) if config.bias and config.weight else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        if self.layer:
            xf = xf - xf.mean(-1, keepdim=True)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.order_a:
            y = y.to(x.dtype)
            if self.weight is not None:
                y = y * (
                    self.weight.to(x.dtype) + self.offset
                    if self.offset
                    else self.weight.to(x.dtype)
                )
            if self.bias is not None:
                y = y + self.bias.to(x.dtype)
            return y
        if self.weight is not None:
            y = y * (self.weight.float() + self.offset if self.offset else self.weight.float())
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)


def make_norm(shape: int, config: DecoderConfig) -> nn.Module:
    if config.impl == "decomposed":
        return DecomposedNorm(shape, config)
    from onnxnorm.nn import LayerNorm, RMSNorm

    if config.norm == "rms":
        norm = RMSNorm(
            shape,
            eps=config.eps,
            elementwise_affine=config.weight,
            scale_offset=config.scale_offset,
            cast_before_scale=config.cast_before_scale,
        )
    else:
        norm = LayerNorm(
            shape,
            eps=config.eps,
            elementwise_affine=config.weight,
            bias=config.bias,
            cast_before_scale=config.cast_before_scale,
        )
    return norm


class DecomposedStream:
    """The residual stream for ``impl="decomposed"``: the same interface as
    :class:`onnxnorm.nn.ResidualStream`, with every add and norm as separate torch ops."""

    def __init__(self, x: torch.Tensor):
        self.x = x

    def normalize(self, norm: nn.Module) -> tuple[torch.Tensor, DecomposedStream]:
        return norm(self.x), self

    def add(self, delta: torch.Tensor, norm: nn.Module | None = None) -> DecomposedStream:
        return DecomposedStream(self.x + (norm(delta) if norm is not None else delta))

    def post_norm(
        self, delta: torch.Tensor, norm: nn.Module, alpha: float = 1.0
    ) -> DecomposedStream:
        if alpha == 1.0:
            return DecomposedStream(norm(self.x + delta))
        # DeepNorm's scaled add in float32, rounded once (as the catalogue's Skip ops do)
        return DecomposedStream(norm((alpha * self.x.float() + delta.float()).to(delta.dtype)))

    def value(self) -> torch.Tensor:
        return self.x

    def finish(self, norm: nn.Module | None = None) -> torch.Tensor:
        return norm(self.x) if norm is not None else self.x


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.heads, self.kv_heads = config.heads, config.kv_heads or config.heads
        d = config.head_dim
        self.q_proj = nn.Linear(config.hidden, self.heads * d, bias=False)
        self.k_proj = nn.Linear(config.hidden, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(config.hidden, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, config.hidden, bias=False)
        self.q_norm = make_norm(d, config) if config.qk_norm else None
        self.k_norm = make_norm(d, config) if config.qk_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, -1)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, -1)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, -1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.hidden, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """An attention and an MLP sublayer with their norms at ``config.position``."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.position = config.position
        pre = config.position in ("pre", "sandwich")
        post = config.position != "pre"
        self.input_layernorm = make_norm(config.hidden, config) if pre else None
        self.self_attn = Attention(config)
        self.post_attention_layernorm = make_norm(config.hidden, config) if post else None
        self.pre_feedforward_layernorm = make_norm(config.hidden, config) if pre else None
        self.mlp = MLP(config)
        self.post_feedforward_layernorm = make_norm(config.hidden, config) if post else None
        self.alpha = config.deepnorm.alpha if config.position == "deepnorm" else 1.0
        if config.position == "deepnorm":
            from onnxnorm.nn import deepnorm_init_

            a, m = self.self_attn, self.mlp
            deepnorm_init_(
                [m.gate_proj, m.up_proj, m.down_proj, a.v_proj, a.o_proj],
                config.deepnorm.beta,
                unscaled=[a.q_proj, a.k_proj],
            )

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
            stream, self.input_layernorm, self.self_attn, self.post_attention_layernorm
        )
        return self._sublayer(
            stream, self.pre_feedforward_layernorm, self.mlp, self.post_feedforward_layernorm
        )


class Decoder(nn.Module):
    """Embedding (when ``vocab`` is set) and its norm, the layers, the final norm, the LM head."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab, config.hidden) if config.vocab else None
        self.embedding_norm = make_norm(config.hidden, config) if config.embedding_norm else None
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.layers))
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
        kinds = (DecomposedNorm,)
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
        per norm, or per residual add fused with the norm after it."""
        c = self.config
        kind = "RMSNorm" if c.norm == "rms" else "LayerNorm"
        nodes: collections.Counter = collections.Counter()
        nodes[kind] += int(c.embedding_norm) + 2 * c.layers * int(c.qk_norm)
        sublayers = 2 * c.layers
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
        for name, parameter in model.named_parameters():
            owner = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
            if owner.endswith("norm"):
                noise = 0.1 * torch.randn(parameter.shape, generator=generator)
                if name.endswith("weight"):
                    parameter.copy_(1.0 - config.scale_offset + noise)
                else:
                    parameter.copy_(noise)
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
    "DecomposedNorm",
    "IMPLS",
    "NORMS",
    "POSITIONS",
    "build",
    "example_input",
    "make_norm",
    "size_in_parameters",
]

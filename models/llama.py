"""A small Llama-style decoder, written the way Hugging Face writes Llama.

Its RMSNorm is either the decomposed Hugging Face module (``norm="hf"``: what real exports
contain, and what ``onnxnorm fuse`` rewrites) or :class:`onnxnorm.nn.RMSNorm` (``norm="onnxnorm"``:
exported directly as one onnxnorm node per norm). Both compute the same function.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from onnxnorm.nn.decoder import (
    MLP,
)  # the same SwiGLU MLP (it reads config.hidden, config.intermediate)


@dataclasses.dataclass
class LlamaConfig:
    hidden: int = 256
    heads: int = 4
    intermediate: int = 688
    layers: int = 2
    eps: float = 1e-6
    norm: str = "hf"  # "hf" or "onnxnorm"


class LlamaRMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: float32 statistics, round to the input type, then scale
    (rounding order A, ``cast_before_scale=1``)."""

    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def make_norm(config: LlamaConfig) -> nn.Module:
    if config.norm == "hf":
        return LlamaRMSNorm(config.hidden, config.eps)
    if config.norm == "onnxnorm":
        from onnxnorm.nn import RMSNorm

        return RMSNorm(config.hidden, eps=config.eps, cast_before_scale=1)
    raise ValueError(f"unknown norm {config.norm!r}: expected 'hf' or 'onnxnorm'")


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden, bias=False)
        self.o_proj = nn.Linear(config.hidden, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, hidden // self.heads).unbind(2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, hidden))


class DecoderLayer(nn.Module):
    """Pre-Norm: x + Attn(Norm(x)), then h + MLP(Norm(h))."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = make_norm(config)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaDecoder(nn.Module):
    """``layers`` decoder layers and the final norm, on hidden states (no embedding)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.layers))
        self.norm = make_norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def count_norms(self) -> int:
        return sum(1 for m in self.modules() if type(m).__name__.endswith("RMSNorm"))


def build(config: LlamaConfig | None = None, seed: int = 0) -> LlamaDecoder:
    """A decoder in eval mode with random weights, the norm weights included (so that a wrong
    scale cannot pass a parity test)."""
    torch.manual_seed(seed)
    model = LlamaDecoder(config or LlamaConfig()).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
    return model

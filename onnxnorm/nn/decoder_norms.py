"""The norms of the reference decoder (``decoder.py``) in its two impls, and its residual stream
as plain torch math.

``impl="onnxnorm"``: onnxnorm.nn's modules (imported when a norm is made, so that a decomposed
decoder needs nothing of them). ``impl="decomposed"``: the norms spelled out in torch ops as
Hugging Face writes them (:class:`DecomposedNorm`, :class:`DecomposedGatedNorm`,
:class:`DecomposedL2Norm`) and every residual add a separate op (:class:`DecomposedStream`):
what a Hugging Face export holds, and what ``onnxnorm fuse`` rewrites. :func:`make_norm`,
:func:`make_gated_norm` and :func:`make_l2_norm` give a decoder's norm in its config's impl.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from onnxnorm.nn.families import DecoderConfig


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


class DecomposedGatedNorm(nn.Module):
    """A gated RMSNorm spelled out as Hugging Face writes it: Qwen3NextRMSNormGated's (norm,
    then SiLU gate) or MambaRMSNormGated's (SiLU gate on float32(x), then the norm in groups),
    both rounding in order A. A weight of one group's size is shared by every group (Qwen3-Next
    reshapes its heads to rows for that)."""

    def __init__(self, hidden: int, group_size: int, eps: float, norm_before_gate: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        if gate is not None and not self.norm_before_gate:
            h = h * F.silu(gate.to(torch.float32))
        *prefix, last = h.shape
        groups = h.view(*prefix, last // self.group_size, self.group_size)
        variance = groups.pow(2).mean(-1, keepdim=True)
        groups = groups * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.numel() == self.group_size:
            h = (self.weight * groups.to(dtype)).view(*prefix, last)
        else:
            h = self.weight * groups.view(*prefix, last).to(dtype)
        if gate is not None and self.norm_before_gate:
            h = (h * F.silu(gate.to(torch.float32))).to(dtype)
        return h


class DecomposedL2Norm(nn.Module):
    """FLA's ``l2norm`` as Qwen3-Next's modeling code writes it (``x * rsqrt(sum(x*x) +
    eps)``), as a module so that :func:`onnxnorm.convert` finds it."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + self.eps)


def make_gated_norm(
    hidden: int, group_size: int, config: DecoderConfig, norm_before_gate: bool
) -> nn.Module:
    """The gated RMSNorm of the hybrid mixers (SiLU, order A, weight at 1: as Qwen3-Next's and
    Mamba2's are, whatever the decoder's other norms do)."""
    if config.impl == "decomposed":
        return DecomposedGatedNorm(hidden, group_size, config.eps, norm_before_gate)
    from onnxnorm.nn import GatedRMSNorm

    return GatedRMSNorm(
        hidden, group_size=group_size, eps=config.eps, norm_before_gate=norm_before_gate
    )


def make_l2_norm(config: DecoderConfig) -> nn.Module:
    """The L2 norm of linear attention's queries and keys (epsilon 1e-6, as FLA's)."""
    if config.impl == "decomposed":
        return DecomposedL2Norm(1e-6)
    from onnxnorm.nn import L2Norm

    return L2Norm(1e-6)


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

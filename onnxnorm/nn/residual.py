"""Residual blocks around norms, fused so that each residual add and the norm after it export
as ONE onnxnorm node.

The four placements of the norm in a transformer block (docs/norms.md):

* Pre-Norm (GPT-2, Llama, most LLMs):   x_{l+1} = x_l + F(Norm(x_l))
* Post-Norm (the original Transformer, BERT):   x_{l+1} = Norm(x_l + F(x_l))
* Sandwich-Norm (CogView, Gemma 2/3):   x_{l+1} = x_l + Norm_post(F(Norm_pre(x_l)))
* DeepNorm (DeepNet):   x_{l+1} = LN(alpha * x_l + F(x_l)), with beta-scaled initialization

In a Pre-Norm or Sandwich-Norm stack the residual add of one sublayer meets the norm that opens
the next sublayer. :class:`ResidualStream` carries the sublayer output that has not been added
yet ("pending") to that next norm, which then runs as one SkipRMSNorm / SkipLayerNorm (Pre-Norm)
or SandwichRMSNorm / SandwichLayerNorm (Sandwich-Norm) node with the new residual stream as its
Sum output. Post-Norm and DeepNorm add and normalize in one Skip node with ``alpha``.

    stream = ResidualStream(x)
    for block in blocks:            # PreNormBlock / SandwichBlock / PostNormBlock / DeepNormBlock
        stream = block(stream)
    y = stream.finish(final_norm)   # or stream.value() without a final norm
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import torch

from onnxnorm.nn.functional import call
from onnxnorm.nn.modules import RESIDUAL_NORM_TYPES, NormBase


def _check_norm(norm: Any, role: str = "norm") -> NormBase:
    if not isinstance(norm, RESIDUAL_NORM_TYPES):
        raise TypeError(
            f"{role} must be an onnxnorm.nn.RMSNorm or LayerNorm (convert the model "
            f"with onnxnorm.convert first), got {type(norm).__name__}"
        )
    return norm


def add_norm(
    norm: NormBase,
    x: torch.Tensor,
    residual: torch.Tensor,
    *,
    alpha: float = 1.0,
    x_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``Sum = alpha * residual + x (+ x_bias)``, ``Y = norm(Sum)``; returns (Y, Sum) from one
    SkipRMSNorm / SkipLayerNorm node."""
    _check_norm(norm)
    norm.check_input(x)
    if (
        not isinstance(residual, torch.Tensor)
        or residual.shape != x.shape
        or residual.dtype != x.dtype
    ):
        raise ValueError(
            f"residual must be a tensor of x's shape {tuple(x.shape)} and type "
            f"{x.dtype}, got {getattr(residual, 'dtype', type(residual).__name__)} "
            f"{tuple(getattr(residual, 'shape', ()))}"
        )
    scale, bias = norm.parameters_for_op()
    return call(
        norm.skip_op,
        x,
        residual,
        scale,
        bias,
        x_bias,
        alpha=float(alpha),
        **norm.attributes(x.dtype),
    )


def _same_attributes(inner: NormBase, outer: NormBase, dtype: torch.dtype) -> bool:
    return (
        type(inner) is type(outer)
        and inner.normalized_shape == outer.normalized_shape
        and inner.attributes(dtype) == outer.attributes(dtype)
    )


def sandwich_norm(
    inner: NormBase, outer: NormBase, x: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``Sum = residual + inner(x)``, ``Y = outer(Sum)``; returns (Y, Sum).

    One SandwichRMSNorm / SandwichLayerNorm node when both norms are of the same kind with the
    same attributes (the sandwich op has one set); otherwise the inner norm and a Skip node."""
    _check_norm(inner, "inner")
    _check_norm(outer, "outer")
    inner.check_input(x)
    if not _same_attributes(inner, outer, x.dtype):
        return add_norm(outer, inner(x), residual)
    inner_scale, inner_bias = inner.parameters_for_op()
    scale, bias = outer.parameters_for_op()
    return call(
        outer.sandwich_op,
        x,
        residual,
        inner_scale,
        inner_bias,
        scale,
        bias,
        **outer.attributes(x.dtype),
    )


@dataclasses.dataclass(frozen=True)
class ResidualStream:
    """The residual stream between blocks: ``x`` plus a sublayer output not added yet.

    ``pending`` is that sublayer output, ``pending_norm`` the norm it goes through before the
    add (Sandwich-Norm's post-sublayer norm), ``alpha`` scales ``x`` in the add. Immutable:
    each method returns the new stream.
    """

    x: torch.Tensor
    pending: torch.Tensor | None = None
    pending_norm: NormBase | None = None

    @classmethod
    def of(cls, value: torch.Tensor | ResidualStream) -> ResidualStream:
        if isinstance(value, ResidualStream):
            return value
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"expected a torch.Tensor or ResidualStream, got {type(value).__name__}"
            )
        return cls(value)

    def normalize(self, norm: NormBase) -> tuple[torch.Tensor, ResidualStream]:
        """Adds what is pending into the stream and normalizes it for the next sublayer, in one
        node; returns (the norm's output, the stream with nothing pending)."""
        if self.pending is None:
            return norm(self.x), self
        if self.pending_norm is None:
            y, total = add_norm(norm, self.pending, self.x)
        else:
            y, total = sandwich_norm(self.pending_norm, norm, self.pending, self.x)
        return y, ResidualStream(total)

    def add(self, delta: torch.Tensor, norm: NormBase | None = None) -> ResidualStream:
        """The stream plus ``delta`` (normalized by ``norm`` first, when given), left pending."""
        stream = self.settle()
        return ResidualStream(stream.x, delta, norm)

    def settle(self) -> ResidualStream:
        """The stream with its pending add done (unfused): for a stream that is not normalized
        next (no final norm, or a block that needs the plain sum)."""
        if self.pending is None:
            return self
        delta = self.pending if self.pending_norm is None else self.pending_norm(self.pending)
        return ResidualStream(self.x + delta)

    def post_norm(self, delta: torch.Tensor, norm: NormBase, alpha: float = 1.0) -> ResidualStream:
        """Post-Norm / DeepNorm: the stream becomes ``norm(alpha * x + delta)``, one Skip node."""
        x = self.value()
        return ResidualStream(add_norm(norm, delta, x, alpha=alpha)[0])

    def value(self) -> torch.Tensor:
        return self.settle().x

    def finish(self, norm: NormBase | None = None) -> torch.Tensor:
        """The final output: ``norm`` of the stream (fused with the pending add), or the stream."""
        if norm is None:
            return self.value()
        return self.normalize(norm)[0]


class PreNormBlock(torch.nn.Module):
    """Pre-Norm: ``x + sublayer(norm(x))``. The add is fused into the next block's norm (or the
    final norm): one SkipRMSNorm / SkipLayerNorm node per residual add + norm."""

    def __init__(self, norm: NormBase, sublayer: torch.nn.Module):
        super().__init__()
        self.norm = _check_norm(norm)
        self.sublayer = sublayer

    def forward(
        self, stream: torch.Tensor | ResidualStream, *args: Any, **kwargs: Any
    ) -> ResidualStream:
        h, stream = ResidualStream.of(stream).normalize(self.norm)
        return stream.add(self.sublayer(h, *args, **kwargs))


class SandwichBlock(torch.nn.Module):
    """Sandwich-Norm: ``x + post_norm(sublayer(pre_norm(x)))``. The post-norm and the add are
    fused with the next block's pre-norm (or the final norm) into one SandwichRMSNorm /
    SandwichLayerNorm node."""

    def __init__(self, pre_norm: NormBase, sublayer: torch.nn.Module, post_norm: NormBase):
        super().__init__()
        self.pre_norm = _check_norm(pre_norm, "pre_norm")
        self.sublayer = sublayer
        self.post_norm = _check_norm(post_norm, "post_norm")

    def forward(
        self, stream: torch.Tensor | ResidualStream, *args: Any, **kwargs: Any
    ) -> ResidualStream:
        h, stream = ResidualStream.of(stream).normalize(self.pre_norm)
        return stream.add(self.sublayer(h, *args, **kwargs), self.post_norm)


class PostNormBlock(torch.nn.Module):
    """Post-Norm: ``norm(alpha * x + sublayer(x))`` (``alpha = 1``: the original Transformer,
    BERT), as one SkipRMSNorm / SkipLayerNorm node without the Sum output."""

    def __init__(self, sublayer: torch.nn.Module, norm: NormBase, alpha: float = 1.0):
        super().__init__()
        self.sublayer = sublayer
        self.norm = _check_norm(norm)
        self.alpha = float(alpha)

    def forward(
        self, stream: torch.Tensor | ResidualStream, *args: Any, **kwargs: Any
    ) -> ResidualStream:
        stream = ResidualStream.of(stream)
        delta = self.sublayer(stream.value(), *args, **kwargs)
        return stream.post_norm(delta, self.norm, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" if self.alpha != 1.0 else ""


@dataclasses.dataclass(frozen=True)
class DeepNormConstants:
    """DeepNorm's alpha (multiplies the residual before the add) and beta (gain of the
    initialization of the FFN, value and output projections) for one stack."""

    alpha: float
    beta: float


def deepnorm_constants(
    architecture: str, encoder_layers: int = 0, decoder_layers: int = 0
) -> dict[str, DeepNormConstants]:
    """DeepNorm's alpha and beta, from the table of Figure 2 of Wang et al., "DeepNet: Scaling
    Transformers to 1,000 Layers" (arXiv:2203.00555), for N encoder and M decoder layers:

    =================  =====================================  ======================================
    architecture       encoder alpha, beta                    decoder alpha, beta
    =================  =====================================  ======================================
    encoder-only       (2N)^(1/4), (8N)^(-1/4)                 --
    decoder-only       --                                      (2M)^(1/4), (8M)^(-1/4)
    encoder-decoder    0.81 (N^4 M)^(1/16), 0.87 (N^4 M)^(-1/16)  (3M)^(1/4), (12M)^(-1/4)
    =================  =====================================  ======================================

    ``architecture`` is ``"encoder"`` (encoder-only), ``"decoder"`` (decoder-only) or
    ``"encoder-decoder"``. Returns ``{"encoder": ..., "decoder": ...}`` with the stacks present.
    """
    n, m = int(encoder_layers), int(decoder_layers)
    if architecture == "encoder":
        if n < 1:
            raise ValueError("encoder-only DeepNorm needs encoder_layers >= 1")
        return {"encoder": DeepNormConstants((2 * n) ** 0.25, (8 * n) ** -0.25)}
    if architecture == "decoder":
        if m < 1:
            raise ValueError("decoder-only DeepNorm needs decoder_layers >= 1")
        return {"decoder": DeepNormConstants((2 * m) ** 0.25, (8 * m) ** -0.25)}
    if architecture == "encoder-decoder":
        if n < 1 or m < 1:
            raise ValueError(
                "encoder-decoder DeepNorm needs encoder_layers and decoder_layers >= 1"
            )
        return {
            "encoder": DeepNormConstants(
                0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)
            ),
            "decoder": DeepNormConstants((3 * m) ** 0.25, (12 * m) ** -0.25),
        }
    raise ValueError(
        f"unknown architecture {architecture!r}: expected 'encoder', 'decoder' or 'encoder-decoder'"
    )


def deepnorm_init_(
    scaled: Iterable[torch.nn.Module], beta: float, unscaled: Iterable[torch.nn.Module] = ()
) -> None:
    """DeepNet's initialization: Xavier-normal with gain ``beta`` for the weights of the FFN,
    value and output projections (``scaled``), gain 1 for the query and key projections
    (``unscaled``); biases are zeroed."""
    with torch.no_grad():
        for modules, gain in ((scaled, beta), (unscaled, 1.0)):
            for module in modules:
                torch.nn.init.xavier_normal_(module.weight, gain=gain)
                if getattr(module, "bias", None) is not None:
                    torch.nn.init.zeros_(module.bias)


class DeepNormBlock(PostNormBlock):
    """DeepNorm: ``LN(alpha * x + sublayer(x))`` with alpha from :func:`deepnorm_constants`;
    one SkipLayerNorm (or SkipRMSNorm) node with ``alpha``. Initialize the sublayers with
    :func:`deepnorm_init_` and the matching beta."""

    def __init__(self, sublayer: torch.nn.Module, norm: NormBase, alpha: float):
        if not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"DeepNorm alpha must be a finite number > 0, got {alpha!r}")
        super().__init__(sublayer, norm, alpha)

"""Norm modules: drop-in replacements for torch.nn's, exported as one onnxnorm node each."""

from __future__ import annotations

import numbers
from typing import Sequence

import torch

from onnxnorm.nn.functional import call


class RMSNorm(torch.nn.Module):
    """``torch.nn.RMSNorm`` with the same parameters and state_dict (``weight``), plus the
    catalogue's ``scale_offset`` (Gemma's ``1 + weight``: the weight starts at 0 then) and
    ``cast_before_scale`` (rounding order for float16/bfloat16, see docs/ops.md).

    Exported by :func:`onnxnorm.export` as one ``onnxnorm::RMSNorm`` node.
    """

    def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None, *,
                 scale_offset: float = 0.0, cast_before_scale: int = 0):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (int(normalized_shape),)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.scale_offset = float(scale_offset)
        self.cast_before_scale = int(cast_before_scale)
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.constant_(self.weight, 1.0 - self.scale_offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[x.dim() - len(self.normalized_shape):]) != self.normalized_shape:
            raise ValueError(f"RMSNorm over {self.normalized_shape} got an input of shape "
                             f"{tuple(x.shape)}")
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return call("RMSNorm", x, self.weight, axis=-len(self.normalized_shape), epsilon=eps,
                    scale_offset=self.scale_offset, cast_before_scale=self.cast_before_scale)

    def extra_repr(self) -> str:
        text = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        if self.scale_offset:
            text += f", scale_offset={self.scale_offset}"
        if self.cast_before_scale:
            text += f", cast_before_scale={self.cast_before_scale}"
        return text

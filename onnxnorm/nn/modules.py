"""Norm modules: drop-in replacements for torch.nn's, exported as one onnxnorm node each."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch

from onnxnorm.nn.functional import call


def _shape(normalized_shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    shape = tuple(int(d) for d in normalized_shape)
    if not shape:
        raise ValueError("normalized_shape must have at least one dimension")
    return shape


class _Norm(torch.nn.Module):
    """What the onnxnorm norm modules share: the catalogue op they run and its attributes.

    ``normalized_shape`` is the shape of the parameters (as in torch); statistics are taken
    over the trailing ``-axis`` dimensions, by default all of ``normalized_shape``. A smaller
    span (``axis=-1`` with a ``[heads, head_dim]`` weight) is Cohere's per-head Q/K norm.
    """

    #: the catalogue op of a plain norm, and its fused residual variants
    op: str = ""
    skip_op: str = ""
    sandwich_op: str = ""
    kind: str = ""

    normalized_shape: tuple[int, ...]
    eps: float | None
    axis: int
    cast_before_scale: int
    scale_offset: float = 0.0

    def _set_axis(self, axis: int | None) -> None:
        rank = len(self.normalized_shape)
        axis = -rank if axis is None else int(axis)
        if not -rank <= axis < 0:
            raise ValueError(
                f"axis must be in [-{rank}, -1] for normalized_shape "
                f"{self.normalized_shape}, got {axis}"
            )
        self.axis = axis

    def check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{type(self).__name__} expects a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point() or x.dtype not in (
            torch.float32,
            torch.float16,
            torch.bfloat16,
        ):
            raise TypeError(
                f"{type(self).__name__} expects float32, float16 or bfloat16 input, got {x.dtype}"
            )
        n = len(self.normalized_shape)
        if x.dim() < n or tuple(x.shape[x.dim() - n :]) != self.normalized_shape:
            raise ValueError(
                f"{type(self).__name__} over {self.normalized_shape} got an input of "
                f"shape {tuple(x.shape)}"
            )

    def epsilon(self, dtype: torch.dtype) -> float:
        return float(self.eps) if self.eps is not None else torch.finfo(dtype).eps

    def attributes(self, dtype: torch.dtype) -> dict[str, Any]:
        """The catalogue attributes of this norm for an input of ``dtype``."""
        attrs: dict[str, Any] = {
            "axis": self.axis,
            "epsilon": self.epsilon(dtype),
            "cast_before_scale": self.cast_before_scale,
        }
        if self.kind == "rms":
            attrs["scale_offset"] = self.scale_offset
        return attrs

    def parameters_for_op(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(Scale, Bias) as the catalogue op takes them."""
        return self.weight, getattr(self, "bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return call(self.op, x, *self.parameters_for_op(), **self.attributes(x.dtype))

    def _extra(self) -> str:
        text = ""
        if self.axis != -len(self.normalized_shape):
            text += f", axis={self.axis}"
        if self.scale_offset:
            text += f", scale_offset={self.scale_offset}"
        if self.cast_before_scale:
            text += f", cast_before_scale={self.cast_before_scale}"
        return text


class RMSNorm(_Norm):
    """``torch.nn.RMSNorm`` with the same parameters and state_dict (``weight``), plus the
    catalogue's ``scale_offset`` (Gemma's ``1 + weight``: the weight starts at 0 then) and
    ``cast_before_scale`` (rounding order for float16/bfloat16, see docs/ops.md).

    Exported by :func:`onnxnorm.export` as one ``onnxnorm::RMSNorm`` node.
    """

    op, skip_op, sandwich_op, kind = "RMSNorm", "SkipRMSNorm", "SandwichRMSNorm", "rms"

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        scale_offset: float = 0.0,
        cast_before_scale: int = 0,
        axis: int | None = None,
    ):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.scale_offset = float(scale_offset)
        self.cast_before_scale = int(cast_before_scale)
        self._set_axis(axis)
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.empty(self.normalized_shape, device=device, dtype=dtype)
            )
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.constant_(self.weight, 1.0 - self.scale_offset)

    def parameters_for_op(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.weight, None

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}" + self._extra()
        )


class LayerNorm(_Norm):
    """``torch.nn.LayerNorm`` with the same parameters and state_dict (``weight``, ``bias``;
    ``elementwise_affine`` and ``bias`` flags as in torch), plus ``cast_before_scale``
    (rounding order for float16/bfloat16; 0, torch's own order, by default) and ``axis``.

    Exported by :func:`onnxnorm.export` as one ``onnxnorm::LayerNorm`` node.
    """

    op, skip_op, sandwich_op, kind = "LayerNorm", "SkipLayerNorm", "SandwichLayerNorm", "layer"

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        cast_before_scale: int = 0,
        axis: int | None = None,
    ):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.cast_before_scale = int(cast_before_scale)
        self._set_axis(axis)
        if elementwise_affine:
            self.weight = torch.nn.Parameter(
                torch.empty(self.normalized_shape, device=device, dtype=dtype)
            )
            if bias:
                self.bias = torch.nn.Parameter(
                    torch.empty(self.normalized_shape, device=device, dtype=dtype)
                )
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}" + self._extra()
        )


NORM_TYPES = (RMSNorm, LayerNorm)

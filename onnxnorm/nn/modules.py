"""Norm modules: drop-in replacements for torch.nn's, exported as one onnxnorm node each."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch

from onnxnorm.nn.functional import call

#: the integers a norm takes for a size: numpy's too (numbers.Integral); int named beside it for
#: the type checker, to which an int is no numbers.Integral
_INTEGER = (int, numbers.Integral)


def _shape(
    normalized_shape: int | Sequence[int] | None, affine: bool = True
) -> tuple[int, ...] | None:
    if normalized_shape is None:
        if affine:
            raise ValueError("normalized_shape may be None only for a norm without weights")
        return None
    if isinstance(normalized_shape, _INTEGER):
        return (int(normalized_shape),)
    shape = tuple(int(d) for d in normalized_shape)
    if not shape:
        raise ValueError("normalized_shape must have at least one dimension")
    return shape


def _check_float(module: torch.nn.Module, x: Any, role: str = "input") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{type(module).__name__} expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(
            f"{type(module).__name__} expects float32, float16 or bfloat16 {role}, got {x.dtype}"
        )


def _add_weight(
    module: torch.nn.Module, name: str, shape: tuple[int, ...] | None, present: bool, device, dtype
) -> None:
    """Registers parameter ``name`` of ``shape`` (uninitialized: reset_parameters sets it), or
    None when the module has none (as torch's norms register their absent weights)."""
    if present:
        setattr(module, name, torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype)))
    else:
        module.register_parameter(name, None)


def _reset_offset_weight(module: torch.nn.Module) -> None:
    """An RMS norm's weight at 1 - scale_offset, so that the scale it applies starts at 1."""
    if module.weight is not None:
        torch.nn.init.constant_(module.weight, 1.0 - module.scale_offset)


class NormBase(torch.nn.Module):
    """What the onnxnorm norm modules share: the catalogue op they run and its attributes.

    ``normalized_shape`` is the shape of the parameters (as in torch); statistics are taken
    over the trailing ``-axis`` dimensions, by default all of ``normalized_shape``. A smaller
    span (``axis=-1`` with a ``[heads, head_dim]`` weight) is Cohere's per-head Q/K norm. A norm
    without weights may have no ``normalized_shape`` (None): it normalizes the trailing ``-axis``
    dimensions (by default the last) of whatever size (Llama 4's Q/K norm).
    """

    #: the catalogue op of a plain norm, and its fused residual variants
    op: str = ""
    skip_op: str = ""
    sandwich_op: str = ""
    kind: str = ""

    normalized_shape: tuple[int, ...] | None
    eps: float | None
    axis: int
    cast_before_scale: int
    scale_offset: float = 0.0

    def _set_axis(self, axis: int | None) -> None:
        if self.normalized_shape is None:  # no weights: any trailing dims
            axis = -1 if axis is None else int(axis)
            if axis >= 0:
                raise ValueError(f"axis must be negative (counted from the back), got {axis}")
            self.axis = axis
            return
        rank = len(self.normalized_shape)
        axis = -rank if axis is None else int(axis)
        if not -rank <= axis < 0:
            raise ValueError(
                f"axis must be in [-{rank}, -1] for normalized_shape "
                f"{self.normalized_shape}, got {axis}"
            )
        self.axis = axis

    def check_input(self, x: torch.Tensor) -> None:
        _check_float(self, x)
        if self.normalized_shape is None:
            if x.dim() < -self.axis:
                raise ValueError(
                    f"{type(self).__name__} over the last {-self.axis} dimension(s) got an "
                    f"input of shape {tuple(x.shape)}"
                )
            return
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
        if self.axis != -len(self.normalized_shape or (0,)):
            text += f", axis={self.axis}"
        if self.scale_offset:
            text += f", scale_offset={self.scale_offset}"
        if self.cast_before_scale:
            text += f", cast_before_scale={self.cast_before_scale}"
        return text


class RMSNorm(NormBase):
    """``torch.nn.RMSNorm`` with the same parameters and state_dict (``weight``), plus the
    catalogue's ``scale_offset`` (Gemma's ``1 + weight``: the weight starts at 0 then) and
    ``cast_before_scale`` (rounding order for float16/bfloat16, see docs/ops.md). Without
    weights (``elementwise_affine=False``) ``normalized_shape`` may be None: then it normalizes
    the trailing ``-axis`` dims (default: the last) of any size, as Llama 4's Q/K norm does.

    Exported by :func:`onnxnorm.export` as one ``onnxnorm::RMSNorm`` node.
    """

    op, skip_op, sandwich_op, kind = "RMSNorm", "SkipRMSNorm", "SandwichRMSNorm", "rms"

    def __init__(
        self,
        normalized_shape: int | Sequence[int] | None,
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
        self.normalized_shape = _shape(normalized_shape, elementwise_affine)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.scale_offset = float(scale_offset)
        self.cast_before_scale = int(cast_before_scale)
        self._set_axis(axis)
        _add_weight(self, "weight", self.normalized_shape, elementwise_affine, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_offset_weight(self)

    def parameters_for_op(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.weight, None

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}" + self._extra()
        )


class LayerNorm(NormBase):
    """``torch.nn.LayerNorm`` with the same parameters and state_dict (``weight``, ``bias``;
    ``elementwise_affine`` and ``bias`` flags as in torch), plus ``cast_before_scale``
    (rounding order for float16/bfloat16; 0, torch's own order, by default) and ``axis``.
    Without weights ``normalized_shape`` may be None (the trailing ``-axis`` dims, any size).

    Exported by :func:`onnxnorm.export` as one ``onnxnorm::LayerNorm`` node.
    """

    op, skip_op, sandwich_op, kind = "LayerNorm", "SkipLayerNorm", "SandwichLayerNorm", "layer"

    def __init__(
        self,
        normalized_shape: int | Sequence[int] | None,
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
        self.normalized_shape = _shape(normalized_shape, elementwise_affine)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.cast_before_scale = int(cast_before_scale)
        self._set_axis(axis)
        _add_weight(self, "weight", self.normalized_shape, elementwise_affine, device, dtype)
        _add_weight(self, "bias", self.normalized_shape, elementwise_affine and bias, device, dtype)
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


ACTIVATIONS = ("silu", "sigmoid")


class GatedRMSNorm(torch.nn.Module):
    """RMSNorm with a gate, over groups of the last dimension: the norm of hybrid and
    linear-attention LLMs, with the ``weight`` and the call ``forward(hidden_states, gate=None)``
    of the Hugging Face classes. Exported by :func:`onnxnorm.export` as one
    ``onnxnorm::GatedRMSNorm`` node.

    * ``hidden_size``: the size of ``weight``. The input's last dimension is ``hidden_size``, or
      a multiple of it when ``group_size`` is ``hidden_size`` (one head's weight shared by every
      head of a flattened ``[..., heads * head_dim]`` input).
    * ``group_size``: statistics over each run of ``group_size`` values (Mamba2's
      ``hidden_size // n_groups``); None: over the whole last dimension.
    * ``activation``: ``"silu"`` (Qwen3-Next, Mamba2, ...) or ``"sigmoid"`` (Kimi Linear), in
      float32 of float32(gate).
    * ``norm_before_gate``: True normalizes, scales, then multiplies by act(gate) (Qwen3-Next,
      Kimi Linear); False multiplies float32(x) by act(gate) first, unrounded (Mamba2,
      Nemotron-H, Bamba, Zamba2, GraniteMoeHybrid; Falcon-H1 has either).
    * ``scale_offset``: added to the weight (1: zero-centred weights, which start at 0).
    * ``cast_before_scale``: 1 (order A, the default: Qwen3-Next and the Mamba2 family) rounds
      the normalized value, the scale and their product to the input's type, then applies the
      gate in float32 and rounds once more; 0 (order B: Kimi Linear, Falcon-H1) computes in
      float32 and rounds once. The orders differ only in float16/bfloat16.

    Without a gate it is a grouped RMSNorm.
    """

    op = "GatedRMSNorm"

    def __init__(
        self,
        hidden_size: int,
        group_size: int | None = None,
        eps: float = 1e-6,
        activation: str = "silu",
        norm_before_gate: bool = True,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        scale_offset: float = 0.0,
        cast_before_scale: int = 1,
    ):
        super().__init__()
        if not isinstance(hidden_size, _INTEGER) or hidden_size < 1:
            raise ValueError(f"hidden_size must be a positive integer, got {hidden_size!r}")
        self.hidden_size = int(hidden_size)
        group = self.hidden_size if group_size is None else group_size
        if not isinstance(group, _INTEGER) or group < 1 or self.hidden_size % group:
            raise ValueError(
                f"group_size must be a positive divisor of hidden_size {hidden_size}, got "
                f"{group_size!r}"
            )
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.group_size = int(group)
        self.eps = float(eps)
        self.activation = activation
        self.norm_before_gate = bool(norm_before_gate)
        self.elementwise_affine = elementwise_affine
        self.scale_offset = float(scale_offset)
        self.cast_before_scale = int(cast_before_scale)
        _add_weight(self, "weight", (self.hidden_size,), elementwise_affine, device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_offset_weight(self)

    def check_input(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> None:
        _check_float(self, x)
        last = x.shape[-1] if x.dim() else 0
        shared = self.group_size == self.hidden_size and last and last % self.hidden_size == 0
        if last != self.hidden_size and not shared:
            raise ValueError(
                f"{type(self).__name__} over {self.hidden_size} (groups of {self.group_size}) "
                f"got an input of shape {tuple(x.shape)}"
            )
        if gate is not None:
            _check_float(self, gate, "gate")
            # a float32 input may come with a half-precision gate (Mamba2's scan output is
            # float32, its gate of the model's type): the gate is taken to float32, exactly
            exact = gate.dtype == x.dtype or x.dtype == torch.float32
            if gate.shape != x.shape or not exact:
                raise ValueError(
                    f"{type(self).__name__}: the gate must have the input's shape and type (or "
                    f"the input be float32), got {gate.dtype} {tuple(gate.shape)} for "
                    f"{x.dtype} {tuple(x.shape)}"
                )

    def attributes(self, x: torch.Tensor) -> dict[str, Any]:
        """The catalogue attributes of this norm for the input ``x``."""
        return {
            "axis": -1,
            "epsilon": self.eps,
            "cast_before_scale": self.cast_before_scale,
            "scale_offset": self.scale_offset,
            "group_size": 0 if self.group_size == x.shape[-1] else self.group_size,
            "activation": ACTIVATIONS.index(self.activation),
            "norm_before_gate": int(self.norm_before_gate),
        }

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None):
        self.check_input(hidden_states, gate)
        weight = self.weight
        if gate is not None and gate.dtype != hidden_states.dtype:
            gate = gate.float()
        if weight is not None and weight.dtype not in (hidden_states.dtype, torch.float32):
            weight = weight.float()  # the op takes a Scale of the input's type or float32
        return call(self.op, hidden_states, weight, gate, **self.attributes(hidden_states))

    def extra_repr(self) -> str:
        text = f"{self.hidden_size}, group_size={self.group_size}, eps={self.eps}"
        text += f", activation={self.activation!r}, norm_before_gate={self.norm_before_gate}"
        if not self.elementwise_affine:
            text += ", elementwise_affine=False"
        if self.scale_offset:
            text += f", scale_offset={self.scale_offset}"
        return text + f", cast_before_scale={self.cast_before_scale}"


class L2Norm(torch.nn.Module):
    """L2 normalization with an epsilon, ``x / sqrt(sum(x^2) + eps)`` over the trailing
    ``-axis`` dimensions (default: the last) of any size, statistics in float32 and one rounding
    to the input's type: FLA's ``l2norm``, the query and key norm of gated delta-rule linear
    attention (Qwen3-Next, Kimi Linear). No parameters. Exported by :func:`onnxnorm.export` as
    one ``onnxnorm::L2Norm`` node.

    Llama 4's ``Llama4TextL2Norm`` is not this op despite its name: it divides by the root of
    the *mean* square, an :class:`RMSNorm` without weight.
    """

    op = "L2Norm"

    def __init__(self, eps: float = 1e-6, axis: int = -1):
        super().__init__()
        if int(axis) >= 0:
            raise ValueError(f"axis must be negative (counted from the back), got {axis}")
        self.eps = float(eps)
        self.axis = int(axis)

    def check_input(self, x: torch.Tensor) -> None:
        _check_float(self, x)
        if x.dim() < -self.axis:
            raise ValueError(
                f"L2Norm over the last {-self.axis} dimension(s) got an input of shape "
                f"{tuple(x.shape)}"
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return call(self.op, x, axis=self.axis, epsilon=self.eps)

    def extra_repr(self) -> str:
        return f"eps={self.eps}" + (f", axis={self.axis}" if self.axis != -1 else "")


#: the norms whose residual add can be fused with them (:mod:`onnxnorm.nn.residual`)
RESIDUAL_NORM_TYPES = (RMSNorm, LayerNorm)
#: every onnxnorm norm module: each exports as one onnxnorm node
NORM_TYPES = (RMSNorm, LayerNorm, GatedRMSNorm, L2Norm)

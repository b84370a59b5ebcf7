"""Which onnxnorm configuration a norm module computes, found by running it: :func:`probe`.

A copy of the module, with random weights, runs on random inputs (and a random gate, for a
module whose forward takes one) and is compared with every candidate :class:`Config`: RMSNorm
or LayerNorm, scale offset 0 or 1 (Gemma's ``1 + weight``), statistics over all or only the
last weight dims (Cohere's per-head Q/K norm), epsilon; for a norm without weights also L2Norm;
for a gated norm the GatedRMSNorm configurations (SiLU or sigmoid, the gate after or before the
norm, the group size from its ``group_size`` or ``n_groups`` attribute, else every divisor of
the weight's size, scale offset 0 or 1). float32 settles the configuration; float16 and
bfloat16 then settle the rounding order (``cast_before_scale``: order A rounds the normalized
value before the scale, as Llama and T5 do; order B rounds once, as Gemma, Cohere and torch
do), which only shows in half precision. A norm without weights and without a size (Llama 4's
``Llama4TextL2Norm``) is probed on a stand-in size (:data:`ANY_SIZE_PROBE`) and is a norm of
any size. A module that matches no candidate raises :class:`ProbeFailure` with the reason.

:func:`onnxnorm.convert` (``converter.py``) probes the modules that look like norms and builds
each replacement from its :class:`Config`.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
from collections.abc import Iterable
from typing import Any

import torch

from onnxnorm.errors import first_line
from onnxnorm.nn.functional import call
from onnxnorm.nn.modules import ACTIVATIONS, GatedRMSNorm, L2Norm, LayerNorm, RMSNorm

#: attributes that hold a norm's epsilon, in the order they are looked up
EPS_ATTRIBUTES = (
    "eps",
    "variance_epsilon",
    "epsilon",
    "layer_norm_eps",
    "rms_norm_eps",
    "layer_norm_epsilon",
)
#: epsilons tried when a module has none of those attributes
EPS_CANDIDATES = (1e-5, 1e-6, 1e-12, 1e-8, 1e-3, 1e-4, 1e-7, 1e-10)
#: attributes that hold a weightless norm's normalized shape
SHAPE_ATTRIBUTES = ("normalized_shape", "hidden_size", "dim", "size")
#: the trailing dims a norm without weights and without a size is probed on
ANY_SIZE_PROBE = (4, 16)
#: op names of Config.kind
OPS = {"rms": "RMSNorm", "layer": "LayerNorm", "l2": "L2Norm", "gated": "GatedRMSNorm"}


@dataclasses.dataclass(frozen=True)
class Config:
    """An onnxnorm norm configuration that a module was found to compute."""

    kind: str  # a key of OPS: "rms", "layer", "l2" or "gated"
    #: the parameters' shape (normalized_shape); None for a norm without weights of any size
    shape: tuple[int, ...] | None
    axis: int
    eps: float | None
    scale_offset: float = 0.0
    cast_before_scale: int = 0
    weight: bool = True
    bias: bool = False
    #: GatedRMSNorm: the group size, the gate's activation and where the gate applies
    group_size: int = 0
    activation: str = "silu"
    norm_before_gate: bool = True
    #: what the probe could not settle exactly (empty when it reproduced the module bit for bit)
    note: str = dataclasses.field(default="", compare=False)

    def attributes(self, x: torch.Tensor) -> dict[str, Any]:
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        attrs: dict[str, Any] = {"axis": self.axis, "epsilon": eps}
        if self.kind == "l2":
            return attrs
        attrs["cast_before_scale"] = self.cast_before_scale
        if self.kind in ("rms", "gated"):
            attrs["scale_offset"] = self.scale_offset
        if self.kind == "gated":
            attrs["group_size"] = 0 if self.group_size == x.shape[-1] else self.group_size
            attrs["activation"] = ACTIVATIONS.index(self.activation)
            attrs["norm_before_gate"] = int(self.norm_before_gate)
        return attrs

    def run(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.kind == "l2":
            return call("L2Norm", x, **self.attributes(x))
        if self.kind == "gated":
            return call("GatedRMSNorm", x, weight, gate, **self.attributes(x))
        return call(OPS[self.kind], x, weight, bias, **self.attributes(x))

    def build(self) -> torch.nn.Module:
        if self.kind == "gated":
            if self.shape is None or self.eps is None:
                raise ValueError("a GatedRMSNorm configuration has a shape and an epsilon")
            return GatedRMSNorm(
                self.shape[0],
                group_size=self.group_size,
                eps=self.eps,
                activation=self.activation,
                norm_before_gate=self.norm_before_gate,
                elementwise_affine=self.weight,
                scale_offset=self.scale_offset,
                cast_before_scale=self.cast_before_scale,
                device="meta",
            )
        if self.kind == "l2":
            if self.eps is None:
                raise ValueError("an L2Norm configuration has an epsilon")
            return L2Norm(eps=self.eps, axis=self.axis)
        if self.kind == "rms":
            return RMSNorm(
                self.shape,
                eps=self.eps,
                elementwise_affine=self.weight,
                scale_offset=self.scale_offset,
                cast_before_scale=self.cast_before_scale,
                axis=self.axis,
                device="meta",
            )
        return LayerNorm(
            self.shape,
            eps=self.eps if self.eps is not None else 1e-5,
            elementwise_affine=self.weight or self.bias,
            bias=self.bias,
            cast_before_scale=self.cast_before_scale,
            axis=self.axis,
            device="meta",
        )

    def describe(self) -> str:
        if self.shape is None:
            size = "last dim" if self.axis == -1 else f"last {-self.axis} dims"
            parts = [size] if self.kind != "l2" else []
        else:
            parts = [f"{list(self.shape)}"]
        parts.append(f"eps={self.eps:g}" if self.eps is not None else "eps=None")
        if self.kind == "l2":
            parts += [f"axis={self.axis}"] if self.axis != -1 else []
            return f"L2Norm({', '.join(parts)})"
        if self.shape is not None and self.axis != -len(self.shape):
            parts.append(f"axis={self.axis}")
        if self.kind == "gated":
            if self.shape is not None and self.group_size != self.shape[0]:
                parts.append(f"group_size={self.group_size}")
            parts.append(self.activation)
            parts.append("norm then gate" if self.norm_before_gate else "gate then norm")
        if self.scale_offset:
            parts.append(f"scale_offset={self.scale_offset:g}")
        if not self.weight:
            parts.append("no weight")
        if self.kind == "layer" and not self.bias:
            parts.append("no bias")
        parts.append("order A" if self.cast_before_scale else "order B")
        return f"{OPS[self.kind]}({', '.join(parts)})"


def eps_of(module: torch.nn.Module) -> float | None:
    """The module's epsilon, from the first of :data:`EPS_ATTRIBUTES` it has (None: none)."""
    for name in EPS_ATTRIBUTES:
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def _shape_of(module: torch.nn.Module) -> tuple[int, ...] | None:
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() >= 1:
        return tuple(weight.shape)
    for name in SHAPE_ATTRIBUTES:
        value = getattr(module, name, None)
        if isinstance(value, int) and value > 0:
            return (value,)
        if (
            isinstance(value, (tuple, list, torch.Size))
            and value
            and all(isinstance(d, int) for d in value)
        ):
            return tuple(value)
    return None


def _takes_gate(module: torch.nn.Module) -> bool:
    """Whether the module's forward takes a ``gate`` argument (the gated RMSNorms)."""
    try:
        return "gate" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


def _has_parameter(module: torch.nn.Module, name: str) -> bool:
    """Whether ``name`` is a parameter of ``module`` itself (a buffer of that name, such as
    Falcon-Mamba's unused all-ones ``weight``, is not: the replacement could not share it)."""
    return name in dict(module.named_parameters(recurse=False))


def _candidates(module: torch.nn.Module, shape: tuple[int, ...]) -> Iterable[Config]:
    weight = _has_parameter(module, "weight")
    bias = _has_parameter(module, "bias")
    eps = eps_of(module)
    name = type(module).__name__.lower()
    kinds: tuple[str, ...] = (
        ("layer", "rms") if "layer" in name and "rms" not in name else ("rms", "layer")
    )
    if not weight and not bias:
        kinds += ("l2",)
    epsilons = (eps,) if eps is not None else EPS_CANDIDATES
    for e in epsilons:
        for kind in kinds:
            for axis in range(-1, -len(shape) - 1, -1)[::-1]:
                offsets = (0.0, 1.0) if kind == "rms" and weight else (0.0,)
                for offset in offsets:
                    if kind == "rms" and bias:
                        continue  # an RMSNorm with a bias is not a norm any known model uses
                    yield Config(kind, shape, axis, e, offset, 0, weight, bias)


def _gated_candidates(module: torch.nn.Module, shape: tuple[int, ...]) -> Iterable[Config]:
    """GatedRMSNorm configurations, the ones the module's attributes name first."""
    hidden = shape[0]
    weight = _has_parameter(module, "weight")
    eps = eps_of(module)
    groups = []
    size, count = getattr(module, "group_size", None), getattr(module, "n_groups", None)
    if isinstance(size, int) and size > 0:
        groups.append(size)
    if isinstance(count, int) and count > 0 and hidden % count == 0:
        groups.append(hidden // count)
    groups += [d for d in range(hidden, 0, -1) if hidden % d == 0]  # the whole extent first
    groups = [g for i, g in enumerate(groups) if hidden % g == 0 and g not in groups[:i]]
    activations = (
        ACTIVATIONS[::-1] if getattr(module, "activation", None) == "sigmoid" else ACTIVATIONS
    )
    places = (False, True) if getattr(module, "norm_before_gate", None) is False else (True, False)
    for e in (eps,) if eps is not None else EPS_CANDIDATES:
        for group in groups:
            for activation in activations:
                for norm_first in places:
                    for offset in (0.0, 1.0) if weight else (0.0,):
                        yield Config(
                            "gated",
                            shape,
                            -1,
                            e,
                            offset,
                            0,
                            weight,
                            False,
                            group,
                            activation,
                            norm_first,
                        )


class ProbeFailure(Exception):
    """The module computes no onnxnorm configuration; the message says why."""


def _run(
    module: torch.nn.Module, x: torch.Tensor, gate: torch.Tensor | None = None
) -> torch.Tensor:
    try:
        y = module(x) if gate is None else module(x, gate)
    except Exception as error:  # noqa: BLE001 - the module cannot be called as a norm: report why
        what = "a tensor input and a gate" if gate is not None else "a tensor input"
        raise ProbeFailure(
            f"its forward fails on {what} ({type(error).__name__}: {first_line(error, '')})"
        ) from None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        raise ProbeFailure("its forward does not return a tensor of its input's shape")
    return y


def _cpu_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` on the CPU to probe; its weights are overwritten by the probe, so a
    module on the meta device (weights not loaded yet) gets uninitialized storage."""
    if any(t.is_meta for t in module.parameters(recurse=False)):
        return copy.deepcopy(module).to_empty(device="cpu")
    return copy.deepcopy(module).to("cpu")


def probe(module: torch.nn.Module, seed: int = 0) -> Config:
    """The onnxnorm configuration that ``module`` computes, found by running a copy of it with
    random weights (and a random gate, for a module whose forward takes one); raises
    ``ProbeFailure`` with the reason when none matches."""
    gated = _takes_gate(module)
    shape = _shape_of(module)
    any_size = False
    if shape is None:
        if gated or any(True for _ in module.parameters(recurse=False)):
            raise ProbeFailure(
                "cannot tell its normalized shape (no weight and no "
                "normalized_shape/hidden_size attribute)"
            )
        shape, any_size = ANY_SIZE_PROBE, True  # no weights: the same norm at any size
    if gated and len(shape) != 1:
        raise ProbeFailure(
            f"a gated norm with a weight of shape {list(shape)}: GatedRMSNorm takes a 1-D weight"
        )
    generator = torch.Generator().manual_seed(seed)
    probe_module = _cpu_copy(module).float()
    params = dict(probe_module.named_parameters(recurse=False))
    with torch.no_grad():
        if "weight" in params:
            params["weight"].copy_(
                1.0 + 0.5 * torch.randn(params["weight"].shape, generator=generator)
            )
        if "bias" in params:
            params["bias"].copy_(torch.randn(params["bias"].shape, generator=generator))
        weight, bias = params.get("weight"), params.get("bias")
        x = 3.0 * torch.randn((2, 3) + shape, generator=generator) + 0.5
        tiny = 1e-3 * torch.randn((2, 3) + shape, generator=generator)
        gate = 2.0 * torch.randn(x.shape, generator=generator) if gated else None
        want, want_tiny = _run(probe_module, x, gate), _run(probe_module, tiny, gate)
        if want.dtype != torch.float32:
            raise ProbeFailure(f"its forward turns float32 into {want.dtype}")
        candidates = _gated_candidates(module, shape) if gated else _candidates(module, shape)
        matches = []
        for config in candidates:
            if torch.allclose(
                config.run(x, weight, bias, gate), want, rtol=1e-4, atol=1e-4
            ) and torch.allclose(
                config.run(tiny, weight, bias, gate), want_tiny, rtol=1e-3, atol=1e-4
            ):
                matches.append(config)
                break
        if not matches:
            raise ProbeFailure(
                "its forward matches no onnxnorm configuration (GatedRMSNorm: SiLU or sigmoid "
                "gate, after or before the norm, in groups that divide the weight, scale offset "
                "0 or 1)"
                if gated
                else "its forward matches no onnxnorm configuration (RMSNorm or "
                "LayerNorm, scale offset 0 or 1, over the weight's dims)"
            )
        config = matches[0]
        if any_size:
            config = dataclasses.replace(config, shape=None)
        order, note = _rounding_order(module, config, x, gate, generator)
        return dataclasses.replace(config, cast_before_scale=order, note=note)


def _rounding_order(
    module: torch.nn.Module,
    config: Config,
    x: torch.Tensor,
    gate: torch.Tensor | None,
    generator: torch.Generator,
) -> tuple[int, str]:
    """0 (order B) or 1 (order A): which one reproduces the module bit for bit in bfloat16 and
    float16 (the orders differ only there; order B when neither half type runs or tells), and a
    note when neither does exactly."""
    mismatches, total, tried = {0: 0, 1: 0}, 0, []
    for dtype in (torch.bfloat16, torch.float16):
        half = _cpu_copy(module).to(dtype)
        params = dict(half.named_parameters(recurse=False))
        if "weight" in params:  # weights far from 1, so that the order shows in the last bit
            params["weight"].copy_(
                1.0 + 2.0 * torch.randn(params["weight"].shape, generator=generator)
            )
        xh = x.to(dtype)
        gh = gate.to(dtype) if gate is not None else None
        try:
            want = half(xh) if gh is None else half(xh, gh)
        except Exception:  # noqa: BLE001 - a module without this half type tells no order
            continue
        if not isinstance(want, torch.Tensor) or want.dtype != dtype:
            continue
        for order in (0, 1):
            got = dataclasses.replace(config, cast_before_scale=order).run(
                xh, params.get("weight"), params.get("bias"), gh
            )
            mismatches[order] += int((got != want).sum())
        total += want.numel()
        tried.append(str(dtype).removeprefix("torch."))
    order = 1 if mismatches[1] < mismatches[0] else 0
    if not tried:
        return order, "rounding order not determined: the module does not run in half precision"
    if mismatches[order]:
        return order, (
            f"not bit-exact in {'/'.join(tried)}: {mismatches[order]} of {total} elements differ"
        )
    return order, ""

"""``onnxnorm.convert(model)``: replace the norm modules of an existing model with onnxnorm's.

torch.nn.LayerNorm and torch.nn.RMSNorm map directly. Any other module that looks like a norm
(its class name says so, or it has only ``weight``/``bias`` parameters and an epsilon) is
identified by probing its forward (``probe.py``: a copy of it with random weights against every
candidate onnxnorm configuration, float32 for the configuration, float16 and bfloat16 for the
rounding order). A module that matches no candidate is left in place and reported.

A module whose forward takes a ``gate`` argument (``forward(hidden_states, gate=None)``: the
gated RMSNorms of Qwen3-Next, Qwen3.5, Kimi Linear, Mamba2, Nemotron-H, Bamba, Zamba2,
GraniteMoeHybrid and Falcon-H1) is probed with a random gate against the GatedRMSNorm
configurations and replaced by :class:`onnxnorm.nn.GatedRMSNorm`, which keeps that call. A
norm without weights and without a size (Llama 4's ``Llama4TextL2Norm``) is replaced by a norm
of any size.

The replacement takes over the original's Parameter objects, so state_dict keys, tied weights
and optimizers stay as they were.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from onnxnorm.errors import OnnxNormError
from onnxnorm.nn.modules import NORM_TYPES

# ``X as X``: names of this module before probe.py, importable from here as before
from onnxnorm.nn.probe import (
    ANY_SIZE_PROBE as ANY_SIZE_PROBE,
    EPS_ATTRIBUTES as EPS_ATTRIBUTES,
    EPS_CANDIDATES as EPS_CANDIDATES,
    OPS as OPS,
    SHAPE_ATTRIBUTES as SHAPE_ATTRIBUTES,
    Config,
    ProbeFailure,
    eps_of,
    probe,
)

#: norms with no onnxnorm op: left in place with this reason
UNSUPPORTED = {
    torch.nn.modules.batchnorm._BatchNorm: "BatchNorm: exported as the standard "
    "BatchNormalization (no onnxnorm op; the fusion pipeline folds it into a neighbouring layer)",
    torch.nn.GroupNorm: "GroupNorm: no onnxnorm op (statistics over channel groups)",
    torch.nn.modules.instancenorm._InstanceNorm: "InstanceNorm: no onnxnorm op (statistics "
    "over spatial dims per channel)",
    torch.nn.LocalResponseNorm: "LocalResponseNorm: no onnxnorm op",
}
#: layer types that are never norms (they have weight and bias too)
NOT_NORMS = (
    torch.nn.Linear,
    torch.nn.Embedding,
    torch.nn.EmbeddingBag,
    torch.nn.modules.conv._ConvNd,
    torch.nn.MultiheadAttention,
)


@dataclasses.dataclass(frozen=True)
class Replaced:
    name: str
    original: str
    replacement: str
    how: str  # "direct" (torch.nn class) or "probe"


@dataclasses.dataclass(frozen=True)
class Left:
    name: str
    original: str
    reason: str


@dataclasses.dataclass
class ConversionReport:
    """What :func:`convert` replaced, and what it left in place and why."""

    replaced: list[Replaced] = dataclasses.field(default_factory=list)
    left: list[Left] = dataclasses.field(default_factory=list)
    already: list[str] = dataclasses.field(default_factory=list)

    @property
    def found(self) -> int:
        return len(self.replaced) + len(self.left) + len(self.already)

    def __str__(self) -> str:
        if not self.found:
            return "no norm modules found: nothing to convert"
        lines = [
            f"replaced {len(self.replaced)} norm module(s)"
            + (f", {len(self.already)} already onnxnorm" if self.already else "")
            + f", left {len(self.left)}"
        ]
        for r in self.replaced:
            lines.append(
                f"  replaced {r.name or '<model>'}: {r.original} -> {r.replacement} ({r.how})"
            )
        for item in self.left:
            lines.append(f"  left {item.name or '<model>'}: {item.original}: {item.reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "replaced": [dataclasses.asdict(r) for r in self.replaced],
            "left": [dataclasses.asdict(item) for item in self.left],
            "already_onnxnorm": list(self.already),
        }


def _direct(module: torch.nn.Module) -> Config | None:
    """The configuration of torch's own norm modules (no probe needed); subclasses that
    override forward (float32 wrappers and the like) are probed instead."""
    if (
        isinstance(module, torch.nn.LayerNorm)
        and type(module).forward is torch.nn.LayerNorm.forward
    ):
        shape = tuple(module.normalized_shape)
        return Config(
            "layer",
            shape,
            -len(shape),
            float(module.eps),
            weight=module.weight is not None,
            bias=module.bias is not None,
        )
    if isinstance(module, torch.nn.RMSNorm) and type(module).forward is torch.nn.RMSNorm.forward:
        shape = tuple(module.normalized_shape)
        return Config("rms", shape, -len(shape), module.eps, weight=module.weight is not None)
    return None


def _looks_like_norm(module: torch.nn.Module) -> bool:
    if isinstance(module, NOT_NORMS) or list(module.children()):
        return False
    if "norm" in type(module).__name__.lower():
        return True
    names = {name for name, _ in module.named_parameters(recurse=False)}
    return bool(names) and names <= {"weight", "bias"} and eps_of(module) is not None


def _named_like_norm(module: torch.nn.Module) -> bool:
    return type(module).__name__.lower().endswith(("norm", "normgated"))


def _holds_layers(module: torch.nn.Module) -> str:
    """Why a module named like a norm that holds other layers is left as it is."""
    kinds = sorted({type(child).__name__ for child in module.children()})
    return (
        f"it holds other layers ({', '.join(kinds)}): not one norm op (an adaptive or "
        "modulated norm, or a block); the norms inside it are converted on their own"
    )


def _parents(model: torch.nn.Module) -> Iterable[torch.nn.Module]:
    seen = set()
    for module in model.modules():
        if id(module) not in seen:
            seen.add(id(module))
            yield module


def convert(model: torch.nn.Module, *, seed: int = 0) -> ConversionReport:
    """Replaces, in place, every norm module of ``model`` that an onnxnorm module can compute
    exactly (same outputs, same parameters and state_dict keys) and returns the report of what
    was replaced and what was left and why. See the module docstring for how norms are found."""
    if not isinstance(model, torch.nn.Module):
        raise OnnxNormError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    report = ConversionReport()
    replacements: dict[int, torch.nn.Module] = {}
    for name, module in model.named_modules():
        if isinstance(module, NORM_TYPES):
            report.already.append(name)
            continue
        unsupported = next(
            (reason for cls, reason in UNSUPPORTED.items() if isinstance(module, cls)), None
        )
        if unsupported:
            report.left.append(Left(name, type(module).__name__, unsupported))
            continue
        config, how = _direct(module), "direct"
        if config is None:
            if not _looks_like_norm(module):
                if _named_like_norm(module) and list(module.children()):
                    report.left.append(Left(name, type(module).__name__, _holds_layers(module)))
                continue
            how = "probe"
            try:
                config = probe(module, seed)
            except ProbeFailure as failure:
                report.left.append(Left(name, type(module).__name__, str(failure)))
                continue
            notes = [f"epsilon {config.eps:g} guessed"] if eps_of(module) is None else []
            notes += [config.note] if config.note else []
            if notes:
                how = f"probe ({'; '.join(notes)})"
        replacements[id(module)] = _replacement(module, config)
        report.replaced.append(Replaced(name, type(module).__name__, config.describe(), how))
    if replacements:
        for parent in list(_parents(model)):
            for child_name, child in list(parent._modules.items()):
                if child is not None and id(child) in replacements:
                    setattr(parent, child_name, replacements[id(child)])
        if id(model) in replacements:  # the model is itself a norm: it cannot replace itself
            report.replaced = [r for r in report.replaced if r.name]
            report.left.append(
                Left(
                    "",
                    type(model).__name__,
                    "the model itself is a norm "
                    "module: use the replacement onnxnorm module instead",
                )
            )
    return report


def _replacement(module: torch.nn.Module, config: Config) -> torch.nn.Module:
    new = config.build()
    for name in ("weight", "bias"):
        if getattr(new, name, None) is not None:
            setattr(new, name, getattr(module, name))
    new.train(module.training)
    return new


def replacement_for(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """The onnxnorm module that computes what ``module`` computes (sharing its parameters);
    raises OnnxNormError when there is none."""
    config = _direct(module)
    if config is None:
        try:
            config = probe(module, seed)
        except ProbeFailure as failure:
            raise OnnxNormError(f"{type(module).__name__}: {failure}") from None
    return _replacement(module, config)

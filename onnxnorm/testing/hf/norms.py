"""The norm classes of the installed transformers, found by reading its model modules, and tiny
instances of them.

No class name is typed here: :func:`norm_classes` reads every ``transformers/models/*/
modeling_*.py`` for the classes whose name ends in ``Norm`` or ``NormGated`` (``LlamaRMSNorm``,
``T5LayerNorm``, ``Mamba2RMSNormGated``, ``Llama4TextL2Norm``, ...) and the functions whose name
ends in ``l2norm`` (FLA's, which the linear-attention families call on their queries and keys),
so a class added or renamed by a transformers release is found without an edit here. Reading
the files (not importing them) takes under a second; a class is imported only when it is built.

:func:`variants` gives the ways to build one: the defaults, and each boolean constructor
argument flipped (``norm_before_gate``, ``with_scale``, ``elementwise_affine``, ...).
:func:`build` makes a tiny instance from the constructor's signature alone, or raises
:class:`NotBuildable` with the reason.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

#: a top-level norm class of a modeling module: its name, its bases and its body
_CLASS = re.compile(r"^class (\w*Norm(?:Gated)?)\(([^)]*)\):\n(.*?)(?=^\S|\Z)", re.M | re.S)
#: a top-level l2norm function (FLA's, copied into the linear-attention families)
_FUNCTION = re.compile(r"^def (\w*l2norm)\(", re.M)
#: a constructor flag for the scale: ``with_scale: bool = True``
_SCALE_FLAG = re.compile(r"\b\w*scale\w*\s*(?::\s*bool\s*)?=\s*(?:True|False)\b")
#: the bases of a norm layer (not of a decoder layer that merely ends in "Norm")
_LAYER_BASES = re.compile(r"^(torch\.)?nn\.(Module|\w*Norm\w*)$")
#: constructor arguments that hold the number of groups, and the size of one
_GROUP_COUNT = ("n_groups", "num_groups", "groups", "ngroups")
_GROUP_SIZE = ("group_size",)
#: an argument that names a size (filled with the width where it defaults to None)
_SIZE = re.compile(r"size|dim|shape|channels|features")


class _Groups:
    """Two groups, as a group count or a group size (the width is known only when built)."""

    def __repr__(self) -> str:
        return "2 groups"


GROUPS = _Groups()


class NotBuildable(Exception):
    """A norm class whose constructor this module cannot fill in; the message says why."""


@dataclasses.dataclass(frozen=True)
class NormClass:
    """A norm class (or l2norm function) of a transformers model module."""

    #: the folder under transformers/models (the module is modeling_<model_type>)
    model_type: str
    #: the class or function name
    name: str
    #: forward takes (hidden_states, gate)
    gated: bool = False
    function: bool = False
    #: a module class that creates no parameter (an L2 norm, a norm without scale)
    weightless: bool = False
    #: its constructor takes a flag for its scale (Gemma 3n's ``with_scale``)
    optional_scale: bool = False

    @property
    def hybrid(self) -> bool:
        """One of the norms of hybrid and linear-attention models and their kin: gated, an
        l2norm, weightless, or built with or without its scale."""
        return self.gated or self.function or self.weightless or self.optional_scale

    @property
    def module(self) -> str:
        return f"transformers.models.{self.model_type}.modeling_{self.model_type}"

    def load(self):
        """The class (or function); ImportError where its module does not import here."""
        return getattr(importlib.import_module(self.module), self.name)

    def __str__(self) -> str:
        return f"{self.model_type}.{self.name}"


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way to build a :class:`NormClass`: constructor keywords beside the defaults."""

    norm: NormClass
    overrides: tuple[tuple[str, Any], ...] = ()

    @property
    def gated(self) -> bool:
        return self.norm.gated

    @property
    def key(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.overrides)
        return f"{self.norm}({extra})" if extra else str(self.norm)

    def __str__(self) -> str:
        return self.key


def _models_folder() -> Path | None:
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "models"


@functools.cache
def norm_classes() -> tuple[NormClass, ...]:
    """Every norm class and l2norm function that the installed transformers defines, in the
    order of its model folders; empty without transformers."""
    folder = _models_folder()
    if folder is None:
        return ()
    found = []
    for path in sorted(folder.glob("*/modeling_*.py")):
        model_type = path.parent.name
        if path.stem != f"modeling_{model_type}":
            continue  # a second modeling file of a folder (a variant's): its module differs
        text = path.read_text(encoding="utf-8")
        for match in _CLASS.finditer(text):
            name, bases, body = match.groups()
            if not all(_LAYER_BASES.match(b.strip()) for b in bases.split(",") if b.strip()):
                continue
            forward = re.search(r"def forward\(\s*self\s*,([^)]*)\)", body)
            gated = forward is not None and bool(re.search(r"\bgate\b", forward.group(1)))
            weightless = "Parameter(" not in body and "Module" in bases
            init = re.search(r"def __init__\(([^)]*)\)", body)
            flag = init is not None and bool(_SCALE_FLAG.search(init.group(1)))
            found.append(NormClass(model_type, name, gated, False, weightless, flag))
        for match in _FUNCTION.finditer(text):
            found.append(NormClass(model_type, match.group(1), function=True))
    return tuple(found)


def hybrid_variants() -> list[Variant]:
    """The variants of the norms of hybrid and linear-attention models: every gated norm class,
    every l2norm function and every weightless norm class (L2 norms, norms built without their
    scale), each way it builds (:func:`variants`). Imports those classes."""
    found = []
    for norm in norm_classes():
        if not norm.hybrid:
            continue
        try:
            ways = variants(norm)
        except ImportError:
            continue  # a model module that needs a package not installed here
        found += [v for v in ways if not norm.optional_scale or _drops_scale(v)]
    return found


def _drops_scale(variant: Variant) -> bool:
    """Whether the variant flips a class's scale off (Gemma 3n's ``with_scale=False``)."""
    return any(value is False and "scale" in name for name, value in variant.overrides)


def _parameters(cls) -> list[inspect.Parameter]:
    """The constructor's named parameters; for a class that passes ``*args, **kwargs`` to a
    torch norm it derives from (``class X(nn.LayerNorm)``), that norm's."""
    for owner in cls.__mro__:
        try:
            signature = inspect.signature(owner.__init__)
        except (TypeError, ValueError):
            return []
        named = [
            p
            for p in list(signature.parameters.values())[1:]
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if named or len(signature.parameters) == 1 or owner.__module__.startswith("torch."):
            return named
    return []


def variants(norm: NormClass) -> list[Variant]:
    """The ways to build ``norm``: its defaults, then each boolean constructor argument with a
    default flipped, one at a time, and each group argument that defaults to one group (None, or
    a count of 1) set to two groups (a function has one way). Imports the class."""
    if norm.function:
        return [Variant(norm)]
    cls = norm.load()
    found = [Variant(norm)]
    for parameter in _parameters(cls):
        if isinstance(parameter.default, bool):
            found.append(Variant(norm, ((parameter.name, not parameter.default),)))
        elif (parameter.name in _GROUP_SIZE and parameter.default is None) or (
            parameter.name in _GROUP_COUNT and parameter.default in (None, 1)
        ):
            found.append(Variant(norm, ((parameter.name, GROUPS),)))
    return found


def _config(model_type: str, hidden: int):
    from transformers import CONFIG_MAPPING

    try:
        config_class = CONFIG_MAPPING[model_type]
    except KeyError:
        raise NotBuildable(
            f"its constructor takes a config, and {model_type!r} names no config class"
        ) from None
    config = config_class()
    for owner in (config, getattr(config, "text_config", None)):
        if owner is not None and hasattr(owner, "hidden_size"):
            owner.hidden_size = hidden
    return config


def arguments(variant: Variant, hidden: int) -> dict[str, Any]:
    """The constructor keywords of a tiny ``variant``: the width ``hidden`` for each required
    size argument, two groups (a count of 2, or groups of ``hidden // 2``) for a required group
    argument or one a variant sets, a default
    config of the model type for a ``config`` argument (its hidden size set to ``hidden``),
    then the variant's overrides; :class:`NotBuildable` for a required argument of another
    kind."""
    kwargs: dict[str, Any] = {}
    for parameter in _parameters(variant.norm.load()):
        name = parameter.name
        if parameter.default is parameter.empty and name in _GROUP_SIZE + _GROUP_COUNT:
            kwargs[name] = GROUPS
        elif parameter.default is None and _SIZE.search(name):
            kwargs[name] = hidden  # a size that defaults to None (read from a config)
        elif parameter.default is not parameter.empty:
            continue
        elif name == "config":
            kwargs[name] = _config(variant.norm.model_type, hidden)
        elif parameter.annotation in (bool, "bool") or name.startswith(("is_", "use_")):
            raise NotBuildable(f"its constructor needs the flag {name!r}")
        else:  # a size: the width (hidden_size, dim, normalized_shape, num_channels, ...)
            kwargs[name] = hidden
    kwargs.update(variant.overrides)
    for name, value in kwargs.items():
        if value is GROUPS:  # two groups: a count of 2, or groups of half the width
            kwargs[name] = 2 if name in _GROUP_COUNT else hidden // 2
    return kwargs


def build(variant: Variant | NormClass, hidden: int = 16, *, seed: int = 1):
    """A tiny ``variant`` in eval mode, its weights (if any) drawn by
    :func:`~onnxnorm.testing.hf.weights.randomize_norms` from ``seed``; an l2norm function as
    a module.
    ``forward(x, gate)`` for a gated one, ``forward(x)`` for the others. Raises
    :class:`NotBuildable` (with the reason) where the constructor cannot be filled in or
    refuses the arguments."""
    import torch

    from onnxnorm.testing.hf.weights import randomize_norms

    if isinstance(variant, NormClass):
        variant = Variant(variant)
    built = variant.norm.load()
    if variant.norm.function:

        class Function(torch.nn.Module):
            def forward(self, x):
                return built(x)

        Function.__name__ = Function.__qualname__ = variant.norm.name
        return Function().eval()
    kwargs = arguments(variant, hidden)
    try:
        module = built(**kwargs)
    except Exception as error:  # noqa: BLE001 - any refusal of the constructor is the reason
        words = " ".join(str(error).split())[:200]
        raise NotBuildable(
            f"its constructor refuses {kwargs}: {type(error).__name__}: {words}"
        ) from None
    if not isinstance(module, torch.nn.Module):
        raise NotBuildable(f"it builds a {type(module).__name__}, not a torch module")
    return randomize_norms(module.eval(), seed)


__all__ = [
    "GROUPS",
    "NormClass",
    "NotBuildable",
    "Variant",
    "arguments",
    "build",
    "hybrid_variants",
    "norm_classes",
    "variants",
]

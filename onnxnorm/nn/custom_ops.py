"""What the catalogue's torch custom ops are built from, for the norm ops (``functional.py``)
and the rotary ops (``rotary_functional.py``) alike: the ``torch.library`` of the onnxnorm
domain they are defined in, the onnxscript opset their translations write nodes of, their names
in ``torch.ops.onnxnorm``, the signatures of their translations, and the catalogue's norm as
torch math, which both kinds of op compute.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import onnxscript
import torch

from onnxnorm.ops import catalogue, schemas

schemas.register()

#: an attribute's kind -> its type in a torch op schema
TORCH_TYPES = {"int": "int", "float": "float"}
_PY_TYPES = {"int": int, "float": float}
#: the onnxnorm domain as an onnxscript opset: ``getattr(OPSET, op)(...)`` writes one node
OPSET = onnxscript.values.Opset(catalogue.DOMAIN, catalogue.VERSION)
_LIBRARY = torch.library.Library(catalogue.DOMAIN, "DEF")


def snake_name(op: str) -> str:
    """``SkipRMSNorm`` -> ``skip_rms_norm``: the op's name in ``torch.ops.onnxnorm``."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", op).lower()


def define(
    name: str,
    schema: str,
    implementation: Callable[..., Any],
    fake: Callable[..., Any],
) -> Any:
    """``torch.ops.onnxnorm.<name>``, defined with ``schema`` (its parameters and results), the
    eager ``implementation`` and the ``fake`` that gives its outputs' shapes while tracing."""
    _LIBRARY.define(name + schema)
    _LIBRARY.impl(name, implementation, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{catalogue.DOMAIN}::{name}", fake, lib=_LIBRARY)
    return getattr(torch.ops.onnxnorm, name)


def signature(spec: catalogue.OpSpec, inputs: list[tuple[str, bool]]) -> inspect.Signature:
    """A translation's signature: ``inputs`` (name, whether it defaults to None), then the
    op's attributes with their defaults and Python types."""
    parameters = [
        inspect.Parameter(
            name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=None if optional else inspect.Parameter.empty,
        )
        for name, optional in inputs
    ]
    parameters += [
        inspect.Parameter(
            a.name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=a.default,
            annotation=_PY_TYPES[a.kind],
        )
        for a in spec.attributes
    ]
    return inspect.Signature(parameters)


def named(translate: Any, spec: catalogue.OpSpec, signature: inspect.Signature, name: str) -> Any:
    """``translate`` with what inspect.signature reports (onnxscript's converter reads it;
    typeshed's function type leaves out the __signature__ that inspect honours) and ``name``."""
    translate.__signature__ = signature
    translate.__annotations__ = {a.name: _PY_TYPES[a.kind] for a in spec.attributes}
    translate.__name__ = name
    return translate


def norm(
    spec: catalogue.OpSpec,
    z: torch.Tensor,
    dims: tuple[int, ...],
    args: dict[str, Any],
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """The catalogue's norm of ``z`` with its scale and bias, in z's type, as torch math."""
    zf = z.float()
    if spec.norm == "layer":
        zf = zf - zf.mean(dims, keepdim=True)
    normalized = zf * torch.rsqrt(zf.pow(2).mean(dims, keepdim=True) + args["epsilon"])
    offset = args.get("scale_offset", 0.0)
    # order A rounds to z's type before the scale, order B stays in float32 to the end
    work = z.dtype if args["cast_before_scale"] else torch.float32
    y = normalized.to(work)
    if scale is not None:
        y = y * (scale.to(work) + offset if offset else scale.to(work))
    elif offset:
        y = y * (1.0 + offset)
    if bias is not None:
        y = y + bias.to(work)
    return y.to(z.dtype)

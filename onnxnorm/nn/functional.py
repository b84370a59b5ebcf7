"""The catalogue ops on the torch side.

In eager mode each op is plain, differentiable torch math that follows the catalogue's semantics
(float32 statistics, the rounding order of ``cast_before_scale``). While ``torch.onnx.export``
traces the model, the same call goes through a ``torch.library`` custom op
(``torch.ops.onnxnorm.<snake_name>``) that the exporter turns into one onnxnorm node through
:data:`TRANSLATION_TABLE`. Schemas, signatures and the translation functions are all generated
from the catalogue, from the pieces of ``custom_ops.py``.

The norm ops are defined here; the rotary ops (``catalogue.ROTARY_OPS``: the Q/K norm and RoPE
of attention, each two custom ops, with K and of Q alone) in ``rotary_functional.py``. Both are
called through :func:`call`, and both are in :data:`TRANSLATION_TABLE`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from onnxnorm.nn import rotary_functional
from onnxnorm.nn.custom_ops import OPSET, TORCH_TYPES, define, named, norm, signature, snake_name

# ``X as X``: the rotary ops' torch helpers, public names of this module too
from onnxnorm.nn.rotary_functional import (
    partner as partner,
    rotary_output_shape as rotary_output_shape,
    rotate as rotate,
)
from onnxnorm.ops import catalogue


def _eager(spec: catalogue.OpSpec, args: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    x = args["X"]
    rank = x.dim()
    if not -rank <= args["axis"] < rank:
        raise ValueError(f"{spec.name}: axis {args['axis']} is out of range for rank {rank}")
    dims = tuple(range(args["axis"] % rank, rank))
    if spec.gated:
        return (_gated(spec, x, args["axis"] % rank, args, args["Scale"], args["Gate"]),)
    if spec.norm == "l2":
        zf = x.float()
        return (
            (zf * torch.rsqrt(zf.pow(2).sum(dims, keepdim=True) + args["epsilon"])).to(x.dtype),
        )
    if not spec.has_residual:
        return (norm(spec, x, dims, args, args["Scale"], args["Bias"]),)
    if spec.residual == "skip":
        total = args["alpha"] * args["Residual"].float() + x.float()
        if args["XBias"] is not None:
            total = total + args["XBias"].float()
    else:
        inner = norm(spec, x, dims, args, args["InnerScale"], args["InnerBias"])
        total = args["Residual"].float() + inner.float()
    z = total.to(x.dtype)
    return norm(spec, z, dims, args, args["Scale"], args["Bias"]), z


def activation(gate: torch.Tensor, kind: int) -> torch.Tensor:
    """A GatedRMSNorm gate's activation of float32(gate), in float32: 0 SiLU, 1 sigmoid (torch's
    own kernels, as the Hugging Face classes call them)."""
    g = gate.float()
    return torch.sigmoid(g) if kind == 1 else torch.nn.functional.silu(g)


def _gated(
    spec: catalogue.OpSpec,
    x: torch.Tensor,
    axis: int,
    args: dict[str, Any],
    scale: torch.Tensor | None,
    gate: torch.Tensor | None,
) -> torch.Tensor:
    """GatedRMSNorm as torch math: the gate's activation multiplied into float32(X) before the
    statistics (norm_before_gate = 0, not rounded) or into the scaled result after them; RMS
    statistics over each group of group_size values of the extent [axis, rank); the scale in
    the rounding order of cast_before_scale (order A: the normalized value, the scale and their
    product rounded to X's type, then the gate in float32 and one more rounding)."""
    shape = tuple(x.shape)
    extent = math.prod(shape[axis:])
    group = args["group_size"] or extent
    if group <= 0 or extent % group:
        raise ValueError(
            f"{spec.name}: group_size {group} does not divide the normalized extent {extent} of "
            f"X of shape {shape} from axis {axis}"
        )
    if gate is not None and (gate.shape != x.shape or gate.dtype != x.dtype):
        raise ValueError(
            f"{spec.name}: Gate must have X's type and shape, got {gate.dtype} "
            f"{tuple(gate.shape)} for X {x.dtype} {shape}"
        )
    act = activation(gate, args["activation"]) if gate is not None else None
    gate_first = act is not None and not args["norm_before_gate"]
    z = x.float() * act if gate_first else x.float()
    groups = z.reshape(shape[:axis] + (extent // group, group))
    normalized = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + args["epsilon"])
    # order A rounds to X's type before the scale, order B stays in float32 to the end
    work = x.dtype if args["cast_before_scale"] else torch.float32
    y = normalized.reshape(shape).to(work)
    offset = args["scale_offset"]
    if scale is not None:
        s = scale.to(work) + offset if offset else scale.to(work)
        if s.numel() == group and group != extent and shape[-1] != group:
            # one group's weight, shared by every group
            y = (y.reshape(-1, group) * s.reshape(group)).reshape(shape)
        else:
            y = y * s
    elif offset:
        y = y * (1.0 + offset)
    if act is not None and not gate_first:
        y = y.float() * act
    return y.to(x.dtype)


def _schema(spec: catalogue.OpSpec) -> str:
    params = [f"Tensor{'?' if p.optional else ''} {p.name}" for p in spec.inputs]
    params += [f"{TORCH_TYPES[a.kind]} {a.name}" for a in spec.attributes]
    results = ", ".join("Tensor" for _ in spec.outputs)
    return f"({', '.join(params)}) -> {'(' + results + ')' if len(spec.outputs) > 1 else results}"


def _define(spec: catalogue.OpSpec) -> tuple[Any, Any]:
    name = snake_name(spec.name)
    names = [p.name for p in spec.inputs] + [a.name for a in spec.attributes]

    def implementation(*args: Any) -> Any:
        result = _eager(spec, dict(zip(names, args)))
        return result if spec.has_residual else result[0]

    def fake(*args: Any) -> Any:
        x = args[0]
        # distinct tensors: outputs that alias each other make the exporter confuse them
        if spec.has_residual:
            return tuple(torch.empty_like(x) for _ in spec.outputs)
        return torch.empty_like(x)

    custom = define(name, _schema(spec), implementation, fake)
    bound_to = signature(spec, [(p.name, p.optional) for p in spec.inputs])

    def translate(*args: Any, **kwargs: Any) -> Any:
        bound = bound_to.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        inputs = [values[p.name] for p in spec.inputs]
        attrs = {a.name: values[a.name] for a in spec.attributes}
        return getattr(OPSET, spec.name)(*inputs, **attrs, _num_outputs=len(spec.outputs))

    return custom, named(translate, spec, bound_to, spec.name)


# The float ops: the quantized ones come from fusing a quantized graph, not from torch modules.
_OPS = {spec.name: _define(spec) for spec in catalogue.FLOAT_OPS.values()}

#: torch op overload -> onnxscript translation, for ``torch.onnx.export(custom_translation_table=)``
TRANSLATION_TABLE = {
    op.default: translate
    for op, translate in [
        *_OPS.values(),
        *(d for pair in rotary_functional.CUSTOM_OPS.values() for d in pair),
    ]
}


def call(op: str, *inputs: torch.Tensor | None, **attrs: Any) -> Any:
    """Runs catalogue op ``op``: eager torch math, or the custom op while exporting.

    ``inputs`` are positional in the catalogue's order (None for an absent optional input);
    attributes not given take their catalogue defaults. Returns Y, or (Y, Sum) for ops with a
    Residual; a rotary op (``catalogue.ROTARY_OPS``) returns (QOut, KOut), or QOut where K is
    None.
    """
    spec = catalogue.get(op)
    if op not in _OPS and op not in rotary_functional.CUSTOM_OPS:
        raise ValueError(f"{op} has no torch custom op (the quantized ops come from fusion)")
    unknown = set(attrs) - {a.name for a in spec.attributes}
    if unknown:
        raise TypeError(f"{op}: unknown attribute(s) {sorted(unknown)}")
    if len(inputs) > len(spec.inputs):
        raise TypeError(f"{op}: takes at most {len(spec.inputs)} inputs, got {len(inputs)}")
    inputs = tuple(inputs) + (None,) * (len(spec.inputs) - len(inputs))
    for p, value in zip(spec.inputs, inputs):
        if value is None and not p.optional:
            raise ValueError(f"{op}: input {p.name} is required")
    values = [attrs.get(a.name, a.default) for a in spec.attributes]
    if spec.rotary:
        return rotary_functional.call(spec, inputs, values)
    if torch.compiler.is_exporting():
        return _OPS[op][0](*inputs, *values)
    names = [p.name for p in spec.inputs] + [a.name for a in spec.attributes]
    result = _eager(spec, dict(zip(names, list(inputs) + values)))
    return result if spec.has_residual else result[0]

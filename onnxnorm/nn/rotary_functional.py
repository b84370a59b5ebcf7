"""The rotary ops (``catalogue.ROTARY_OPS``: the Q/K norm and RoPE of attention) on the torch
side, for ``functional.call``: their eager math and their torch custom ops.

A rotary op takes an optional K and gives KOut only where K is given; a torch custom op returns
a fixed number of tensors, so each rotary op is two custom ops: ``<snake_name>`` with K (the K
inputs required or optional as in the catalogue, outputs QOut and KOut) and ``<snake_name>_q``
for Q alone (no K, KScale or KBias; output QOut). Both translate to the same onnxnorm node, the
second with K left out and one output, as the fusion writes a node of Q alone.
"""

from __future__ import annotations

from typing import Any

import torch

from onnxnorm.nn.custom_ops import OPSET, TORCH_TYPES, define, named, norm, signature, snake_name
from onnxnorm.ops import catalogue

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _to_rows(x: torch.Tensor, args: dict[str, Any], op: str, name: str) -> torch.Tensor:
    """Q or K as [batch, seq, heads, head_size], from the op's layout."""
    head_size, layout = args["head_size"], args["layout"]
    if x.dim() == 3:
        if not head_size or x.shape[2] % head_size:
            raise ValueError(
                f"{op}: a 3-D {name} of shape {tuple(x.shape)} needs head_size (> 0) dividing "
                f"its last dim; head_size is {head_size}"
            )
        if layout == 1:
            raise ValueError(
                f"{op}: a 3-D {name} is [batch, seq, heads * head_size]: layout 0 or 2"
            )
        return x.unflatten(2, (x.shape[2] // head_size, head_size))
    if x.dim() != 4:
        raise ValueError(f"{op}: {name} must be 3-D or 4-D, got shape {tuple(x.shape)}")
    if head_size and x.shape[3] != head_size:
        raise ValueError(f"{op}: {name}'s heads are of size {x.shape[3]}, head_size is {head_size}")
    return x.transpose(1, 2) if layout == 1 else x


def rotary_output_shape(x: torch.Tensor, head_size: int, layout: int) -> tuple[Any, ...]:
    """The shape of a rotary op's output for Q or K ``x``: x's own (layout 0 and 1), or
    [batch, heads, seq, head_size] (layout 2, from 4-D or 3-D x)."""
    shape = tuple(x.shape)
    if layout != 2:
        return shape
    if len(shape) == 3:
        return (shape[0], shape[2] // head_size, shape[1], head_size)
    return (shape[0], shape[2], shape[1], shape[3])


def _angles(
    args: dict[str, Any], batch: int, seq: int, rotary_dim: int, op: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each token's angles, one per rotated value, in Cos's type:
    [batch or 1, seq, 1, rotary_dim] (a pair's two values share theirs where Cos holds one per
    pair; rows gathered by PositionIds where given)."""
    cos, sin, positions = args["Cos"], args["Sin"], args["PositionIds"]
    if cos.shape != sin.shape:
        raise ValueError(
            f"{op}: Cos and Sin differ in shape: {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    width = cos.shape[-1] if cos.dim() else 0
    if width not in (rotary_dim // 2, rotary_dim):
        raise ValueError(
            f"{op}: Cos's last dim must be rotary_dim / 2 = {rotary_dim // 2} (one angle per "
            f"pair) or rotary_dim = {rotary_dim} (one per value), got {width}"
        )
    if positions is not None:
        if cos.dim() != 2:
            raise ValueError(
                f"{op}: with PositionIds, Cos is [max_position, C], got {tuple(cos.shape)}"
            )
        if tuple(positions.shape) != (batch, seq):
            raise ValueError(
                f"{op}: PositionIds must be [batch, seq] = {(batch, seq)}, got "
                f"{tuple(positions.shape)}"
            )
        if positions.numel() and (positions.min() < 0 or positions.max() >= cos.shape[0]):
            raise ValueError(
                f"{op}: a position id is outside Cos's {cos.shape[0]} rows: "
                f"{int(positions.min())} to {int(positions.max())}"
            )
        cos, sin = cos[positions], sin[positions]
    elif cos.dim() != 3 or cos.shape[0] not in (1, batch) or cos.shape[1] != seq:
        raise ValueError(
            f"{op}: without PositionIds, Cos is per token, [batch or 1, seq, C] with batch "
            f"{batch} and seq {seq}, got {tuple(cos.shape)}"
        )
    if width != rotary_dim:  # one angle per pair: each of the pair's values takes it
        if args["interleaved"]:
            cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        else:
            cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return cos.unsqueeze(2), sin.unsqueeze(2)


def partner(x: torch.Tensor, interleaved: int) -> torch.Tensor:
    """The values each rotated value is rotated with, signed: rotate_half's cat(-x2, x1), or
    the pairs' (-x[2j + 1], x[2j])."""
    if interleaved:
        return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotary_dim: int,
    interleaved: int,
    in_t: int,
) -> torch.Tensor:
    """``x`` with the first ``rotary_dim`` values of each head rotated, in x's type: as eager
    PyTorch's ``x * cos + partner(x) * sin`` in x's type, the angles rounded to it (``in_t``),
    or in float32 and rounded once."""
    t = x.dtype
    head = x[..., :rotary_dim]
    other = partner(head, interleaved)
    if in_t and t != torch.float32:
        c, s = cos.to(t), sin.to(t)
        rotated = head * c + other * s
    else:
        rotated = (head.float() * cos.float() + other.float() * sin.float()).to(t)
    if rotary_dim == x.shape[-1]:
        return rotated
    return torch.cat([rotated, x[..., rotary_dim:]], dim=-1)


def _rotary_norm(
    spec: catalogue.OpSpec,
    rows: torch.Tensor,
    args: dict[str, Any],
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """The norm of a rotary op on ``rows`` [batch, seq, heads, head_size], in rows' type: over
    each head, or (per_head = 0) over each token's heads."""
    batch, seq, heads, head_size = rows.shape
    z = rows if args["per_head"] else rows.reshape(batch, seq, heads * head_size)

    def flat(w: torch.Tensor | None) -> torch.Tensor | None:
        if w is None:
            return None
        w = w.reshape(-1, head_size)
        if args["per_head"]:
            return w
        return w.expand(heads, head_size).reshape(heads * head_size)

    if spec.norm == "l2":
        zf = z.float()
        y = (zf * torch.rsqrt(zf.pow(2).sum(-1, keepdim=True) + args["epsilon"])).to(z.dtype)
    else:
        y = norm(spec, z, (-1,), args, flat(scale), flat(bias))
    return y.reshape(rows.shape)


def _rotary_check(spec: catalogue.OpSpec, args: dict[str, Any]) -> None:
    """The types a rotary op takes: Q float, K of Q's type and rank, the weights (and Cos and
    Sin) of Q's type or float32 and one type among them, int64 PositionIds."""
    op, q = spec.name, args["Q"]
    t = q.dtype
    if t not in _FLOATS:
        raise TypeError(f"{op}: Q must be float32, float16 or bfloat16, got {t}")
    for p in spec.inputs:
        value = args.get(p.name)
        if value is None or p.type_var not in ("T", "S", "A"):
            continue
        if p.type_var == "T" and (value.dtype != t or value.dim() != q.dim()):
            raise TypeError(f"{op}: {p.name} must be of Q's type and rank, got {value.dtype}")
        if p.type_var != "T" and value.dtype not in (t, torch.float32):
            raise TypeError(f"{op}: {p.name} must be of Q's type {t} or float32, got {value.dtype}")
    for var, names in (("S", "the norm weights"), ("A", "Cos and Sin")):
        types = {
            args[p.name].dtype
            for p in spec.inputs
            if p.type_var == var and args.get(p.name) is not None
        }
        if len(types) > 1:
            raise TypeError(f"{op}: {names} must share one type, got {sorted(map(str, types))}")
    positions = args.get("PositionIds")
    if positions is not None and positions.dtype != torch.int64:
        raise TypeError(f"{op}: PositionIds must be int64, got {positions.dtype}")
    if args["per_head"] == 0 and args["layout"] == 1:
        raise ValueError(f"{op}: per_head = 0 normalizes a token's heads together: layout 0 or 2")


def _rotary(spec: catalogue.OpSpec, args: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """QOut (and KOut where K is given) of a rotary op as torch math, in the reference's
    rounding: float32 statistics, the norm's output rounded to Q's type, the rotation per
    rotary_in_t (``rotary_first``: rotated, then normalized)."""
    op = spec.name
    _rotary_check(spec, args)
    q_rows = _to_rows(args["Q"], args, op, "Q")
    batch, seq, _, head_size = q_rows.shape
    rotary_dim = args["rotary_dim"] or head_size
    if rotary_dim % 2 or rotary_dim > head_size:
        raise ValueError(
            f"{op}: rotary_dim must be even and at most head_size {head_size}, got {rotary_dim}"
        )
    cos, sin = _angles(args, batch, seq, rotary_dim, op)
    turn = (cos, sin, rotary_dim, args["interleaved"], args["rotary_in_t"])
    outputs = []
    for name in ("Q", "K"):
        x = args.get(name)
        if x is None:
            continue
        rows = q_rows if name == "Q" else _to_rows(x, args, op, name)
        if tuple(rows.shape[:2]) != (batch, seq) or rows.shape[3] != head_size:
            raise ValueError(
                f"{op}: {name} of shape {tuple(x.shape)} does not match Q's "
                f"{tuple(args['Q'].shape)}"
            )
        heads = rows.shape[2]
        weights = []
        for w in (name + "Scale", name + "Bias"):
            value = args.get(w)
            if value is not None and value.numel() not in (head_size, heads * head_size):
                raise ValueError(
                    f"{op}: {w} of shape {tuple(value.shape)} must hold head_size = {head_size} "
                    f"values or heads * head_size = {heads * head_size}"
                )
            weights.append(value)
        if args["rotary_first"]:
            y = _rotary_norm(spec, rotate(rows, *turn), args, *weights)
        else:
            y = rotate(_rotary_norm(spec, rows, args, *weights), *turn)
        if args["layout"] == 0:
            outputs.append(y.reshape(x.shape))
        else:
            outputs.append(y.transpose(1, 2).contiguous())
    return tuple(outputs)


#: the inputs a rotary op of Q alone leaves out
_K_INPUTS = ("K", "KScale", "KBias")


def _define_rotary(spec: catalogue.OpSpec, with_k: bool) -> tuple[Any, Any]:
    """The custom op of rotary op ``spec`` with K (outputs QOut and KOut) or of Q alone
    (``<snake_name>_q``, output QOut), and its translation to one onnxnorm node."""
    name = snake_name(spec.name) + ("" if with_k else "_q")
    params = [p for p in spec.inputs if with_k or p.name not in _K_INPUTS]
    schema = [f"Tensor{'?' if p.optional and p.name != 'K' else ''} {p.name}" for p in params]
    schema += [f"{TORCH_TYPES[a.kind]} {a.name}" for a in spec.attributes]
    names = [p.name for p in params] + [a.name for a in spec.attributes]

    def implementation(*args: Any) -> Any:
        result = _rotary(spec, dict(zip(names, args)))
        return result if with_k else result[0]

    def fake(*args: Any) -> Any:
        values = dict(zip(names, args))
        shaped = [
            values[n].new_empty(
                rotary_output_shape(values[n], values["head_size"], values["layout"])
            )
            for n in (("Q", "K") if with_k else ("Q",))
        ]
        return tuple(shaped) if with_k else shaped[0]

    results = "(Tensor, Tensor)" if with_k else "Tensor"
    custom = define(name, f"({', '.join(schema)}) -> {results}", implementation, fake)

    # optional inputs default to None after the last required one (Cos and Sin follow weights)
    last = max(i for i, p in enumerate(params) if not p.optional or p.name == "K")
    bound_to = signature(spec, [(p.name, i > last) for i, p in enumerate(params)])

    def translate(*args: Any, **kwargs: Any) -> Any:
        bound = bound_to.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        inputs = [values.get(p.name) for p in spec.inputs]
        while inputs[-1] is None:  # trailing absent inputs are left out of the node
            inputs.pop()
        attrs = {a.name: values[a.name] for a in spec.attributes}
        # the exporter gives the node every output of the schema: a node of Q alone loses its
        # unused KOut afterwards (exporter.single_output_rotary)
        outputs = getattr(OPSET, spec.name)(*inputs, **attrs)
        return outputs if with_k else outputs[0]

    return custom, named(translate, spec, bound_to, spec.name + ("" if with_k else "_q"))


#: rotary op -> (its custom op with K, its custom op of Q alone), each with its translation
CUSTOM_OPS = {
    spec.name: (_define_rotary(spec, True), _define_rotary(spec, False))
    for spec in catalogue.ROTARY_OPS.values()
}


def call(spec: catalogue.OpSpec, inputs: tuple[torch.Tensor | None, ...], values: list[Any]) -> Any:
    """Runs rotary op ``spec`` (``functional.call``, its arguments checked there): ``inputs``
    every input in the catalogue's order (None where absent), ``values`` every attribute's.
    (QOut, KOut), or QOut where K is None."""
    op = spec.name
    names = [p.name for p in spec.inputs] + [a.name for a in spec.attributes]
    given = dict(zip(names, list(inputs) + values))
    with_k = given["K"] is not None
    if not with_k and any(given.get(n) is not None for n in _K_INPUTS):
        raise ValueError(f"{op}: KScale and KBias need K")
    if torch.compiler.is_exporting():
        custom = CUSTOM_OPS[op][0 if with_k else 1][0]
        kept = [v for p, v in zip(spec.inputs, inputs) if with_k or p.name not in _K_INPUTS]
        return custom(*kept, *values)
    result = _rotary(spec, given)
    return result if with_k else result[0]

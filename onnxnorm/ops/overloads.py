"""The function overloads of onnxnorm nodes: the name that says which body a node's variant runs.

A node of an onnxnorm op carries, next to its op type, a function *overload* naming its variant:
which optional inputs it has and its rounding order (``scale_bias_a``, ``scale``, ``none`` ...).
``overload`` writes the name, ``node_variant`` the one of a node, and ``parse_overload`` reads
a name back for the body writer (``onnxnorm.ops.bodies``).

Below some opsets the body has to know more than the overload names from 15 on (those names are
a public contract and stay as they are):

- below 15 there is no CastLike (nor Shape's ``start``, which becomes Shape and Slice): the body
  casts to X's element type by name, so the overload ends in it, ``f32``, ``f16`` or ``bf16``
  (``scale_a_f16``);
- below 12 Constant has no ``value_float``, so a reference to the node's attributes cannot
  become a tensor: the body holds the node's attribute values, and the overload names them after
  the type, ``axis<i>``, ``eps<v>``, ``alpha<v>`` (Skip ops), with ``offset<v>`` for ``offset``,
  each number the shortest text that reads back as the same float32
  (``scale_offset1_a_f16_axis-1_eps1e-06``). Nodes that differ in a value get a body each,
  where the norms of one model nearly always share theirs. Baked values are exact and plain to
  read; the alternative, a value computed from an op that takes a float attribute (LeakyRelu of
  -1 is exactly -alpha), would put an op of unrelated meaning into every body and rest on each
  runtime computing it exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxnorm.ops import catalogue
from onnxnorm.ops.opsets import MIN_OPSET, REF_OPSET

#: X's element type in an overload name below MIN_OPSET
X_TYPE_NAMES: dict[int, str] = {
    TensorProto.FLOAT: "f32",
    TensorProto.FLOAT16: "f16",
    TensorProto.BFLOAT16: "bf16",
}
#: the prefixes of the attribute values in an overload name below REF_OPSET
_VALUE_NAMES = {"axis": "axis", "epsilon": "eps", "alpha": "alpha", "scale_offset": "offset"}
_VALUE_PART = re.compile(r"(axis|eps|alpha|offset)([-+0-9.e]+)")


def input_part(name: str) -> str:
    """An input's name in an overload: "Y_zero_point" -> "yzeropoint" ("_" joins the parts)."""
    return name.lower().replace("_", "")


def _number(value: float) -> str:
    """``value`` as float32 in the shortest text that reads back as the same float32."""
    text = str(np.float32(value))
    return text[:-2] if text.endswith(".0") else text


def overload(
    spec: catalogue.OpSpec,
    present: Iterable[str],
    cast_before_scale: int,
    scale_offset: float = 0.0,
    with_sum: bool = True,
    with_float: bool = False,
    opset: int = MIN_OPSET,
    x_type: int | None = None,
    attrs: dict[str, Any] | None = None,
    y_float32: bool = False,
) -> str:
    """The function overload naming a node's variant: its optional inputs, whether it has a
    scale offset, its rounding order (``a`` for order A) and, for ops with a Residual, whether
    the node leaves out its Sum output (``nosum``: ORT cannot type a call to a function that
    has more outputs than the call). A quantized op's body has its optional Y_float output
    (and every output before it) when the node has it (``float``), else ends before it. A
    float32 Y (attribute ``y_float32``, the mixed form of LayerNorm and RMSNorm) is
    ``yfloat32``. A rotary op's name has the parts of its layout and rotation
    (``_rotary_parts``).

    Below MIN_OPSET the name ends in X's element type ``x_type``, below REF_OPSET also in the
    node's attribute values (``attrs``, defaults for those absent): see the module docstring."""
    present = set(present)
    parts = [input_part(name) for name in spec.optional_inputs if name in present] or ["none"]
    if scale_offset:
        parts += ["offset" if opset >= REF_OPSET else f"offset{_number(scale_offset)}"]
    parts += ["a"] if cast_before_scale else []
    if spec.gated:
        parts += _gated_parts({**spec.defaults, **(attrs or {})}, "Gate" in present)
    if spec.rotary:
        parts += _rotary_parts({**spec.defaults, **(attrs or {})})
    parts += ["yfloat32"] if y_float32 else []
    if spec.quantize != "none" and with_float:
        parts += ["float"]
    else:
        parts += ["nosum"] if spec.has_residual and not with_sum else []
    if opset < MIN_OPSET:
        if x_type not in X_TYPE_NAMES:
            raise ValueError(
                f"below opset {MIN_OPSET} an overload names X's element type (float, "
                f"float16 or bfloat16), got {type_name(x_type)}"
            )
        parts.append(X_TYPE_NAMES[x_type])
    if opset < REF_OPSET:
        values = {**spec.defaults, **(attrs or {})}
        parts += [f"axis{int(values['axis'])}"] if "axis" in values else []
        parts += [f"eps{_number(values['epsilon'])}"]
        parts += [f"alpha{_number(values['alpha'])}"] if "alpha" in values else []
    return "_".join(parts)


def _gated_parts(values: dict[str, Any], gated: bool) -> list[str]:
    """The parts that give a GatedRMSNorm body its shape: ``group<n>`` for its group size,
    and with a Gate ``sigmoid`` for that activation (SiLU has no part) and ``gatefirst`` for
    norm_before_gate = 0."""
    parts = [f"group{int(values['group_size'])}"] if values["group_size"] else []
    if gated:
        parts += ["sigmoid"] if values["activation"] == 1 else []
        parts += ["gatefirst"] if values["norm_before_gate"] == 0 else []
    return parts


def _rotary_parts(values: dict[str, Any]) -> list[str]:
    """The parts that give a rotary op's body its shape: ``layout1`` / ``layout2``,
    ``headsize<n>`` (3-D Q and K, reshaped by head_size), ``pertoken`` (per_head = 0),
    ``rotary<n>`` (a rotary_dim, the rest of each head passed through), ``interleaved``,
    ``rotaryfirst`` and ``rotaryint`` (rotary_in_t = 1); the defaults have no part. Whether K
    is present is its input part, ``k``; Cos's width needs none (the body reads it)."""
    parts = [f"layout{int(values['layout'])}"] if values["layout"] else []
    parts += [f"headsize{int(values['head_size'])}"] if values["head_size"] else []
    parts += ["pertoken"] if values["per_head"] == 0 else []
    parts += [f"rotary{int(values['rotary_dim'])}"] if values["rotary_dim"] else []
    parts += ["interleaved"] if values["interleaved"] else []
    parts += ["rotaryfirst"] if values["rotary_first"] else []
    parts += ["rotaryint"] if values["rotary_in_t"] else []
    return parts


def group_size(parts: set[str]) -> int:
    """The group size an overload names (0: none)."""
    return number_part(parts, "group")


def number_part(parts: set[str], prefix: str) -> int:
    """The number of an overload's part ``<prefix><n>`` (``group64``, ``rotary32``; 0: no
    such part)."""
    for part in parts:
        if part.startswith(prefix) and part[len(prefix) :].isdigit():
            return int(part[len(prefix) :])
    return 0


def parse_overload(
    spec: catalogue.OpSpec, variant: str, opset: int
) -> tuple[set[str], int | None, dict[str, Any] | None]:
    """An overload's parts (the value parts as their bare names: ``offset``), X's element type
    it names (below MIN_OPSET) and the attribute values it holds (below REF_OPSET, else None)."""
    parts: set[str] = set()
    x_type, values = None, {}
    names = {name: key for key, name in _VALUE_NAMES.items()}
    types = {name: t for t, name in X_TYPE_NAMES.items()}
    for part in variant.split("_"):
        match = _VALUE_PART.fullmatch(part)
        if part in types:
            x_type = types[part]
        elif match:
            key = names[match[1]]
            values[key] = int(match[2]) if key == "axis" else float(match[2])
            parts.add(match[1])
        else:
            parts.add(part)
    if opset < MIN_OPSET and x_type is None:
        raise ValueError(
            f"overload {variant!r} names no element type of X (f32, f16 or bf16), "
            f"which a body below opset {MIN_OPSET} needs (it has no CastLike)"
        )
    if opset >= REF_OPSET:
        return parts, x_type, None
    needed = [
        a.name
        for a in spec.attributes
        if a.name in _VALUE_NAMES and (a.name != "scale_offset" or "offset" in parts)
    ]
    missing = [_VALUE_NAMES[name] for name in needed if name not in values]
    if missing:
        raise ValueError(
            f"overload {variant!r} names no {', '.join(missing)} value, which a body "
            f"below opset {REF_OPSET} holds (Constant has no value_float there)"
        )
    return parts, x_type, {**spec.defaults, **values}


def node_variant(node: onnx.NodeProto, opset: int = MIN_OPSET, x_type: int | None = None) -> str:
    """The overload of ``node`` in a model of standard opset ``opset`` whose X has element type
    ``x_type`` (needed below MIN_OPSET)."""
    spec = catalogue.get(node.op_type)
    names = [p.name for p in spec.inputs]
    present = [names[i] for i, value in enumerate(node.input) if value and i < len(names)]
    attrs = {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}

    def has(output: str) -> bool:
        index = spec.output_index(output)
        return index is not None and len(node.output) > index and bool(node.output[index])

    if spec.rotary and not has("KOut"):  # a K without KOut: the body has QOut alone
        present = [name for name in present if name != "K"]

    return overload(
        spec,
        present,
        attrs.get("cast_before_scale", 0),
        attrs.get("scale_offset", 0.0),
        has("Sum"),
        has("Y_float"),
        opset,
        x_type,
        {k: v for k, v in attrs.items() if k in spec.defaults},
        bool(attrs.get("y_float32", 0)),
    )


def type_name(elem_type: int | None) -> str:
    """An element type as messages name it ("float16"; "unknown" for None)."""
    return "unknown" if elem_type is None else TensorProto.DataType.Name(elem_type).lower()

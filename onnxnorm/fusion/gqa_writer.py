"""The per-head Q/K RMS norms before a ``com.microsoft GroupQueryAttention`` written into that
op's own ``q_norm_weight`` / ``k_norm_weight`` inputs: the ``attention`` form of a runtime's
``rms`` family (``onnxnorm/targets.py``: ONNX Runtime's CUDA provider), for
:mod:`onnxnorm.fusion.lowering`, which runs :func:`fold_norms` before it writes the other nodes.

What ONNX Runtime computes with those inputs (the 1.32 schema of GroupQueryAttention, and its
CUDA kernel's source): each head of Q and of K becomes
``T(x * rsqrt(mean(x^2) + qk_norm_epsilon) * float(w))``, the statistics and the product in
float32 and one rounding to Q's type T, before GroupQueryAttention's own rotary and the append to
the KV cache; ``w`` is one ``[head_size]`` weight of type T shared by every head. That is an
onnxnorm RMSNorm over the head's values in rounding order B (the float32 statistics differ from
another kernel's by their summation order and rsqrt, as between any two kernels), so a norm is
written there only where every part of the node is that:

- Q and K of the GroupQueryAttention each come from an RMSNorm between the Reshapes of a head
  view and back (onnxruntime-genai's model builder writes ``Reshape [0, -1, head_size]``,
  SimplifiedLayerNormalization, ``Reshape [0, -1, hidden]``), each read by the next alone, from
  a projection of GroupQueryAttention's 3-D shape;
- the RMSNorm spans the head (its last axis) only, has no bias, rounds in order B
  (``cast_before_scale = 0``, not the mixed form), and its weight plus scale offset is exactly a
  ``[head_size]`` tensor of T (a new initializer where it is stored otherwise);
- T is float16 or bfloat16: the CUDA kernel has no float32 form, and a float32
  GroupQueryAttention runs on the CPU provider, which refuses these inputs (measured, 1.32);
- Q's and K's epsilons are equal: one ``qk_norm_epsilon``, the attribute onnxruntime-gpu 1.31.1
  (the newest CUDA build; its CUDA provider checks these inputs) has too, where 1.32 adds
  ``q_norm_epsilon`` / ``k_norm_epsilon``;
- GroupQueryAttention rotates Q and K itself (``do_rotary = 1``, which ONNX Runtime's own
  fusion of these norms and its WebGPU kernel require), has no norm weights yet and an
  unquantized KV cache (ONNX Runtime routes the quantized cache with these inputs to a path it
  has not validated yet).

A candidate norm that fails a condition stays in the runtime's next form, and the lowering's note
says why (:func:`fold_norms` returns the reasons). A rotary op before a GroupQueryAttention
(``do_rotary = 0``) stays too: giving GroupQueryAttention the rotation back needs its positions,
and its ``position_ids`` input is read only at the first element of a first prompt.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxnorm.fusion.ort_gated import MS_DOMAIN
from onnxnorm.fusion.rope_writer import add_initializer
from onnxnorm.ops import catalogue, functions
from onnxnorm.ops.functions import Note

#: the form's name in a runtime's table (``onnxnorm.targets.FORMS``)
ATTENTION = "attention"
#: GroupQueryAttention's inputs of the norm weights
Q_NORM_WEIGHT, K_NORM_WEIGHT = 14, 15
_HALF: dict[int, str] = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}


@dataclass
class _Side:
    """The RMSNorm before Q or K of one GroupQueryAttention, and what it becomes."""

    views: tuple[onnx.NodeProto, onnx.NodeProto]  # the Reshape to heads and the one back
    norm: onnx.NodeProto
    projection: str
    epsilon: float
    #: the weight GroupQueryAttention takes: an initializer's name, or new values to write
    weight: str | np.ndarray


class _Graphs:
    """Who produces and who reads each value, over the model's graphs (a subgraph may read a
    value of the graph around it by name)."""

    def __init__(self, model: onnx.ModelProto):
        self.producer: dict[str, onnx.NodeProto] = {}
        self.reads: dict[str, int] = {}
        for graph in functions.all_graphs(model.graph):
            for node in graph.node:
                for name in node.output:
                    self.producer[name] = node
                for name in node.input:
                    self.reads[name] = self.reads.get(name, 0) + 1
            for value in graph.output:
                self.reads[value.name] = self.reads.get(value.name, 0) + 1

    def only_reader(self, name: str) -> bool:
        return self.reads.get(name, 0) == 1

    def made_by(self, name: str, op: str, domain: str = "") -> onnx.NodeProto | None:
        node = self.producer.get(name)
        if node is None or node.op_type != op or node.domain not in (domain, *_aliases(domain)):
            return None
        return node


def _aliases(domain: str) -> tuple[str, ...]:
    return ("ai.onnx",) if domain == "" else ()


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def fold_norms(
    model: onnx.ModelProto,
    types: Mapping[str, int],
    dims: Mapping[str, list],
    initializers: Mapping[str, onnx.TensorProto],
) -> tuple[list[Note], dict[str, str]]:
    """Writes the Q/K RMSNorms before each GroupQueryAttention of ``model`` (in place) into its
    norm inputs where that is exact (the module's docstring), and removes them with their head
    views. ``types`` and ``dims``: what the lowering knows of the values (more is inferred where
    needed); ``initializers``: the model's, those kept apart from it included. Returns a note per
    norm written so, and the reason of each candidate norm left, by its output's name."""
    graphs = _Graphs(model)
    known = _Known(model, types, dims, initializers)
    notes: list[Note] = []
    reasons: dict[str, str] = {}
    # (subgraphs first: rewriting a graph copies its nodes, the subgraphs in them included)
    for graph in reversed(list(functions.all_graphs(model.graph))):
        gone: list[onnx.NodeProto] = []
        for gqa in [n for n in graph.node if _is_gqa(n)]:
            sides = [_candidate(graphs, gqa, i) for i in (0, 1)]
            found = [s for s in sides if s is not None]
            if len(found) == 1:
                reasons[found[0][1].output[0]] = (
                    "GroupQueryAttention takes Q's and K's norm weights together, and the other "
                    "has no norm of its own"
                )
            if len(found) != 2:
                continue  # not the pattern (no norm, packed QKV, ...)
            plans: list[_Side] = []
            why = _gqa_problem(gqa) or _type_problem(known, found[0][1].input[0])
            for index, (views, norm) in enumerate(found):
                if why:
                    break
                plan = _plan(known, gqa, index, views, norm)
                if isinstance(plan, str):
                    why = f"{'QK'[index]}'s norm: {plan}"
                else:
                    plans.append(plan)
            if not why and plans[0].epsilon != plans[1].epsilon:
                why = (
                    f"Q's epsilon {plans[0].epsilon:g} and K's {plans[1].epsilon:g} differ "
                    "(GroupQueryAttention takes one qk_norm_epsilon)"
                )
            if why:
                for _, norm in found:
                    reasons[norm.output[0]] = why
                continue
            gone += _rewrite(graphs, known, gqa, plans)
            for index, side in enumerate(plans):
                notes.append(
                    Note(
                        side.norm.name or side.norm.op_type,
                        side.norm.op_type,
                        f"{MS_DOMAIN}.GroupQueryAttention's {'qk'[index]}_norm_weight",
                    )
                )
        if gone:  # (one pass: the graph's nodes are copied back)
            nodes = [n for n in graph.node if all(n is not g for g in gone)]
            del graph.node[:]
            graph.node.extend(nodes)
    return notes, reasons


def _is_gqa(node: onnx.NodeProto) -> bool:
    return node.op_type == "GroupQueryAttention" and node.domain == MS_DOMAIN


def _candidate(
    graphs: _Graphs, gqa: onnx.NodeProto, index: int
) -> tuple[tuple[onnx.NodeProto, onnx.NodeProto], onnx.NodeProto] | None:
    """The Reshape, RMSNorm and Reshape before input ``index`` (Q or K) of ``gqa``, each read
    by the next alone; None where the input is something else."""
    if len(gqa.input) <= index or not gqa.input[index]:
        return None
    back = graphs.made_by(gqa.input[index], "Reshape")
    if back is None or not graphs.only_reader(back.output[0]):
        return None
    norm = graphs.made_by(back.input[0], "RMSNorm", catalogue.DOMAIN)
    if norm is None or len([o for o in norm.output if o]) != 1:
        return None
    if not graphs.only_reader(norm.output[0]) or not norm.input:
        return None
    to_heads = graphs.made_by(norm.input[0], "Reshape")
    if to_heads is None:
        return None
    return (to_heads, back), norm


def _gqa_problem(gqa: onnx.NodeProto) -> str:
    """Why ``gqa`` cannot take norm weights ("": it can)."""
    attrs = _attrs(gqa)
    if attrs.get("do_rotary", 0) != 1:
        return (
            "its GroupQueryAttention does not rotate (do_rotary = 0); ONNX Runtime's own fusion "
            "of these norms and its WebGPU kernel take the weights only with its rotary"
        )
    if any(len(gqa.input) > i and gqa.input[i] for i in (Q_NORM_WEIGHT, K_NORM_WEIGHT)):
        return "its GroupQueryAttention has norm weights already"
    for kind in ("k_quant_type", "v_quant_type"):
        value = attrs.get(kind, b"NONE")
        if (value.decode() if isinstance(value, bytes) else str(value)).upper() != "NONE":
            return (
                "its GroupQueryAttention quantizes the KV cache (ONNX Runtime's CUDA path of the "
                "norm weights with a quantized cache is not validated)"
            )
    return ""


def _type_problem(known: _Known, x: str) -> str:
    """Why a norm of X ``x`` cannot go into GroupQueryAttention for its type ("": it can)."""
    t = known.type_of(x)
    if t in _HALF:
        return ""
    kind = "of an unknown type" if t is None else helper.tensor_dtype_to_np_dtype(t).name
    return (
        f"Q is {kind}: GroupQueryAttention's CUDA kernel takes float16 and bfloat16 only (a "
        f"{kind} one runs on the CPU provider, which refuses q_norm_weight)"
    )


class _Known:
    """The types, dims and constant values of the model's values."""

    def __init__(self, model, types, dims, initializers):
        self.model, self.initializers = model, initializers
        self.types, self.dims = dict(types), dict(dims)
        self._inferred = False

    def dims_of(self, name: str) -> list | None:
        if name not in self.dims and not self._inferred:
            self._inferred = True
            types, dims = functions.value_types(
                self.model, [name], list(self.initializers.values())
            )
            self.types, self.dims = {**types, **self.types}, {**dims, **self.dims}
        return self.dims.get(name)

    def type_of(self, name: str) -> int | None:
        if name not in self.types:
            self.dims_of(name)
        return self.types.get(name)

    def values(self, name: str) -> np.ndarray | None:
        """The values of initializer or Constant ``name`` held in the model (None: not one,
        or its data is in another file)."""
        tensor = self.initializers.get(name)
        if tensor is None:
            for graph in functions.all_graphs(self.model.graph):
                for node in graph.node:
                    if node.op_type == "Constant" and list(node.output) == [name]:
                        value = _attrs(node).get("value")
                        tensor = value if isinstance(value, onnx.TensorProto) else None
        if tensor is None or tensor.data_location == TensorProto.EXTERNAL:
            return None
        try:
            return numpy_helper.to_array(tensor)
        except (OSError, ValueError):
            return None


def _plan(
    known: _Known,
    gqa: onnx.NodeProto,
    index: int,
    views: tuple[onnx.NodeProto, onnx.NodeProto],
    norm: onnx.NodeProto,
) -> _Side | str:
    """What the RMSNorm ``norm`` before input ``index`` of ``gqa`` becomes, or why it cannot."""
    spec = catalogue.get(norm.op_type)
    attrs = {**spec.defaults, **_attrs(norm)}
    x = norm.input[0]
    t = known.type_of(x)
    if t not in _HALF:
        return _type_problem(known, x)
    if attrs["cast_before_scale"]:
        return (
            "rounding order A (cast_before_scale = 1) rounds the normalized value before the "
            "weight; GroupQueryAttention rounds once, after it"
        )
    if attrs["y_float32"]:
        return "its Y is float32 (the mixed form); GroupQueryAttention's is Q's type"
    if len(norm.input) > 2 and norm.input[2]:
        return "it has a bias; GroupQueryAttention's norm has none"
    to_heads, back = views
    heads = _attrs(gqa).get("num_heads" if index == 0 else "kv_num_heads")
    projection = to_heads.input[0]
    shape = known.dims_of(projection)
    if not heads or not shape or len(shape) != 3 or not isinstance(shape[2], int):
        return f"the shape of the projection {projection!r} is not known"
    hidden = shape[2]
    if hidden % heads:
        return f"its projection's {hidden} values are not {heads} heads"
    size = hidden // heads
    x_dims = known.dims_of(x)
    rank = len(x_dims) if x_dims else None
    axis = attrs["axis"]
    if not (axis == -1 or (rank is not None and axis == rank - 1)):
        return (
            f"it normalizes from axis {axis}, more than each head's values; GroupQueryAttention "
            "normalizes each head"
        )
    why = _views_problem(known, to_heads, back, heads, size)
    if why:
        return why
    weight, why = _weight(known, norm, attrs, t, size)
    if weight is None:
        return why
    return _Side(views, norm, projection, float(np.float32(attrs["epsilon"])), weight)


def _views_problem(
    known: _Known, to_heads: onnx.NodeProto, back: onnx.NodeProto, heads: int, size: int
) -> str:
    """Why the Reshapes around the norm are not a view of each head and back to the
    projection's [batch, seq, heads * size] ("": they are)."""
    shapes = []
    for node in (to_heads, back):
        values = known.values(node.input[1]) if len(node.input) > 1 else None
        if values is None or _attrs(node).get("allowzero", 0):
            return f"the shape of the Reshape {node.name or node.output[0]!r} is not a constant"
        shapes.append([int(v) for v in np.asarray(values).reshape(-1)])
    first, last = shapes
    hidden = heads * size
    to_rows = first == [0, -1, size]
    to_4d = len(first) == 4 and first[:2] == [0, 0] and first[2] in (heads, -1)
    to_4d = to_4d and first[3] == size
    if (to_rows and last == [0, -1, hidden]) or (
        to_4d and last in ([0, 0, hidden], [0, 0, -1], [0, -1, hidden])
    ):
        return ""
    return (
        f"the view to heads and back (Reshape to {first}, then to {last}) is not one of "
        f"[batch, seq, {heads} x {size}]"
    )


def _weight(
    known: _Known, norm: onnx.NodeProto, attrs: dict, t: int, size: int
) -> tuple[str | np.ndarray | None, str]:
    """GroupQueryAttention's weight of ``norm``: the name of a [size] tensor of type ``t`` to
    take as it is, or new values (weight plus scale offset, exactly of type ``t``); or None and
    why there is none."""
    np_type = helper.tensor_dtype_to_np_dtype(t)
    offset = np.float32(attrs["scale_offset"])
    name = norm.input[1] if len(norm.input) > 1 and norm.input[1] else None
    if name is None:
        return np.full(size, np.float32(1) + offset, np.float32).astype(np_type), ""
    if not offset and known.type_of(name) == t and known.dims_of(name) == [size]:
        return name, ""
    values = known.values(name)
    if values is None:
        return None, f"its weight {name!r} is not a constant held in the model file"
    if values.size != size:
        return None, (
            f"its weight holds {values.size} values, not one head's {size} (GroupQueryAttention "
            "takes one weight for every head)"
        )
    wanted = values.astype(np.float32).reshape(size) + offset
    written = wanted.astype(np_type)
    if not np.array_equal(written.astype(np.float32), wanted):
        what = "weight plus scale offset" if offset else "weight"
        return None, f"its {what} is not exactly a {_HALF[t]} tensor"
    return written, ""


def _rewrite(
    graphs: _Graphs, known: _Known, gqa: onnx.NodeProto, sides: list[_Side]
) -> list[onnx.NodeProto]:
    """``gqa`` reading the projections and the norm weights of ``sides``; returns the nodes
    that nothing reads then: their norms and views (a view to heads read elsewhere stays)."""
    inputs = list(gqa.input) + [""] * max(0, K_NORM_WEIGHT + 1 - len(gqa.input))
    gone: list[onnx.NodeProto] = []
    for index, side in enumerate(sides):
        inputs[index] = side.projection
        weight = side.weight
        if not isinstance(weight, str):
            weight = _new_initializer(known, weight, f"{side.norm.input[1] or side.norm.name}_gqa")
        inputs[Q_NORM_WEIGHT + index] = weight
        to_heads, back = side.views
        gone += [back, side.norm]
        if graphs.only_reader(to_heads.output[0]):
            gone.append(to_heads)
    del gqa.input[:]
    gqa.input.extend(inputs)
    kept = [a for a in gqa.attribute if a.name != "qk_norm_epsilon"]
    del gqa.attribute[:]
    gqa.attribute.extend(kept)
    gqa.attribute.append(helper.make_attribute("qk_norm_epsilon", sides[0].epsilon))
    return gone


def _new_initializer(known: _Known, values: np.ndarray, hint: str) -> str:
    taken = set(_names(known.model)) | set(known.initializers)
    return add_initializer(known.model, known.types, known.dims, values, hint, taken)


def _names(model: onnx.ModelProto) -> Iterator[str]:
    for graph in functions.all_graphs(model.graph):
        yield from (t.name for t in graph.initializer)
        for node in graph.node:
            yield from node.output

"""Writing one rotary op (``catalogue.ROTARY_OPS``) as norm ops and RotaryEmbeddings, for
:mod:`onnxnorm.fusion.lowering` (which picks the target; which cases are written so and why they
are exact: its docstring).

Q (and K) are taken to rows of heads, [batch, seq, heads, head_size] (layout 1: [batch, heads,
seq, head_size]; a 3-D one reshaped by head_size). The norm is the target's norm op over the head
(per_head = 0: over the token's heads, axis -2) with a unit scale on the rows in float32, then
the weights, reshaped to [1 or heads, head_size] (layout 1: [1 or heads, 1, head_size]), in the
catalogue's own arithmetic (``NormWriter._scaled``), rounded to Q's type. The rotation is ONNX's
``RotaryEmbedding`` (opset 23) or ONNX Runtime's ``com.microsoft RotaryEmbedding`` on float32
values, rounded once to Q's type after it (ONNX Runtime's own op on float16 values where its Cos
and Sin are float16: it computes them in float32 and rounds once, the same bits), fed with:

- the rows as [batch, heads, seq, head_size] (layout 1, and layout 2 where the rotation is the
  last step: a Transpose, which layout 2 asks for anyway), else as [batch, seq, heads *
  head_size] with ``num_heads`` (Reshapes);
- Cos and Sin of one angle per pair: as they are, with PositionIds, or per token (expanded to
  Q's batch where they hold one row for it); caches of one angle per value are used where they
  are initializers whose halves (interleaved: pairs) hold the same bits: the first of each
  written as a new initializer.

A node that cannot be written so (L2NormRotary, whose norm no op computes; rotary_in_t = 1 in
16 bits; ...: ``_rope_plan`` says why in words) gets its function body inlined, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnxnorm.fusion.norm_writer import NormWriter
from onnxnorm.fusion.ort_gated import MS_DOMAIN
from onnxnorm.ops import functions

_FLOAT = TensorProto.FLOAT
#: [batch, seq, heads, head_size] <-> [batch, heads, seq, head_size]
_SWAP = [0, 2, 1, 3]
#: the opset of ONNX's RotaryEmbedding and RMSNormalization
ROTARY_OPSET = 23


def add_initializer(
    model: onnx.ModelProto,
    types: dict[str, int],
    dims: dict[str, list],
    values: np.ndarray,
    hint: str,
    taken: set[str],
) -> str:
    """A new initializer of ``model`` holding ``values`` (their type), named after ``hint``
    (``hint_1``, ``hint_2``, ... past the names in ``taken``), its type and dims recorded in
    ``types`` and ``dims``; returns its name."""
    name, index = hint, 0
    while name in taken:
        index += 1
        name = f"{hint}_{index}"
    tensor = numpy_helper.from_array(values, name)
    model.graph.initializer.append(tensor)
    types[name], dims[name] = tensor.data_type, list(values.shape)
    return name


@dataclass(frozen=True)
class _Plan:
    """What the rotation of one rotary node is written with."""

    head_size: int
    #: Q's and K's head counts (K's where K is rotated)
    heads: dict[str, int]
    #: the rotated values of each head
    rotary_dim: int
    #: Cos and Sin of one angle per pair, of the rotation's type, as RotaryEmbedding takes them
    cos: str
    sin: str
    positions: str | None
    #: the rotation in Q's type (ONNX Runtime's op on float16): no casts around it
    in_q_type: bool


class RopeWriter(NormWriter):
    """A NormWriter that also writes the rotary ops (``_rotary``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        #: whether the model's value types were inferred for the rotary nodes' inputs
        self._inferred = False
        #: (Cos, Sin, rotary_dim, interleaved) -> their initializers of one angle per pair
        self._pairs_made: dict[tuple[str, str, int, int], tuple[str, str]] = {}

    def _rotary(self, node, spec, attrs, args, outs) -> tuple[str, str]:
        """The rotary ``node`` written for ``self.target`` ("onnx" or "ort"); where it cannot
        be, its function body inlined, with the reason."""
        plan, why = self._rope_plan(spec, attrs, args, outs)
        if plan is None:
            return self._inline(node, why)
        t = self.x_type
        names = ["Q"] + (["K"] if args["K"] and outs["KOut"] else [])
        norm = ""
        for name in names:
            x, out = args[name], outs[name + "Out"]
            three_d = len(self.dims[x]) == 3
            # the forms of a value: [b, s, h, d] "bshd", [b, h, s, d] "bhsd", [b, s, h * d] "flat"
            form = "flat" if three_d else "bhsd" if attrs["layout"] == 1 else "bshd"
            rows = "bhsd" if attrs["layout"] == 1 else "bshd"  # the norm's
            want = "bhsd" if attrs["layout"] else "flat" if three_d else "bshd"  # the output's
            heads, bhsd = plan.heads[name], rows == "bhsd"
            if attrs["rotary_first"]:
                rotated, form = self._rope(x, form, bhsd, heads, plan, attrs)
                value = self._in_t(self._to_form(rotated, form, rows, heads, plan), t)
                y, norm = self._rope_norm(spec, attrs, args, name, value, bhsd, plan)
                self._finish(y, self._steps(rows, want, heads, plan), False, out)
            else:
                value = self._to_form(x, form, rows, heads, plan)
                y, norm = self._rope_norm(spec, attrs, args, name, value, bhsd, plan)
                rotated, form = self._rope(y, rows, want == "bhsd", heads, plan, attrs)
                cast = not plan.in_q_type and t != _FLOAT
                self._finish(rotated, self._steps(form, want, heads, plan), cast, out)
        rope = f"{MS_DOMAIN}.RotaryEmbedding" if self.target == "ort" else "RotaryEmbedding"
        rope += "" if plan.in_q_type or t == _FLOAT else " (float32)"
        return (f"{rope} + {norm}" if attrs["rotary_first"] else f"{norm} + {rope}"), ""

    # -- which form -------------------------------------------------------------------------
    def _rope_plan(self, spec, attrs, args, outs) -> tuple[_Plan | None, str]:
        """The plan of the rotation, or None and why the node cannot be written as a norm op
        and a RotaryEmbedding."""
        t, ort = self.x_type, self.target == "ort"
        if spec.norm == "l2":
            return None, (
                "no op of ONNX or ONNX Runtime divides by sqrt(sum(x^2) + epsilon) "
                "(LpNormalization has no epsilon)"
            )
        if not ort and self.opset < ROTARY_OPSET:
            needs = "RotaryEmbedding" + (" or RMSNormalization" if spec.norm == "rms" else "")
            return None, f"opset {self.opset} has no standard {needs} (needs {ROTARY_OPSET})"
        if attrs["rotary_in_t"] and t != _FLOAT:
            return None, (
                "rotary_in_t = 1 rounds each product and the sum to Q's type, which ONNX Runtime's "
                "RotaryEmbedding does not (it computes float16 in float32 and rounds once, and has "
                "no bfloat16 kernel)"
            )
        positions = args["PositionIds"]
        if ort and positions is None:
            return None, (
                "ONNX Runtime's RotaryEmbedding gathers Cos and Sin by position_ids, and the node "
                "has none (its Cos and Sin are per token)"
            )
        names = ["Q"] + (["K"] if args["K"] and outs["KOut"] else [])
        self._infer([args[n] for n in names] + [args["Cos"], args["Sin"]])
        head_size, heads = 0, {}
        for name in names:
            size, count = self._heads(args[name], attrs)
            if not size or not count or (head_size and size != head_size):
                return None, f"the head size and head count of {name} are not known"
            head_size, heads[name] = size, count
        rotary_dim = attrs["rotary_dim"] or head_size
        cos, sin = args["Cos"], args["Sin"]
        cos_dims = self.dims.get(cos) or []
        if len(cos_dims) != (2 if positions else 3) or cos_dims[-1] is None:
            return None, "the shape of Cos is not known"
        width = cos_dims[-1]
        if width == rotary_dim:  # one angle per value: the first of each pair, where proved
            pairs = self._pair_caches(cos, sin, rotary_dim, attrs["interleaved"])
            if isinstance(pairs, str):
                return None, pairs
            cos, sin = pairs
        elif width != rotary_dim // 2:
            return None, f"Cos holds {width} angles per token, not rotary_dim or its half"
        in_q_type = ort and t == TensorProto.FLOAT16 and self.types.get(cos) == t
        if not in_q_type:
            cos, sin = self.float32(cos), self.float32(sin)
        batch = self.dims[args["Q"]][0]
        if positions is None and (batch is None or cos_dims[0] != batch):
            # per token for the whole batch: repeated to Q's batch, as RotaryEmbedding takes them
            first = self.slice(self("Shape", args["Q"]), [0], [1], [0])
            repeats = self("Concat", first, self.ints([1, 1]), axis=0)
            cos, sin = self("Expand", cos, repeats), self("Expand", sin, repeats)
        return _Plan(head_size, heads, rotary_dim, cos, sin, positions, in_q_type), ""

    def _infer(self, names: list[str]) -> None:
        """The types and dims of ``names`` where the model does not declare them (once)."""
        if self._inferred or all(n in self.dims for n in names):
            return
        self._inferred = True
        types, dims = functions.value_types(self.model, names, list(self.initializers.values()))
        self.types, self.dims = {**types, **self.types}, {**dims, **self.dims}

    def _heads(self, x: str, attrs) -> tuple[int | None, int | None]:
        """The head size and head count of Q or K ``x`` (None: not known)."""
        dims = self.dims.get(x)
        if dims is None or len(dims) not in (3, 4):
            return None, None
        if len(dims) == 4:
            return dims[3], dims[1] if attrs["layout"] == 1 else dims[2]
        size, hidden = attrs["head_size"], dims[2]
        if not size or not hidden or hidden % size:
            return None, None
        return size, hidden // size

    def _pair_caches(self, cos: str, sin: str, rotary_dim: int, interleaved: int):
        """Cos and Sin of one angle per value as new initializers of one per pair (one for
        every node that rotates by them): where both are initializers whose halves (interleaved:
        each pair's two values) hold the same bits; else why not."""
        made, key = self._pairs_made, (cos, sin, rotary_dim, interleaved)
        if key in made:
            return made[key]
        cos_values, sin_values = self._initializer(cos), self._initializer(sin)
        if cos_values is None or sin_values is None:
            return (
                "Cos and Sin hold one angle per value (C = rotary_dim), which RotaryEmbedding "
                "does not take, and are not initializers whose halves could be proved to repeat"
            )
        split = "pairs" if interleaved else "halves"
        firsts = []
        for name, array in ((cos, cos_values), (sin, sin_values)):
            if interleaved:
                first, second = array[..., 0::2], array[..., 1::2]
            else:
                first, second = array[..., : rotary_dim // 2], array[..., rotary_dim // 2 :]
            first, second = np.ascontiguousarray(first), np.ascontiguousarray(second)
            if first.tobytes() != second.tobytes():
                return (
                    f"the {split} of {name} (one angle per value) differ, and RotaryEmbedding "
                    "takes one angle per pair"
                )
            firsts.append(first)
        made[key] = (
            self._initializer_of(firsts[0], f"{cos}_pairs"),
            self._initializer_of(firsts[1], f"{sin}_pairs"),
        )
        return made[key]

    def _initializer_of(self, values: np.ndarray, hint: str) -> str:
        """A new initializer of ``values`` (their type) named after ``hint``."""
        taken = {t.name for t in self.model.graph.initializer} | set(self.types)
        return add_initializer(self.model, self.types, self.dims, values, hint, taken)

    # -- the nodes --------------------------------------------------------------------------
    def _rope_norm(self, spec, attrs, args, name, rows, bhsd, plan) -> tuple[str, str]:
        """``rows`` (of Q's type) normalized over each head (per_head = 0: each token) with the
        weights of ``name`` (Q or K): the target's norm op with a unit scale on them in
        float32, then the weights in the catalogue's arithmetic, rounded to Q's type; and what
        that is in words."""
        op = self._core_op(spec)
        if op is None:  # (_rope_plan refuses the opsets without one first)
            raise ValueError(f"opset {self.opset} has no norm op of {spec.name}")
        axis = -1 if attrs["per_head"] else -2
        xf = self.float32(rows)
        ones = self.ones(xf, axis, -axis)
        normed = self(op, xf, ones, axis=axis, epsilon=float(attrs["epsilon"]))
        shape = [-1, 1, plan.head_size] if bhsd else [-1, plan.head_size]
        weights = []
        for w in (name + "Scale", name + "Bias"):
            value = args.get(w)
            if value is not None and self.dims.get(value) != [plan.head_size]:
                reshaped = self("Reshape", value, self.ints(shape))
                self.types[reshaped] = self.types.get(value, _FLOAT)
                value = reshaped
            weights.append(value)
        y = self._name("normed")
        self.types[y] = self.x_type
        what = self._scaled(spec, attrs, normed, weights[0], weights[1], y, f"{op} (unit scale)")
        return y, what

    def _rope(self, x, form, bhsd, heads, plan, attrs) -> tuple[str, str]:
        """``x`` (of Q's type, in ``form``) rotated by RotaryEmbedding: [batch, heads, seq,
        head_size] where ``bhsd`` or already so, else [batch, seq, heads * head_size]; the
        result in float32 (in Q's type where ``plan.in_q_type``) and its form."""
        value = x if plan.in_q_type else self.float32(x)
        if form == "bshd":
            value = self._to_form(value, form, "bhsd" if bhsd else "flat", heads, plan)
            form = "bhsd" if bhsd else "flat"
        kw: dict[str, Any] = {"interleaved": int(attrs["interleaved"])}
        partial = plan.rotary_dim != plan.head_size
        if partial:
            kw["rotary_embedding_dim"] = plan.rotary_dim
        if form == "flat" or (self.target == "ort" and partial):
            kw["num_heads"] = heads  # (ONNX Runtime's op needs it for a partial rotation)
        if self.target == "ort":
            self.uses_ms = True
            inputs = [value, plan.positions or "", plan.cos, plan.sin]
            out = self.emit("RotaryEmbedding", inputs, domain=MS_DOMAIN, **kw)[0]
        else:
            inputs = [value, plan.cos, plan.sin] + ([plan.positions] if plan.positions else [])
            out = self.emit("RotaryEmbedding", inputs, **kw)[0]
        self.types[out] = self.x_type if plan.in_q_type else _FLOAT
        return out, form

    def _in_t(self, value: str, t: int) -> str:
        """``value`` (float32, or of Q's type) rounded to Q's type ``t``."""
        if self.types.get(value) == t or t == _FLOAT:
            self.types[value] = t
            return value
        out = self("Cast", value, to=t)
        self.types[out] = t
        return out

    def _steps(self, form: str, want: str, heads: int, plan) -> list[tuple[str, list, dict]]:
        """The Reshapes and Transposes that take a value in ``form`` (bshd, bhsd, flat) to
        ``want``."""
        steps: list[tuple[str, list, dict]] = []
        if form == "flat" and want != "flat":
            steps.append(("Reshape", [self.ints([0, 0, heads, plan.head_size])], {}))
            form = "bshd"
        if form == "bshd" and want == "bhsd":
            steps.append(("Transpose", [], {"perm": _SWAP}))
        elif form == "bshd" and want == "flat":
            steps.append(("Reshape", [self.ints([0, 0, -1])], {}))
        elif form == "bhsd" and want != "bhsd":
            raise ValueError(f"no layout of the rotary ops takes [batch, heads, ...] to {want}")
        return steps

    def _to_form(self, value: str, form: str, want: str, heads: int, plan) -> str:
        """``value`` in ``form`` taken to ``want`` (its element type kept)."""
        for op, extra, kw in self._steps(form, want, heads, plan):
            out = self(op, value, *extra, **kw)
            if value in self.types:
                self.types[out] = self.types[value]
            value = out
        return value

    def _finish(self, value: str, steps, cast: bool, out: str) -> None:
        """``value`` through ``steps`` (and a Cast to Q's type where ``cast``) into ``out``."""
        ops = list(steps) + ([("Cast", [], {"to": self.x_type})] if cast else [])
        if not ops:  # the node that wrote ``value`` writes ``out`` instead
            last = self.new_nodes[-1]
            if list(last.output) == [value]:
                last.output[0] = out
            else:
                self("Identity", value, out=out)
        for i, (op, extra, kw) in enumerate(ops):
            value = self(op, value, *extra, out=out if i == len(ops) - 1 else None, **kw)

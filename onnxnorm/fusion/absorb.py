"""The absorb rules, which grow the node a core rule wrote (``norms.py``) by what follows it,
and the norms computed in double.

A following ``Mul`` by a weight becomes Scale (a ``Mul`` by ``w + c``: Scale and
``scale_offset = c``, Gemma's ``1 + w``), a following ``Add`` becomes Bias, and
``Cast(norm(Cast(x, float32)), x's type)`` becomes the norm of x in x's type. Each absorb fixes
the rounding order it proves: a Mul or Add in float16/bfloat16 after the normalized value was
rounded is order A (``cast_before_scale = 1``: Llama, T5), float32 arithmetic rounded once by
the final Cast is order B (Gemma, Cohere).

A norm computed in double (X cast to DOUBLE, the statistics, scale and bias in double, the
result cast back) takes the same two steps in double: the core writes (:func:`in_double`) the
norm of the value X was cast from, computed in float32 and its result cast to double, and
:class:`DoubleAbsorb` grows it through the weights in double to the Cast back. Only a result
rounded to float16/bfloat16 is fused, with a note on what float32 statistics change
(:data:`DOUBLE_STATISTICS`); a result in float32 or double stays, with the measured loss
(:data:`DOUBLE_TO_FLOAT`).
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from onnxnorm.fusion._base import (
    DATA_TYPES,
    FLOAT,
    FusionRule,
    NotThisPattern,
    Rejected,
    Replacement,
    attribute,
    check_scale,
    dead,
    dtype,
    scalar,
    statistics_type,
)
from onnxnorm.fusion.checks import check_type, check_weight
from onnxnorm.fusion.report import Tracker
from onnxnorm.ops import catalogue

# ---------------------------------------------------------------------------------------------
# norms computed in double

DOUBLE = ir.DataType.DOUBLE
HALF = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)

#: the report's note on a norm computed in double whose result is rounded to float16/bfloat16,
#: measured against the double computation as ONNX Runtime runs it (onnxruntime 1.32, CPU; rows
#: of 64 and 4096 values from 2^-70 to 2^70, every target; docs/fusion.md)
DOUBLE_STATISTICS = {
    "RMSNorm": (
        "statistics computed in DOUBLE in the original, its result rounded to {type}; onnxnorm "
        "computes them in float32, epsilon a float32 attribute. Measured against the double "
        "result: at most 1 unit in the last place of {type} (2 where the result is rounded "
        "before a weight in {type}), in at most 1 value in 4,000 (bfloat16 rounded before any "
        "weight, through ONNX Runtime's ops: up to 1 in 4, where the float32 epsilon moves "
        "ties); a row whose squares sum past float32's 3.4e38 (never from a float16 X) comes out 0"
    ),
    "LayerNorm": (
        "statistics computed in DOUBLE in the original, its result rounded to {type}; onnxnorm "
        "computes them in float32, epsilon a float32 attribute. Measured against the double "
        "result: at most 1 unit in the last place of the row's largest |Y| in {type}; a row "
        "whose squares sum near or past float32's 3.4e38 (never from a float16 X) is lost"
    ),
}

#: why a norm computed in double with a float32 result stays: what float32 statistics lose
#: (measured as :data:`DOUBLE_STATISTICS`)
DOUBLE_TO_FLOAT = {
    "RMSNorm": (
        "float32 statistics would be up to 4 units in the last place from the original's "
        "correctly rounded result with 64 values a row and 9 with 4096 (14 through ONNX "
        "Runtime's float32 ops), more than 1 for up to 27 values in 100, and 0 for a row whose "
        "squares sum past 3.4e38"
    ),
    "LayerNorm": (
        "float32 statistics would be up to 3 units in the last place of the row's largest |Y| "
        "from the original's correctly rounded result (6 through ONNX Runtime's float32 ops, "
        "1362 through its LayerNormalization for a row of mean 3 and spread 0.001), and lose a "
        "row whose squares sum past 3.4e38"
    ),
}


@dataclasses.dataclass(frozen=True)
class InDouble(Replacement):
    """A node that computes in float32 a value the original computes in double: its rewrite
    casts the node's float32 Y to DOUBLE for the double arithmetic that reads it, and casts a
    Scale or Bias that is not float32 to float32."""


def in_double(
    op_name: str, x: ir.Value, y: ir.Value, axis: int, strict: bool, eps: float
) -> Replacement:
    """The norm of a core whose X is DOUBLE: X must be a float32/float16/bfloat16 value cast to
    double, and every use of the result ``y`` must end, through double Muls and Adds (the
    weights), in a Cast to float16 or bfloat16, whose rounding hides what float32 statistics
    change (measured: :data:`DOUBLE_STATISTICS`). The node is the norm of the value before the
    cast, its Y float32 (``y_float32``), cast to double by the rewrite; the absorb rules take
    the weights and the Cast back."""
    source = _cast_source(x)
    ends = _double_ends(y)
    lost = "the statistics are computed in DOUBLE; onnxnorm computes them in FLOAT"
    if source is None or ends - set(HALF):
        if source is not None and ir.DataType.FLOAT in ends:
            raise Rejected(
                f"{lost} and has no DOUBLE kernels: the result is rounded to FLOAT, and "
                + DOUBLE_TO_FLOAT[op_name]
            )
        # a double X, or a result used in double: the words of every other DOUBLE statistic
        statistics_type(DOUBLE, strict)
        raise AssertionError("statistics_type accepted DOUBLE")
    out = "/".join(sorted(t.name for t in ends))
    if strict:
        raise Rejected(
            f"{lost} (strict precision): the result is rounded to {out}, but float32 "
            "statistics would lose double's precision (fused by default, with the measured loss)"
        )
    x_type = dtype(source, "X")
    attrs = {"axis": axis, "epsilon": eps, "cast_before_scale": 0, "y_float32": int(x_type in HALF)}
    note = DOUBLE_STATISTICS[op_name].format(type=out)
    return InDouble(op_name, {"X": source}, attrs, note)


def _cast_source(x: ir.Value) -> ir.Value | None:
    """The float32/float16/bfloat16 value that ``x`` is a Cast of, if it is one."""
    node = x.producer()
    if node is None or node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return None
    source = node.inputs[0]
    if source is None or source.dtype not in DATA_TYPES:
        return None
    return source


def _double_ends(value: ir.Value, depth: int = 6) -> set[ir.DataType]:
    """The types in which a double value's uses end: the target type of each Cast reached
    through double Muls and Adds; DOUBLE for a use that stays in double (another op, a graph
    output, a longer chain)."""
    ends: set[ir.DataType] = set()
    if value.is_graph_output():
        ends.add(DOUBLE)
    for user in value.consumers():
        if dead(user):
            continue
        standard = user.domain in ("", "ai.onnx")
        if standard and user.op_type == "Cast":
            ends.add(ir.DataType(attribute(user, "to", DOUBLE)))
        elif standard and user.op_type in ("Mul", "Add") and depth > 0:
            for out in user.outputs:
                ends |= _double_ends(out, depth - 1)
        else:
            ends.add(DOUBLE)
    return ends or {DOUBLE}


def rewrite_in_double(rule: FusionRule, op, y, total=None, **bindings):
    """The base rewrite; for an :class:`InDouble` node, with its Scale and Bias cast to float32
    first and its Y cast to DOUBLE after."""
    accepted = rule._accepted
    if accepted is None or not isinstance(accepted[1], InDouble):
        return FusionRule.rewrite(rule, op, y, total, **bindings)
    root, new = accepted
    inputs = dict(new.inputs)
    for name in ("Scale", "Bias"):
        value = inputs.get(name)
        if value is not None and value.dtype != FLOAT:
            cast = op.Cast(value, to=FLOAT)
            cast.type, cast.shape = ir.TensorType(FLOAT), value.shape
            inputs[name] = cast
    rule._accepted = (root, dataclasses.replace(new, inputs=inputs))
    norm = FusionRule.rewrite(rule, op, y, total, **bindings)
    norm.type = ir.TensorType(FLOAT)
    result = op.Cast(norm, to=DOUBLE)
    result.type, result.shape = y.type, y.shape
    return result


# ---------------------------------------------------------------------------------------------
# absorb rules


class ScaleAbsorb(FusionRule):
    """``Mul(norm, w)`` (``Mul(norm, w + c)`` with ``offset``) becomes the norm's Scale
    (and ``scale_offset = c``). In float16/bfloat16 the Mul runs after the rounding: order A."""

    def __init__(self, tracker: Tracker, op_name: str, offset: bool) -> None:
        self.title = f"{op_name} scale{' + offset' if offset else ''} absorbed"
        super().__init__(tracker, f"{op_name}Scale{'Offset' if offset else ''}")
        self.op_name, self.offset = op_name, offset

    def pattern(self, op, x, scale, c):
        norm = getattr(op, self.op_name)(
            x, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["norm"]
        )
        factor = op.Add(scale, c) if self.offset else scale
        return op.Mul(norm, factor, _outputs=["y"])

    def inspect(self, context, x, scale, norm, y, c=None, **_):
        norm = Replacement.of(norm.producer())
        attrs = norm.attributes
        check_weight(scale, x, "Scale", attrs["axis"])
        if any(v is not None for k, v in norm.inputs.items() if k != "X"):
            raise NotThisPattern("the norm already has a Scale or Bias")
        if attrs.get("scale_offset"):
            raise Rejected("the norm already has a scale offset")
        x_type = dtype(x, "X")
        check_type(x_type, Scale=scale, Y=y)
        check_scale(scale, x, attrs["axis"])
        if self.offset:
            value = scalar(c, "the scale offset")
            attrs["scale_offset"] = value
            if dtype(c, "the scale offset") != x_type:
                raise Rejected("the scale offset is not of X's type")
        attrs["cast_before_scale"] = int(x_type != FLOAT)
        return Replacement(self.op_name, {"X": x, "Scale": scale}, attrs)


class BiasAbsorb(FusionRule):
    """``Add(norm, b)`` becomes the norm's Bias where the rounding allows it: float32, or a
    norm that already rounds before its scale (order A) or has no Scale."""

    def __init__(self, tracker: Tracker, op_name: str) -> None:
        self.title = f"{op_name} bias absorbed"
        super().__init__(tracker, f"{op_name}Bias")
        self.op_name = op_name

    def pattern(self, op, x, bias):
        norm = getattr(op, self.op_name)(
            x, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["norm"]
        )
        return op.Add(norm, bias, _outputs=["y"])

    def inspect(self, context, x, bias, norm, y, **_):
        norm = Replacement.of(norm.producer())
        attrs = norm.attributes
        check_weight(bias, x, "Bias", attrs["axis"])
        if norm.inputs["Bias"] is not None:
            raise NotThisPattern("the norm already has a Bias")
        x_type = dtype(x, "X")
        check_type(x_type, Bias=bias, Y=y)
        check_scale(bias, x, attrs["axis"])
        if x_type != FLOAT:
            if norm.inputs["Scale"] is None and not attrs.get("scale_offset"):
                attrs["cast_before_scale"] = 1
            elif not attrs["cast_before_scale"]:
                raise Rejected(
                    "the norm rounds once after its scale (order B) but the bias is "
                    f"added in {x_type.name} after that rounding"
                )
        return Replacement(self.op_name, dict(norm.inputs, Bias=bias), attrs)


class CastAbsorb(FusionRule):
    """``Cast(norm(Cast(x, FLOAT)), x's type)`` becomes the norm of x: the statistics, scale and
    bias in float32 and one rounding at the end (order B). The inner Cast may have other users:
    it stays for them."""

    shared = ("xf",)

    def __init__(self, tracker: Tracker, op_name: str) -> None:
        self.title = f"{op_name} input/output casts absorbed"
        super().__init__(tracker, f"{op_name}Casts")
        self.op_name = op_name

    def pattern(self, op, x):
        xf = op.Cast(x, _outputs=["xf"])
        norm = getattr(op, self.op_name)(
            xf, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["norm"]
        )
        return op.Cast(norm, _outputs=["y"])

    def inspect(self, context, x, xf, norm, y, **_):
        norm = Replacement.of(norm.producer())
        x_type = dtype(x, "X")
        if dtype(y, "Y") == DOUBLE:
            raise NotThisPattern("a norm cast to DOUBLE: the double rules' (DoubleAbsorb)")
        if dtype(xf, "the cast X") != FLOAT:
            raise Rejected("the inner Cast is not to FLOAT")
        check_type(x_type, Y=y)
        for what in ("Scale", "Bias"):
            value = norm.inputs.get(what)
            if value is not None and dtype(value, what) not in (FLOAT, x_type):
                raise Rejected(f"{what} is neither FLOAT nor X's type")
        return Replacement(
            self.op_name, dict(norm.inputs, X=x), dict(norm.attributes, cast_before_scale=0)
        )


class DoubleAbsorb(FusionRule):
    """The steps after a core computed in double (:func:`in_double`), on its
    ``Cast(norm, DOUBLE)``: ``what`` is "scale" (``Mul`` by a double weight: Scale), "offset"
    (``Mul`` by ``w + c``: Scale and ``scale_offset = c``), "bias" (``Add``: Bias), each still
    cast to double, or "cast" (the ``Cast`` back to X's type, which ends it: Y in X's type, one
    rounding, order B). Every use must still end in float16/bfloat16 (:func:`_double_ends`). A
    double weight becomes float32: exactly where it is a float32/float16/bfloat16 weight cast to
    double, else rounded to float32 (a folded ``1 + w``), which the note's measurement holds."""

    def __init__(self, tracker: Tracker, op_name: str, what: str) -> None:
        self.title = f"{op_name} computed in double: {what} absorbed"
        super().__init__(tracker, f"{op_name}Double{what.capitalize()}")
        self.op_name, self.what = op_name, what

    def pattern(self, op, x, weight, c):
        norm = getattr(op, self.op_name)(
            x, _domain=catalogue.DOMAIN, _allow_other_inputs=True, _outputs=["norm"]
        )
        wide = op.Cast(norm, _outputs=["wide"])
        if self.what == "cast":
            return op.Cast(wide, _outputs=["y"])
        if self.what == "bias":
            return op.Add(wide, weight, _outputs=["y"])
        factor = op.Add(weight, c) if self.what == "offset" else weight
        return op.Mul(wide, factor, _outputs=["y"])

    def inspect(self, context, x, norm, wide, y, weight=None, c=None, **_):
        node = Replacement.of(norm.producer())
        attrs = node.attributes
        if dtype(wide, "the norm cast") != DOUBLE or dtype(norm, "Y") != FLOAT:
            raise NotThisPattern("not a float32 norm cast to DOUBLE")
        if self.what == "cast":
            return self.cast_back(node, dtype(x, "X"), dtype(y, "Y"))
        if not _double_ends(y) <= set(HALF):
            raise Rejected(
                "the result is used in DOUBLE or rounded to FLOAT: the double arithmetic "
                f"after the norm stays ({self.what})"
            )
        if dtype(weight, self.what) != DOUBLE:
            raise NotThisPattern(f"the {self.what} is not DOUBLE")
        check_weight(weight, x, self.what, attrs["axis"])
        source = _cast_source(weight)
        value = weight if source is None else source
        check_scale(value, x, attrs["axis"])
        inputs = dict(node.inputs)
        if self.what == "bias":
            if inputs["Bias"] is not None:
                raise NotThisPattern("the norm already has a Bias")
            inputs["Bias"] = value
        else:
            if any(v is not None for k, v in inputs.items() if k != "X"):
                raise NotThisPattern("the norm already has a Scale or Bias")
            if attrs.get("scale_offset"):
                raise Rejected("the norm already has a scale offset")
            if self.what == "offset":
                attrs["scale_offset"] = scalar(c, "the scale offset")
            inputs["Scale"] = value
        return InDouble(self.op_name, inputs, attrs)

    def cast_back(self, node: Replacement, x_type: ir.DataType, y_type: ir.DataType):
        """``Cast(Cast(norm, DOUBLE), y_type)``: the norm of Y ``y_type`` (the float32 Y cast to
        double and back is the float32 Y; rounded to X's type, the op's own last rounding)."""
        attrs = dict(node.attributes)
        if y_type == x_type:
            attrs["y_float32"] = 0
        elif y_type != FLOAT:
            raise Rejected(
                f"the result is cast to {y_type.name}, X is {x_type.name}: the norm gives Y in "
                "X's type or FLOAT"
            )
        if attrs["cast_before_scale"]:
            raise NotThisPattern("the norm rounds before its scale (order A)")
        return Replacement(self.op_name, node.inputs, attrs)

    def rewrite(self, op, y, total=None, **bindings):
        return rewrite_in_double(self, op, y, total, **bindings)

"""Rules that turn a norm, decomposed or as a single op of another domain, into one onnxnorm
``LayerNorm`` or ``RMSNorm`` node.

Decomposed norms are found in two steps, which together cover the spellings PyTorch's
exporters write for every model family (Llama, Gemma, T5, Cohere, ...):

1. a *core* rule finds the statistics and the normalization, computed in float32
   (``x / sqrt(mean(x^2) + eps)``; ``(x - mean) / sqrt(mean((x - mean)^2) + eps)``), and
   writes an onnxnorm node without Scale or Bias;
2. *absorb* rules grow that node: a following ``Mul`` by a weight becomes Scale (``Mul`` by
   ``w + c`` becomes Scale with ``scale_offset = c``: Gemma's ``1 + w``), a following ``Add``
   becomes Bias, and ``Cast(norm(Cast(x, float32)), x's type)`` becomes the norm of x in x's
   type. Each absorb fixes the rounding order it proves: a Mul or Add done in float16/bfloat16
   after the normalized value was rounded is order A (``cast_before_scale = 1``: Llama, T5);
   arithmetic done in float32 and rounded once by the final Cast is order B (Gemma, Cohere).

A norm computed in double (X cast to DOUBLE, statistics, scale and bias in double, the result
cast back) is the same two steps in double (:func:`in_double`): the core writes the norm of the
value cast to double, computing in float32, cast to double (``Cast(norm(x), DOUBLE)``), which the
absorb rules grow through the weights in double to the Cast back. Only a result rounded to
float16/bfloat16 is fused (a note says what float32 statistics change); a float32 or double
result is left with the measured loss.

The pipeline applies these rules until nothing changes.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxnorm.fusion._base import (
    DATA_TYPES,
    FLOAT,
    WRITTEN_BY_PASS,
    FusionRule,
    NotThisPattern,
    Rejected,
    Replacement,
    attribute,
    check_scale,
    dead,
    dtype,
    epsilon,
    scalar,
    statistics_type,
)
from onnxnorm.fusion.checks import check_mixed, check_type, check_weight, mean_axis, square
from onnxnorm.fusion.report import Tracker
from onnxnorm.ops import catalogue

MS_DOMAIN = "com.microsoft"


#: how a core rule divides by the root of the statistic plus epsilon, ``v``: ``Div(x, Sqrt(v))``,
#: ``Mul(x, Reciprocal(Sqrt(v)))`` or ``Mul(x, Div(1, Sqrt(v)))``, ``Mul(x, Pow(v, -0.5))``
#: (Gemma 3n's ``torch.pow(mean_squared, -0.5)``)
FORMS = ("div", "mul", "pow")


def divide(op, x, v, one, half, form: str):
    """The pattern of ``x`` divided by the root of ``v`` as ``form`` (:data:`FORMS`) says."""
    if form == "div":
        return op.Div(x, op.Sqrt(v), _outputs=["y"])
    if form == "pow":
        return op.Mul(x, op.Pow(v, half), _outputs=["y"])
    d = op.Sqrt(v)
    return op.Mul(x, pattern.OrValue([op.Reciprocal(d), op.Div(one, d)]), _outputs=["y"])


def check_root(one: ir.Value | None, half: ir.Value | None) -> None:
    """The constants of a :func:`divide`: the reciprocal's numerator 1, the Pow exponent -0.5."""
    if one is not None and scalar(one, "the reciprocal's numerator") != 1:
        raise Rejected(f"the reciprocal's numerator is {scalar(one, 'the numerator')}, not 1")
    if half is not None and scalar(half, "the Pow exponent") != -0.5:
        raise Rejected(
            f"the root is Pow(., {scalar(half, 'the Pow exponent')}), not Pow(., -0.5): "
            "not the reciprocal square root"
        )


class _Core(FusionRule):
    """The statistics and the normalization of a decomposed ``op_name``, in float32 (or in
    double: :func:`in_double`), divided as ``form`` says (:data:`FORMS`)."""

    op_name: str

    def __init__(
        self, tracker: Tracker, form: str, strict_precision: bool = False, eps: bool = True
    ) -> None:
        self.title = f"{self.op_name} (decomposed)"
        name = f"{self.op_name}Core{form.capitalize()}{'' if eps else 'NoEpsilon'}"
        super().__init__(tracker, name, strict_precision)
        self.form, self.eps = form, eps

    def divide(self, op, x, v, one, half, eps):
        """``x`` divided by the root of ``v + eps``; of ``v`` alone where the exporter dropped
        the Add of a tiny epsilon (the dynamo exporter does): a norm with epsilon 0."""
        return divide(op, x, op.Add(v, eps) if self.eps else v, one, half, self.form)

    def checked(self, x: ir.Value, y: ir.Value, axis: int, eps: ir.Value | None) -> Replacement:
        """The node of a match of output ``y`` whose statistics start at ``axis``."""
        if dtype(x, "X") == DOUBLE:
            return in_double(self.op_name, x, y, axis, self.strict_precision, self.epsilon(eps))
        note = statistics_type(dtype(x, "X"), self.strict_precision)
        attrs = {"axis": axis, "epsilon": self.epsilon(eps), "cast_before_scale": 0}
        return Replacement(self.op_name, {"X": x}, attrs, note)

    def epsilon(self, eps: ir.Value | None) -> float:
        return epsilon(scalar(eps, "epsilon")) if self.eps and eps is not None else 0.0

    def rewrite(self, op, y, total=None, **bindings):
        return _rewrite_in_double(self, op, y, total, **bindings)


class RMSCore(_Core):
    """``x / sqrt(mean(x^2, -1) + eps)``: ``Pow(x, 2)`` or ``Mul(x, x)``."""

    op_name = "RMSNorm"

    def pattern(self, op, x, eps, two, one, half):
        mean = op.ReduceMean(square(op, x, two), _allow_other_inputs=True, _outputs=["mean"])
        return self.divide(op, x, mean, one, half, eps)

    def inspect(self, context, x, y, mean, eps=None, two=None, one=None, half=None, **_):
        return self.checked(x, y, core_shape(x, mean.producer(), two, one, half), eps)


class LayerCore(_Core):
    """``(x - mean) / sqrt(mean((x - mean)^2, -1) + eps)``, with the same spellings of the square
    as :class:`RMSCore`."""

    op_name = "LayerNorm"

    def pattern(self, op, x, eps, two, one, half):
        mu = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["mu"])
        centred = op.Sub(x, mu)
        var = op.ReduceMean(square(op, centred, two), _allow_other_inputs=True, _outputs=["mean"])
        return self.divide(op, centred, var, one, half, eps)

    def inspect(self, context, x, y, mean, mu, eps=None, two=None, one=None, half=None, **_):
        axis = core_shape(x, mean.producer(), two, one, half)
        if mean_axis(mu.producer(), x) != axis:
            raise Rejected("the mean and the variance reduce over different axes")
        return self.checked(x, y, axis, eps)


def core_checks(x, mean_node, two, one, half, strict: bool) -> tuple[str, int]:
    """The checks every core rule makes; returns the report's note on the statistics' type and
    the first normalized axis."""
    note = statistics_type(dtype(x, "X"), strict)
    return note, core_shape(x, mean_node, two, one, half)


def core_shape(x, mean_node, two, one, half) -> int:
    """The exponent and root checks of a core rule; returns the first normalized axis."""
    if two is not None and scalar(two, "the Pow exponent") != 2:
        raise Rejected(f"the Pow exponent is {scalar(two, 'the Pow exponent')}, not 2")
    check_root(one, half)
    return mean_axis(mean_node, x)


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


def _rewrite_in_double(rule: FusionRule, op, y, total=None, **bindings):
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
        return _rewrite_in_double(self, op, y, total, **bindings)


# ---------------------------------------------------------------------------------------------
# single ops of other domains


class StandardLayerNorm(FusionRule):
    """ONNX ``LayerNormalization`` (opset 17). PyTorch's layer_norm, which the exporters turn
    into it, and ONNX Runtime's kernels round once at the end: order B."""

    title = "LayerNorm (ONNX LayerNormalization)"

    def __init__(self, tracker: Tracker, strict_precision: bool = False) -> None:
        super().__init__(tracker, "LayerNormalization", strict_precision)

    def pattern(self, op, x, scale):
        return op.LayerNormalization(x, scale, _allow_other_inputs=True, _outputs=["y"])

    def inspect(self, context, x, scale, y, **_):
        node = y.producer()
        if WRITTEN_BY_PASS in node.metadata_props:  # reported by the rule that wrote it
            raise NotThisPattern("written by the pass for its statistics")
        _extra_outputs_unused(node)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        note = _stash(node, self.strict_precision)
        x_type = dtype(x, "X")
        mixed = check_mixed(x_type, y, Scale=scale, Bias=bias)
        axis = _axis(node, x)
        for value in (scale, bias):
            if value is not None:
                check_scale(value, x, axis)
        inputs = {
            "X": x,
            "Scale": None if _is_ones(scale) else scale,
            "Bias": None if bias is None or _is_zeros(bias) else bias,
        }
        return Replacement(
            "LayerNorm",
            inputs,
            {
                "axis": axis,
                "epsilon": epsilon(attribute(node, "epsilon", 1e-5)),
                "cast_before_scale": 0,
                **({"y_float32": 1} if mixed else {}),
            },
            note,
        )


class StandardRMSNorm(FusionRule):
    """ONNX ``RMSNormalization`` (opset 23), as PyTorch's rms_norm computes it: the normalized
    value rounded, then the scale in X's type (order A)."""

    title = "RMSNorm (ONNX RMSNormalization)"
    source_op = "RMSNormalization"
    #: whether the op rounds the normalized value before its scale in float16/bfloat16
    order_a = True

    def __init__(self, tracker: Tracker, strict_precision: bool = False) -> None:
        super().__init__(tracker, self.source_op, strict_precision)

    def pattern(self, op, x, scale):
        return getattr(op, self.source_op)(x, scale, _outputs=["y"])

    def inspect(self, context, x, scale, y, **_):
        node = y.producer()
        _extra_outputs_unused(node)
        note = _stash(node, self.strict_precision)
        x_type = dtype(x, "X")
        mixed = False
        if self.order_a:
            # (RMSNormalization-23's own body rounds the normalized value to X's type and
            # multiplies it by a Scale of another type: no arithmetic to match for mixed types)
            check_type(x_type, Scale=scale, Y=y)
        else:
            mixed = check_mixed(x_type, y, Scale=scale)
        axis = _axis(node, x)
        check_scale(scale, x, axis)
        return Replacement(
            "RMSNorm",
            {"X": x, "Scale": None if _is_ones(scale) else scale},
            {
                "axis": axis,
                "epsilon": epsilon(attribute(node, "epsilon", 1e-5)),
                "cast_before_scale": int(self.order_a and x_type != FLOAT),
                **({"y_float32": 1} if mixed else {}),
            },
            note,
        )


class SimplifiedLayerNorm(StandardRMSNorm):
    """ONNX Runtime's ``SimplifiedLayerNormalization`` (RMSNorm; its kernels round once: B)."""

    title = "RMSNorm (ORT SimplifiedLayerNormalization)"
    source_op = "SimplifiedLayerNormalization"
    order_a = False


class MsSkipNorm(FusionRule):
    """com.microsoft ``SkipLayerNormalization(input, skip, gamma, beta?, bias?)`` and
    ``SkipSimplifiedLayerNormalization(input, skip, gamma, bias?)``: Sum is output 3.
    (ONNX Runtime normalizes the float32 sum before rounding it; the catalogue op normalizes the
    rounded Sum: the same definition, at most one unit in the last place apart for float16.)"""

    def __init__(self, tracker: Tracker, layer: bool, n_out: int) -> None:
        self.layer, self.n_out = layer, n_out
        self.ms_op = "SkipLayerNormalization" if layer else "SkipSimplifiedLayerNormalization"
        self.op_name = "SkipLayerNorm" if layer else "SkipRMSNorm"
        self.title = f"{self.op_name} (ORT {self.ms_op})"
        super().__init__(tracker, f"{self.ms_op}{n_out}")

    def pattern(self, op, x, residual, scale):
        names = ["y", "mean", "inv", "total"][: self.n_out]
        outs = getattr(op, self.ms_op)(
            x, residual, scale, _domain=MS_DOMAIN, _allow_other_inputs=True, _outputs=names
        )
        return (outs[0], outs[3]) if self.n_out == 4 else outs

    def inspect(self, context, x, residual, scale, y, **_):
        node = y.producer()
        for value in node.outputs[1:3]:
            if value is not None and (value.uses() or value.is_graph_output()):
                raise Rejected("the mean or inverse standard deviation output is used")
        x_type = dtype(x, "X")
        check_type(x_type, Residual=residual, Scale=scale, Y=y)
        if x.shape is None or residual.shape is None or x.shape != residual.shape:
            raise Rejected("cannot prove that input and skip have the same shape")
        check_scale(scale, x, -1)
        rest = list(node.inputs[3:])
        bias = rest.pop(0) if self.layer and rest else None
        xbias = rest.pop(0) if rest else None
        for what, value in (("Bias", bias), ("XBias", xbias)):
            if value is not None:
                check_type(x_type, **{what: value})
                check_scale(value, x, -1)
        inputs = {"X": x, "Residual": residual, "Scale": scale, "Bias": bias, "XBias": xbias}
        return Replacement(
            self.op_name,
            inputs,
            {
                "axis": -1,
                "epsilon": epsilon(attribute(node, "epsilon", 1e-12)),
                "cast_before_scale": 0,
            },
        )


def _extra_outputs_unused(node: ir.Node) -> None:
    for value in node.outputs[1:]:
        if value is not None and (value.uses() or value.is_graph_output()):
            raise Rejected(
                f"output {value.name!r} (the mean or inverse standard deviation) is used"
            )


def _stash(node: ir.Node, strict: bool) -> str:
    """The report's note on the op's statistics type (``stash_type``)."""
    stash = ir.DataType(attribute(node, "stash_type", 1))
    if stash == FLOAT:
        return ""
    try:
        return statistics_type(stash, strict)
    except Rejected:
        why = (
            " and has no DOUBLE kernels: fusing would lose the original's precision"
            if stash == ir.DataType.DOUBLE
            else " (strict precision)"
            if strict
            else ""
        )
        raise Rejected(
            f"stash_type is {stash.name}; onnxnorm computes the statistics in FLOAT{why}"
        ) from None


def _axis(node: ir.Node, x: ir.Value) -> int:
    axis = attribute(node, "axis", -1)
    rank = x.shape.rank() if x.shape is not None else None
    if rank is not None and not -rank <= axis < rank:
        raise Rejected(f"axis {axis} is out of range for X of rank {rank}")
    if axis >= 0 and rank is not None:
        axis -= rank  # negative: independent of X's rank
    elif axis >= 0:
        raise Rejected(f"axis {axis} with X of unknown rank")
    return axis


def _all_equal(value: ir.Value, number: float) -> bool:
    """Whether ``value`` is a constant of ``number`` everywhere: an initializer or Constant, or a
    ConstantOfShape of it (the lowering's unit Scale, which a norm op's output never takes its
    shape from)."""
    producer = value.producer()
    if producer is not None and producer.op_type == "ConstantOfShape" and producer.domain == "":
        filled = producer.attributes.get("value")
        if filled is None:
            return number == 0
        return bool((filled.as_tensor().numpy() == number).all())
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return False
    try:
        return bool((tensor.numpy() == number).all())
    except (OSError, ValueError):  # external data that cannot be read here: keep the input
        return False


def _is_ones(value: ir.Value) -> bool:
    return _all_equal(value, 1)


def _is_zeros(value: ir.Value) -> bool:
    return _all_equal(value, 0)


def norm_rules(tracker: Tracker, strict_precision: bool = False) -> list[pattern.RewriteRule]:
    """Stage 1: every norm becomes an onnxnorm LayerNorm/RMSNorm (apply to a fixpoint).
    ``strict_precision``: leave norms whose statistics the original computes in float16 or
    bfloat16 as they are (by default they are fused, with float32 statistics, and noted)."""
    from onnxnorm.fusion.standard import standard_rules

    strict = strict_precision
    rules = [
        *standard_rules(tracker, strict),
        StandardLayerNorm.rule(tracker, strict_precision=strict),
        StandardRMSNorm.rule(tracker, strict_precision=strict),
        SimplifiedLayerNorm.rule(tracker, strict_precision=strict),
        *(
            MsSkipNorm.rule(tracker, layer=layer, n_out=n)
            for layer in (True, False)
            for n in (4, 1)
        ),
    ]
    for form in FORMS:
        # LayerNorm first: RMSNorm's pattern also matches the centred half of a LayerNorm
        rules += [
            core.rule(tracker, form=form, strict_precision=strict, eps=eps)
            for eps in (True, False)
            for core in (LayerCore, RMSCore)
        ]
    for name in ("RMSNorm", "LayerNorm"):
        # only an op with a scale_offset takes Mul(norm, w + c) as Scale w and offset c; for
        # the others the plain Mul rule takes w + c as Scale
        offsets = (True, False) if "scale_offset" in catalogue.get(name).defaults else (False,)
        rules += [ScaleAbsorb.rule(tracker, op_name=name, offset=offset) for offset in offsets]
        rules += [BiasAbsorb.rule(tracker, op_name=name), CastAbsorb.rule(tracker, op_name=name)]
        steps = ["offset", "scale", "bias", "cast"] if offsets[0] else ["scale", "bias", "cast"]
        rules += [DoubleAbsorb.rule(tracker, op_name=name, what=what) for what in steps]
    return rules

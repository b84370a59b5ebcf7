"""The terms in which the op catalogue (``catalogue.py``) defines each op: the element types
and type variables of its inputs and outputs, the kinds of norm, residual add and quantization,
the rules an attribute's values follow (:data:`CHECKS`), and the records of an op
(:class:`OpSpec`), its inputs and outputs (:class:`Param`) and attributes (:class:`Attribute`),
with what follows from them (the types an op accepts, its defaults).

Like the catalogue it needs only the standard library: ``tools/gen_native_ops.py`` loads the
catalogue's modules (this one, ``norm_attributes.py``, ``rotary_catalogue.py``, ``catalogue.py``)
by their paths, so that the native op table is generated without the package's dependencies.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

#: Element types an onnxnorm tensor may have (one type per node for X, Residual, Y and Sum).
DATA_TYPES = ("tensor(float)", "tensor(float16)", "tensor(bfloat16)")
#: Every (T, S) an op accepts: X's type, and the type of its weights (S: X's type or float32).
TYPE_PAIRS = tuple((t, s) for t in DATA_TYPES for s in dict.fromkeys((t, "tensor(float)")))
#: The (T, S) pairs whose Y may also be float32 (type variable U) in the ops that have U: a
#: float16 or bfloat16 X with float32 weights, the form of ONNX Runtime's mixed-precision
#: LayerNormalization and SimplifiedLayerNormalization (X in T; Scale, Bias and Y in float32).
MIXED_PAIRS = (("tensor(float16)", "tensor(float)"), ("tensor(bfloat16)", "tensor(float)"))
#: Element types of a quantized output and its zero point (type variable Q): the 8-bit integers
#: of ONNX's QuantizeLinear and its float8 e4m3fn (the float8 type that quantization tools write
#: for activations), in the order the native element enum numbers them after DATA_TYPES.
QUANT_TYPES = ("tensor(uint8)", "tensor(int8)", "tensor(float8e4m3fn)")
#: The largest finite float8 e4m3fn value: QuantizeLinear's saturation bound for that type.
FLOAT8_E4M3FN_MAX = 448.0
#: The values of OpSpec.norm, OpSpec.residual and OpSpec.quantize, in the order the native enums
#: number them. norm: "layer" (mean and variance), "rms" (root mean square), "l2" (root of the
#: sum of squares). quantize: "none" (Y in X's type), "static" (Y quantized as QuantizeLinear does
#: with a given scale and zero point), "dynamic" (as DynamicQuantizeLinear does: uint8, scale and
#: zero point from Y's range).
NORM_KINDS = ("layer", "rms", "l2")
RESIDUAL_KINDS = ("none", "skip", "sandwich")
QUANTIZE_KINDS = ("none", "static", "dynamic")
#: The type variables of inputs and outputs, in the order the native enum numbers them, with what
#: each stands for.
TYPE_VARS = {
    "T": "X's type: float32, float16 or bfloat16, one per node",
    "S": "T or float32 (weights)",
    "U": "Y's type: T, or float32 where T is float16 or bfloat16 and S is float32 (the "
    "mixed-precision form, attribute y_float32 = 1: Y before its last rounding to T)",
    "Q": "the quantized type: uint8, int8 or float8e4m3fn (the op's quant_types)",
    "F": "float32",
    "I": "int64 (position ids)",
    "A": "the rotation angles' type (Cos, Sin): T or float32",
}


@dataclasses.dataclass(frozen=True)
class Check:
    """A rule for an attribute's value, named so that the native library applies the same rule
    (its op table is generated from this catalogue)."""

    name: str
    #: what a good value is, for messages: "must be <requirement>, got <value>"
    requirement: str
    holds: Callable[[Any], bool]


def _is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


CHECKS: dict[str, Check] = {
    c.name: c
    for c in (
        Check("none", "any value", lambda value: True),
        Check("finite", "a finite number", _is_finite),
        Check(
            "finite_non_negative",
            "a finite number >= 0",
            lambda value: _is_finite(value) and value >= 0,
        ),
        Check("zero_or_one", "0 or 1", lambda value: value in (0, 1)),
        Check("zero_one_or_two", "0, 1 or 2", lambda value: value in (0, 1, 2)),
        Check(
            "non_negative_int",
            "an integer >= 0",
            lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class Attribute:
    name: str
    kind: str  # "int" or "float"
    default: Any
    doc: str
    #: the rule its values follow: a key of CHECKS
    check: str = "none"

    def validate(self, value: Any) -> str | None:
        """An error message for a bad value, or None."""
        rule = CHECKS[self.check]
        return None if rule.holds(value) else f"must be {rule.requirement}, got {value!r}"


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    #: a key of TYPE_VARS: "T" (the node's data type), "S" (T or float32: Scale and Bias), "Q"
    #: (a quantized output and its zero point), "F" (float32 always), "I" (int64), "A" (T or
    #: float32: Cos and Sin)
    type_var: str
    doc: str
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    #: a value of NORM_KINDS: "layer" (mean and variance), "rms" (root mean square) or "l2"
    #: (root of the sum of squares)
    norm: str
    #: "none"; "skip": Sum = alpha * Residual + X (+ XBias), then the norm of Sum;
    #: "sandwich": Sum = Residual + Norm(X) (inner scale and bias), then the norm of Sum
    residual: str
    summary: str
    formula: str
    inputs: tuple[Param, ...]
    outputs: tuple[Param, ...]
    attributes: tuple[Attribute, ...]
    #: a value of QUANTIZE_KINDS: whether (and how) Y is quantized
    quantize: str = "none"
    #: the types Q may take (quantized ops only), the first where nothing names it
    quant_types: tuple[str, ...] = ()
    #: the op whose norm a quantized op computes ("SkipRMSNorm" for SkipRMSNormQuantizeLinear)
    base: str | None = None

    @property
    def norm_op(self) -> str:
        """The op whose float output this op computes (itself for an op without quantization)."""
        return self.base or self.name

    @property
    def type_constraints(self) -> dict[str, tuple[str, ...]]:
        """The types each type variable the op uses may take, in TYPE_VARS order."""
        allowed = {
            "T": DATA_TYPES,
            "S": DATA_TYPES,
            "U": DATA_TYPES,
            "Q": self.quant_types,
            "F": ("tensor(float)",),
            "I": ("tensor(int64)",),
            "A": DATA_TYPES,
        }
        used = {p.type_var for p in self.inputs + self.outputs}
        return {var: allowed[var] for var in TYPE_VARS if var in used}

    @property
    def type_sets(self) -> tuple[tuple[str, str, str], ...]:
        """Every (T, S, U) the op accepts: U is T, and for an op whose Y is of type U, also
        float32 for each of MIXED_PAIRS (U stands for T where the op has no U, S for T where
        it has no weights)."""
        if not any(p.type_var == "S" for p in self.inputs):  # no weights: S is T
            return tuple((t, t, t) for t in DATA_TYPES)
        plain = tuple((t, s, t) for t, s in TYPE_PAIRS)
        if not any(p.type_var == "U" for p in self.outputs):
            return plain
        return plain + tuple((t, s, "tensor(float)") for t, s in MIXED_PAIRS)

    def output_index(self, name: str) -> int | None:
        """The position of output ``name``, or None when the op has no such output."""
        for index, p in enumerate(self.outputs):
            if p.name == name:
                return index
        return None

    @property
    def gated(self) -> bool:
        """Takes the gate input Gate, and the attributes of a gated norm (GatedRMSNorm)."""
        return any(p.name == "Gate" for p in self.inputs)

    @property
    def rotary(self) -> bool:
        """Rotates its inputs as well as normalizing them: the Q/K ops of attention, with their
        Cos and Sin (RMSNormRotary, LayerNormRotary)."""
        return any(p.name == "Cos" for p in self.inputs)

    @property
    def has_residual(self) -> bool:
        """Takes a Residual input and gives the new residual stream as optional output Sum."""
        return self.residual != "none"

    @property
    def optional_inputs(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.inputs if p.optional)

    @property
    def required_inputs(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.inputs if not p.optional)

    def attribute(self, name: str) -> Attribute:
        for a in self.attributes:
            if a.name == name:
                return a
        raise KeyError(f"{self.name} has no attribute {name!r}")

    @property
    def defaults(self) -> dict[str, Any]:
        return {a.name: a.default for a in self.attributes}

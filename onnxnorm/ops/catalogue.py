"""The op catalogue: every onnxnorm op defined once.

Everything else derives from these definitions: the onnx schemas (``schemas.py``), the ONNX
function bodies (``functions.py``), the numpy reference (``reference.py``), the torch custom ops
and export (``onnxnorm.nn``), the fusion rules' replacement nodes, ``docs/ops.md`` and the test
matrix. The names here are the public contract (docs/design.md): users write them into
graphs and tools match on them. The native library's op table
(``custom_ops/include/onnxnorm/ops_generated.h``) is generated from it by
``tools/gen_native_ops.py``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

DOMAIN = "onnxnorm"
VERSION = 1

#: Element types an onnxnorm tensor may have (one type per node for X, Residual, Y and Sum).
DATA_TYPES = ("tensor(float)", "tensor(float16)", "tensor(bfloat16)")
#: Every (T, S) an op accepts: X's type, and the type of its weights (S: X's type or float32).
TYPE_PAIRS = tuple((t, s) for t in DATA_TYPES for s in dict.fromkeys((t, "tensor(float)")))
#: The values of OpSpec.norm and OpSpec.residual, in the order the native enums number them.
NORM_KINDS = ("layer", "rms")
RESIDUAL_KINDS = ("none", "skip", "sandwich")


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


CHECKS: dict[str, Check] = {c.name: c for c in (
    Check("none", "any value", lambda value: True),
    Check("finite", "a finite number", _is_finite),
    Check("finite_non_negative", "a finite number >= 0",
          lambda value: _is_finite(value) and value >= 0),
    Check("zero_or_one", "0 or 1", lambda value: value in (0, 1)),
)}


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
    #: "T" (the node's data type) or "S" (T or float32: Scale and Bias)
    type_var: str
    doc: str
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    #: "layer" (mean and variance) or "rms" (root mean square)
    norm: str
    #: "none"; "skip": Sum = alpha * Residual + X (+ XBias), then the norm of Sum;
    #: "sandwich": Sum = Residual + Norm(X) (inner scale and bias), then the norm of Sum
    residual: str
    summary: str
    formula: str
    inputs: tuple[Param, ...]
    outputs: tuple[Param, ...]
    attributes: tuple[Attribute, ...]

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


AXIS = Attribute(
    "axis", "int", -1,
    "First normalized dimension: statistics are taken over the dimensions [axis, rank). "
    "Negative values count from the back.",
)
EPSILON = Attribute(
    "epsilon", "float", 1e-5,
    "Added to the variance (LayerNorm) or the mean square (RMSNorm) before the square root.",
    "finite_non_negative",
)
CAST_BEFORE_SCALE = Attribute(
    "cast_before_scale", "int", 0,
    "Rounding order for float16/bfloat16. 0 (order B: Gemma, OLMo 2, Cohere, PyTorch kernels): "
    "normalize, scale and shift in float32, round once to X's type. 1 (order A: Llama, T5, the "
    "ONNX standard ops): round the normalized value to X's type, then scale and shift in X's type. "
    "Both orders are the same for float32.",
    "zero_or_one",
)
SCALE_OFFSET = Attribute(
    "scale_offset", "float", 0.0,
    "Added to Scale before it multiplies (Gemma's `1 + weight` is scale_offset = 1). The sum is "
    "taken in float32 in order B and in X's type in order A.",
    "finite",
)
ALPHA = Attribute(
    "alpha", "float", 1.0,
    "Multiplies Residual before the add (DeepNorm's alpha; 1 for Pre-/Post-Norm).",
    "finite",
)

_X = Param("X", "T", "Input tensor.")
_SCALE = Param(
    "Scale", "S",
    "Multiplier; its shape is a suffix of X's shape covering at least the normalized "
    "dimensions (it may span more, e.g. per-head Q/K norms). Absent means 1.",
    optional=True,
)
_BIAS = Param("Bias", "S", "Added after the scale; same shape rule as Scale. Absent means 0.",
              optional=True)
_RESIDUAL = Param("Residual", "T", "The residual stream; same shape as X.")
_XBIAS = Param("XBias", "S", "Bias of the sublayer that produced X, added into the sum; its "
               "shape is a suffix of X's shape.", optional=True)
_Y = Param("Y", "T", "The normalized output, same shape and type as X.")
_SUM = Param("Sum", "T", "alpha * Residual + X (+ XBias) in X's type: the new residual stream.",
             optional=True)

_LAYER_FORMULA = "Y = (Z - mean(Z)) / sqrt(var(Z) + epsilon) * Scale + Bias  (population variance)"
_RMS_FORMULA = "Y = Z / sqrt(mean(Z^2) + epsilon) * (Scale + scale_offset) + Bias"
_SKIP_FORMULA = "Sum = alpha * Residual + X (+ XBias);  Z = Sum"
_SANDWICH_FORMULA = ("Sum = Residual + Norm(X; InnerScale, InnerBias) (rounded to X's type);  "
                     "Z = Sum")
_INNER_SCALE = Param("InnerScale", "S", "Scale of the inner norm, applied to X before the "
                     "residual add; same shape rule as Scale.", optional=True)
_INNER_BIAS = Param("InnerBias", "S", "Bias of the inner norm; same shape rule as Scale.",
                    optional=True)
_SANDWICH_SUM = Param("Sum", "T", "Residual + Norm(X) in X's type: the new residual stream.",
                      optional=True)


def _spec(name: str, norm: str, residual: str, summary: str) -> OpSpec:
    inputs: tuple[Param, ...] = (_X,)
    outputs: tuple[Param, ...] = (_Y,)
    attributes = (AXIS, EPSILON, CAST_BEFORE_SCALE)
    if norm == "rms":
        attributes += (SCALE_OFFSET,)
    if residual == "skip":
        inputs += (_RESIDUAL, _SCALE, _BIAS, _XBIAS)
        outputs += (_SUM,)
        attributes += (ALPHA,)
        prefix = _SKIP_FORMULA
    elif residual == "sandwich":
        inputs += (_RESIDUAL, _INNER_SCALE, _INNER_BIAS, _SCALE, _BIAS)
        outputs += (_SANDWICH_SUM,)
        prefix = _SANDWICH_FORMULA
    else:
        inputs += (_SCALE, _BIAS)
        prefix = "Z = X"
    formula = prefix + ";  " + (_LAYER_FORMULA if norm == "layer" else _RMS_FORMULA)
    return OpSpec(name, norm, residual, summary, formula, inputs, outputs, attributes)


OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        _spec("LayerNorm", "layer", "none",
              "Layer normalization over the trailing dimensions, statistics in float32."),
        _spec("RMSNorm", "rms", "none",
              "Root-mean-square normalization (T5, Llama, Gemma with scale_offset = 1)."),
        _spec("SkipLayerNorm", "layer", "skip",
              "Residual add (optionally scaled: DeepNorm) fused with LayerNorm."),
        _spec("SkipRMSNorm", "rms", "skip",
              "Residual add (optionally scaled: DeepNorm) fused with RMSNorm."),
        _spec("SandwichLayerNorm", "layer", "sandwich",
              "Sandwich-Norm: LayerNorm of the sublayer output, residual add, LayerNorm of the "
              "sum (CogView's Sandwich-LN), in one pass over memory."),
        _spec("SandwichRMSNorm", "rms", "sandwich",
              "Sandwich-Norm with RMSNorm: Gemma 2/3's post-sublayer norm, residual add and "
              "the next pre-sublayer norm, in one pass over memory."),
    )
}


def get(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"onnxnorm has no op {name!r}; known ops: {', '.join(OPS)}") from None

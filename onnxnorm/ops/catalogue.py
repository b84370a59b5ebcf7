"""The op catalogue: every onnxnorm op defined once.

Everything else derives from these definitions: the onnx schemas (``schemas.py``), the ONNX
function bodies (``bodies.py``), the numpy reference (``reference.py``), the torch custom ops
and export (``onnxnorm.nn``), the fusion rules' replacement nodes, ``docs/ops.md`` and the test
matrix. The names here are the public contract (docs/design.md): users write them into
graphs and tools match on them. The native library's op table
(``custom_ops/include/onnxnorm/ops_generated.h``) is generated from it by
``tools/gen_native_ops.py``.

An op is written in the terms of ``spec.py`` (its types, checks and records), which are
importable from here too. The norm ops are defined here; the rotary ops (the Q/K norm and RoPE of
attention) in ``rotary_catalogue.py``; the attributes both kinds share (epsilon, the rounding
order, the scale offset) in ``norm_attributes.py``. This module gathers them: read every op,
rotary ones included, and those shared attributes from here. All four modules need only the
standard library: the generator loads them by their paths, which is why they import each other
by relative imports.
"""

from __future__ import annotations

# ``X as X``: names of the other catalogue modules (the attributes the norm ops share with the
# rotary ops, the rotary ops, the terms of spec.py), read through this one by its every user
from .norm_attributes import (
    CAST_BEFORE_SCALE as CAST_BEFORE_SCALE,
    EPSILON as EPSILON,
    SCALE_OFFSET as SCALE_OFFSET,
)
from .rotary_catalogue import ROTARY_OPS as ROTARY_OPS
from .spec import (
    CHECKS as CHECKS,
    DATA_TYPES as DATA_TYPES,
    FLOAT8_E4M3FN_MAX as FLOAT8_E4M3FN_MAX,
    MIXED_PAIRS as MIXED_PAIRS,
    NORM_KINDS as NORM_KINDS,
    QUANT_TYPES,
    QUANTIZE_KINDS as QUANTIZE_KINDS,
    RESIDUAL_KINDS as RESIDUAL_KINDS,
    TYPE_PAIRS as TYPE_PAIRS,
    TYPE_VARS as TYPE_VARS,
    Attribute,
    Check as Check,
    OpSpec,
    Param,
)

DOMAIN = "onnxnorm"
VERSION = 1


AXIS = Attribute(
    "axis",
    "int",
    -1,
    "First normalized dimension: statistics are taken over the dimensions [axis, rank). "
    "Negative values count from the back.",
)
Y_FLOAT32 = Attribute(
    "y_float32",
    "int",
    0,
    "Y's type: 0, X's; 1, float32 (X float16 or bfloat16, the weights float32 or absent): the "
    "mixed-precision form of ONNX Runtime's LayerNormalization and SimplifiedLayerNormalization, "
    "Y before its last rounding to X's type (order B: the float32 result; order A: the product "
    "rounded to X's type, plus Bias in float32). The node's declared Y type must agree.",
    "zero_or_one",
)
ALPHA = Attribute(
    "alpha",
    "float",
    1.0,
    "Multiplies Residual before the add (DeepNorm's alpha; 1 for Pre-/Post-Norm).",
    "finite",
)

_X = Param("X", "T", "Input tensor.")
_SCALE = Param(
    "Scale",
    "S",
    "Multiplier; its shape is a suffix of X's shape covering at least the normalized "
    "dimensions (it may span more, e.g. per-head Q/K norms). Absent means 1.",
    optional=True,
)
_BIAS = Param(
    "Bias", "S", "Added after the scale; same shape rule as Scale. Absent means 0.", optional=True
)
_RESIDUAL = Param("Residual", "T", "The residual stream; same shape as X.")
_XBIAS = Param(
    "XBias",
    "S",
    "Bias of the sublayer that produced X, added into the sum; its shape is a suffix of X's shape.",
    optional=True,
)
_Y = Param("Y", "T", "The normalized output, same shape and type as X.")
_Y_MIXED = Param(
    "Y",
    "U",
    "The normalized output, same shape as X; of X's type, or float32 "
    "(y_float32 = 1) for a float16 or bfloat16 X with float32 weights.",
)
_SUM = Param(
    "Sum",
    "T",
    "alpha * Residual + X (+ XBias) in X's type: the new residual stream.",
    optional=True,
)

_LAYER_FORMULA = "Y = (Z - mean(Z)) / sqrt(var(Z) + epsilon) * Scale + Bias  (population variance)"
_RMS_FORMULA = "Y = Z / sqrt(mean(Z^2) + epsilon) * (Scale + scale_offset) + Bias"
_SKIP_FORMULA = "Sum = alpha * Residual + X (+ XBias);  Z = Sum"
_SANDWICH_FORMULA = (
    "Sum = Residual + Norm(X; InnerScale, InnerBias) (rounded to X's type);  Z = Sum"
)
_INNER_SCALE = Param(
    "InnerScale",
    "S",
    "Scale of the inner norm, applied to X before the residual add; same shape rule as Scale.",
    optional=True,
)
_INNER_BIAS = Param(
    "InnerBias", "S", "Bias of the inner norm; same shape rule as Scale.", optional=True
)
_SANDWICH_SUM = Param(
    "Sum", "T", "Residual + Norm(X) in X's type: the new residual stream.", optional=True
)


_QUANT_FORMULA = {
    "static": "Y = saturate(round_half_even(float32(Y_float) / float32(Y_scale)) + "
    "Y_zero_point)  (QuantizeLinear of Y_float rounded to X's type; NaN gives Q's "
    "minimum; for float8e4m3fn: Y = float8e4m3fn(clamp(float32(Y_float) / "
    "float32(Y_scale), -448, 448)) rounded half to even, NaN stays NaN, the zero "
    "point's value unused)",
    "dynamic": "Y, Y_scale, Y_zero_point = DynamicQuantizeLinear(float32(Y_float))  (Y_float "
    "rounded to X's type; uint8; ONNX Runtime's rule: Y_scale = 1 where Y_float is "
    "all 0; NaN is left out of the range, wherever it sits, and gives 0)",
}
_Y_SCALE_IN = Param(
    "Y_scale",
    "T",
    "QuantizeLinear's scale, per tensor: a scalar or one-element tensor of X's type.",
)
_Y_ZERO_POINT_IN = Param(
    "Y_zero_point",
    "Q",
    "QuantizeLinear's zero point, per tensor: a scalar or one-element tensor "
    "of uint8, int8 or float8e4m3fn, which is Y's type. Absent means uint8 0. A float8e4m3fn zero "
    "point gives Y's type only: its value is not used, as ONNX Runtime's QuantizeLinear and the "
    "ONNX reference implementation do not use it.",
    optional=True,
)
_YQ_STATIC = Param(
    "Y",
    "Q",
    "The norm's output rounded to X's type, quantized as "
    "QuantizeLinear quantizes it; same shape as X.",
)
_YQ_DYNAMIC = Param(
    "Y",
    "Q",
    "The norm's output rounded to X's type, then to float32, quantized "
    "as DynamicQuantizeLinear quantizes it (uint8); same shape as X.",
)
_Y_SCALE_OUT = Param(
    "Y_scale",
    "F",
    "(max(0, max Y_float) - min(0, min Y_float)) / 255 in float32, a scalar; 1 where both are 0.",
)
_Y_ZERO_POINT_OUT = Param(
    "Y_zero_point", "Q", "round_half_even(clamp(-min(0, min Y_float) / Y_scale, 0, 255)), a scalar."
)
_Y_FLOAT = Param(
    "Y_float",
    "T",
    "The norm's output before quantization, in X's type: for graphs where it has other consumers.",
    optional=True,
)


def _spec(
    name: str,
    norm: str,
    residual: str,
    summary: str,
    quantize: str = "none",
    base: str | None = None,
) -> OpSpec:
    inputs: tuple[Param, ...] = (_X,)
    outputs: tuple[Param, ...] = (_Y,)
    attributes: tuple[Attribute, ...] = (AXIS, EPSILON, CAST_BEFORE_SCALE)
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
        if quantize == "none":
            outputs = (_Y_MIXED,)
            attributes += (Y_FLOAT32,)
        prefix = "Z = X"
    formula = prefix + ";  " + (_LAYER_FORMULA if norm == "layer" else _RMS_FORMULA)
    quant_types: tuple[str, ...] = ()
    if quantize == "static":
        inputs += (_Y_SCALE_IN, _Y_ZERO_POINT_IN)
        outputs = (_YQ_STATIC,) + outputs[1:] + (_Y_FLOAT,)
        quant_types = QUANT_TYPES
    elif quantize == "dynamic":
        outputs = (_YQ_DYNAMIC, _Y_SCALE_OUT, _Y_ZERO_POINT_OUT) + outputs[1:] + (_Y_FLOAT,)
        quant_types = ("tensor(uint8)",)
    if quantize != "none":
        formula = formula.replace("Y = ", "Y_float = ") + ";  " + _QUANT_FORMULA[quantize]
    return OpSpec(
        name,
        norm,
        residual,
        summary,
        formula,
        inputs,
        outputs,
        attributes,
        quantize,
        quant_types,
        base,
    )


def _quantized(base: OpSpec, quantize: str) -> OpSpec:
    """``base`` followed by QuantizeLinear (static) or DynamicQuantizeLinear (dynamic)."""
    suffix = "QuantizeLinear" if quantize == "static" else "DynamicQuantizeLinear"
    summary = (
        f"{base.name} with its output quantized as ONNX's {suffix} quantizes it, in one "
        "pass over memory"
        if quantize == "static"
        else f"{base.name} with its output quantized as ONNX's {suffix} quantizes it (uint8, "
        "scale and zero point from the output's range)"
    )
    return _spec(base.name + suffix, base.norm, base.residual, summary + ".", quantize, base.name)


OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        _spec(
            "LayerNorm",
            "layer",
            "none",
            "Layer normalization over the trailing dimensions, statistics in float32.",
        ),
        _spec(
            "RMSNorm",
            "rms",
            "none",
            "Root-mean-square normalization (T5, Llama, Gemma with scale_offset = 1).",
        ),
        _spec(
            "SkipLayerNorm",
            "layer",
            "skip",
            "Residual add (optionally scaled: DeepNorm) fused with LayerNorm.",
        ),
        _spec(
            "SkipRMSNorm",
            "rms",
            "skip",
            "Residual add (optionally scaled: DeepNorm) fused with RMSNorm.",
        ),
        _spec(
            "SandwichLayerNorm",
            "layer",
            "sandwich",
            "Sandwich-Norm: LayerNorm of the sublayer output, residual add, LayerNorm of the "
            "sum (CogView's Sandwich-LN), in one pass over memory.",
        ),
        _spec(
            "SandwichRMSNorm",
            "rms",
            "sandwich",
            "Sandwich-Norm with RMSNorm: Gemma 2/3's post-sublayer norm, residual add and "
            "the next pre-sublayer norm, in one pass over memory.",
        ),
    )
}
# The quantized forms (ids after the first six: the native enums number ops in this order), then
# the norms of hybrid LLMs.
OPS.update(
    {
        spec.name: spec
        for quantize in ("static", "dynamic")
        for base in ("LayerNorm", "RMSNorm", "SkipLayerNorm", "SkipRMSNorm")
        for spec in (_quantized(OPS[base], quantize),)
    }
)
GROUP_SIZE = Attribute(
    "group_size",
    "int",
    0,
    "Normalize each run of group_size consecutive values of the normalized extent on its own "
    "(Mamba2's n_groups = extent / group_size); 0: the whole extent is one group. Must divide "
    "the extent.",
    "non_negative_int",
)
ACTIVATION = Attribute(
    "activation",
    "int",
    0,
    "The gate's activation, computed in float32: 0 = SiLU, g * sigmoid(g) (Qwen3-Next, "
    "Mamba2, Nemotron-H ...); 1 = sigmoid (Kimi Linear).",
    "zero_or_one",
)
NORM_BEFORE_GATE = Attribute(
    "norm_before_gate",
    "int",
    1,
    "1: normalize X, then multiply by act(Gate) (Qwen3-Next, Qwen3.5, Kimi Linear, ONNX "
    "Runtime's GatedRMSNorm); 0: multiply X by act(Gate) in float32 (not rounded), then "
    "normalize the product (Mamba2, Nemotron-H, Bamba, Zamba2, GraniteMoeHybrid). Falcon-H1 "
    "has either. No effect without Gate.",
    "zero_or_one",
)
_GATE = Param(
    "Gate",
    "T",
    "The gate, of X's shape and type. Absent: no gate (a grouped RMSNorm).",
    optional=True,
)
_GATED_SCALE = Param(
    "Scale",
    "S",
    "Multiplier: of shape [group_size] (one group's weight, shared by every group: ONNX "
    "Runtime's GatedRMSNorm), or a suffix of X's shape covering the normalized dimensions (it "
    "may span more, per-head weights, where group_size is 0). Absent means 1.",
    optional=True,
)
_L2_Y = Param("Y", "T", "The normalized output, same shape and type as X.")

OPS.update(
    {
        "GatedRMSNorm": OpSpec(
            "GatedRMSNorm",
            "rms",
            "none",
            "RMSNorm with a gate, over groups of the last dimensions: the norms of hybrid and "
            "linear-attention LLMs (Qwen3-Next and Kimi Linear normalize, then gate; Mamba2, "
            "Nemotron-H, Bamba, Zamba2 and GraniteMoeHybrid gate, then normalize in groups).",
            "A = act(float32(Gate)) (1 without Gate);  RMS_g(Z) = Z / sqrt(mean_g(Z^2) + "
            "epsilon), mean_g over each group of group_size values;  norm_before_gate = 1: "
            "Y = RMS_g(X) * (Scale + scale_offset) * A;  norm_before_gate = 0: "
            "Y = RMS_g(float32(X) * A) * (Scale + scale_offset)",
            (_X, _GATED_SCALE, _GATE),
            (_Y,),
            (
                AXIS,
                EPSILON,
                CAST_BEFORE_SCALE,
                SCALE_OFFSET,
                GROUP_SIZE,
                ACTIVATION,
                NORM_BEFORE_GATE,
            ),
        ),
        "L2Norm": OpSpec(
            "L2Norm",
            "l2",
            "none",
            "L2 normalization with an epsilon, statistics in float32: the q/k norm of gated "
            "delta-rule attention (Qwen3-Next, FLA's l2norm).",
            "Y = X / sqrt(sum(X^2) + epsilon)  (the sum, not the mean, over [axis, rank))",
            (_X,),
            (_L2_Y,),
            (AXIS, EPSILON),
        ),
    }
)


#: Every op of the domain: the norm ops (OPS), then the rotary ops, in the order the native op
#: table numbers them. What holds for any op (the native table, schemas, function bodies, the op
#: reference) reads this; what holds for the norms of one tensor X reads OPS.
ALL_OPS: dict[str, OpSpec] = {**OPS, **ROTARY_OPS}

#: The ops whose Y is in X's type (no quantization).
FLOAT_OPS = {name: spec for name, spec in OPS.items() if spec.quantize == "none"}
#: The ops whose Y is quantized.
QUANTIZED_OPS = {name: spec for name, spec in OPS.items() if spec.quantize != "none"}
#: Every single op of any domain that computes a norm, as (domain, op type) -> (norms, residual
#: adds) one node of it holds: the catalogue's ops (a Skip op one norm and one add, a Sandwich
#: op two norms and one add, a quantized op its norm's, a rotary op one norm per tensor it
#: normalizes: Q, and K where the node has it), then the norm ops of ONNX and of ONNX
#: Runtime (which registers LayerNormalization and SimplifiedLayerNormalization in both the
#: ONNX domain and com.microsoft). What counts norms (the fusion comparison, the export's
#: report) and what counts norm time (the generation benchmark's profile) reads this one table,
#: so an op added to the catalogue counts everywhere.
NORM_OPS: dict[tuple[str, str], tuple[int, int]] = {
    **{
        (DOMAIN, name): (2 if spec.residual == "sandwich" else 1, int(spec.residual != "none"))
        for name, spec in ALL_OPS.items()
    },
    ("", "LayerNormalization"): (1, 0),
    ("", "RMSNormalization"): (1, 0),
    ("", "SimplifiedLayerNormalization"): (1, 0),
    ("com.microsoft", "LayerNormalization"): (1, 0),
    ("com.microsoft", "SimplifiedLayerNormalization"): (1, 0),
    ("com.microsoft", "SkipLayerNormalization"): (1, 1),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): (1, 1),
    ("com.microsoft", "GatedRMSNorm"): (1, 0),
    ("", "LpNormalization"): (1, 0),
}


def norms_held(domain: str, op_type: str, outputs: int = 1) -> tuple[int, int]:
    """(norms, residual adds) one node holds (NORM_OPS; (0, 0) for any other op), a rotary
    node's norms counted per tensor it normalizes: ``outputs``, the outputs the node has."""
    domain = "" if domain == "ai.onnx" else domain
    norms, adds = NORM_OPS.get((domain, op_type), (0, 0))
    if domain == DOMAIN and op_type in ROTARY_OPS:
        norms *= outputs
    return norms, adds


def get(name: str) -> OpSpec:
    """The op ``name`` (of ALL_OPS)."""
    try:
        return ALL_OPS[name]
    except KeyError:
        raise KeyError(f"onnxnorm has no op {name!r}; known ops: {', '.join(ALL_OPS)}") from None

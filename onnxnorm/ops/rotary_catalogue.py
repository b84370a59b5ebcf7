"""The rotary ops of the catalogue: the norm site of attention, where Q and K are normalized per
head (or per token) and rotated by their positions (RoPE), both in one call.

``RMSNormRotary``, ``LayerNormRotary`` and ``L2NormRotary`` are defined here in the terms of
``spec.py``, with the norm attributes they share with the norm ops (``norm_attributes.py``).
``catalogue.py`` reads them as ``ROTARY_OPS`` and numbers them after the norm ops in
``ALL_OPS``: the catalogue stays the one place users and the rest of the package read every op
from. Like the catalogue this module needs only the standard library and imports by relative
imports: the native code generator loads it by path.
"""

from __future__ import annotations

from .norm_attributes import CAST_BEFORE_SCALE, EPSILON, SCALE_OFFSET
from .spec import Attribute, OpSpec, Param

_Q = Param(
    "Q",
    "T",
    "Queries: [batch, seq, heads, head_size] (layout 0 or 2), [batch, seq, heads * head_size] "
    "(head_size given; layout 0 or 2) or [batch, heads, seq, head_size] (layout 1).",
)
_K = Param(
    "K",
    "T",
    "Keys, laid out as Q with a head count of their own (grouped-query attention). Absent: "
    "Q alone is normalized and rotated.",
    optional=True,
)
_Q_SCALE = Param(
    "QScale",
    "S",
    "Q's norm weight: [head_size] (one head's, shared by every head: Qwen3, Gemma 3, Cohere's "
    "shape when heads share it) or [heads, head_size] = [heads * head_size] (a weight per head: "
    "Cohere, StableLM; or over the whole token: OLMo 2 with per_head = 0). Absent means 1.",
    optional=True,
)
_K_SCALE = Param("KScale", "S", "K's norm weight, shaped as QScale for K's heads.", optional=True)
_COS = Param(
    "Cos",
    "A",
    "cos of the rotation angles, of Q's type or float32 (OLMo 2 and Llama 4 keep theirs in "
    "float32): [max_position, C] gathered by PositionIds, or per token [batch or 1, seq, C] "
    "without them; C = rotary_dim / 2 (one value per rotated pair, ONNX's RotaryEmbedding) or "
    "rotary_dim (one per value: the full-width caches Hugging Face models compute, their halves "
    "or pairs duplicated or not; multimodal rotary sections are built into them).",
)
_SIN = Param("Sin", "A", "sin of the rotation angles, of Cos's type and shape.")
_Q_BIAS = Param("QBias", "S", "Q's norm bias, shaped as QScale (Phi, Chameleon).", optional=True)
_K_BIAS = Param("KBias", "S", "K's norm bias, shaped as KScale.", optional=True)
_POSITION_IDS = Param(
    "PositionIds",
    "I",
    "Each token's position, [batch, seq]: the row of Cos and Sin it takes. Absent: Cos and Sin "
    "are given per token.",
    optional=True,
)
_Q_OUT = Param(
    "QOut",
    "T",
    "Q normalized and rotated (rotary_first = 1: rotated, then normalized), in Q's layout "
    "(layout 2: [batch, heads, seq, head_size]).",
)
_K_OUT = Param("KOut", "T", "K normalized and rotated, as QOut; given where K is.", optional=True)
HEAD_SIZE = Attribute(
    "head_size",
    "int",
    0,
    "The size of a head where Q and K are 3-D [batch, seq, heads * head_size]; 0: they are 4-D.",
    "non_negative_int",
)
LAYOUT = Attribute(
    "layout",
    "int",
    0,
    "0: Q, K and the outputs are [batch, seq, heads, head_size] (or 3-D); 1: [batch, heads, seq, "
    "head_size]; 2: Q and K as in 0, the outputs [batch, heads, seq, head_size] (the transpose a "
    "model writes between its Q/K norm and its rotary, taken in).",
    "zero_one_or_two",
)
PER_HEAD = Attribute(
    "per_head",
    "int",
    1,
    "1: each head normalized over its own head_size values (Qwen3, Gemma 3, Cohere, ...); 0: each "
    "token over all its heads (OLMo 2's norm of the whole projection; layout 0 or 2).",
    "zero_or_one",
)
ROTARY_DIM = Attribute(
    "rotary_dim",
    "int",
    0,
    "The leading values of each head that are rotated (partial rotary: StableLM, GLM); the rest "
    "pass through the norm alone. 0: the whole head. Even, at most head_size.",
    "non_negative_int",
)
INTERLEAVED = Attribute(
    "interleaved",
    "int",
    0,
    "0: the head's first and second halves are rotated together, value i with value i + "
    "rotary_dim / 2 (rotate_half: Llama, Qwen, Gemma, OLMo); 1: consecutive pairs, value 2j "
    "with 2j + 1 (GPT-J style: Cohere, Llama 4).",
    "zero_or_one",
)
ROTARY_FIRST = Attribute(
    "rotary_first",
    "int",
    0,
    "0: normalize, then rotate (the Q/K norms of Qwen3, Gemma 3, OLMo 2, Cohere ...); 1: rotate, "
    "then normalize (Llama 4's weightless norm after its rotary).",
    "zero_or_one",
)
ROTARY_IN_T = Attribute(
    "rotary_in_t",
    "int",
    0,
    "How the rotation rounds for float16/bfloat16: 0, computed in float32 and rounded once to "
    "X's type (fused kernels; Llama 4's complex product); 1, each product and the sum rounded to "
    "X's type, as eager PyTorch (q * cos + rotate_half(q) * sin) and ONNX's RotaryEmbedding "
    "function compute it. The same for float32. The norm's output is rounded to X's type "
    "before the rotation (and the rotation's before the norm, with rotary_first = 1), as the "
    "models compute it.",
    "zero_or_one",
)
_ROTARY_FORMULA = (
    "N(x) = the norm of x over each head (per_head = 1) or each token (per_head = 0) with its "
    "weight, rounded to Q's type;  R(x) = x rotated: for each rotated pair (a, b) = (x[i], "
    "x[i + rotary_dim / 2]) (interleaved: (x[2j], x[2j + 1])), a' = a * cos_a - b * sin_a, "
    "b' = b * cos_b + a * sin_b, the angles of the token's row of Cos and Sin (one per pair, or "
    "one per value), values past rotary_dim unchanged;  QOut = R(N(Q)), KOut = R(N(K)) "
    "(rotary_first = 1: N(R(.)))"
)
_ROTARY_NORMS = {
    "rms": "x / sqrt(mean(x^2) + epsilon) * (Scale + scale_offset)",
    "layer": "(x - mean(x)) / sqrt(var(x) + epsilon) * Scale + Bias  (population variance)",
    "l2": "x / sqrt(sum(x^2) + epsilon)",
}
_ROTARY_ATTRIBUTES = (
    HEAD_SIZE,
    LAYOUT,
    PER_HEAD,
    ROTARY_DIM,
    INTERLEAVED,
    ROTARY_FIRST,
    ROTARY_IN_T,
)


def _rotary_spec(name: str, norm: str, summary: str) -> OpSpec:
    inputs: tuple[Param, ...] = (_Q, _K)
    attributes: tuple[Attribute, ...] = (EPSILON,)
    if norm != "l2":
        inputs += (_Q_SCALE, _K_SCALE)
        attributes += (CAST_BEFORE_SCALE,)
    if norm == "layer":
        inputs += (_Q_BIAS, _K_BIAS)
    if norm == "rms":
        attributes += (SCALE_OFFSET,)
    return OpSpec(
        name,
        norm,
        "none",
        summary,
        f"{_ROTARY_FORMULA};  the norm: {_ROTARY_NORMS[norm]}",
        inputs + (_COS, _SIN, _POSITION_IDS),
        (_Q_OUT, _K_OUT),
        attributes + _ROTARY_ATTRIBUTES,
    )


ROTARY_OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        _rotary_spec(
            "RMSNormRotary",
            "rms",
            "The Q/K norm of attention and its rotary embedding, for Q and K in one call: "
            "RMSNorm per head or per token (Gemma's 1 + weight with scale_offset = 1; weightless "
            "for Llama 4), then (or after) RoPE, half-split or interleaved, partial, with the "
            "transpose to [batch, heads, seq, head_size] taken in.",
        ),
        _rotary_spec(
            "LayerNormRotary",
            "layer",
            "The LayerNorm of Q and K per head (Cohere and StableLM without bias, Phi and "
            "Chameleon with it) and the rotary embedding, as RMSNormRotary.",
        ),
        _rotary_spec(
            "L2NormRotary",
            "l2",
            "The weightless L2 norm of Q and K per head (the root of the sum of squares) and the "
            "rotary embedding, as RMSNormRotary.",
        ),
    )
}

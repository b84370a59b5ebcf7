"""The attributes of the norm's own arithmetic that every op which normalizes shares: the norm
ops of ``catalogue.py`` and the rotary ops of ``rotary_catalogue.py`` take them alike (its
epsilon, its rounding order, the offset added to its weight).

Defined here once, below both catalogue modules, so that each can import them without importing
the other. Like ``spec.py`` this module needs only the standard library (the native code
generator loads it by path, with the catalogue).
"""

from __future__ import annotations

from .spec import Attribute

EPSILON = Attribute(
    "epsilon",
    "float",
    1e-5,
    "Added to the variance (LayerNorm), the mean square (RMSNorm) or the sum of squares "
    "(L2Norm) before the square root.",
    "finite_non_negative",
)
CAST_BEFORE_SCALE = Attribute(
    "cast_before_scale",
    "int",
    0,
    "Rounding order for float16/bfloat16. 0 (order B: Gemma, OLMo 2, Cohere, PyTorch kernels): "
    "normalize, scale and shift in float32, round once to X's type. 1 (order A: Llama, T5, the "
    "ONNX standard ops): round the normalized value to X's type, then scale and shift in X's type. "
    "Both orders are the same for float32.",
    "zero_or_one",
)
SCALE_OFFSET = Attribute(
    "scale_offset",
    "float",
    0.0,
    "Added to Scale before it multiplies (Gemma's `1 + weight` is scale_offset = 1). The sum is "
    "taken in float32 in order B and in X's type in order A.",
    "finite",
)

"""The inputs and attributes of one case of a rotary op (RMSNormRotary, LayerNormRotary,
L2NormRotary), built from a case's axes (the names of tests/ops/test_rotary_bodies.py's matrix):
what the bodies' and the lowering's tests (tests/fusion/test_rotary_lowering.py) build their
one-node models from."""

from __future__ import annotations

import numpy as np

from onnxnorm.ops import catalogue
from tests.support.matrix import DTYPES

BATCH, SEQ, Q_HEADS, K_HEADS, HEAD_SIZE, MAX_POSITION = 2, 3, 4, 2, 16, 12
EPS = 2.0**-16

#: the default of each axis: layout 0 (4-D; "0-3d", "2-3d": [batch, seq, heads * head_size];
#: "1", "2"), half-split, the whole head rotated (rotary_dim 0), one angle per pair gathered by
#: PositionIds (cache: "pairs-ids", "values-ids", "values-token", "pairs-token-batch1"), K, norm
#: first, per head, rotation in float32, no weights ("shared": one head's, "per-head"), weights
#: and angles of Q's type ("T", or "float32"), order B, no scale offset
DEFAULTS = {
    "layout": "0",
    "interleaved": 0,
    "rotary_dim": 0,
    "cache": "pairs-ids",
    "k": True,
    "rotary_first": 0,
    "per_head": 1,
    "rotary_in_t": 0,
    "weights": "none",
    "weight_type": "T",
    "angle_type": "T",
    "cast_before_scale": 0,
    "scale_offset": 0.0,
}


def fit(op: str, case: dict) -> dict:
    """``case`` without the weights, rounding order and offset ``op`` does not have."""
    norm = catalogue.get(op).norm
    if norm == "l2":
        case = {**case, "weights": "none", "cast_before_scale": 0, "weight_type": "T"}
    return case if norm == "rms" else {**case, "scale_offset": 0.0}


def arrays_and_attrs(
    op: str, case: dict, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], dict]:
    """The inputs (by catalogue name) and attributes of one case (``DEFAULTS``' axes and
    ``dtype``, Q's type by its numpy name)."""
    spec = catalogue.get(op)
    t = DTYPES[case["dtype"]]
    layout, three_d = int(case["layout"][0]), case["layout"].endswith("3d")
    attrs = {
        "epsilon": EPS,
        "layout": layout,
        "interleaved": case["interleaved"],
        "rotary_dim": case["rotary_dim"],
        "rotary_first": case["rotary_first"],
        "per_head": case["per_head"],
        "rotary_in_t": case["rotary_in_t"],
        "head_size": HEAD_SIZE if three_d else 0,
        "cast_before_scale": case["cast_before_scale"],
        "scale_offset": case["scale_offset"],
    }
    attrs = {k: v for k, v in attrs.items() if k in spec.defaults}

    def qk(heads: int) -> np.ndarray:
        if three_d:
            shape: tuple[int, ...] = (BATCH, SEQ, heads * HEAD_SIZE)
        elif layout == 1:
            shape = (BATCH, heads, SEQ, HEAD_SIZE)
        else:
            shape = (BATCH, SEQ, heads, HEAD_SIZE)
        return (rng.standard_normal(shape) * 1.5 + 0.3).astype(t)

    arrays = {"Q": qk(Q_HEADS)}
    if case["k"]:
        arrays["K"] = qk(K_HEADS)
    w_type = t if case["weight_type"] == "T" else np.float32
    for name, heads in (("Q", Q_HEADS), ("K", K_HEADS)):
        if case["weights"] == "none" or name not in arrays:
            continue
        shape = (HEAD_SIZE,) if case["weights"] == "shared" else (heads, HEAD_SIZE)
        if case["per_head"] == 0 and case["weights"] == "per-head":
            shape = (heads * HEAD_SIZE,)
        arrays[name + "Scale"] = (rng.standard_normal(shape) * 0.3 + 1).astype(w_type)
        if spec.norm == "layer":
            arrays[name + "Bias"] = (rng.standard_normal(shape) * 0.3).astype(w_type)
    rotary = case["rotary_dim"] or HEAD_SIZE
    per_pair, ids = case["cache"].startswith("pairs"), case["cache"].endswith("ids")
    width = rotary // 2 if per_pair else rotary
    if ids:
        shape = (MAX_POSITION, width)
        arrays["PositionIds"] = rng.integers(0, MAX_POSITION, (BATCH, SEQ)).astype(np.int64)
    else:
        shape = (1 if case["cache"].endswith("batch1") else BATCH, SEQ, width)
    angle = rng.uniform(-np.pi, np.pi, shape)
    a_type = t if case["angle_type"] == "T" else np.float32
    arrays["Cos"], arrays["Sin"] = np.cos(angle).astype(a_type), np.sin(angle).astype(a_type)
    return arrays, attrs

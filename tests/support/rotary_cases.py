"""The inputs and attributes of one case of a rotary op (RMSNormRotary, LayerNormRotary,
L2NormRotary), built from a case's axes (the names of tests/ops/test_rotary_bodies.py's matrix):
what the bodies' and the lowering's tests (tests/fusion/test_rotary_lowering.py) build their
one-node models from."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from onnxnorm.ops import catalogue
from tests.support.matrix import BF16, DTYPES, F16, F32

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


#: the rows of the angle tables of :func:`make_case`
KERNEL_MAX_POSITION = 40


def make_case(
    op,
    dtype,
    rng,
    *,
    w_type=None,
    a_type=None,
    layout=0,
    rank3=False,
    interleaved=0,
    rotary_dim=0,
    cache="pair-ids",
    with_k=True,
    rotary_first=0,
    per_head=1,
    rotary_in_t=0,
    heads=(8, 2),
    head_size=64,
    batch=2,
    seq=3,
    order=0,
    offset=0.0,
    weights="shared",
    bias=True,
):
    """The inputs (by name) and attributes of one call of ``op``, for the kernels' tests (CPU
    and CUDA): the axes as keywords, angles in [-8, 8], tables of KERNEL_MAX_POSITION rows.
    weights: "shared" ([head_size]), "per-head" ([heads, head_size]) or None (absent)."""
    spec = catalogue.ROTARY_OPS[op]
    names = {p.name for p in spec.inputs}
    w_type = w_type or dtype
    a_type = a_type or dtype
    rd = rotary_dim or head_size
    attrs = {"layout": layout, "interleaved": interleaved, "rotary_first": rotary_first}
    attrs |= {"per_head": per_head, "rotary_in_t": rotary_in_t, "epsilon": 1e-5}
    if rotary_dim:
        attrs["rotary_dim"] = rotary_dim
    if rank3:
        attrs["head_size"] = head_size
    if "cast_before_scale" in spec.defaults:
        attrs["cast_before_scale"] = order
    if "scale_offset" in spec.defaults:
        attrs["scale_offset"] = offset

    def tensor(h):
        shape = (batch, h, seq, head_size) if layout == 1 else (batch, seq, h, head_size)
        x = rng.standard_normal(shape) * 2.0 + (0.5 if spec.norm == "layer" else 0.0)
        return (x.reshape(batch, seq, h * head_size) if rank3 else x).astype(dtype)

    arrays = {"Q": tensor(heads[0])}
    if with_k:
        arrays["K"] = tensor(heads[1])
    for x, h in (("Q", heads[0]), ("K", heads[1])):
        if x not in arrays or weights is None:
            continue
        shape = (head_size,) if weights == "shared" else (h, head_size)
        if x + "Scale" in names:
            base = 0.0 if offset else 1.0
            arrays[x + "Scale"] = (base + 0.3 * rng.standard_normal(shape)).astype(w_type)
        if x + "Bias" in names and bias:
            arrays[x + "Bias"] = (0.3 * rng.standard_normal(shape)).astype(w_type)
    width = rd if cache.startswith("value") else rd // 2
    if cache.endswith("ids"):
        angles = rng.uniform(-8.0, 8.0, (KERNEL_MAX_POSITION, width))
        arrays["PositionIds"] = rng.integers(0, KERNEL_MAX_POSITION, (batch, seq)).astype(np.int64)
    else:
        angles = rng.uniform(-8.0, 8.0, (1 if cache.endswith("shared") else batch, seq, width))
    arrays["Cos"] = np.cos(angles).astype(a_type)
    arrays["Sin"] = np.sin(angles).astype(a_type)
    return arrays, attrs


#: the cache forms make_case draws from: one angle per pair or per value, gathered by position
#: ids, per token, or per token shared by the batch
CACHES = ("pair-ids", "value-ids", "value-token", "pair-shared")
#: the matrix's layout forms: (layout, Q of rank 3)
LAYOUT_FORMS = [(0, False), (0, True), (1, False), (2, False), (2, True)]


def drawn_cases(pick: np.random.Generator) -> Iterator[tuple[str, type, dict, int]]:
    """The pruned matrix, once: every op x type x layout form x half-split / interleaved x
    rotary_first, the other axes drawn from ``pick`` case by case (seeded by the caller, so the
    same cases each run). Yields (op, dtype, make_case's keywords, a seed for the arrays); the
    CPU tests and the CUDA harness draw the same cases from the same seed."""
    for op, dtype, (layout, rank3), interleaved, first in itertools.product(
        list(catalogue.ROTARY_OPS), (F32, F16, BF16), LAYOUT_FORMS, (0, 1), (0, 1)
    ):
        head_size = int(pick.choice([64, 128, 12]))
        heads = [(8, 2), (4, 4), (2, 1)][int(pick.integers(3))]
        rotary_dim = int(pick.choice([0, 0, head_size // 2 if head_size % 4 == 0 else 8]))
        kw = dict(
            layout=layout,
            rank3=rank3,
            interleaved=interleaved,
            rotary_first=first,
            rotary_dim=rotary_dim,
            head_size=head_size,
            heads=heads,
            w_type=F32 if dtype != F32 and pick.random() < 0.5 else None,
            a_type=F32 if dtype != F32 and pick.random() < 0.5 else None,
            cache=CACHES[int(pick.integers(len(CACHES)))],
            with_k=bool(pick.random() < 0.8),
            per_head=0 if layout != 1 and pick.random() < 0.3 else 1,
            rotary_in_t=int(pick.random() < 0.5),
            order=int(pick.random() < 0.5),
            offset=float(pick.random() < 0.3),
            weights=[None, "shared", "per-head"][int(pick.integers(3))],
            bias=bool(pick.random() < 0.7),
            seq=int(pick.choice([1, 3, 5])),
        )
        yield op, dtype, kw, int(pick.integers(2**31))

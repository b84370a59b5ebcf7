"""Property-based tests (hypothesis) of every op through ONNX Runtime with the onnxnorm library,
against the numpy reference (onnxnorm.ops.reference) within its tolerance.

Each example draws a whole call: X's type and the weights' type, a shape (rank 1 to 4, width 1,
odd widths, widths around multiples of the vector width, rows wider than 65,536), the first
normalized axis (counted from the front or the back), which optional inputs are present and their
shapes (per-head weights spanning more dimensions than the statistics, leading 1s), every
attribute given or left at its default (epsilon from 0 to large, alpha, scale_offset, both
rounding orders), Sum wanted or not, one or two threads, and what the values are like (normal,
huge, tiny, subnormal, constant rows, mean 1e4 with std 1e-2, magnitudes mixed within a row,
NaN and Inf at drawn places). GatedRMSNorm's draws add its groups (none, or a divisor of the
normalized extent, with a Scale of one group or of the whole extent), its Gate (absent, or of
normal, large, huge, tiny or constant values, with NaN and Inf), its activation and whether the
gate comes before the norm. NaN and Inf must come out exactly where the reference has them.

The values are drawn by numpy from a seed that hypothesis draws, so an example is small to
describe and quick to make; hypothesis shrinks the call's structure and the seed.

The quantized ops are held to two exact properties on the same drawn calls (with a drawn
Y_scale and zero point: none, uint8, int8 or float8 e4m3fn): their float part is the float op's
kernel bit for bit (Y_float and Sum), and their quantized outputs are ONNX Runtime's quantizer
(the reference's) applied to their own Y_float, with nothing off by a step (float8: the same bits,
any NaN code where the reference has NaN).

Profiles (ONNXNORM_HYPOTHESIS_PROFILE):
  ci        (default) derandomized, a bounded number of examples per op: part of ``make test``
  fuzz      ``make fuzz``: the long campaign (100,000 cases or more over the ops), random unless
            --hypothesis-seed is given; ONNXNORM_FUZZ_COUNTS names the JSON file of counts
  sanitize  ``make sanitize``: a short campaign against the library built with AddressSanitizer
            and UndefinedBehaviorSanitizer (docs/reliability.md)
"""

from __future__ import annotations

import collections
import dataclasses
import fcntl
import json
import math
import os
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from onnxnorm import ops
from onnxnorm.ops import reference
from onnxnorm.testing.graphs import single_node_model
from tests.support.helpers import run
from tests.support.matrix import BF16, DTYPES, F16, F32, TYPE_PAIRS, WEIGHTS

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
#: examples per op in each profile (the fuzz profile: 17,000 per op, 102,000 over the float ops);
#: ONNXNORM_HYPOTHESIS_EXAMPLES sets another number for the profile in use
EXAMPLES = {"ci": 40, "fuzz": 17000, "sanitize": 150}
PROFILE = os.environ.get("ONNXNORM_HYPOTHESIS_PROFILE", "ci")
if PROFILE not in EXAMPLES:
    raise pytest.UsageError(
        f"ONNXNORM_HYPOTHESIS_PROFILE must be one of {', '.join(EXAMPLES)}, got {PROFILE!r}"
    )
if os.environ.get("ONNXNORM_HYPOTHESIS_EXAMPLES"):
    EXAMPLES[PROFILE] = int(os.environ["ONNXNORM_HYPOTHESIS_EXAMPLES"])
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    max_examples=EXAMPLES["ci"],
    suppress_health_check=_SUPPRESS,
)
settings.register_profile(
    "fuzz",
    deadline=None,
    print_blob=True,
    max_examples=EXAMPLES["fuzz"],
    suppress_health_check=_SUPPRESS,
)
settings.register_profile(
    "sanitize",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    max_examples=EXAMPLES["sanitize"],
    suppress_health_check=_SUPPRESS,
)
#: what X's values are like (see _values)
X_KINDS = ("normal", "huge", "tiny", "subnormal", "constant", "large-mean", "mixed")
RESIDUAL_KINDS = ("normal", "huge", "tiny", "constant", "mixed")
WEIGHT_KINDS = ("normal", "zero", "wide")
#: what GatedRMSNorm's gate values are like (see _gate_values)
GATE_KINDS = ("normal", "large", "huge", "tiny", "constant")

#: log10 of the largest values drawn: float16's largest finite values; for float32 and bfloat16,
#: the largest whose row statistics fit float32, where the kernels take them (kernels.h): the sum
#: of the squares of a row of 140,000 values of 2e15 is 5.6e35, while squares of 1.9e19 and more
#: overflow float32 (docs/reliability.md)
_LOG10_MAX = {F32: 15.3, F16: 4.8, BF16: 15.3}
#: log10 of the smallest normal value of each type
_LOG10_TINY = {F32: -37.9, F16: -4.2, BF16: -37.9}
_SUBNORMAL = {F32: (1.4e-45, 1.1e-38), F16: (6e-8, 6e-5), BF16: (9.2e-41, 1.1e-38)}


@dataclasses.dataclass
class Call:
    """One drawn call of an op: everything but the values, which come from ``seed``."""

    op: str
    x_type: np.dtype
    w_type: np.dtype
    batch: tuple[int, ...]  # X's dimensions before the first normalized one
    normalized: tuple[int, ...]  # X's dimensions from the first normalized one on
    axis: int
    weight_shapes: dict[str, tuple[int, ...]]
    attrs: dict[str, float | int]
    with_sum: bool
    threads: int
    x_kind: str
    residual_kind: str
    weight_kind: str
    specials: int  # how many NaN / +Inf / -Inf to put into X
    seed: int
    gate_kind: str | None = None  # GatedRMSNorm's Gate: None (absent) or one of GATE_KINDS
    gate_specials: int = 0  # how many NaN / +Inf / -Inf to put into the gate

    @property
    def shape(self) -> tuple[int, ...]:
        return self.batch + self.normalized

    @property
    def cols(self) -> int:
        return math.prod(self.normalized)

    def width_class(self) -> str:
        cols = self.cols
        if cols > 65536:
            return "wider than 65,536"
        if cols == 1:
            return "width 1"
        if cols % 16 == 0:
            return "multiple of 16"
        if cols < 16:
            return "narrower than 16"
        return "not a multiple of 16"


def _f32(value: float) -> float:
    """The value ONNX stores for a float attribute (float32), as a Python float."""
    return float(np.float32(value))


_EPSILONS = st.one_of(
    st.sampled_from([0.0, 1e-12, 1e-6, 1e-5, 1e-3, 1.0, 1e4, 1e12]),
    st.floats(0.0, 1e6, allow_subnormal=False),
).map(_f32)
_ALPHAS = st.one_of(st.sampled_from([1.0, 0.0, 0.5, 2.0, -1.0]), st.floats(-8.0, 8.0)).map(_f32)
_OFFSETS = st.one_of(st.sampled_from([0.0, 1.0, -1.0]), st.floats(-4.0, 4.0)).map(_f32)


@st.composite
def _widths(draw) -> int:
    """The number of normalized elements per row."""
    kind = draw(st.sampled_from(["small", "around a vector", "medium", "buffer edge", "wide"]))
    if kind == "small":
        return draw(st.integers(1, 17))
    if kind == "around a vector":  # multiples of 8, 16 and 32 and their neighbours
        return max(
            1,
            draw(st.integers(1, 40)) * draw(st.sampled_from([8, 16, 32]))
            + draw(st.sampled_from([-1, 0, 1])),
        )
    if kind == "medium":
        return draw(st.integers(18, 1500))
    if kind == "buffer edge":  # the kernels keep rows of up to 4096 elements in stack buffers
        return draw(st.integers(4090, 4100))
    return draw(st.integers(65537, 140000))


@st.composite
def _dims(draw, total: int, count: int) -> tuple[int, ...]:
    """``count`` dimensions whose product is ``total``: factors of it, in a drawn order."""
    dims = [total] + [1] * (count - 1)
    for i in range(1, count):
        divisors = [d for d in range(1, min(dims[0], 64) + 1) if dims[0] % d == 0]
        d = draw(st.sampled_from(divisors))
        dims[0] //= d
        dims[i] = d
    return tuple(draw(st.permutations(dims)))


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@st.composite
def calls(draw, op: str) -> Call:
    spec = ops.OPS[op]
    x_type, w_type = draw(st.sampled_from(TYPE_PAIRS))
    cols = draw(_widths())
    normalized = draw(_dims(cols, draw(st.integers(1, 2))))
    most_rows = max(1, min(64, 300000 // cols))
    rows = draw(st.integers(1, most_rows))
    batch = draw(_dims(rows, draw(st.integers(0 if rows == 1 else 1, 2))))
    rank = len(batch) + len(normalized)
    axis = len(batch) if draw(st.booleans()) else len(batch) - rank
    # GatedRMSNorm's groups: none (0, or the attribute left out), or a divisor of the extent
    group_size = draw(st.sampled_from(_divisors(cols))) if spec.gated and draw(st.booleans()) else 0

    names = [p.name for p in spec.inputs if p.name in WEIGHTS]
    weight_shapes = {}
    for name in names:
        if not draw(st.booleans()):
            continue
        # a suffix of X's shape covering the normalized dimensions: per head when it takes in
        # batch dimensions too; sometimes with leading 1s (with groups: exactly the normalized
        # dimensions, or one group's [group_size])
        extra = draw(st.integers(0, len(batch))) if not group_size else 0
        shape = batch[len(batch) - extra :] + normalized
        if group_size and draw(st.booleans()):
            shape = (group_size,)
        if len(shape) < rank:
            shape = (1,) * draw(st.integers(0, 1)) + shape
        weight_shapes[name] = shape

    attrs: dict[str, float | int] = {}
    if group_size or (spec.gated and draw(st.booleans())):
        attrs["group_size"] = group_size
    for a in spec.attributes:
        # (the mixed form, y_float32 = 1, is held to the reference by the kernel tests, ctest
        # and tests/support/cuda_harness.py, over every width and both rounding orders)
        if a.name in ("axis", "y_float32", "group_size") or not draw(st.booleans()):
            continue
        attrs[a.name] = draw(
            {
                "epsilon": _EPSILONS,
                "cast_before_scale": st.sampled_from([0, 1]),
                "scale_offset": _OFFSETS,
                "alpha": _ALPHAS,
                "activation": st.sampled_from([0, 1]),
                "norm_before_gate": st.sampled_from([0, 1]),
            }[a.name]
        )
    # With epsilon 0, a row's mean square must not underflow float32 (where the kernels sum the
    # squares): squares of values below 1e-19 do, so such rows of float32 and bfloat16 are drawn
    # with epsilon > 0 only (docs/reliability.md)
    unscaled = attrs.get("epsilon", 1.0) == 0 and x_type != F16
    tiny = ("tiny", "subnormal") if unscaled else ()
    # The gate (GatedRMSNorm). Before the norm, it scales the values whose squares are summed: a
    # gate that takes them towards 0 (tiny values, large negative ones) is drawn only where
    # epsilon, not their mean square, sets the scale (as tiny X values above)
    gate_kind = None
    if spec.gated and draw(st.booleans()):
        before = attrs.get("norm_before_gate", 1) == 0
        small_epsilon = attrs.get("epsilon", 1.0) < 1e-20
        kinds = [k for k in GATE_KINDS if not (before and small_epsilon and k in ("tiny", "large"))]
        gate_kind = draw(st.sampled_from(kinds))
    return Call(
        op=op,
        x_type=x_type,
        w_type=w_type,
        batch=batch,
        normalized=normalized,
        axis=axis,
        weight_shapes=weight_shapes,
        attrs=attrs,
        with_sum=spec.has_residual and draw(st.booleans()),
        threads=draw(st.sampled_from([1, 1, 2])) if rows > 1 else 1,
        x_kind=draw(st.sampled_from([k for k in X_KINDS if k not in tiny])),
        residual_kind=draw(st.sampled_from([k for k in RESIDUAL_KINDS if k not in tiny])),
        weight_kind=draw(st.sampled_from(WEIGHT_KINDS)),
        specials=draw(st.sampled_from([0, 0, 0, 1, 3])),
        seed=draw(st.integers(0, 2**32 - 1)),
        gate_kind=gate_kind,
        gate_specials=draw(st.sampled_from([0, 0, 1, 3])) if gate_kind else 0,
    )


def _values(
    rng: np.random.Generator, kind: str, shape: tuple[int, ...], rows: int, dtype: np.dtype
) -> np.ndarray:
    """float64 values of ``kind`` in ``dtype``'s range (rounded to it by the caller)."""
    n = math.prod(shape)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    if kind == "normal":
        v = rng.standard_normal(n) * rng.choice([0.1, 1.0, 3.0]) + rng.choice([0.0, 0.5, -2.0])
    elif kind == "huge":  # up to the type's largest finite values
        top = _LOG10_MAX[dtype] - 0.3
        v = sign * 10.0 ** rng.uniform(top - 4.0, top, n)
    elif kind == "tiny":  # around the smallest normal values
        low = _LOG10_TINY[dtype]
        v = sign * 10.0 ** rng.uniform(low, low + 3.0, n)
    elif kind == "subnormal":
        low, high = _SUBNORMAL[dtype]
        v = sign * rng.uniform(low, high, n)
    elif kind == "constant":  # every row one value (zero for some)
        per_row = rng.choice([0.0, 1.0, -3.5, 1e3], rows) * (rng.random(rows) < 0.8)
        v = np.repeat(per_row, n // rows if rows else 0)
    elif kind == "large-mean":
        v = 1e4 + 1e-2 * rng.standard_normal(n)
    elif kind == "mixed":  # magnitudes spread over eight decades within each row
        v = rng.standard_normal(n) * 10.0 ** rng.uniform(-4.0, 4.0, n)
    else:
        raise AssertionError(kind)
    return v.reshape(shape)


def _weights(rng: np.random.Generator, kind: str, name: str, shape: tuple[int, ...]) -> np.ndarray:
    n = math.prod(shape)
    base = 1.0 if "Scale" in name else 0.0
    if kind == "zero":
        v = np.zeros(n)
    elif kind == "wide" and base:  # products that overflow or underflow the 16-bit types
        v = np.exp2(rng.uniform(-24.0, 15.0, n)) * np.where(rng.random(n) < 0.5, -1.0, 1.0)
    else:
        v = base + 0.3 * rng.standard_normal(n)
    return v.reshape(shape)


def _gate_values(
    rng: np.random.Generator, kind: str, shape: tuple[int, ...], rows: int
) -> np.ndarray:
    """float64 gate values of ``kind``: "large" spans where the sigmoid saturates and exp(-|g|)
    leaves float32's normal range (|g| up to 120), "huge" magnitudes up to 1e4, "tiny" 1e-30 to
    1e-20, "constant" one value per row."""
    n = math.prod(shape)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    if kind == "normal":
        v = rng.standard_normal(n) * rng.choice([0.3, 1.0, 3.0])
    elif kind == "large":
        v = rng.uniform(-120.0, 120.0, n)
    elif kind == "huge":
        v = sign * 10.0 ** rng.uniform(0.0, 4.0, n)
    elif kind == "tiny":
        v = sign * 10.0 ** rng.uniform(-30.0, -20.0, n)
    elif kind == "constant":
        v = np.repeat(rng.choice([0.0, 1.0, -3.5, 20.0], rows), n // rows if rows else 0)
    else:
        raise AssertionError(kind)
    return v.reshape(shape)


def make_arrays(call: Call) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(call.seed)
    rows = math.prod(call.batch)
    with np.errstate(over="ignore"):
        x = _values(rng, call.x_kind, call.shape, rows, call.x_type)
        if call.specials:
            flat = x.reshape(-1)
            where = rng.choice(flat.size, size=min(call.specials, flat.size), replace=False)
            flat[where] = rng.choice([np.nan, np.inf, -np.inf], where.size)
        arrays = {"X": x.astype(call.x_type)}
        if ops.OPS[call.op].has_residual:
            residual = _values(rng, call.residual_kind, call.shape, rows, call.x_type)
            arrays["Residual"] = residual.astype(call.x_type)
        for name, shape in call.weight_shapes.items():
            arrays[name] = _weights(rng, call.weight_kind, name, shape).astype(call.w_type)
        if call.gate_kind is not None:
            gate = _gate_values(rng, call.gate_kind, call.shape, rows)
            if call.attrs.get("norm_before_gate", 1) == 0 and call.x_kind == "huge":
                # (X * act(Gate) must keep its squares' sum within float32, as X's must)
                gate = np.clip(gate, -4.0, 4.0)
            # Before the norm with epsilon (about) 0, a large negative gate takes X * act(Gate)
            # to where its squares underflow, as tiny X values would (see calls)
            before = call.attrs.get("norm_before_gate", 1) == 0
            if before and call.attrs.get("epsilon", 1.0) < 1e-20:
                gate = np.maximum(gate, -20.0)
            if call.gate_specials:
                flat = gate.reshape(-1)
                where = rng.choice(
                    flat.size, size=min(call.gate_specials, flat.size), replace=False
                )
                flat[where] = rng.choice([np.nan, np.inf, -np.inf], where.size)
            arrays["Gate"] = gate.astype(call.x_type)
    return arrays


_MANTISSA_BITS = {F32: 23, F16: 10, BF16: 7}
#: the magnitude from which a value rounds to Inf in each type: its largest finite value and
#: half a unit in its last place
_ROUNDS_TO_INF = {
    t: float(ml_dtypes.finfo(t).max) * (1 + 2.0 ** -(_MANTISSA_BITS[t] + 2))
    for t in DTYPES.values()
}


def assert_close(
    label: str,
    got: np.ndarray,
    want: np.ndarray,
    dtype: np.dtype,
    *,
    scale: np.ndarray | float = 1.0,
    terms: np.ndarray | float = 0.0,
    rtol: float | None = None,
    rounding: bool = False,
) -> None:
    """``got`` within the reference's tolerance for ``dtype`` of ``want``; NaN exactly where
    ``want`` has NaN, Inf of the same sign exactly where it has Inf, except where the finite one
    of the two is within the tolerance of rounding to Inf itself (the reference rounds a float64
    value, the kernel a float32 one).

    The tolerance is the reference's (rtol, atol), widened where the op widens an error:
    ``scale``, the magnitude of what multiplies a normalized value (atol holds the normalized
    value, whose own size is about 1; a Scale of 1e4 makes its error 1e4 times larger);
    ``terms``, the magnitude of what was added up (rtol of each term, as a sum may cancel);
    ``rounding``, a unit in the last place of ``want`` (a sum the kernel adds in float32 and
    rounds to ``dtype``, where the reference rounds the exact sum)."""
    assert got.shape == want.shape, f"{label}: shape {got.shape}, want {want.shape}"
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    assert np.array_equal(nan_g, nan_w), (
        f"{label}: NaN at {np.argwhere(nan_g != nan_w)[:5].tolist()} differs from the reference"
    )
    ref_rtol, atol = reference.tolerance(dtype)
    rtol = max(ref_rtol, rtol or 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.where(np.isfinite(w), w, g)
        bound = atol * scale + rtol * (np.abs(finite) + terms)
        if rounding:
            bound = bound + np.abs(finite) * 2.0 ** -_MANTISSA_BITS[dtype]
        bound = np.broadcast_to(bound, w.shape)
        inf_differs = (np.isinf(g) | np.isinf(w)) & (g != w)
        rounds_to_inf = np.isfinite(bound) & (np.abs(finite) + bound >= _ROUNDS_TO_INF[dtype])
        wrong_inf = inf_differs & ~rounds_to_inf
        assert not wrong_inf.any(), (
            f"{label}: Inf at {np.argwhere(wrong_inf)[:5].tolist()} differs from the reference: "
            f"{g[wrong_inf][:3].tolist()}, want {w[wrong_inf][:3].tolist()}"
        )
        bad = np.isfinite(g) & np.isfinite(w) & ~(np.abs(g - w) <= bound)
    if bad.any():
        where = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{label}: {bad.sum()} of {bad.size} values outside the tolerance "
            f"(rtol {rtol:.3g}, atol {atol}); first at {list(map(int, where))}: "
            f"{g[where]!r}, want {w[where]!r}"
        )


def _magnitude(
    arrays: dict[str, np.ndarray], name: str, shape: tuple[int, ...], plus: float = 0.0
) -> np.ndarray | float:
    """|input + plus| broadcast to X's shape, or |1 + plus| (a Scale) / 0 (a Bias) when absent.
    (A GatedRMSNorm Scale of one group, [group_size], repeats over the groups.)"""
    if name not in arrays:
        return abs((1.0 if "Scale" in name else 0.0) + plus)
    value = np.abs(arrays[name].astype(np.float64) + plus)
    try:
        return np.broadcast_to(value, shape)
    except ValueError:  # one group's, repeated along the groups (which broadcasting cannot do)
        return np.tile(value.reshape(-1), math.prod(shape) // value.size).reshape(shape)


def _statistics_rtol(call: Call) -> float:
    """How far float32 row statistics may be off, relative: each of the 32 lane sums adds
    cols / 32 values, rounding each time, and LayerNorm's variance, E[d^2] - E[d]^2, may lose up
    to a factor 4 of that to cancellation before the kernels take a second pass (kernels.h).
    About the reference's 1e-5 for rows of 4,096; more for wider ones."""
    return 4.0 * (math.ceil(call.cols / 32) + 5) * 2.0**-24


def _centring_error(call: Call, z: np.ndarray) -> np.ndarray | float:
    """LayerNorm's mean, summed in float32, is off by up to the statistics' rtol times the mean
    of |z - shift| (the kernels sum the row around the mean of its first 8 values, kernels.h):
    an error in normalized units the same for every value of the row, which a relative bound
    does not cover where Y is near 0. That mean over the row's spread; 0 for RMSNorm."""
    if ops.OPS[call.op].norm != "layer":
        return 0.0
    rows = z.astype(np.float64).reshape(math.prod(call.batch), call.cols)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        shift = rows[:, :8].mean(axis=1, keepdims=True)
        spread = np.sqrt(rows.var(axis=1, keepdims=True) + call.attrs.get("epsilon", 1e-5))
        error = np.abs(rows - shift).mean(axis=1, keepdims=True) / spread
    error = np.where(np.isfinite(error), error, 0.0)
    return np.broadcast_to(error, rows.shape).reshape(call.shape)


def _norm_bounds(
    call: Call, arrays: dict[str, np.ndarray], scale: str, bias: str, z: np.ndarray
) -> dict[str, np.ndarray | float]:
    """assert_close's widening for the output of a norm of ``z`` with weights ``scale`` and
    ``bias``."""
    offset = call.attrs.get("scale_offset", 0.0)
    weight = np.maximum(1.0, _magnitude(arrays, scale, call.shape, offset))
    return {
        "scale": weight,
        "terms": _magnitude(arrays, bias, call.shape) + _centring_error(call, z) * weight,
        "rtol": _statistics_rtol(call) if call.x_type == F32 else None,
    }


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def _run(
    call: Call, arrays: dict[str, np.ndarray], attrs: dict, with_sum: bool
) -> list[np.ndarray]:
    model = single_node_model(call.op, arrays, attrs, functions=False, optional_outputs=with_sum)
    return run(model, arrays, with_library=True, threads=call.threads)


def check_call(call: Call, arrays: dict[str, np.ndarray] | None = None) -> None:
    """Runs one call through ONNX Runtime and holds its outputs to the reference.

    Ops without a residual: Y against the reference. Ops with one: Sum against the reference's
    (relative to the terms it adds up, as the kernels add in float32 and round once more), and Y
    against the reference's norm of the Sum the kernel computed: a Sum a unit in the last place
    off the reference's, as a float32 sum may be, moves a row with a large mean and a small
    spread by much more than the norm's tolerance. Without Sum wanted, Y must be the same bits
    as with it."""
    spec = ops.OPS[call.op]
    arrays = make_arrays(call) if arrays is None else arrays
    attrs = {"axis": call.axis, **call.attrs}
    norm_op = "LayerNorm" if spec.norm == "layer" else "RMSNorm"
    norm_attrs = {k: v for k, v in attrs.items() if k != "alpha"}
    got = _run(call, arrays, attrs, with_sum=spec.has_residual)
    if not spec.has_residual:
        with np.errstate(invalid="ignore", over="ignore"):  # (SiLU(-Inf) = -Inf * 0)
            (want,) = reference.run(call.op, *[arrays.get(p.name) for p in spec.inputs], **attrs)
        z = arrays["X"]
        outer = _norm_bounds(call, arrays, "Scale", "Bias", z)
        if "Gate" in arrays:  # GatedRMSNorm: Y * act(Gate), or the norm of X * act(Gate)
            with np.errstate(invalid="ignore", over="ignore"):
                act = reference.activation(arrays["Gate"], attrs.get("activation", 0))
            if attrs.get("norm_before_gate", 1):
                outer["scale"] = outer["scale"] * np.maximum(1.0, np.abs(act))
        assert_close("Y", got[0], want, call.x_type, **outer)
        return
    y, z = got
    want_sum = reference.run(call.op, *[arrays.get(p.name) for p in spec.inputs], **attrs)[1]
    x, residual = (arrays[n].astype(np.float64) for n in ("X", "Residual"))
    if spec.residual == "skip":
        terms = np.abs(attrs.get("alpha", 1.0) * residual) + np.abs(x)
        terms = terms + _magnitude(arrays, "XBias", call.shape)
        assert_close("Sum", z, want_sum, call.x_type, terms=terms, rounding=True)
    else:
        (inner,) = reference.run(
            norm_op, arrays["X"], arrays.get("InnerScale"), arrays.get("InnerBias"), **norm_attrs
        )
        bounds = _norm_bounds(call, arrays, "InnerScale", "InnerBias", arrays["X"])
        bounds["terms"] = bounds["terms"] + np.abs(residual) + np.abs(inner.astype(np.float64))
        assert_close("Sum", z, want_sum, call.x_type, rounding=True, **bounds)
    (want_y,) = reference.run(
        norm_op, z.astype(call.x_type), arrays.get("Scale"), arrays.get("Bias"), **norm_attrs
    )
    outer = _norm_bounds(call, arrays, "Scale", "Bias", z)
    assert_close("Y", y, want_y, call.x_type, **outer)
    if not call.with_sum:
        (y_alone,) = _run(call, arrays, attrs, with_sum=False)
        assert _same_bits(y_alone, y), "Y without Sum differs from Y with Sum"


# ---------------------------------------------------------------------------------------------
# Counts: what each op was tried on, written at the end of the session when
# ONNXNORM_FUZZ_COUNTS names a file (make fuzz writes build/fuzz/counts.json)

COUNTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def _count(call: Call) -> None:
    c = COUNTS[call.op]
    c["cases"] += 1
    c[f"type {call.x_type.name}/{call.w_type.name}"] += 1
    c[f"width {call.width_class()}"] += 1
    c[f"axis {'other than -1' if len(call.normalized) > 1 else '-1'}"] += 1
    c[f"X {call.x_kind}"] += 1
    c[f"NaN/Inf in X {'yes' if call.specials else 'no'}"] += 1
    if ops.OPS[call.op].gated:
        c[f"gate {call.gate_kind or 'absent'}"] += 1
        c[f"NaN/Inf in the gate {'yes' if call.gate_specials else 'no'}"] += 1
        c[f"groups {'yes' if call.attrs.get('group_size') else 'no'}"] += 1
    c[f"threads {call.threads}"] += 1
    c[f"optional inputs {len(call.weight_shapes)}"] += 1
    if any(len(s) > len(call.normalized) and s[0] != 1 for s in call.weight_shapes.values()):
        c["per-head weights"] += 1
    for name, value in call.attrs.items():
        c[f"attribute {name} given"] += 1
        if name == "epsilon" and value == 0:
            c["epsilon 0"] += 1
        if name == "cast_before_scale":
            c[f"order {'A' if value else 'B'}"] += 1
    if ops.OPS[call.op].has_residual:
        c[f"Sum {'wanted' if call.with_sum else 'not wanted'}"] += 1


@pytest.fixture(scope="module", autouse=True)
def _write_counts():
    """Adds this process's counts to the file (under a lock: pytest-xdist workers share it)."""
    yield
    path = os.environ.get("ONNXNORM_FUZZ_COUNTS")
    if not path or not COUNTS:
        return
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        data = (
            json.loads(text)
            if text.strip()
            else {
                "profile": PROFILE,
                "seed": os.environ.get("ONNXNORM_FUZZ_SEED"),
                "total_cases": 0,
                "ops": {},
            }
        )
        for op, counts in COUNTS.items():
            merged = collections.Counter(data["ops"].get(op, {}))
            merged.update(counts)
            data["ops"][op] = dict(sorted(merged.items()))
        data["total_cases"] = sum(c["cases"] for c in data["ops"].values())
        f.seek(0)
        f.truncate()
        f.write(json.dumps(data, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------
# The properties


@pytest.mark.parametrize("op", list(ops.catalogue.FLOAT_OPS))
def test_op_matches_reference(op):
    @settings(settings.get_profile(PROFILE))
    @given(call=calls(op))
    def check(call):
        _count(call)
        check_call(call)

    start = time.perf_counter()
    try:
        check()
    finally:
        COUNTS[op]["seconds"] += round(time.perf_counter() - start)


@pytest.mark.parametrize("op", list(ops.catalogue.FLOAT_OPS))
def test_rows_narrower_than_8_of_large_constant_values(op):
    """Found by this campaign: LayerNorm's first statistics pass shifts by the mean of the row's
    first 8 values, and for rows narrower than 8 it summed the lanes past the row too. A
    Sandwich's lanes there hold the inner norm of 0, which for X = 1000 in float16 overflowed to
    Inf: every row came out NaN."""
    for x_type in DTYPES.values():
        for cols in range(1, 10):
            call = Call(
                op=op,
                x_type=x_type,
                w_type=x_type,
                batch=(4,),
                normalized=(cols,),
                axis=-1,
                weight_shapes={},
                attrs={},
                with_sum=False,
                threads=1,
                x_kind="constant",
                residual_kind="normal",
                weight_kind="normal",
                specials=0,
                seed=0,
            )
            x = np.repeat([[1e3], [1e4], [-3.5], [6e4]], cols, axis=1)
            arrays = {"X": x.astype(x_type)}
            if ops.OPS[op].has_residual:
                arrays["Residual"] = (
                    np.linspace(-0.05, 0.05, 4 * cols).reshape(4, cols).astype(x_type)
                )
            check_call(call, arrays)


# ---------------------------------------------------------------------------------------------
# The quantized ops: their float part is the float op's kernel, bit for bit, and their quantized
# outputs are exactly ONNX Runtime's quantizer applied to their own float output

_Y_SCALES = st.one_of(
    st.sampled_from([1e-3, 0.02, 0.1, 1.0, 64.0]), st.floats(1e-4, 100.0, allow_subnormal=False)
)
#: float8 e4m3fn's Y_scale: also scales that take most values past 448 (a norm's values are
#: about 1; 1/448 = 2.2e-3) and most into its subnormals (below 2^-6 = 0.0156) and to zero
_FLOAT8_Y_SCALES = st.one_of(st.sampled_from([1e-4, 1e-3, 2e-3, 128.0, 1000.0]), _Y_SCALES)
#: the static zero point's kinds: its type (uint8 when "none": absent)
ZERO_POINT_KINDS = ("none", "uint8", "int8", "float8e4m3fn")
FLOAT8 = reference.FLOAT8_E4M3FN


@st.composite
def quantized_calls(draw, op: str) -> tuple[Call, dict[str, np.ndarray]]:
    """A drawn call of the float op ``op`` quantizes (everything as for that op: shapes, axis,
    weights, attributes, values, threads), and the quantizer's inputs: Y_scale of X's type and a
    uint8, int8 or float8 e4m3fn zero point or none (static). A float8 zero point's value is not
    used: it is drawn from every float8 value, NaN included."""
    spec = ops.OPS[op]
    call = draw(calls(spec.norm_op))
    quant: dict[str, np.ndarray] = {}
    if spec.quantize == "static":
        kind = draw(st.sampled_from(ZERO_POINT_KINDS))
        scales = _FLOAT8_Y_SCALES if kind == "float8e4m3fn" else _Y_SCALES
        quant["Y_scale"] = np.array(draw(scales), call.x_type)
        if kind == "float8e4m3fn":
            quant["Y_zero_point"] = np.array(draw(st.integers(0, 255)), np.uint8).view(FLOAT8)
        elif kind != "none":
            info = np.iinfo(kind)
            quant["Y_zero_point"] = np.array(draw(st.integers(int(info.min), int(info.max))), kind)
    return call, quant


def quantized_model(
    op: str, arrays: dict[str, np.ndarray], attrs: dict, **kwargs
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """single_node_model without bodies, and the arrays to feed it."""
    return single_node_model(op, arrays, attrs, functions=False, **kwargs), arrays


def quantized_differs(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where a quantized output differs from the reference's: the values of the integer types;
    for float8 e4m3fn, the bits, with any NaN code (0x7F, 0xFF) taken for NaN only where the
    reference has NaN."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype != FLOAT8:
        return got != want
    bits = got.view(np.uint8)
    nan = np.isnan(want.astype(np.float32))
    return np.where(nan, (bits & 0x7F) != 0x7F, bits != want.view(np.uint8))


def check_quantized_call(op: str, call: Call, quant: dict[str, np.ndarray]) -> None:
    spec, base = ops.OPS[op], ops.OPS[call.op]
    arrays = make_arrays(call)
    attrs = {"axis": call.axis, **call.attrs}
    want_float = run(
        single_node_model(call.op, arrays, attrs, functions=False),
        arrays,
        with_library=True,
        threads=call.threads,
    )
    quantized = {**arrays, **quant}
    got = dict(
        zip(
            [p.name for p in spec.outputs],
            run(*quantized_model(op, quantized, attrs), with_library=True, threads=call.threads),
        )
    )
    assert _same_bits(got["Y_float"], want_float[0]), f"{op}: Y_float differs from {call.op}'s Y"
    if base.has_residual:
        assert _same_bits(got["Sum"], want_float[1]), f"{op}: Sum differs from {call.op}'s Sum"
    y_float = got["Y_float"].astype(call.x_type)  # (bfloat16 comes back as float32, exactly)
    if spec.quantize == "static":
        zero_point = quant.get("Y_zero_point", np.zeros((), np.uint8))
        want = reference.quantize_linear(y_float, quant["Y_scale"], zero_point)
    else:
        want, scale, zero_point = reference.dynamic_quantize_linear(y_float)
        assert got["Y_scale"].tobytes() == scale.tobytes(), (got["Y_scale"], scale)
        assert got["Y_zero_point"] == zero_point, (got["Y_zero_point"], zero_point)
    differs = quantized_differs(got["Y"], want)
    assert not differs.any(), (
        f"{op}: {differs.sum()} quantized values differ from the quantizer "
        f"of Y_float; first at {np.argwhere(differs)[0].tolist()}"
    )
    alone = run(
        *quantized_model(op, quantized, attrs, optional_outputs=False),
        with_library=True,
        threads=call.threads,
    )
    assert alone[0].dtype == got["Y"].dtype and alone[0].tobytes() == got["Y"].tobytes(), (
        f"{op}: Y without the optional outputs differs"
    )


@pytest.mark.parametrize("op", list(ops.catalogue.QUANTIZED_OPS))
def test_quantized_op_matches_its_float_op_and_quantizer(op):
    @settings(settings.get_profile(PROFILE))
    @given(drawn=quantized_calls(op))
    def check(drawn):
        call, quant = drawn
        _count(dataclasses.replace(call, op=op))
        if "Y_scale" in quant:
            zero_point = quant.get("Y_zero_point")
            COUNTS[op][f"zero point {'none' if zero_point is None else zero_point.dtype}"] += 1
        check_quantized_call(op, call, quant)

    start = time.perf_counter()
    try:
        check()
    finally:
        COUNTS[op]["seconds"] += round(time.perf_counter() - start)

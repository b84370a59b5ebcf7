"""numpy reference of every catalogue op: the oracle for every test.

Statistics are computed in float64. The rounding to X's type follows the op's
``cast_before_scale`` attribute exactly as the catalogue describes it, so that a float16 or
bfloat16 kernel can be held to a tolerance of a unit or two in the last place.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from onnxnorm.ops import catalogue, rotation

_DTYPES = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}


def check_attributes(spec: catalogue.OpSpec, attrs: dict[str, Any]) -> dict[str, Any]:
    """Merges ``attrs`` over the op's defaults, rejecting unknown names and bad values."""
    unknown = set(attrs) - {a.name for a in spec.attributes}
    if unknown:
        raise ValueError(
            f"{spec.name}: unknown attribute(s) {sorted(unknown)}; "
            f"expected {[a.name for a in spec.attributes]}"
        )
    merged = {**spec.defaults, **attrs}
    for a in spec.attributes:
        problem = a.validate(merged[a.name])
        if problem:
            raise ValueError(f"{spec.name}: attribute {a.name} {problem}")
    return merged


def normalized_axis(axis: int, rank: int, op: str = "") -> int:
    if rank == 0:
        raise ValueError(f"{op}: X must have rank >= 1")
    if not -rank <= axis < rank:
        raise ValueError(f"{op}: axis {axis} is out of range for X of rank {rank}")
    return axis % rank


def check_suffix(
    name: str, shape: tuple[int, ...], x_shape: tuple[int, ...], axis: int, op: str = ""
) -> None:
    """Scale, Bias and XBias must be a suffix of X's shape covering the normalized dims
    (leading 1s ignored)."""
    dims = list(shape)
    while len(dims) > len(x_shape) - axis and dims and dims[0] == 1:
        dims.pop(0)
    if len(dims) < len(x_shape) - axis or tuple(dims) != tuple(x_shape[len(x_shape) - len(dims) :]):
        raise ValueError(
            f"{op}: {name} of shape {tuple(shape)} does not fit X of shape "
            f"{tuple(x_shape)} normalized from axis {axis}: it must equal a suffix "
            f"of X's shape that covers X.shape[{axis}:]"
        )


def run(op: str, *inputs: np.ndarray | None, **attrs: Any) -> list[np.ndarray]:
    """Evaluates catalogue op ``op`` on positional ``inputs`` (None for an absent optional
    input, trailing ones may be left out). Returns every output, in the op's order (Y, and Sum
    for ops with a Residual; the quantized ops' Y_scale and Y_zero_point (dynamic), Sum and
    Y_float). ``y_float32 = 1`` gives LayerNorm's and RMSNorm's Y in float32 (the mixed form:
    X float16 or bfloat16, weights float32; Y before its last rounding to X's type)."""
    spec = catalogue.get(op)
    given = _given(spec, inputs)
    a = check_attributes(spec, attrs)
    if spec.rotary:
        return _rotary_outputs(spec, given, a)

    x = np.asarray(given["X"])
    t = x.dtype
    if t not in _DTYPES:
        raise TypeError(f"{op}: X must be float32, float16 or bfloat16, got {t}")
    axis = normalized_axis(a["axis"], x.ndim, op)
    for p in spec.inputs:
        value = given[p.name]
        if p.type_var == "S" and value is not None:
            if value.dtype not in (t, np.dtype(np.float32)):
                raise TypeError(
                    f"{op}: {p.name} must be of X's type {t} or float32, got {value.dtype}"
                )
            if not (spec.gated and _is_group_weight(value.shape, a["group_size"])):
                check_suffix(p.name, value.shape, x.shape, axis, op)
            # leading 1s beyond X's rank broadcast to nothing: Y keeps X's shape
            given[p.name] = value.reshape(value.shape[max(0, value.ndim - x.ndim) :])

    yt = _y_dtype(spec, t, a.get("y_float32", 0), given)
    axes = tuple(range(axis, x.ndim))
    if spec.gated:
        return [_gated(spec, x, axis, a, given["Scale"], given["Gate"])]
    outputs = _float_outputs(spec, x, axes, a, given, yt)
    return outputs if spec.quantize == "none" else _quantized_outputs(spec, outputs, given)


def _given(spec: catalogue.OpSpec, inputs: tuple) -> dict[str, np.ndarray | None]:
    """The op's inputs by name (None for an absent optional one); required ones checked."""
    names = [p.name for p in spec.inputs]
    if len(inputs) > len(names):
        raise ValueError(f"{spec.name}: takes at most {len(names)} inputs, got {len(inputs)}")
    given = dict(zip(names, list(inputs) + [None] * (len(names) - len(inputs))))
    for name in spec.required_inputs:
        if given[name] is None:
            raise ValueError(f"{spec.name}: input {name} is required")
    return given


def _rotary_outputs(
    spec: catalogue.OpSpec, given: dict[str, np.ndarray | None], a: dict[str, Any]
) -> list[np.ndarray]:
    """QOut (and KOut) of a rotary op: each of Q and K normalized and rotated in turn."""
    op = spec.name
    q = np.asarray(given["Q"])
    t = q.dtype
    if t not in _DTYPES:
        raise TypeError(f"{op}: Q must be float32, float16 or bfloat16, got {t}")
    for p in spec.inputs:
        value = given[p.name]
        if value is None:
            continue
        if p.type_var == "T" and (value.dtype != t or value.ndim != q.ndim):
            raise TypeError(f"{op}: {p.name} must be of Q's type and rank, got {value.dtype}")
        if p.type_var in ("S", "A") and value.dtype not in (t, np.dtype(np.float32)):
            raise TypeError(f"{op}: {p.name} must be of Q's type {t} or float32, got {value.dtype}")
    for var, names in (("S", "the norm weights"), ("A", "Cos and Sin")):
        named = (given[p.name] for p in spec.inputs if p.type_var == var)
        types = {value.dtype for value in named if value is not None}
        if len(types) > 1:
            raise TypeError(f"{op}: {names} must share one type, got {sorted(map(str, types))}")
    if a["per_head"] == 0 and a["layout"] == 1:
        raise ValueError(f"{op}: per_head = 0 normalizes a token's heads together: layout 0 or 2")
    rows = rotation.to_rows(q, a, op, "Q")
    batch, seq, _, head_size = rows.shape
    rotary_dim = a["rotary_dim"] or head_size
    if rotary_dim % 2 or rotary_dim > head_size:
        raise ValueError(
            f"{op}: rotary_dim must be even and at most head_size {head_size}, got {rotary_dim}"
        )
    positions = given["PositionIds"]
    if positions is not None and positions.dtype != np.int64:
        raise TypeError(f"{op}: PositionIds must be int64, got {positions.dtype}")
    cos, sin = rotation.angles(
        _required(given, "Cos"),
        _required(given, "Sin"),
        positions,
        batch,
        seq,
        rotary_dim,
        a["interleaved"],
        op,
    )
    outputs = []
    for name in ("Q", "K"):
        x = given[name]
        if x is None:
            continue
        x_rows = rotation.to_rows(x, a, op, name)
        if x_rows.shape[:2] != (batch, seq) or x_rows.shape[3] != head_size:
            raise ValueError(f"{op}: {name} of shape {x.shape} does not match Q's {q.shape}")
        heads = x_rows.shape[2]
        scale, bias = (
            _head_weight(op, w, given.get(w), heads, head_size)
            for w in (name + "Scale", name + "Bias")
        )
        axes = (3,) if a["per_head"] else (2, 3)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN/Inf propagate
            turn = (cos, sin, rotary_dim, a["interleaved"], a["rotary_in_t"])
            if a["rotary_first"]:
                y = normalize(spec, rotation.rotate(x_rows, *turn), axes, a, scale, bias)
            else:
                y = rotation.rotate(normalize(spec, x_rows, axes, a, scale, bias), *turn)
        outputs.append(rotation.from_rows(y, x.shape, a["layout"]))
    return outputs


def _head_weight(
    op: str, name: str, value: np.ndarray | None, heads: int, head_size: int
) -> np.ndarray | None:
    """A rotary op's norm weight as [1 or heads, head_size]: one head's, or each head's."""
    if value is None:
        return None
    if value.size not in (head_size, heads * head_size):
        raise ValueError(
            f"{op}: {name} of shape {value.shape} must hold head_size = {head_size} values or "
            f"heads * head_size = {heads * head_size}"
        )
    return value.reshape(-1, head_size)


def _required(given: dict[str, np.ndarray | None], name: str) -> np.ndarray:
    """A required input, which :func:`run` has checked is given."""
    value = given[name]
    if value is None:
        raise ValueError(f"input {name} is required")
    return value


def _is_group_weight(shape: tuple[int, ...], group_size: int) -> bool:
    """A GatedRMSNorm Scale of shape [group_size] (leading 1s ignored): one group's weight."""
    dims = list(shape)
    while len(dims) > 1 and dims[0] == 1:
        dims.pop(0)
    return group_size > 0 and dims == [group_size]


def activation(gate: np.ndarray, kind: int) -> np.ndarray:
    """The gate's activation of float32(gate) (0 SiLU, 1 sigmoid), computed in float64 and
    rounded to float32 as the op defines it (so below about -104 it is 0, where e^g leaves
    float32's range), returned in float64."""
    g = gate.astype(np.float32).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        sigmoid = 1.0 / (1.0 + np.exp(-g))
        value = g * sigmoid if kind == 0 else sigmoid
    with np.errstate(over="ignore", under="ignore"):
        return value.astype(np.float32).astype(np.float64)


def _gated(
    spec: catalogue.OpSpec,
    x: np.ndarray,
    axis: int,
    a: dict[str, Any],
    scale: np.ndarray | None,
    gate: np.ndarray | None,
) -> np.ndarray:
    """GatedRMSNorm's Y: the gate's activation before the norm (on float32(X), not rounded) or
    after it, RMS statistics over groups of group_size values of the extent [axis, rank)."""
    op, t = spec.name, x.dtype
    extent = int(np.prod(x.shape[axis:], dtype=np.int64))
    group = a["group_size"] or extent
    if extent % group:
        raise ValueError(
            f"{op}: group_size {group} does not divide the normalized extent {extent} of X of "
            f"shape {x.shape} from axis {axis}"
        )
    if gate is not None and (gate.dtype != t or gate.shape != x.shape):
        raise ValueError(
            f"{op}: Gate must have X's type and shape, got {gate.dtype}{gate.shape} for X "
            f"{t}{x.shape}"
        )
    if (
        scale is not None
        and a["group_size"]
        and not _is_group_weight(scale.shape, group)
        and int(np.prod(scale.shape, dtype=np.int64)) != extent
    ):
        raise ValueError(
            f"{op}: with group_size {group}, Scale must be of shape [{group}] or cover "
            f"exactly the normalized dimensions {x.shape[axis:]}, got {scale.shape}"
        )
    gated = activation(gate, a["activation"]) if gate is not None else None
    before = gated is not None and not a["norm_before_gate"]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        z = x.astype(np.float64)
        if gated is not None and before:
            z = (x.astype(np.float32).astype(np.float64) * gated).astype(np.float32)
            z = z.astype(np.float64)  # the product in float32, as the model computes it
        groups = z.reshape(-1, group)
        normalized = groups / np.sqrt((groups * groups).mean(axis=1, keepdims=True) + a["epsilon"])
        normalized = normalized.reshape(x.shape)
        y = _weighted(normalized, scale, a["scale_offset"], a["cast_before_scale"], t, group)
        if gated is not None and not before:
            y = y.astype(np.float64) * gated if a["cast_before_scale"] else y * gated
    return y.astype(t)


def _weighted(
    normalized: np.ndarray,
    scale: np.ndarray | None,
    offset: float,
    order_a: int,
    t: np.dtype,
    group: int,
) -> np.ndarray:
    """``normalized`` (float64) times Scale + offset as the rounding order says: order A (a
    16-bit X) rounds the normalized value, the weight and the product to X's type (the result
    is of X's type); order B and float32 keep float64 (the caller rounds once). A Scale of
    shape [group] multiplies each group."""
    order_a = bool(order_a) and t != np.float32
    s: np.ndarray
    if scale is None:
        s = np.ones((), np.float64)
    else:
        s = scale.astype(t) if order_a else scale.astype(np.float64)
    if offset:
        s = s.astype(np.float64) + (np.float64(t.type(offset)) if order_a else offset)
        s = s.astype(t) if order_a else s
    shape = normalized.shape
    if scale is not None and scale.size == group and normalized.size and shape[-1] != group:
        normalized = normalized.reshape(-1, group)
        s = s.reshape(-1)
    if order_a:
        y = (normalized.astype(t).astype(np.float64) * s.astype(np.float64)).astype(t)
    else:
        y = normalized * s.astype(np.float64)
    return y.reshape(shape)


def _y_dtype(
    spec: catalogue.OpSpec, t: np.dtype, y_float32: int, given: dict[str, np.ndarray | None]
) -> np.dtype:
    """Y's type: X's, or (``y_float32``) float32, where X is 16-bit and the weights float32."""
    if not y_float32:
        return t
    named = (given[p.name] for p in spec.inputs if p.type_var == "S")
    weights = [w for w in named if w is not None]
    if t == np.float32 or any(w.dtype != np.float32 for w in weights):
        raise TypeError(
            f"{spec.name}: y_float32 = 1 needs a float16 or bfloat16 X and float32 "
            f"weights; X is {t}, the weights {[str(w.dtype) for w in weights]}"
        )
    return np.dtype(np.float32)


def _float_outputs(
    spec: catalogue.OpSpec,
    x: np.ndarray,
    axes: tuple[int, ...],
    a: dict[str, Any],
    given: dict[str, np.ndarray | None],
    yt: np.dtype | None = None,
) -> list[np.ndarray]:
    """Y (and Sum) of the op's norm, in X's type (Y in ``yt``, for the ops whose Y is of type U)."""
    op, t = spec.name, x.dtype
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN/Inf propagate
        if not spec.has_residual:
            return [normalize(spec, x, axes, a, given.get("Scale"), given.get("Bias"), yt)]
        residual = _required(given, "Residual")
        if residual.dtype != t or residual.shape != x.shape:
            raise ValueError(
                f"{op}: Residual must have X's type and shape, got "
                f"{residual.dtype}{residual.shape} for X {t}{x.shape}"
            )
        if spec.residual == "skip":
            total = a["alpha"] * residual.astype(np.float64) + x.astype(np.float64)
            x_bias = given["XBias"]
            if x_bias is not None:
                total = total + x_bias.astype(np.float64)
        else:
            inner = normalize(spec, x, axes, a, given["InnerScale"], given["InnerBias"])
            total = residual.astype(np.float64) + inner.astype(np.float64)
        z = total.astype(t)
        return [normalize(spec, z, axes, a, given["Scale"], given["Bias"]), z]


_QUANT_DTYPES = {
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(float8e4m3fn)": np.dtype(ml_dtypes.float8_e4m3fn),
}
#: numpy's float8 e4m3fn type (ml_dtypes), Q's float type
FLOAT8_E4M3FN = _QUANT_DTYPES["tensor(float8e4m3fn)"]


def _per_tensor(op: str, name: str, value: np.ndarray) -> np.ndarray:
    value = np.asarray(value)
    if value.size != 1 or value.ndim > 1:
        raise ValueError(
            f"{op}: {name} must be a scalar or a one-element 1-D tensor (per-tensor "
            f"quantization), got shape {value.shape}"
        )
    return value.reshape(())


def _quantized_outputs(
    spec: catalogue.OpSpec, outputs: list[np.ndarray], given: dict[str, np.ndarray | None]
) -> list[np.ndarray]:
    """The quantized op's outputs from its norm's (Y in X's type, and Sum)."""
    y = outputs[0]
    if spec.quantize == "static":
        scale = _per_tensor(spec.name, "Y_scale", _required(given, "Y_scale"))
        if scale.dtype != y.dtype:
            raise TypeError(
                f"{spec.name}: Y_scale must be of X's type {y.dtype}, got {scale.dtype}"
            )
        zero_point = given["Y_zero_point"]
        if zero_point is None:
            zero_point = np.zeros((), np.uint8)
        zero_point = _per_tensor(spec.name, "Y_zero_point", zero_point)
        if zero_point.dtype not in [_QUANT_DTYPES[q] for q in spec.quant_types]:
            raise TypeError(
                f"{spec.name}: Y_zero_point must be uint8, int8 or float8e4m3fn, got "
                f"{zero_point.dtype}"
            )
        quantized = [quantize_linear(y, scale, zero_point)]
    else:
        quantized = list(dynamic_quantize_linear(y))
    return quantized + outputs[1:] + [y]


def quantize_linear(y: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """ONNX QuantizeLinear per tensor, as ONNX Runtime computes it: float32(y) / float32(scale)
    in float32, rounded half to even, plus the zero point, saturated to the zero point's type;
    NaN gives the type's minimum, +-Inf its maximum and minimum. ``scale`` and ``zero_point``
    are one-element arrays.

    A float8 e4m3fn zero point (its value unused, as ORT and ONNX's reference do) gives
    QuantizeLinear's default saturate = 1: the quotient clamped to [-448, 448] (+-Inf
    included), then rounded half to even to float8 e4m3fn; NaN stays NaN."""
    scale, zero_point = np.asarray(scale).reshape(()), np.asarray(zero_point).reshape(())
    if zero_point.dtype == FLOAT8_E4M3FN:
        bound = np.float32(catalogue.FLOAT8_E4M3FN_MAX)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            v = y.astype(np.float32) / np.float32(scale)
        return np.clip(v, -bound, bound).astype(FLOAT8_E4M3FN)  # (clip keeps NaN)
    info = np.iinfo(zero_point.dtype)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        v = y.astype(np.float32) / np.float32(scale)  # float32 division, as the kernels divide
        v = np.rint(v.astype(np.float64)) + float(zero_point)
        v = np.where(np.isnan(v), info.min, np.clip(v, info.min, info.max))
    return v.astype(zero_point.dtype)


def dynamic_quantize_linear(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear (uint8) of float32(y), as ONNX Runtime computes it:
    range [min(0, min y), max(0, max y)] with NaN left out (wherever it sits: ORT's own min/max
    does so but for a NaN that ends a vectorized stretch, which makes its scale NaN), scale
    (max - min) / 255 in float32, or 1 where the range is [0, 0] (the ONNX operator text would
    give 0 and a NaN zero point), zero point round_half_even(clamp(0 - min / scale, 0, 255))
    (255 where that is NaN: an infinite range), then QuantizeLinear with them."""
    f = y.astype(np.float32)
    numbers = f[~np.isnan(f)]
    lo = np.float32(min(0.0, numbers.min())) if numbers.size else np.float32(0)
    hi = np.float32(max(0.0, numbers.max())) if numbers.size else np.float32(0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        scale = np.float32(1) if hi == lo else np.float32(hi - lo) / np.float32(255)
        initial = np.float32(0) - lo / scale
    zero_point = np.asarray(
        np.uint8(255 if np.isnan(initial) else np.rint(np.clip(initial, 0, 255))), np.uint8
    ).reshape(())
    scale_array = np.asarray(scale, np.float32).reshape(())
    return quantize_linear(f, scale_array, zero_point), scale_array, zero_point


def normalize(
    spec: catalogue.OpSpec,
    z: np.ndarray,
    axes: tuple[int, ...],
    a: dict[str, Any],
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    yt: np.dtype | None = None,
) -> np.ndarray:
    """The norm of ``z`` (statistics over ``axes``) with its scale and bias, in z's type, or in
    ``yt`` (float32): then without the last rounding to z's type (the bias's add in order A, the
    whole result in order B)."""
    t = z.dtype
    yt = t if yt is None else yt
    z64 = z.astype(np.float64)
    if spec.norm == "layer":
        centred = z64 - z64.mean(axis=axes, keepdims=True)
        normalized = centred / np.sqrt(
            (centred * centred).mean(axis=axes, keepdims=True) + a["epsilon"]
        )
    elif spec.norm == "l2":
        normalized = z64 / np.sqrt((z64 * z64).sum(axis=axes, keepdims=True) + a["epsilon"])
    else:
        normalized = z64 / np.sqrt((z64 * z64).mean(axis=axes, keepdims=True) + a["epsilon"])

    offset = a.get("scale_offset", 0.0)
    if a.get("cast_before_scale") and t != np.float32:
        # order A: round the normalized value, then every step rounds to X's type
        y = normalized.astype(t)
        s = scale.astype(t) if scale is not None else np.ones((), t)
        if offset:
            s = (s.astype(np.float64) + np.float64(t.type(offset))).astype(t)
        y = (y.astype(np.float64) * s.astype(np.float64)).astype(t)
        if bias is not None:
            y = (y.astype(np.float64) + bias.astype(t).astype(np.float64)).astype(yt)
        return y.astype(yt)
    # order B (and float32): one rounding at the end
    y = normalized * ((scale.astype(np.float64) if scale is not None else 1.0) + offset)
    if bias is not None:
        y = y + bias.astype(np.float64)
    return y.astype(yt)


def tolerance(dtype: Any) -> tuple[float, float]:
    """(rtol, atol) that a kernel computing in float32 must meet against this reference."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return 2e-3, 2e-3
    if dtype == ml_dtypes.bfloat16:
        return 1.6e-2, 1.6e-2
    return 1e-5, 1e-5

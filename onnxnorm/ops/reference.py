"""numpy reference of every catalogue op: the oracle for every test.

Statistics are computed in float64. The rounding to X's type follows the op's
``cast_before_scale`` attribute exactly as the catalogue describes it, so that a float16 or
bfloat16 kernel can be held to a tolerance of a unit or two in the last place.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from onnxnorm.ops import catalogue

_DTYPES = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}


def check_attributes(spec: catalogue.OpSpec, attrs: dict[str, Any]) -> dict[str, Any]:
    """Merges ``attrs`` over the op's defaults, rejecting unknown names and bad values."""
    unknown = set(attrs) - {a.name for a in spec.attributes}
    if unknown:
        raise ValueError(f"{spec.name}: unknown attribute(s) {sorted(unknown)}; "
                         f"expected {[a.name for a in spec.attributes]}")
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


def check_suffix(name: str, shape: tuple[int, ...], x_shape: tuple[int, ...], axis: int,
                 op: str = "") -> None:
    """Scale, Bias and XBias must be a suffix of X's shape covering the normalized dims
    (leading 1s ignored)."""
    dims = list(shape)
    while len(dims) > len(x_shape) - axis and dims and dims[0] == 1:
        dims.pop(0)
    if len(dims) < len(x_shape) - axis or tuple(dims) != tuple(x_shape[len(x_shape) - len(dims):]):
        raise ValueError(f"{op}: {name} of shape {tuple(shape)} does not fit X of shape "
                         f"{tuple(x_shape)} normalized from axis {axis}: it must equal a suffix "
                         f"of X's shape that covers X.shape[{axis}:]")


def run(op: str, *inputs: np.ndarray | None, **attrs: Any) -> list[np.ndarray]:
    """Evaluates catalogue op ``op`` on positional ``inputs`` (None for an absent optional
    input, trailing ones may be left out). Returns every output (Y, and Sum for ops with a Residual)."""
    spec = catalogue.get(op)
    names = [p.name for p in spec.inputs]
    if len(inputs) > len(names):
        raise ValueError(f"{op}: takes at most {len(names)} inputs, got {len(inputs)}")
    given = dict(zip(names, list(inputs) + [None] * (len(names) - len(inputs))))
    for name in spec.required_inputs:
        if given[name] is None:
            raise ValueError(f"{op}: input {name} is required")
    a = check_attributes(spec, attrs)

    x = np.asarray(given["X"])
    t = x.dtype
    if t not in _DTYPES:
        raise TypeError(f"{op}: X must be float32, float16 or bfloat16, got {t}")
    axis = normalized_axis(a["axis"], x.ndim, op)
    for p in spec.inputs:
        value = given[p.name]
        if p.type_var == "S" and value is not None:
            if value.dtype not in (t, np.dtype(np.float32)):
                raise TypeError(f"{op}: {p.name} must be of X's type {t} or float32, "
                                f"got {value.dtype}")
            check_suffix(p.name, value.shape, x.shape, axis, op)
            # leading 1s beyond X's rank broadcast to nothing: Y keeps X's shape
            given[p.name] = value.reshape(value.shape[max(0, value.ndim - x.ndim):])

    axes = tuple(range(axis, x.ndim))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN/Inf propagate
        if not spec.has_residual:
            return [_norm(spec, x, axes, a, given["Scale"], given["Bias"])]
        residual = given["Residual"]
        if residual.dtype != t or residual.shape != x.shape:
            raise ValueError(f"{op}: Residual must have X's type and shape, got "
                             f"{residual.dtype}{residual.shape} for X {t}{x.shape}")
        if spec.residual == "skip":
            total = a["alpha"] * residual.astype(np.float64) + x.astype(np.float64)
            if given["XBias"] is not None:
                total = total + given["XBias"].astype(np.float64)
        else:
            inner = _norm(spec, x, axes, a, given["InnerScale"], given["InnerBias"])
            total = residual.astype(np.float64) + inner.astype(np.float64)
        z = total.astype(t)
        return [_norm(spec, z, axes, a, given["Scale"], given["Bias"]), z]


def _norm(spec: catalogue.OpSpec, z: np.ndarray, axes: tuple[int, ...], a: dict[str, Any],
          scale: np.ndarray | None, bias: np.ndarray | None) -> np.ndarray:
    """The norm of ``z`` (statistics over ``axes``) with its scale and bias, in z's type."""
    t = z.dtype
    z64 = z.astype(np.float64)
    if spec.norm == "layer":
        centred = z64 - z64.mean(axis=axes, keepdims=True)
        normalized = centred / np.sqrt((centred * centred).mean(axis=axes, keepdims=True)
                                       + a["epsilon"])
    else:
        normalized = z64 / np.sqrt((z64 * z64).mean(axis=axes, keepdims=True) + a["epsilon"])

    offset = a.get("scale_offset", 0.0)
    if a["cast_before_scale"] and t != np.float32:
        # order A: round the normalized value, then every step rounds to X's type
        y = normalized.astype(t)
        s = scale.astype(t) if scale is not None else np.ones((), t)
        if offset:
            s = (s.astype(np.float64) + np.float64(t.type(offset))).astype(t)
        y = (y.astype(np.float64) * s.astype(np.float64)).astype(t)
        if bias is not None:
            y = (y.astype(np.float64) + bias.astype(t).astype(np.float64)).astype(t)
        return y
    # order B (and float32): one rounding at the end
    y = normalized * ((scale.astype(np.float64) if scale is not None else 1.0) + offset)
    if bias is not None:
        y = y + bias.astype(np.float64)
    return y.astype(t)


def tolerance(dtype: Any) -> tuple[float, float]:
    """(rtol, atol) that a kernel computing in float32 must meet against this reference."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return 2e-3, 2e-3
    if dtype == ml_dtypes.bfloat16:
        return 1.6e-2, 1.6e-2
    return 1e-5, 1e-5

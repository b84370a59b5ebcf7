"""The rotary embedding (RoPE) of the rotary ops (``catalogue.ROTARY_OPS``) in numpy, for the
reference (``reference.py``): the layouts of Q and K, the angles of each token, the rotation.

Values are computed in float64; :func:`rotate` rounds to X's type as the op's ``rotary_in_t``
says, so that a kernel computing in float32 can be held to a unit or two in the last place.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def to_rows(x: np.ndarray, a: dict[str, Any], op: str, name: str) -> np.ndarray:
    """``x`` (Q or K) as [batch, seq, heads, head_size], from the op's layout."""
    head_size, layout = a["head_size"], a["layout"]
    if x.ndim == 3:
        if not head_size or x.shape[2] % head_size:
            raise ValueError(
                f"{op}: a 3-D {name} of shape {x.shape} needs head_size (> 0) dividing its "
                f"last dim; head_size is {head_size}"
            )
        if layout == 1:
            raise ValueError(
                f"{op}: a 3-D {name} is [batch, seq, heads * head_size]: layout 0 or 2"
            )
        return x.reshape(x.shape[0], x.shape[1], x.shape[2] // head_size, head_size)
    if x.ndim != 4:
        raise ValueError(f"{op}: {name} must be 3-D or 4-D, got shape {x.shape}")
    if head_size and x.shape[3] != head_size:
        raise ValueError(f"{op}: {name}'s heads are of size {x.shape[3]}, head_size is {head_size}")
    return x.transpose(0, 2, 1, 3) if layout == 1 else x


def from_rows(y: np.ndarray, shape: tuple[int, ...], layout: int) -> np.ndarray:
    """[batch, seq, heads, head_size] back to the output's layout (Q's ``shape``)."""
    if layout == 0:
        return y.reshape(shape)
    return np.ascontiguousarray(y.transpose(0, 2, 1, 3))


def angles(
    cos: np.ndarray,
    sin: np.ndarray,
    positions: np.ndarray | None,
    batch: int,
    seq: int,
    rotary_dim: int,
    interleaved: int,
    op: str,
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of each token's angles, one per rotated value: [batch, seq, 1, rotary_dim]
    float64 (a pair's two values share theirs where the caches hold one per pair)."""
    width = cos.shape[-1] if cos.ndim else 0
    if cos.shape != sin.shape:
        raise ValueError(f"{op}: Cos and Sin differ in shape: {cos.shape} and {sin.shape}")
    if width not in (rotary_dim // 2, rotary_dim):
        raise ValueError(
            f"{op}: Cos's last dim must be rotary_dim / 2 = {rotary_dim // 2} (one angle per "
            f"pair) or rotary_dim = {rotary_dim} (one per value), got {width}"
        )
    if positions is not None:
        if cos.ndim != 2:
            raise ValueError(f"{op}: with PositionIds, Cos is [max_position, C], got {cos.shape}")
        if positions.shape != (batch, seq):
            raise ValueError(
                f"{op}: PositionIds must be [batch, seq] = {(batch, seq)}, got {positions.shape}"
            )
        if positions.size and (positions.min() < 0 or positions.max() >= cos.shape[0]):
            raise ValueError(
                f"{op}: a position id is outside Cos's {cos.shape[0]} rows: "
                f"{positions.min()} to {positions.max()}"
            )
        c, s = cos[positions], sin[positions]
    else:
        if cos.ndim != 3 or cos.shape[0] not in (1, batch) or cos.shape[1] != seq:
            raise ValueError(
                f"{op}: without PositionIds, Cos is per token, [batch or 1, seq, C] with batch "
                f"{batch} and seq {seq}, got {cos.shape}"
            )
        c = np.broadcast_to(cos, (batch, seq, width))
        s = np.broadcast_to(sin, (batch, seq, width))
    c64, s64 = c.astype(np.float64), s.astype(np.float64)
    if width != rotary_dim:  # one angle per pair: each of the pair's values takes it
        if interleaved:
            c64, s64 = np.repeat(c64, 2, axis=-1), np.repeat(s64, 2, axis=-1)
        else:
            c64 = np.concatenate([c64, c64], axis=-1)
            s64 = np.concatenate([s64, s64], axis=-1)
    return c64[:, :, None, :], s64[:, :, None, :]


def partner(x: np.ndarray, interleaved: int) -> np.ndarray:
    """The values each rotated value is rotated with, signed: rotate_half's cat(-x2, x1), or
    the pairs' (-x[2j + 1], x[2j])."""
    if interleaved:
        out = np.empty_like(x)
        out[..., 0::2] = -x[..., 1::2]
        out[..., 1::2] = x[..., 0::2]
        return out
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotate(
    x: np.ndarray,
    c: np.ndarray,
    s: np.ndarray,
    rotary_dim: int,
    interleaved: int,
    in_t: int,
) -> np.ndarray:
    """``x`` ([batch, seq, heads, head_size], of X's type) with its first ``rotary_dim`` values
    of each head rotated by the angles ``c`` and ``s`` (:func:`angles`), in x's type: computed
    in float64 and rounded once, or (``in_t``, a float16/bfloat16 x) with the angles, each
    product and the sum rounded to x's type."""
    t = x.dtype
    head = x[..., :rotary_dim].astype(np.float64)
    other = partner(head, interleaved)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf propagate
        if in_t and t != np.float32:
            c, s = c.astype(t).astype(np.float64), s.astype(t).astype(np.float64)
            first = (head * c).astype(t).astype(np.float64)
            second = (other * s).astype(t).astype(np.float64)
            rotated = (first + second).astype(t)
        else:
            rotated = (head * c + other * s).astype(t)
    return np.concatenate([rotated, x[..., rotary_dim:]], axis=-1)

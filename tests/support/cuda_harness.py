"""The correctness matrix of the onnxnorm CUDA kernels, through their C launcher.

Every catalogue op x dtype (float32, float16, bfloat16) x weight dtype (X's or float32) x Y
dtype (X's; or float32, the mixed form of the ops whose Y is of type U, for a 16-bit X with
float32 weights) x rounding order x sets of optional inputs x row widths (Q/K rows 64-256,
hidden sizes up to beyond what the register path holds, widths that are not a multiple of the
vector width, unaligned views, per-head weights, axis -2), against ``onnxnorm.ops.reference``
within its per-dtype tolerances; plus rows of mean 1e4 and std 1e-2, NaN propagation, and bad
arguments refused before any launch. The quantized ops: every op x dtype x weight dtype x
quantized type (uint8, int8, float8e4m3fn) x zero point (given or not, static) x optional
outputs (Sum, Y_float) x row widths, their Y_float and Sum bit for bit the float op's Y and Sum
from the same library, their quantized Y (and the dynamic scale and zero point) exactly the
reference quantizer's of that Y_float (float8: the same bits; a NaN's sign may differ only where
the reference gives NaN). GatedRMSNorm: every dtype x weight dtype x rounding order x gate (absent;
SiLU or sigmoid, before or after the norm) x row widths from 1 to 16384 x groups (Qwen3-Next's
heads with one head's Scale, Mamba2's groups with a Scale of the whole extent), per-head weights,
axis -2, unaligned views and NaN/Inf rows (in X and in the Gate); L2Norm: every dtype x per-head
rows (head_dim 64 to 256) and widths from 1 to 16384 (40000 in the full matrix), axis -2,
unaligned views, NaN/Inf rows.
Arguments are ``onnxnorm._native.NormArgs`` (and ``CudaQuantArgs``) on torch tensors.

On a GPU (tests/cuda/test_cuda.py, tools/gpu_check.sh) it drives the built CUDA library. Without
one, ``--emulation`` builds the host emulation of the kernels (custom_ops/cuda/emulation: the
same kernel templates, launch table and launcher, compiled by the host C++ compiler, a block's
threads as fibers) and runs the matrix on the CPU:

    python tests/support/cuda_harness.py --emulation          # the full matrix, half a minute
    python tests/support/cuda_harness.py --emulation --quick  # what tests/cuda/test_cuda.py runs
    python tests/support/cuda_harness.py [--library PATH]     # on a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import itertools
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    # run as a script: the checkout on sys.path in place of this folder, whose modules would
    # shadow installed packages of the same names (build, for one)
    sys.path[0] = str(ROOT)
elif str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from onnxnorm import _native  # noqa: E402
from onnxnorm.ops import catalogue, reference  # noqa: E402
from tests.support.matrix import DTYPES, F8  # noqa: E402

CUDA_DIR = ROOT / "custom_ops" / "cuda"


# ---------------------------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Case:
    op: str
    dtype: str  # "float32" | "float16" | "bfloat16"
    weight_dtype: str
    shape: tuple[int, ...]
    present: tuple[str, ...]  # optional inputs given
    attrs: dict[str, Any]
    axis: int = -1
    weight_shape: tuple[int, ...] | None = None  # default: X.shape[axis:]
    unaligned: bool = False
    kind: str = "random"  # "random" | "large-mean" | "nan"
    with_sum: bool = True
    y_dtype: str = ""  # Y's type: X's (""), or float32 for the mixed form of the ops with U

    def __post_init__(self) -> None:
        self.y_dtype = self.y_dtype or self.dtype

    @property
    def mixed(self) -> bool:
        """Y float32 for a 16-bit X (type variable U: Y before its last rounding to X's type)."""
        return self.y_dtype != self.dtype

    def label(self) -> str:
        extra = "".join(
            [
                f" axis={self.axis}" if self.axis != -1 else "",
                f" w{list(self.weight_shape)}" if self.weight_shape else "",
                " unaligned" if self.unaligned else "",
                f" {self.kind}" if self.kind != "random" else "",
                "" if self.with_sum else " no-Sum",
            ]
        )
        y = f"->{self.y_dtype}" if self.mixed else ""
        return (
            f"{self.op} {self.dtype}/{self.weight_dtype}{y} {list(self.shape)} "
            f"[{','.join(self.present) or '-'}] {self.attrs}{extra}"
        )


def _optional_sets(spec: catalogue.OpSpec, quick: bool) -> list[tuple[str, ...]]:
    optional = spec.optional_inputs
    sets = [optional, ()]
    if "Scale" in optional:
        sets.append(("Scale",))
    if not quick and len(optional) > 2:
        sets += [tuple(n for n in optional if n != "Scale"), tuple(optional[:2])]
    seen, out = set(), []
    for s in sets:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def cases(quick: bool = False) -> list[Case]:
    """The correctness matrix."""
    out: list[Case] = []
    widths = [
        (5, 64),
        (7, 128),
        (3, 256),
        (4, 768),
        (3, 1000),
        (3, 1001),
        (2, 4096),
        (2, 8192),
        (2, 16384),
    ]
    if not quick:
        widths += [(9, 32), (3, 2048), (1, 24576), (1, 40000), (2, 1, 4, 8)]
    type_name = _native.elem_type_name
    for op, spec in catalogue.FLOAT_OPS.items():
        if spec.gated or spec.norm == "l2":  # (their own matrices below)
            continue
        rms = spec.norm == "rms"
        skip = spec.residual == "skip"
        # every (T, S, U) the op takes: U (Y's type) float32 for a 16-bit X with float32 weights
        # in the ops whose Y is of type U (the mixed form), else X's type
        type_sets = [tuple(type_name(v) for v in ts) for ts in spec.type_sets]
        for (dt, wt, yt), order in itertools.product(type_sets, (0, 1)):
            if dt == "float32" and order:
                continue
            attrs = {"cast_before_scale": order, "epsilon": 1e-5}
            if rms:
                attrs["scale_offset"] = 1.0 if order else 0.0
            if skip:
                attrs["alpha"] = 0.5 if order else 1.0
            for shape in widths:
                present_sets = (
                    _optional_sets(spec, quick) if shape[-1] <= 1000 else [spec.optional_inputs]
                )
                for present in present_sets:
                    out.append(Case(op, dt, wt, shape, present, dict(attrs), y_dtype=yt))
            all_in = spec.optional_inputs
            # per-head weights (Cohere Q/K norm), axis -2, unaligned views, no Sum output
            out.append(
                Case(
                    op,
                    dt,
                    wt,
                    (2, 3, 4, 128),
                    all_in,
                    dict(attrs),
                    weight_shape=(4, 128),
                    y_dtype=yt,
                )
            )
            out.append(Case(op, dt, wt, (3, 4, 64), all_in, dict(attrs), axis=-2, y_dtype=yt))
            out.append(Case(op, dt, wt, (3, 512), all_in, dict(attrs), unaligned=True, y_dtype=yt))
            if spec.has_residual:
                out.append(Case(op, dt, wt, (4, 256), all_in, dict(attrs), with_sum=False))
        for dt in DTYPES:
            out.append(Case(op, dt, dt, (2, 31), spec.optional_inputs, {}, kind="nan"))
        for (dt, wt, yt), order in itertools.product(type_sets, (0, 1)):
            if yt != dt:  # NaN and infinities through a float32 Y, in both orders
                out.append(
                    Case(
                        op,
                        dt,
                        wt,
                        (2, 31),
                        spec.optional_inputs,
                        {"cast_before_scale": order},
                        kind="nan",
                        y_dtype=yt,
                    )
                )
        if spec.norm == "layer":
            for width in (128, 4096, 3000):
                out.append(Case(op, "float32", "float32", (3, width), (), {}, kind="large-mean"))
    return out + gated_cases(quick) + l2_cases(quick)


#: GatedRMSNorm's gates: absent, or (activation, norm_before_gate)
GATES: list[tuple[int, int] | None] = [None, (0, 1), (1, 1), (0, 0), (1, 0)]


def _gated_case(dt, wt, attrs, shape, present, extra=None, **kw) -> Case:
    return Case("GatedRMSNorm", dt, wt, shape, present, {**attrs, **(extra or {})}, **kw)


def gated_cases(quick: bool = False) -> list[Case]:
    """GatedRMSNorm's matrix: every (T, S) x rounding order x gate x shape. A shape is X's shape,
    group_size and Scale's shape (None: X.shape[axis:], the whole extent)."""
    spec = catalogue.get("GatedRMSNorm")
    shapes: list[tuple[tuple[int, ...], int, tuple[int, ...] | None]] = [
        ((5, 64), 0, None),  # sub-warp rows
        ((3, 2048), 128, (128,)),  # Qwen3-Next: 16 heads of 128, one head's Scale
        ((2, 4096), 512, None),  # Mamba2: 8 groups, a Scale of the whole extent
        ((3, 1001), 0, None),  # the general kernel
        ((2, 16384), 0, None),  # a block per row
        ((4, 1), 0, None),  # width 1
    ]
    if not quick:
        shapes += [
            ((9, 8), 0, None),
            ((7, 256), 0, None),
            ((4, 1000), 0, None),
            ((3, 4096), 0, None),
            ((2, 64), 8, (8,)),  # groups of 8: the narrowest sub-warp rows
            ((3, 3000), 1000, (1000,)),
            ((3, 3003), 1001, None),  # groups of 1001: the general kernel, 3 weight rows
            ((2, 8192), 1024, None),
            ((1, 16384), 4096, (4096,)),
            ((2, 2048), 2048, None),  # one group: group_size the extent
        ]
    out: list[Case] = []
    type_sets = [tuple(_native.elem_type_name(v) for v in ts[:2]) for ts in spec.type_sets]
    for (dt, wt), order, gate in itertools.product(type_sets, (0, 1), GATES):
        if dt == "float32" and order:
            continue
        attrs = {"cast_before_scale": order, "epsilon": 1e-5, "scale_offset": 1.0 if order else 0.0}
        present: tuple[str, ...] = ("Scale",)
        if gate is not None:
            attrs.update(activation=gate[0], norm_before_gate=gate[1])
            present = ("Scale", "Gate")
        case = functools.partial(_gated_case, dt, wt, attrs)
        for shape, group, wshape in shapes:
            out.append(case(shape, present, {"group_size": group}, weight_shape=wshape))
        without_scale = tuple(n for n in present if n != "Scale")
        out.append(case((3, 512), without_scale, {"group_size": 64}))
        # per-head weights (group_size 0: Scale spans the heads), axis -2 in groups, unaligned
        out.append(case((2, 3, 4, 128), present, weight_shape=(4, 128)))
        out.append(case((3, 4, 64), present, {"group_size": 64}, axis=-2, weight_shape=(64,)))
        out.append(case((3, 512), present, unaligned=True))
        if wt == dt:  # NaN and infinities in X and in the Gate: the general and a register kernel
            for shape, group in (((2, 31), 0), ((4, 64), 32)):
                wshape = (group,) if group else None
                out.append(
                    case(shape, present, {"group_size": group}, weight_shape=wshape, kind="nan")
                )
    return out


def l2_cases(quick: bool = False) -> list[Case]:
    """L2Norm's matrix: every dtype x per-head rows [T, H, head_dim] and other widths."""
    shapes: list[tuple[tuple[int, ...], int]] = [
        ((3, 8, 64), -1),  # q/k rows of 64, 128, 256
        ((5, 4, 128), -1),
        ((2, 2, 256), -1),
        ((4, 1), -1),  # width 1
        ((3, 1001), -1),  # the general kernel
        ((2, 16384), -1),  # a block per row
        ((2, 4, 128), -2),  # every head of a token at once
    ]
    if not quick:
        shapes += [
            ((9, 16, 128), -1),
            ((7, 32), -1),
            ((3, 8), -1),
            ((4, 768), -1),
            ((3, 2048), -1),
            ((2, 4096), -1),
            ((1, 40000), -1),
        ]
    out: list[Case] = []
    for dt in DTYPES:
        for i, (shape, axis) in enumerate(shapes):
            epsilon = 1e-6 if i % 2 else 1e-5  # (FLA's and the default)
            out.append(Case("L2Norm", dt, dt, shape, (), {"epsilon": epsilon}, axis=axis))
        out.append(Case("L2Norm", dt, dt, (3, 512), (), {}, unaligned=True))
        out.append(Case("L2Norm", dt, dt, (2, 31), (), {}, kind="nan"))
        out.append(Case("L2Norm", dt, dt, (4, 2, 64), (), {}, kind="nan"))
    return out


@dataclasses.dataclass
class QuantCase:
    """A quantized op's call (the inputs of its float op as Case makes them)."""

    op: str
    dtype: str
    weight_dtype: str
    q_dtype: str  # "uint8" | "int8" | "float8e4m3fn"
    shape: tuple[int, ...]
    zero_point: bool  # static: Y_zero_point given
    with_sum: bool
    with_y_float: bool
    unaligned: bool = False
    kind: str = "random"  # "random" | "nan" | "directed" (Y chosen: see _directed_values)

    def label(self) -> str:
        outputs = [
            n
            for n, on in (
                ("Sum", self.with_sum and catalogue.get(self.op).has_residual),
                ("Y_float", self.with_y_float),
            )
            if on
        ]
        return (
            f"{self.op} {self.dtype}/{self.weight_dtype}->{self.q_dtype} {list(self.shape)}"
            f"{' zp' if self.zero_point else ''} out[{','.join(outputs) or '-'}]"
            f"{' unaligned' if self.unaligned else ''}"
            f"{'' if self.kind == 'random' else ' ' + self.kind}"
        )


def quant_cases(quick: bool = False) -> list[QuantCase]:
    """The quantized ops' matrix."""
    out: list[QuantCase] = []
    widths = [(5, 64), (3, 1000), (3, 1001), (2, 4096)]
    if not quick:
        widths += [(9, 32), (7, 128), (4, 768), (2, 16384), (1, 40000)]
    type_name = _native.elem_type_name
    type_pairs = [(type_name(t), type_name(s)) for t, s in catalogue.TYPE_PAIRS]
    if quick:  # each X type once, float32 weights with a 16-bit X once
        type_pairs = [("float32", "float32"), ("float16", "float16"), ("bfloat16", "float32")]
    outputs = [(True, True), (False, False)] + ([] if quick else [(True, False), (False, True)])
    for op, spec in catalogue.QUANTIZED_OPS.items():
        dynamic = spec.quantize == "dynamic"
        quant_types = [type_name(t) for t in spec.quant_types]
        for (dt, wt), qt in itertools.product(type_pairs, quant_types):
            for zp in (False,) if dynamic else (False, True):
                for i, shape in enumerate(widths):
                    for with_sum, with_y_float in outputs if i == 0 else outputs[:1]:
                        out.append(QuantCase(op, dt, wt, qt, shape, zp, with_sum, with_y_float))
                out.append(QuantCase(op, dt, wt, qt, (3, 512), zp, True, True, unaligned=True))
                out.append(QuantCase(op, dt, wt, qt, (2, 31), zp, True, True, kind="nan"))
                for width in (64, 1001):
                    out.append(
                        QuantCase(op, dt, wt, qt, (3, width), zp, True, True, kind="directed")
                    )
    return out


def _torch_type(name: str):
    """torch's type of a type of DTYPES (torch names them alike)."""
    import torch

    return getattr(torch, name)


def _directed_values(
    dtype: str, scale: float, lo: float, hi: float, count: int, rng: np.random.Generator
) -> np.ndarray:
    """count values of dtype in [lo, hi] whose quantization by ``scale`` tells a correct quantizer
    from a near miss: v / scale a tie (x.5: round half to even), or within a rounding of one
    (v * (1 / scale), which differs from the division, rounds to another whole number)."""
    t = DTYPES[dtype]
    if dtype == "float32":
        pool = rng.uniform(lo, hi, 1 << 20).astype(np.float32)
    else:  # every value of the 16-bit type in the range
        pool = np.arange(1 << 16, dtype=np.uint16).view(t)
        pool = pool[np.isfinite(pool.astype(np.float32))]
        pool = pool[(pool.astype(np.float32) >= lo) & (pool.astype(np.float32) <= hi)]
    f = pool.astype(np.float32)
    s = np.float32(scale)
    with np.errstate(all="ignore"):
        exact = f / s
        near = f * (np.float32(1) / s)
    ties = pool[(exact - np.floor(exact)) == 0.5]
    misses = pool[np.rint(exact) != np.rint(near)]
    chosen = np.concatenate([ties[: count // 2], misses[: count - min(len(ties), count // 2)]])
    return np.resize(chosen, count).astype(t) if chosen.size else np.zeros(count, t)


def _float8_bits(v: np.ndarray) -> np.ndarray:
    """float8 e4m3fn bits of float32 values as QuantizeLinear saturates them (the reference's)."""
    bound = np.float32(catalogue.FLOAT8_E4M3FN_MAX)
    with np.errstate(invalid="ignore"):
        return np.clip(v, -bound, bound).astype(F8).view(np.uint8)


#: the float32 midpoints between neighbouring float8 e4m3fn values (ties of the conversion)
_F8_FINITE = np.sort(np.arange(256, dtype=np.uint8).view(F8).astype(np.float32))
_F8_FINITE = np.unique(_F8_FINITE[np.isfinite(_F8_FINITE)])
_F8_TIES = (_F8_FINITE[:-1] + _F8_FINITE[1:]) / np.float32(2)  # (exact: 4 significant bits)


def _directed_float8_values(
    dtype: str, scale: float, count: int, rng: np.random.Generator
) -> np.ndarray:
    """count values of dtype whose float8 quantization by ``scale`` tells a correct quantizer from
    a near miss: v / scale a tie between two float8 values (round half to even, subnormals
    included), beyond 448 (saturation), or where v * (1 / scale) converts otherwise."""
    t = DTYPES[dtype]
    s = np.float32(scale)
    if dtype == "float32":  # every binade from 2^-12 to 2^10 of the quotient, and its ties
        binades = np.exp2(rng.integers(-12, 10, 1 << 16))
        pool = (rng.uniform(1, 2, 1 << 16) * binades).astype(np.float32)
        pool = np.concatenate([pool, _F8_TIES]) * s
        pool = np.concatenate([pool, -pool]).astype(np.float32)
    else:  # every value of the 16-bit type within 600 scales
        pool = np.arange(1 << 16, dtype=np.uint16).view(t)
        f = pool.astype(np.float32)
        pool = pool[np.isfinite(f) & (np.abs(f) <= 600 * s)]
    f = pool.astype(np.float32)
    with np.errstate(all="ignore"):
        exact = f / s
        near = f * (np.float32(1) / s)
    ties = pool[np.isin(np.abs(exact), _F8_TIES)]
    misses = pool[_float8_bits(exact) != _float8_bits(near)]
    beyond = pool[np.abs(exact) > np.float32(catalogue.FLOAT8_E4M3FN_MAX)]
    inside = pool[np.abs(exact) <= np.float32(catalogue.FLOAT8_E4M3FN_MAX)]
    parts = [
        rng.permutation(ties)[: count // 2],
        rng.permutation(misses)[: count // 4],
        rng.permutation(beyond)[: max(2, count // 16)],
    ]
    rest = count - sum(len(p) for p in parts)  # and values of the range's every binade
    parts.append(rng.choice(inside, rest) if inside.size else np.zeros(rest, pool.dtype))
    return rng.permutation(np.concatenate(parts)).astype(t)


def _make_inputs(case: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    spec = catalogue.get(case.op)
    t, w = DTYPES[case.dtype], DTYPES[case.weight_dtype]
    ax = case.axis % len(case.shape)
    wshape = case.weight_shape or case.shape[ax:]
    arrays: dict[str, np.ndarray] = {}
    if case.kind == "large-mean":
        arrays["X"] = (1e4 + 1e-2 * rng.standard_normal(case.shape)).astype(t)
    else:
        arrays["X"] = (rng.standard_normal(case.shape) * 2 + 0.5).astype(t)
    if case.kind == "nan":
        arrays["X"].reshape(-1)[3] = np.nan
        arrays["X"].reshape(-1)[-2] = np.inf
    if spec.has_residual:
        arrays["Residual"] = rng.standard_normal(case.shape).astype(t)
    for name in case.present:
        if name == "Gate":  # X's shape and type; its activation over its range
            arrays[name] = (2 * rng.standard_normal(case.shape)).astype(t)
            if case.kind == "nan":
                arrays[name].reshape(-1)[[5, 6, 7]] = [np.inf, -np.inf, np.nan]
        elif name in ("Scale", "InnerScale"):
            arrays[name] = (1 + 0.5 * rng.standard_normal(wshape)).astype(w)
        else:
            arrays[name] = (0.5 * rng.standard_normal(wshape)).astype(w)
    return arrays


def _to_device(a: np.ndarray, unaligned: bool = False):
    import torch

    t = _native.from_numpy(a)
    if unaligned:  # a view one element into a larger buffer: not 16-byte aligned
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")
        view = buf[1:].view(t.shape)
        view.copy_(t.cuda())
        return view
    return t.cuda()


def run_case(kernels: _native.Kernels, case: Case, seed: int = 0) -> tuple[bool, str]:
    """Runs one case; returns (passed, message)."""
    import torch

    rng = np.random.default_rng(seed)
    spec = catalogue.get(case.op)
    arrays = _make_inputs(case, rng)
    attrs = dict(case.attrs)
    with np.errstate(invalid="ignore"):  # (a Gate of -Inf: -Inf * sigmoid(-Inf) is NaN)
        want = reference.run(
            case.op,
            *[arrays.get(p.name) for p in spec.inputs],
            axis=case.axis,
            **attrs,
            **({"y_float32": 1} if case.mixed else {}),
        )
    dev = {
        k: _to_device(v, case.unaligned and k in ("X", "Residual", "Gate"))
        for k, v in arrays.items()
    }
    x = dev["X"]
    y_type = _torch_type(case.y_dtype)
    y = torch.empty(x.shape, dtype=y_type, device="cuda")
    s = torch.empty_like(x) if spec.has_residual and case.with_sum else None
    if case.unaligned:
        ybuf = torch.empty(x.numel() + 1, dtype=y_type, device="cuda")
        y = ybuf[1:].view(x.shape)
    args = kernels.args(case.op, dev, y, s, case.axis, **attrs)
    name = kernels.kernel_name(args)
    kernels.launch(args)
    torch.cuda.synchronize()
    got = [y] + ([s] if s is not None else [])
    rtol, atol = reference.tolerance(arrays["X"].dtype)
    if case.mixed and not attrs.get("cast_before_scale", 0):
        # order B into a float32 Y: one rounding, to float32 (order A rounds to X's type before
        # its bias's add: X's tolerance)
        rtol, atol = reference.tolerance(np.float32)
    for label, g, w in zip(("Y", "Sum"), got, want):
        if g.dtype != _torch_type(w.dtype.name):  # (the reference's Y of type U: y_dtype's)
            return False, f"FAIL {case.label()} [{name}] {label}: of type {g.dtype}, not {w.dtype}"
        g32 = _native.to_numpy(g).astype(np.float32)
        w32 = w.astype(np.float32)
        if case.kind == "large-mean":
            rtol, atol = 1e-4, 1e-4  # float32 inputs of mean 1e4 carry 1e-3 absolute noise
        if not np.allclose(g32, w32, rtol=rtol, atol=atol, equal_nan=True) or not np.array_equal(
            np.isnan(g32), np.isnan(w32)
        ):
            bad = ~np.isclose(g32, w32, rtol=rtol, atol=atol, equal_nan=True)
            idx = np.argwhere(bad)[:3].tolist()
            err = np.nanmax(np.abs(g32 - w32)) if g32.size else 0
            return False, (
                f"FAIL {case.label()} [{name}] {label}: max abs err {err:.3g} "
                f"(rtol {rtol}, atol {atol}); first bad {idx}"
            )
    return True, f"ok   {case.label()} [{name}]"


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def run_quant_case(kernels: _native.Kernels, case: QuantCase, seed: int = 0) -> tuple[bool, str]:
    """Runs one quantized case; returns (passed, message)."""
    import torch

    rng = np.random.default_rng(seed)
    spec = catalogue.get(case.op)
    base = catalogue.get(spec.base)
    dynamic = spec.quantize == "dynamic"
    weights = tuple(n for n in base.optional_inputs)
    float_case = Case(
        spec.base,
        case.dtype,
        case.weight_dtype,
        case.shape,
        weights,
        {},
        kind=case.kind,
        unaligned=case.unaligned,
    )
    arrays = _make_inputs(float_case, rng)
    scale = None
    if case.kind == "directed":
        # Scale 0 and Bias v: Y = v exactly, chosen to catch a quantizer that rounds or divides
        # otherwise (and saturation, NaN, infinities for the static ops)
        cols = case.shape[-1]
        w = DTYPES[case.weight_dtype]
        if dynamic:
            lo, hi = -1.0, 2.75
            step = (np.float32(hi) - np.float32(lo)) / np.float32(255)
            values = _directed_values(case.dtype, float(step), lo, hi, cols, rng)
            values[:2] = [lo, hi]  # the range, whatever else the row holds
            values[2] = np.nan
        else:
            scales = [0.1, 0.125, 0.03, 0.007]
            if case.q_dtype == "float8e4m3fn":  # float8's ties are k * scale of few bits: exact
                scales = [0.125, 0.375, 0.078125, 0.03]  # in a 16-bit X for the first three
            scale = np.asarray(rng.choice(scales), DTYPES[case.dtype]).reshape(())
            if case.q_dtype == "float8e4m3fn":
                values = _directed_float8_values(case.dtype, float(scale), cols, rng)
            else:
                values = _directed_values(
                    case.dtype, float(scale), -40 * float(scale), 40 * float(scale), cols, rng
                )
            values[:5] = [np.nan, np.inf, -np.inf, 1e4 * float(scale), -1e4 * float(scale)]
        arrays["Scale"] = np.zeros(cols, w)
        arrays["Bias"] = values.astype(w)
    attrs: dict[str, Any] = {"epsilon": 1e-5}
    if base.norm == "rms":
        attrs["scale_offset"] = 0.0
    if base.has_residual:
        attrs["alpha"] = 1.0
    dev = {k: _to_device(v, case.unaligned and k in ("X", "Residual")) for k, v in arrays.items()}
    x = dev["X"]
    residual = base.has_residual

    def empty(dtype, unaligned: bool = False):
        if unaligned:
            return torch.empty(x.numel() + 1, dtype=dtype, device="cuda")[1:].view(x.shape)
        return torch.empty(x.shape, dtype=dtype, device="cuda")

    # the float op's Y and Sum from the same library: what Y_float and Sum must be, bit for bit
    y_ref, s_ref = empty(x.dtype), empty(x.dtype) if residual else None
    kernels.launch(kernels.args(spec.base, dev, y_ref, s_ref, **attrs))

    q = empty(_native.quant_torch_dtype(case.q_dtype), case.unaligned)
    y_float = empty(x.dtype, case.unaligned) if case.with_y_float else None
    s = empty(x.dtype) if residual and case.with_sum else None
    args = kernels.args(case.op, dev, y_float if y_float is not None else x, s, **attrs)
    if y_float is None:
        args.y = None
    quant = _native.CudaQuantArgs(q_type=_native.QUANT_ELEM_TYPES[case.q_dtype], q=q.data_ptr())
    npq = _native.QUANT_NP_TYPES[case.q_dtype]
    keep = []
    if dynamic:
        out_scale = torch.empty((), dtype=torch.float32, device="cuda")
        out_zp = torch.empty((), dtype=torch.uint8, device="cuda")
        scratch = torch.empty(
            max(1, kernels.quant_scratch_bytes(args) // 4), dtype=torch.float32, device="cuda"
        )
        quant.y_scale, quant.y_zero_point = out_scale.data_ptr(), out_zp.data_ptr()
        quant.scratch = scratch.data_ptr()
    else:
        if scale is None:
            scale = np.asarray(rng.uniform(0.004, 0.05), dtype=DTYPES[case.dtype]).reshape(())
        if npq == F8:  # any value: the float8 zero point's value is not used
            zero_point = np.asarray(rng.choice([0.0, 1.0, -3.5, 448.0]), np.float32).astype(npq)
        else:
            zero_point = np.asarray(rng.integers(-20, 21) + (128 if npq == np.uint8 else 0), npq)
        keep = [_to_device(scale.reshape(1)), _to_device(zero_point.reshape(1))]
        quant.y_scale = keep[0].data_ptr()
        quant.y_zero_point = keep[1].data_ptr() if case.zero_point else None
    name = kernels.kernel_name(args)
    kernels.launch_quantized(args, quant)
    torch.cuda.synchronize()

    label = f"{case.label()} [{name}]"
    want_y = _native.to_numpy(y_ref)
    if y_float is not None and not _same_bits(_native.to_numpy(y_float), want_y):
        return False, f"FAIL {label}: Y_float differs from {spec.base}'s Y"
    if s is not None and not _same_bits(_native.to_numpy(s), _native.to_numpy(s_ref)):
        return False, f"FAIL {label}: Sum differs from {spec.base}'s Sum"
    got_q = _native.to_numpy(q)
    if dynamic:
        want_q, want_scale, want_zp = reference.dynamic_quantize_linear(want_y)
        got_scale, got_zp = _native.to_numpy(out_scale), _native.to_numpy(out_zp)
        if got_scale.tobytes() != want_scale.tobytes() or got_zp.tobytes() != want_zp.tobytes():
            return False, (
                f"FAIL {label}: scale, zero point {got_scale}, {got_zp}; "
                f"the reference's {want_scale}, {want_zp}"
            )
    else:
        zp = zero_point if case.zero_point else np.zeros((), npq)
        want_q = reference.quantize_linear(want_y, scale, zp)
    if npq == F8:  # the bits; any NaN where the reference's is NaN (a GPU's NaN has its own sign)
        got_bits, want_bits = got_q.view(np.uint8), want_q.view(np.uint8)

        def nan(bits):
            return (bits & 0x7F) == 0x7F

        differs = (got_bits != want_bits) & ~(nan(got_bits) & nan(want_bits))
    else:
        differs = got_q != want_q
    if differs.any():
        return False, (
            f"FAIL {label}: {int(differs.sum())} quantized values differ from the "
            f"reference's; first at {np.argwhere(differs)[0].tolist()}"
        )
    return True, f"ok   {label}"


def check(
    kernels: _native.Kernels,
    quick: bool = False,
    verbose: bool = False,
    ops: Sequence[str] | None = None,
) -> list[str]:
    """Runs the correctness matrix; returns the failure messages (empty: all passed)."""
    failures = []
    selected: list[Case | QuantCase] = [
        c for c in [*cases(quick), *quant_cases(quick)] if ops is None or c.op in ops
    ]
    for i, case in enumerate(selected):
        try:
            run = run_quant_case if isinstance(case, QuantCase) else run_case
            ok, message = run(kernels, case, seed=i)
        except Exception as e:  # noqa: BLE001 - a launcher error is a failure of that case
            ok, message = False, f"FAIL {case.label()}: {type(e).__name__}: {e}"
        if verbose or not ok:
            print(message, flush=True)
        if not ok:
            failures.append(message)
    print(f"{len(selected) - len(failures)}/{len(selected)} CUDA kernel cases passed", flush=True)
    return failures


def check_bad_arguments(kernels: _native.Kernels) -> list[str]:
    """Bad arguments are refused before any launch, with a message naming the op."""
    import torch

    x = torch.zeros(4, 64, device="cuda")
    y = torch.empty_like(x)
    f32, f16, bf16 = (_native.ELEM_TYPES[t] for t in DTYPES)
    problems = []
    bad = [
        ("RMSNorm", dict(epsilon=-1.0), "epsilon"),
        ("LayerNorm", dict(scale_offset=1.0), "scale_offset"),
        ("RMSNorm", dict(x=None), "X and Y"),
        ("SkipRMSNorm", dict(residual=None), "Residual"),
        ("RMSNorm", dict(cols=0), "no elements"),
        ("RMSNorm", dict(x_type=7), "float32, float16 or bfloat16"),
        ("RMSNorm", dict(op=99), "unknown op"),
        (
            "LayerNorm",
            dict(x_type=1, weight_type=2, scale=x.data_ptr()),
            "X's type float16 or float32",
        ),
        ("RMSNorm", dict(scale=x.data_ptr(), scale_rows=0), "Scale rows"),
        # Y's type (y_type): X's, or float32 only for a 16-bit X with float32 weights (or none)
        # in the ops whose Y is of type U (not those with a Residual, nor the quantized ones)
        ("SkipRMSNorm", dict(x_type=f16, y_type=f32), "Y must be of X's type float16"),
        (
            "LayerNorm",
            dict(x_type=f16, weight_type=f16, scale=x.data_ptr(), y_type=f32),
            "Y must be of X's type float16",
        ),
        (
            "RMSNorm",
            dict(x_type=bf16, weight_type=bf16, bias=x.data_ptr(), y_type=f32),
            "Y must be of X's type bfloat16",
        ),
        ("LayerNorm", dict(y_type=f16), "Y must be of X's type float32"),
        (
            "RMSNorm",
            dict(x_type=bf16, weight_type=f32, scale=x.data_ptr(), y_type=f16),
            "Y must be of X's type bfloat16",
        ),
        # the Gate and its attributes: GatedRMSNorm's alone, each 0 or 1; L2Norm has no weights
        ("RMSNorm", dict(gate=x.data_ptr()), "onnxnorm::RMSNorm takes no Gate"),
        ("SkipRMSNorm", dict(gate=x.data_ptr()), "takes no Gate"),
        ("GatedRMSNorm", dict(activation=2), "activation must be 0 (SiLU) or 1 (sigmoid), got 2"),
        ("GatedRMSNorm", dict(norm_before_gate=-1), "norm_before_gate must be 0 or 1, got -1"),
        ("RMSNorm", dict(activation=-1), "activation must be 0 (SiLU) or 1"),
        ("GatedRMSNorm", dict(bias=x.data_ptr()), "onnxnorm::GatedRMSNorm takes no Bias"),
        ("GatedRMSNorm", dict(y_type=f16), "Y must be of X's type float32"),
        ("L2Norm", dict(scale=x.data_ptr()), "onnxnorm::L2Norm takes no Scale"),
        (
            "L2Norm",
            dict(scale_offset=0.5),
            "scale_offset must be finite (and 0 for ops without it)",
        ),
        ("L2Norm", dict(x_type=f16, y_type=f32), "Y must be of X's type float16"),
        ("L2Norm", dict(epsilon=float("inf")), "epsilon"),
        ("L2Norm", dict(cols=0), "no elements"),
    ]
    for op, change, expect in bad:
        inputs = {"X": x}
        if catalogue.get(op).has_residual:
            inputs["Residual"] = x
        args = kernels.args(op, inputs, y)
        for k, v in change.items():
            setattr(args, k, v)
        try:
            kernels.launch(args)
            problems.append(f"{op} {change}: accepted")
        except ValueError as e:
            if expect not in str(e):
                problems.append(f"{op} {change}: message {e!s} lacks {expect!r}")
    return problems


def check_quantized_edges(kernels: _native.Kernels) -> list[str]:
    """The quantized launcher's refusals, and an empty dynamic call's scale and zero point."""
    import torch

    x = torch.zeros(4, 64, device="cuda")
    q = torch.empty(4, 64, dtype=torch.uint8, device="cuda")
    scale = torch.full((1,), 0.5, device="cuda")
    problems = []
    bad = [
        ("RMSNormQuantizeLinear", None, "onnxnorm_cuda_launch_quantized"),
        ("RMSNorm", dict(y_scale=scale.data_ptr()), "not a quantized op"),
        ("RMSNormQuantizeLinear", dict(), "Y_scale is required"),
        (
            "RMSNormQuantizeLinear",
            dict(y_scale=scale.data_ptr(), q_type=2),
            "the quantized type must be uint8, int8 or float8e4m3fn, got type code 2",
        ),
        (
            "RMSNormDynamicQuantizeLinear",
            dict(
                y_scale=scale.data_ptr(),
                y_zero_point=q.data_ptr(),
                scratch=scale.data_ptr(),
                q_type=_native.QUANT_ELEM_TYPES["float8e4m3fn"],
            ),
            "the quantized type must be uint8, got type code 5",
        ),
        (
            "RMSNormDynamicQuantizeLinear",
            dict(y_scale=scale.data_ptr(), y_zero_point=q.data_ptr()),
            "scratch",
        ),
        (
            "RMSNormDynamicQuantizeLinear",
            dict(
                y_scale=scale.data_ptr(),
                y_zero_point=q.data_ptr(),
                scratch=scale.data_ptr(),
                q_type=4,
            ),
            "uint8",
        ),
    ]
    for op, change, expect in bad:
        args = kernels.args(op, {"X": x}, x)
        try:
            if change is None:
                kernels.launch(args)
            else:
                fields = {"q_type": _native.QUANT_ELEM_TYPES["uint8"], "q": q.data_ptr(), **change}
                kernels.launch_quantized(args, _native.CudaQuantArgs(**fields))
            problems.append(f"{op} {change}: accepted")
        except ValueError as e:
            if expect not in str(e):
                problems.append(f"{op} {change}: message {e!s} lacks {expect!r}")
    # an empty X: the dynamic op still writes its scale (1) and zero point (0)
    empty = torch.empty(0, 64, device="cuda")
    out_scale = torch.full((), 7.0, device="cuda")
    out_zp = torch.full((), 9, dtype=torch.uint8, device="cuda")
    args = kernels.args("RMSNormDynamicQuantizeLinear", {"X": empty}, empty)
    args.y = None
    if kernels.quant_scratch_bytes(args) != 0:
        problems.append("an empty call asks for scratch")
    kernels.launch_quantized(
        args,
        _native.CudaQuantArgs(
            q_type=_native.QUANT_ELEM_TYPES["uint8"],
            y_scale=out_scale.data_ptr(),
            y_zero_point=out_zp.data_ptr(),
        ),
    )
    torch.cuda.synchronize()
    if (float(out_scale.cpu()), int(out_zp.cpu())) != (1.0, 0):
        problems.append(f"empty dynamic call: scale {out_scale}, zero point {out_zp}")
    args = kernels.args("RMSNormDynamicQuantizeLinear", {"X": x}, x)
    if kernels.quant_scratch_bytes(args) != 4 * 2 * 4:
        problems.append(f"scratch for 4 rows: {kernels.quant_scratch_bytes(args)} bytes")
    return problems


# ---------------------------------------------------------------------------------------------
# Host emulation
# ---------------------------------------------------------------------------------------------
def host_compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def build_emulation(folder: str | os.PathLike) -> Path:
    """Compiles the host emulation of the CUDA library into folder/libonnxnorm_cuda_ops.so (the
    real library's name and entry points); raises RuntimeError with the compiler's output."""
    cxx = host_compiler()
    if cxx is None:
        raise RuntimeError("no host C++ compiler")
    out = Path(folder) / "libonnxnorm_cuda_ops.so"
    command = [
        cxx,
        "-std=c++17",
        "-O0",
        "-shared",
        "-fPIC",
        f"-I{CUDA_DIR / 'emulation'}",
        f"-I{CUDA_DIR}",
        f"-I{ROOT / 'custom_ops' / 'include'}",
        "-DONNXNORM_CUDA_ARCHS=host-emulation",
        str(CUDA_DIR / "emulation" / "host_emulation.cc"),
        "-x",
        "c++",
        str(CUDA_DIR / "launch.cu"),
    ]
    # unoptimized: the quick matrix compiles and runs in 34 s at -O0, 41 s at -O1 (27 s of it the
    # compile). One build per content of the sources and the command, kept in build/ (the
    # kernel-logic and glue tests both need it)
    digest = hashlib.sha256(" ".join(command).encode())
    for source in sorted([*CUDA_DIR.rglob("*"), *(ROOT / "custom_ops" / "include").rglob("*")]):
        if source.is_file():
            digest.update(source.name.encode() + source.read_bytes())
    cached = ROOT / "build" / "cuda-emulation" / digest.hexdigest()[:16] / out.name
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f"{out.name}.{os.getpid()}.tmp")
        build = subprocess.run(
            command + ["-o", str(partial)], capture_output=True, text=True, timeout=600
        )
        if build.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}\n{build.stderr[-4000:]}")
        os.replace(partial, cached)
    shutil.copyfile(cached, out)
    return out


def ort_headers() -> Path | None:
    """The folder of ONNX Runtime's C headers (onnxruntime_c_api.h), or None."""
    for folder in (
        os.environ.get("ONNXRUNTIME_INCLUDE_DIR"),
        "/usr/include/onnxruntime",
        str(ROOT / "third_party" / "onnxruntime" / "include"),
    ):
        if folder and (Path(folder) / "onnxruntime_c_api.h").is_file():
            return Path(folder)
    return None


def build_glue_library(folder: str | os.PathLike) -> Path | None:
    """The CPU library built with ONNXNORM_TEST_CUDA_ROWS_ON_CPU into folder/libonnxnorm_ops.so:
    its CUDA rows claim the CPU provider instead of its CPU rows, so that a CPU session runs the
    CUDA glue against a host-emulated CUDA library next to it. None without ONNX Runtime's
    headers; RuntimeError with the compiler's output. The glue (custom_ops/ort) is compiled
    unoptimized (it runs small tensors, and -O0 compiles in under half the time of -O1); the CPU
    kernels, which the define does not touch and this build never runs, are the editable
    install's objects where there is one (the portable kernels compiled here otherwise). One
    build per content of the sources and the command, kept in build/ (the tests of the norm
    ops' glue and of the rotary ops' glue both need it)."""
    from tests.support.build import package_build_with_tests

    headers = ort_headers()
    cxx = host_compiler()
    if headers is None or cxx is None:
        return None
    package_build = package_build_with_tests(ROOT)
    kernels = (
        sorted(package_build.glob("CMakeFiles/onnxnorm_cpu_kernels.dir/**/*.o"))
        if package_build
        else []
    )
    sources = sorted((ROOT / "custom_ops" / "ort").glob("*.cc"))
    objects = kernels or sorted((ROOT / "custom_ops" / "cpu").glob("*.cc"))
    command = [
        cxx,
        "-std=c++17",
        "-O0",
        "-shared",
        "-fPIC",
        "-DONNXNORM_TEST_CUDA_ROWS_ON_CPU=1",
        f"-I{ROOT / 'custom_ops' / 'include'}",
        f"-I{headers}",
        *map(str, sources),
        *map(str, objects),
    ]
    digest = hashlib.sha256(" ".join(command).encode())
    for source in sorted([*sources, *objects, *(ROOT / "custom_ops" / "include").rglob("*")]):
        if source.is_file():
            digest.update(source.name.encode() + source.read_bytes())
    for header in sorted((ROOT / "custom_ops" / "ort").glob("*.h")):
        digest.update(header.name.encode() + header.read_bytes())
    out = Path(folder) / "libonnxnorm_ops.so"
    cached = ROOT / "build" / "cuda-emulation" / f"glue-{digest.hexdigest()[:16]}" / out.name
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f"{out.name}.{os.getpid()}.tmp")
        build = subprocess.run(
            command + ["-o", str(partial), "-ldl"], capture_output=True, text=True, timeout=900
        )
        if build.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}\n{build.stderr[-4000:]}")
        os.replace(partial, cached)
    shutil.copyfile(cached, out)
    return out


def run_on_host() -> None:
    """Points the harness at host memory for the emulation: "CUDA" tensors stay CPU tensors and
    there are no streams (every emulated launch completes before it returns). For a process of
    its own: it patches torch."""
    import torch

    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_stream = lambda *a, **k: types.SimpleNamespace(cuda_stream=0)

    def no_device(f):
        def call(*a, **k):
            k.pop("device", None)
            return f(*a, **k)

        return call

    torch.empty = no_device(torch.empty)
    torch.zeros = no_device(torch.zeros)
    torch.full = no_device(torch.full)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--emulation",
        action="store_true",
        help="build the host emulation and run on the CPU (no GPU needed)",
    )
    parser.add_argument("--quick", action="store_true", help="a smaller matrix")
    parser.add_argument("--verbose", action="store_true", help="print every case")
    parser.add_argument("--ops", help="comma-separated ops (default: all)")
    parser.add_argument("--library", help="the CUDA library (default: the built one)")
    args = parser.parse_args(argv)
    ops = args.ops.split(",") if args.ops else None
    if args.emulation:
        import tempfile

        folder = tempfile.mkdtemp(prefix="onnxnorm-emulation-")
        try:
            library = build_emulation(folder)
            run_on_host()
            return _check_all(_native.Kernels(library), args.quick, args.verbose, ops)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    import torch

    if not torch.cuda.is_available():
        print("cuda_harness: torch sees no CUDA device (use --emulation)", file=sys.stderr)
        return 2
    kernels = _native.Kernels(args.library)
    print(
        f"# {kernels.path} ({kernels.build_info()}) on {torch.cuda.get_device_name(0)}", flush=True
    )
    return _check_all(kernels, args.quick, args.verbose, ops)


def _check_all(kernels: _native.Kernels, quick: bool, verbose: bool, ops: list[str] | None) -> int:
    failures = check(kernels, quick=quick, verbose=verbose, ops=ops)
    problems = check_bad_arguments(kernels) + check_quantized_edges(kernels)
    if kernels.layout() != _native.layout():
        problems.append(
            f"NormArgs mirror {_native.layout()} differs from the library's {kernels.layout()}"
        )
    for p in problems:
        print("FAIL", p)
    return 1 if failures or problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""The correctness matrix of the rotary ops' CUDA kernels (RMSNormRotary, LayerNormRotary,
L2NormRotary) through their C launcher (``onnxnorm_cuda_launch_rotary``), and their bandwidth.

The launcher takes ``onnxnorm::RotaryArgs`` (custom_ops/include/onnxnorm/rotary_kernels.h, the CPU
kernels' argument struct) and ``CudaRotaryArgs`` (cuda_launch.h: the element types and the bound
of the position ids); :class:`RotaryArgs` and :class:`CudaRotaryArgs` are their ctypes mirrors,
held to the layout the library exports (``onnxnorm_cuda_rotary_args_layout``). Arguments are
filled from torch tensors as the ORT glue (custom_ops/ort/rotary_op.cc) fills them from a node's
inputs.

The matrix: every op x Q's type x layout form (0, 0 with 3-D Q, 1, 2, 2 with 3-D Q) x half-split
or interleaved x rotary_first, the other axes (weights and angles of Q's type or float32, partial
rotary_dim, the caches' forms, K absent, per_head = 0, rotary_in_t, rounding order, scale_offset,
weights absent, shared or per head, biases, grouped-query head counts, head sizes 64, 128 and 12,
tokens per call) drawn per case from a seeded generator; then each kernel configuration (heads of
8 to 512 values, per_head = 0's tokens up to the general kernel's widths), odd head sizes with a
partial rotary, NaN and Inf, an out-of-range position id (its token's rotated values NaN and the
error flag set) and an empty call. Each against ``onnxnorm.ops.reference.run`` within its tolerance
for Q's type and, in float16 and bfloat16, bit for bit for at least 99% of the values.

    python tests/support/cuda_rotary.py --emulation [--quick]   # the host emulation, no GPU
    python tests/support/cuda_rotary.py [--library PATH]        # on a GPU
    python tests/support/cuda_rotary.py --bench [--json PATH]   # the bandwidth rows, on a GPU
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import itertools
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(ROOT)  # run as a script: the checkout, not this folder
elif str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from onnxnorm import _native  # noqa: E402
from onnxnorm.ops import catalogue, reference, rotation  # noqa: E402
from tests.support import cuda_harness  # noqa: E402
from tests.support.matrix import BF16, F16, F32  # noqa: E402
from tests.support.rotary_cases import KERNEL_MAX_POSITION, drawn_cases, make_case  # noqa: E402

ROTARY = list(catalogue.ROTARY_OPS)
#: onnxnorm::NormKind
NORM_KINDS = {"layer": 0, "rms": 1, "l2": 2}
#: the share of float16/bfloat16 values that must be the reference's bits
EXACT = 0.99
#: Cos and Sin: per pair gathered by PositionIds, per value gathered by PositionIds, per value per
#: token [batch, seq, C], per pair shared by the batch [1, seq, C]


# ---------------------------------------------------------------------------------------------
# The launcher's arguments
# ---------------------------------------------------------------------------------------------
class RotaryTensor(ctypes.Structure):
    """Mirror of onnxnorm::RotaryTensor: Q or K of a call."""

    _fields_ = [
        ("x", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("heads", ctypes.c_int64),
        ("scale", ctypes.c_void_p),
        ("scale_rows", ctypes.c_int64),
        ("bias", ctypes.c_void_p),
        ("bias_rows", ctypes.c_int64),
    ]

    def __init__(self, **fields: Any):
        super().__init__(**{"scale_rows": 1, "bias_rows": 1, **fields})


class RotaryArgs(ctypes.Structure):
    """Mirror of onnxnorm::RotaryArgs (custom_ops/include/onnxnorm/rotary_kernels.h)."""

    _fields_ = [
        ("norm", ctypes.c_int32),
        ("cast_before_scale", ctypes.c_int32),
        ("per_head", ctypes.c_int32),
        ("interleaved", ctypes.c_int32),
        ("rotary_first", ctypes.c_int32),
        ("rotary_in_t", ctypes.c_int32),
        ("layout", ctypes.c_int32),
        ("epsilon", ctypes.c_float),
        ("scale_offset", ctypes.c_float),
        ("batch", ctypes.c_int64),
        ("seq", ctypes.c_int64),
        ("head_size", ctypes.c_int64),
        ("rotary_dim", ctypes.c_int64),
        ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p),
        ("angle_width", ctypes.c_int64),
        ("position_ids", ctypes.c_void_p),
        ("cache_batch", ctypes.c_int64),
        ("q", RotaryTensor),
        ("k", RotaryTensor),
    ]

    def __init__(self, **fields: Any):
        defaults = {
            "norm": NORM_KINDS["rms"],
            "per_head": 1,
            "epsilon": catalogue.EPSILON.default,
            "cache_batch": 1,
            "q": RotaryTensor(),
            "k": RotaryTensor(),
        }
        super().__init__(**{**defaults, **fields})


class CudaRotaryArgs(ctypes.Structure):
    """Mirror of onnxnorm::CudaRotaryArgs (custom_ops/include/onnxnorm/cuda_launch.h)."""

    _fields_ = [
        ("q_type", ctypes.c_int32),
        ("weight_type", ctypes.c_int32),
        ("angle_type", ctypes.c_int32),
        ("angle_rows", ctypes.c_int64),
        ("position_error", ctypes.c_void_p),
    ]


def layout() -> dict[str, Any]:
    """The mirrors' layout in the form of onnxnorm_cuda_rotary_args_layout (RotaryTensor's fields
    as q.<field> and k.<field>)."""

    def fields(struct, prefix="", base=0):
        out = []
        for name, kind in struct._fields_:
            offset = base + getattr(struct, name).offset
            if isinstance(kind, type) and issubclass(kind, ctypes.Structure):
                out += fields(kind, f"{name}.", offset)
            else:
                out.append([prefix + name, offset, ctypes.sizeof(kind)])
        return out

    return {
        "RotaryArgs": {"size": ctypes.sizeof(RotaryArgs), "fields": fields(RotaryArgs)},
        "CudaRotaryArgs": {"size": ctypes.sizeof(CudaRotaryArgs), "fields": fields(CudaRotaryArgs)},
    }


class RotaryKernels:
    """The rotary launcher of one loaded CUDA library (the real one or the host emulation)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else _native.cuda_library_path()
        if not self.path.is_file():
            raise FileNotFoundError(f"the onnxnorm CUDA library is not built: {self.path}")
        lib = ctypes.CDLL(str(self.path))
        args = [ctypes.POINTER(RotaryArgs), ctypes.POINTER(CudaRotaryArgs)]
        lib.onnxnorm_cuda_launch_rotary.argtypes = [
            *args,
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        lib.onnxnorm_cuda_launch_rotary.restype = ctypes.c_int
        lib.onnxnorm_cuda_rotary_kernel_name.argtypes = [*args, ctypes.c_char_p, ctypes.c_size_t]
        lib.onnxnorm_cuda_rotary_kernel_name.restype = ctypes.c_int
        lib.onnxnorm_cuda_rotary_args_layout.restype = ctypes.c_char_p
        self.lib = lib

    def layout(self) -> dict[str, Any]:
        return json.loads(self.lib.onnxnorm_cuda_rotary_args_layout())

    def kernel_name(self, args: RotaryArgs, call: CudaRotaryArgs) -> str:
        buf = ctypes.create_string_buffer(256)
        rc = self.lib.onnxnorm_cuda_rotary_kernel_name(
            ctypes.byref(args), ctypes.byref(call), buf, len(buf)
        )
        if rc != 0:
            raise ValueError(buf.value.decode())
        return buf.value.decode()

    def launch(self, args: RotaryArgs, call: CudaRotaryArgs, stream: int | None = None) -> None:
        """Launches on ``stream`` (default: torch's current stream); ValueError on bad arguments,
        RuntimeError on a CUDA error, with the launcher's message."""
        import torch

        if stream is None:
            stream = torch.cuda.current_stream().cuda_stream
        buf = ctypes.create_string_buffer(512)
        rc = self.lib.onnxnorm_cuda_launch_rotary(
            ctypes.byref(args), ctypes.byref(call), ctypes.c_void_p(stream), buf, len(buf)
        )
        if rc == 1:
            raise ValueError(buf.value.decode())
        if rc != 0:
            raise RuntimeError(buf.value.decode())


def _type_code(t) -> int:
    import torch

    return _native.ELEM_TYPES[
        {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[t.dtype]
    ]


def make_args(
    op: str, inputs: dict[str, Any], outputs: dict[str, Any], **attrs: Any
) -> tuple[RotaryArgs, CudaRotaryArgs]:
    """The launcher's arguments for ``op`` on torch tensors ``inputs`` (by catalogue name;
    absent ones left out) and ``outputs`` ("QOut", and "KOut" where K is computed), as the ORT
    glue fills them."""
    spec = catalogue.ROTARY_OPS[op]
    a = reference.check_attributes(spec, attrs)
    q = inputs["Q"]
    shape = tuple(q.shape)
    rows = rotation.to_rows(np.empty(shape, np.uint8), a, op, "Q")
    batch, seq, _, head_size = rows.shape
    rotary_dim = a["rotary_dim"] or head_size
    cos = inputs["Cos"]
    args = RotaryArgs(
        norm=NORM_KINDS[spec.norm],
        cast_before_scale=int(a.get("cast_before_scale", 0)),
        per_head=a["per_head"],
        interleaved=a["interleaved"],
        rotary_first=a["rotary_first"],
        rotary_in_t=a["rotary_in_t"],
        layout=a["layout"],
        epsilon=a["epsilon"],
        scale_offset=a.get("scale_offset", 0.0),
        batch=batch,
        seq=seq,
        head_size=head_size,
        rotary_dim=rotary_dim,
        cos=cos.data_ptr(),
        sin=inputs["Sin"].data_ptr(),
        angle_width=cos.shape[-1],
    )
    call = CudaRotaryArgs(
        q_type=_type_code(q), weight_type=_type_code(q), angle_type=_type_code(cos)
    )
    if inputs.get("PositionIds") is not None:
        args.position_ids = inputs["PositionIds"].data_ptr()
        call.angle_rows = cos.shape[0]
    else:
        args.cache_batch = cos.shape[0]
        call.angle_rows = cos.shape[0] * cos.shape[1]
    for name, tensor in (("Q", args.q), ("K", args.k)):
        x = inputs.get(name)
        if x is None or outputs.get(name + "Out") is None:
            continue
        heads = rotation.to_rows(np.empty(tuple(x.shape), np.uint8), a, op, name).shape[2]
        tensor.x, tensor.y, tensor.heads = x.data_ptr(), outputs[name + "Out"].data_ptr(), heads
        for weight, field in ((name + "Scale", "scale"), (name + "Bias", "bias")):
            w = inputs.get(weight)
            if w is None:
                continue
            call.weight_type = _type_code(w)
            setattr(tensor, field, w.data_ptr())
            setattr(tensor, field + "_rows", max(1, w.numel() // head_size))
    return args, call


# ---------------------------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Case:
    op: str
    dtype: Any
    kw: dict[str, Any]
    seed: int
    kind: str = "random"  # "random" | "nan" | "bad-position" | "empty"
    kernel: str = ""  # a part of the kernel's name the case must take ("" any)

    def label(self) -> str:
        kw = " ".join(f"{k}={v}" for k, v in self.kw.items())
        extra = f" {self.kind}" if self.kind != "random" else ""
        return f"{self.op} {np.dtype(self.dtype).name} {kw}{extra}"


def cases(quick: bool = False) -> list[Case]:
    """The pruned matrix (module docstring); the full one draws each random axis twice."""
    pick = np.random.default_rng(20)
    out: list[Case] = []
    for _ in range(1 if quick else 2):
        out += [Case(op, dtype, kw, seed) for op, dtype, kw, seed in drawn_cases(pick)]
    # every kernel configuration: heads of 8 to 512 values (4 lanes to a warp of 8 slots each),
    # per_head = 0's tokens of 1024 to 8192 values (a block of 128 to 512), wider ones (the
    # general kernel) in each layout, interleaved or not, rotated first or not
    configs = [
        (dict(head_size=8), "subwarp4x4"),
        (dict(head_size=64), "subwarp8x4"),
        (dict(head_size=128), "subwarp16x4"),
        (dict(head_size=256), "warp32x4"),
        (dict(head_size=512, heads=(2, 1)), "warp32x8"),
        (dict(head_size=128, heads=(8, 2), per_head=0), "block128x8"),
        (dict(head_size=128, heads=(32, 8), per_head=0, batch=1, seq=2), "block256x8"),
        (dict(head_size=256, heads=(32, 8), per_head=0, batch=1, seq=1), "block512x8"),
    ]
    general = [
        dict(layout=0, interleaved=0, rotary_first=0),
        dict(layout=2, interleaved=1, rotary_first=0, rotary_dim=256),
        dict(layout=0, interleaved=1, rotary_first=1, rank3=True, rotary_dim=128),
        dict(layout=2, interleaved=0, rotary_first=1, cache="value-token"),
    ]
    for kw in general:
        kw.update(head_size=512, heads=(17, 4), per_head=0, batch=1, seq=2)
        configs.append((kw, "general:block512"))
    for i, ((kw, kernel), op) in enumerate(
        itertools.product(configs, ROTARY if not quick else ROTARY[:1])
    ):
        dtype = (BF16, F16, F32)[i % 3]
        kw = {"rotary_in_t": i % 2, "order": (i // 2) % 2, "weights": "per-head", **kw}
        out.append(Case(op, dtype, kw, 1000 + i, kernel=kernel))
    if quick:  # the other ops through the configurations of their usual heads
        for i, op in enumerate(ROTARY[1:]):
            for kw, kernel in (configs[2], configs[6], configs[-1]):
                out.append(Case(op, (F16, BF16)[i], dict(kw), 2000 + i, kernel=kernel))
    # odd head sizes with a partial rotary (an odd tail of values past it), a rotary over none
    # of the head but its first pair, grouped-query heads of several sizes
    for i, (op, dtype) in enumerate(itertools.product(ROTARY, (F32, F16, BF16))):
        kw = dict(
            head_size=13, rotary_dim=8, heads=(3, 1), interleaved=i % 2, rotary_first=(i // 2) % 2
        )
        out.append(Case(op, dtype, kw, 3000 + i))
        out.append(
            Case(op, dtype, dict(head_size=6, rotary_dim=2, heads=(5, 3), per_head=i % 2), 3100 + i)
        )
    for op, dtype in itertools.product(ROTARY, (F32, F16, BF16)):
        out.append(Case(op, dtype, dict(head_size=64, heads=(4, 2)), 4000, kind="nan"))
    for op in ROTARY:
        out.append(
            Case(op, BF16, dict(head_size=64, heads=(4, 2), seq=3), 5000, kind="bad-position")
        )
        out.append(Case(op, F16, dict(head_size=64, heads=(4, 2), batch=0), 5100, kind="empty"))
    return out


#: float16 and bfloat16 values checked, and those that were the reference's bits
TALLY = {"exact": 0, "total": 0}


def _bits(values: np.ndarray, dtype) -> np.ndarray:
    return np.asarray(np.asarray(values, np.float32).astype(dtype)).view(np.uint16)


def run_case(kernels: RotaryKernels, case: Case) -> tuple[bool, str]:
    """Runs one case; returns (passed, message)."""
    import torch

    rng = np.random.default_rng(case.seed)
    arrays, attrs = make_case(case.op, case.dtype, rng, **case.kw)
    spec = catalogue.ROTARY_OPS[case.op]
    bad_token = None
    if case.kind == "nan":
        arrays["Q"].reshape(-1)[[3, 70]] = [np.nan, np.inf]
        arrays["K"].reshape(-1)[-2] = -np.inf
    if case.kind == "bad-position":  # one token's id past Cos's rows (the reference: id 0)
        bad_token = (1, 2)
        arrays["PositionIds"][bad_token] = KERNEL_MAX_POSITION
    given = dict(arrays)
    if bad_token is not None:
        given["PositionIds"] = arrays["PositionIds"].copy()
        given["PositionIds"][bad_token] = 0
    with np.errstate(invalid="ignore", over="ignore"):
        want = reference.run(case.op, *[given.get(p.name) for p in spec.inputs], **attrs)
    dev = {k: cuda_harness._to_device(v) for k, v in arrays.items()}
    outputs = {"QOut": torch.empty(want[0].shape, dtype=dev["Q"].dtype, device="cuda")}
    if "K" in arrays:
        outputs["KOut"] = torch.empty(want[1].shape, dtype=dev["Q"].dtype, device="cuda")
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    args, call = make_args(case.op, dev, outputs, **attrs)
    call.position_error = flag.data_ptr()
    label = case.label()
    name = kernels.kernel_name(args, call)
    if case.kernel and case.kernel not in name:
        return False, f"FAIL {label}: kernel {name}, not {case.kernel}"
    kernels.launch(args, call)
    torch.cuda.synchronize()
    if int(flag.cpu()[0]) != (bad_token is not None):
        return False, f"FAIL {label} [{name}]: position error flag {int(flag.cpu()[0])}"
    rtol, atol = reference.tolerance(case.dtype)
    exact = total = 0
    for out_name, w in zip(("QOut", "KOut"), want):
        g = _native.to_numpy(outputs[out_name]).astype(np.float32)
        w32 = w.astype(np.float32)
        if g.shape != w32.shape:
            return False, f"FAIL {label} [{name}] {out_name}: shape {g.shape}, not {w32.shape}"
        if (
            bad_token is not None
        ):  # layout 0, 4-D: the token's rotated values NaN, the rest the reference's
            token = g[bad_token]
            if not np.isnan(token[..., : w32.shape[-1]]).all():
                return (
                    False,
                    f"FAIL {label} [{name}] {out_name}: the bad token's values are not NaN",
                )
            g, w32 = g.copy(), w32.copy()
            g[bad_token] = w32[bad_token] = 0
        if not np.allclose(g, w32, rtol=rtol, atol=atol, equal_nan=True) or not np.array_equal(
            np.isnan(g), np.isnan(w32)
        ):
            bad = ~np.isclose(g, w32, rtol=rtol, atol=atol, equal_nan=True) | (
                np.isnan(g) != np.isnan(w32)
            )
            err = np.nanmax(np.abs(g - w32)) if g.size else 0
            return False, (
                f"FAIL {label} [{name}] {out_name}: max abs err {err:.3g} (rtol {rtol}, atol "
                f"{atol}); first bad {np.argwhere(bad)[:3].tolist()}"
            )
        if case.dtype != F32 and w32.size:
            same = _bits(g, case.dtype) == _bits(w32, case.dtype)
            same |= np.isnan(g) & np.isnan(w32)
            exact += int(same.sum())
            total += same.size
    TALLY["exact"] += exact
    TALLY["total"] += total
    if total and exact / total < EXACT:
        return (
            False,
            f"FAIL {label} [{name}]: {exact}/{total} values bit for bit, below {EXACT:.0%}",
        )
    return True, f"ok   {label} [{name}]"


def check(kernels: RotaryKernels, quick: bool = False, verbose: bool = False) -> list[str]:
    """Runs the matrix; returns the failure messages (empty: all passed)."""
    failures = []
    selected = cases(quick)
    for case in selected:
        try:
            ok, message = run_case(kernels, case)
        except Exception as e:  # noqa: BLE001 - a launcher error is a failure of that case
            ok, message = False, f"FAIL {case.label()}: {type(e).__name__}: {e}"
        if verbose or not ok:
            print(message, flush=True)
        if not ok:
            failures.append(message)
    print(
        f"{len(selected) - len(failures)}/{len(selected)} CUDA rotary kernel cases passed "
        f"({TALLY['exact']}/{TALLY['total']} float16 and bfloat16 values bit for bit)",
        flush=True,
    )
    return failures


def check_bad_arguments(kernels: RotaryKernels) -> list[str]:
    """Bad arguments are refused before any launch, with a message naming the op (worded as the
    CPU kernel's ORT errors where both check the same thing); the norm launcher refuses the
    rotary ops."""
    import torch

    q = torch.zeros(1, 2, 4, 16, device="cuda")
    k = torch.zeros(1, 2, 2, 16, device="cuda")
    cos = torch.zeros(8, 8, device="cuda")
    ids = torch.zeros(1, 2, dtype=torch.int64, device="cuda")
    scale = torch.full((16,), 1.0, device="cuda")
    outputs = {"QOut": torch.empty_like(q), "KOut": torch.empty_like(k)}
    inputs = {"Q": q, "K": k, "QScale": scale, "Cos": cos, "Sin": cos, "PositionIds": ids}
    f16, bf16 = _native.ELEM_TYPES["float16"], _native.ELEM_TYPES["bfloat16"]
    bad: list[tuple[str, dict, dict, str]] = [
        (
            "RMSNormRotary",
            dict(rotary_dim=7),
            {},
            "rotary_dim must be even and at most head_size 16, got 7",
        ),
        (
            "RMSNormRotary",
            dict(rotary_dim=18),
            {},
            "rotary_dim must be even and at most head_size 16, got 18",
        ),
        (
            "RMSNormRotary",
            dict(angle_width=5),
            {},
            "Cos's last dim must be rotary_dim / 2 = 8 (one angle per pair) or rotary_dim = 16 "
            "(one per value), got 5",
        ),
        (
            "RMSNormRotary",
            dict(per_head=0, layout=1),
            {},
            "onnxnorm::RMSNormRotary: per_head = 0 normalizes a token's heads together: "
            "layout 0 or 2",
        ),
        ("RMSNormRotary", dict(layout=3), {}, "layout must be 0, 1 or 2, got 3"),
        ("LayerNormRotary", dict(interleaved=2), {}, "interleaved must be 0 or 1, got 2"),
        ("RMSNormRotary", dict(rotary_in_t=-1), {}, "rotary_in_t must be 0 or 1, got -1"),
        ("RMSNormRotary", dict(epsilon=-1.0), {}, "epsilon must be a finite number >= 0"),
        (
            "LayerNormRotary",
            dict(scale_offset=1.0),
            {},
            "scale_offset must be finite (and 0 for ops without it)",
        ),
        (
            "L2NormRotary",
            dict(q_scale=True),
            {},
            "onnxnorm::L2NormRotary takes no QScale, KScale, QBias or KBias",
        ),
        ("RMSNormRotary", dict(q_bias=True), {}, "onnxnorm::RMSNormRotary takes no QBias or KBias"),
        ("RMSNormRotary", dict(q_x=None), {}, "onnxnorm::RMSNormRotary: input Q is required"),
        ("RMSNormRotary", dict(k_x=None), {}, "output KOut needs input K"),
        ("RMSNormRotary", dict(k_y=None), {}, "input K needs output KOut"),
        ("RMSNormRotary", dict(cos=None), {}, "input Cos is required"),
        (
            "RMSNormRotary",
            dict(q_scale_rows=3),
            {},
            "QScale must hold head_size = 16 values or heads * head_size = 64",
        ),
        (
            "RMSNormRotary",
            dict(position_ids=None, cache_batch=2),
            {},
            "without PositionIds, Cos is per token",
        ),
        ("RMSNormRotary", dict(batch=-1), {}, "batch must be >= 0, got -1"),
        ("RMSNormRotary", dict(norm=7), {}, "unknown norm kind 7"),
        (
            "RMSNormRotary",
            {},
            dict(q_type=7),
            "Q must be float32, float16 or bfloat16 (type code 7)",
        ),
        (
            "RMSNormRotary",
            {},
            dict(q_type=f16, weight_type=bf16, angle_type=f16),
            "the norm weights must be of Q's type float16 or float32, got bfloat16",
        ),
        (
            "RMSNormRotary",
            {},
            dict(q_type=bf16, weight_type=bf16, angle_type=f16),
            "Cos and Sin must be of Q's type bfloat16 or float32, got float16",
        ),
        ("RMSNormRotary", {}, dict(angle_rows=-1), "angle_rows must be >= 0, got -1"),
        ("RMSNormRotary", {}, dict(position_error=2), "position_error must be 4-byte aligned"),
    ]
    problems = []
    for op, change, call_change, expect in bad:
        given = dict(inputs)
        if op == "L2NormRotary":
            given.pop("QScale")
        args, call = make_args(op, given, outputs)
        for key, value in change.items():
            if key.startswith(("q_", "k_")):
                tensor = args.q if key[0] == "q" else args.k
                field = key[2:]
                value = scale.data_ptr() if value is True else value
                setattr(tensor, field, value)
            else:
                setattr(args, key, value)
        for key, value in call_change.items():
            setattr(call, key, value)
        try:
            kernels.launch(args, call)
            problems.append(f"{op} {change} {call_change}: accepted")
        except ValueError as e:
            if expect not in str(e):
                problems.append(f"{op} {change} {call_change}: message {e!s} lacks {expect!r}")
    # the norm launcher refuses a rotary op
    norm = _native.Kernels(kernels.path)
    x = torch.zeros(4, 64, device="cuda")
    norm_args = norm.args("RMSNorm", {"X": x}, x)
    norm_args.op = list(catalogue.ALL_OPS).index("RMSNormRotary")
    try:
        norm.launch(norm_args)
        problems.append("onnxnorm_cuda_launch accepted RMSNormRotary")
    except ValueError as e:
        if "launch it with onnxnorm_cuda_launch_rotary" not in str(e):
            problems.append(f"onnxnorm_cuda_launch's message for a rotary op: {e}")
    return problems


def check_layout(kernels: RotaryKernels) -> list[str]:
    if kernels.layout() != layout():
        return [
            f"the rotary mirrors' layout {layout()} differs from the library's {kernels.layout()}"
        ]
    return []


# ---------------------------------------------------------------------------------------------
# Bandwidth
# ---------------------------------------------------------------------------------------------
#: the Q/K shapes: tokens per call (decode 1 and 8, prefill 512), 32 query and 8 key heads of 128
BENCH_TOKENS = (1, 8, 512)
BENCH_HEADS = (32, 8)
BENCH_HEAD_SIZE = 128


def bench(kernels: RotaryKernels, dtypes: Sequence[str], reps: int) -> list[dict[str, Any]]:
    """RMSNormRotary of Q [T, 32, 128] and K [T, 8, 128] with one head's QScale and KScale, the
    half-width cache of 4096 positions in float32 gathered by PositionIds, on torch's current
    stream: the median time of one launch (flushed L2 for prefill; for decode, 200 launches back
    to back, divided), bytes moved (Q and K read, QOut and KOut written, the weights, the
    positions and their rows of Cos and Sin read) over it, and the ratio to a device copy of Q
    and K timed the same way."""
    import torch

    rows = []
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for dtype, tokens in itertools.product(dtypes, BENCH_TOKENS):
        t = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
        q = torch.randn(1, tokens, BENCH_HEADS[0], BENCH_HEAD_SIZE, dtype=t, device="cuda")
        k = torch.randn(1, tokens, BENCH_HEADS[1], BENCH_HEAD_SIZE, dtype=t, device="cuda")
        angle = torch.rand(4096, BENCH_HEAD_SIZE // 2, device="cuda") * 8
        inputs = {
            "Q": q,
            "K": k,
            "QScale": torch.ones(BENCH_HEAD_SIZE, dtype=t, device="cuda"),
            "KScale": torch.ones(BENCH_HEAD_SIZE, dtype=t, device="cuda"),
            "Cos": angle.cos(),
            "Sin": angle.sin(),
            "PositionIds": torch.arange(tokens, device="cuda").view(1, tokens),
        }
        outputs = {"QOut": torch.empty_like(q), "KOut": torch.empty_like(k)}
        args, call = make_args("RMSNormRotary", inputs, outputs)
        qk = torch.cat([q.view(-1), k.view(-1)])
        copy = torch.empty_like(qk)

        def timed(fn, decode: bool) -> float:
            samples = []
            for _ in range(min(reps, 10) if decode else reps):
                if not decode:
                    flush.zero_()
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                for _ in range(200 if decode else 1):
                    fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3 / (200 if decode else 1))
            return statistics.median(samples)

        decode = tokens <= 8
        kernels.launch(args, call)
        torch.cuda.synchronize()
        us = timed(lambda a=args, c=call: kernels.launch(a, c), decode)
        copy_us = timed(lambda out=copy, src=qk: out.copy_(src), decode)
        size = qk.element_size()
        moved = (
            2 * qk.numel() * size
            + 2 * BENCH_HEAD_SIZE * size
            + tokens * (8 + 2 * 4 * BENCH_HEAD_SIZE // 2)
        )
        gbs = moved / us / 1e3
        copy_gbs = 2 * qk.numel() * size / copy_us / 1e3
        rows.append(
            {
                "op": "RMSNormRotary",
                "dtype": dtype,
                "shape": f"{tokens}x({BENCH_HEADS[0]}+{BENCH_HEADS[1]})x{BENCH_HEAD_SIZE}",
                "kernel": kernels.kernel_name(args, call),
                "us": us,
                "gbs": gbs,
                "copy_gbs": copy_gbs,
                "pct_of_copy": 100 * gbs / copy_gbs,
                "timing": "back to back" if decode else "flushed",
            }
        )
        r = rows[-1]
        print(
            f"| {r['op']} | {dtype} | {r['shape']} | {r['kernel']} | {us:.2f} | {gbs:.0f} | "
            f"{copy_gbs:.0f} | {r['pct_of_copy']:.0f}% | {r['timing']} |",
            flush=True,
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--emulation", action="store_true", help="build the host emulation and run on the CPU"
    )
    parser.add_argument("--quick", action="store_true", help="a smaller matrix")
    parser.add_argument("--verbose", action="store_true", help="print every case")
    parser.add_argument("--library", help="the CUDA library (default: the built one)")
    parser.add_argument("--bench", action="store_true", help="the bandwidth rows instead (a GPU)")
    parser.add_argument("--dtypes", default="bfloat16,float16", help="--bench: the types")
    parser.add_argument("--reps", type=int, default=30, help="--bench: repetitions")
    parser.add_argument("--json", help="--bench: write the rows here")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.emulation:
        if args.bench:
            parser.error("--bench needs a GPU")
        folder = tempfile.mkdtemp(prefix="onnxnorm-emulation-")
        try:
            library = cuda_harness.build_emulation(folder)
            cuda_harness.run_on_host()
            return _check_all(RotaryKernels(library), args.quick, args.verbose)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    import torch

    if not torch.cuda.is_available():
        print("cuda_rotary: torch sees no CUDA device (use --emulation)", file=sys.stderr)
        return 2
    kernels = RotaryKernels(args.library)
    print(f"# {kernels.path} on {torch.cuda.get_device_name(0)}", flush=True)
    if args.bench:
        print("| op | dtype | shape | kernel | time (us) | GB/s | copy GB/s | % of copy | timing |")
        print("|---|---|---|---|---|---|---|---|---|")
        rows = bench(kernels, args.dtypes.split(","), args.reps)
        if args.json:
            env = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
            Path(args.json).write_text(json.dumps({"rows": rows, "environment": env}, indent=1))
        return 0
    return _check_all(kernels, args.quick, args.verbose)


def _check_all(kernels: RotaryKernels, quick: bool, verbose: bool) -> int:
    failures = check(kernels, quick=quick, verbose=verbose)
    problems = check_layout(kernels) + check_bad_arguments(kernels)
    for p in problems:
        print("FAIL", p)
    return 1 if failures or problems else 0


if __name__ == "__main__":
    sys.exit(main())

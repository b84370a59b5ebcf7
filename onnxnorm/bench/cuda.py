"""CUDA kernel harness: checks and benchmarks the onnxnorm CUDA kernels without onnxruntime-gpu.

It loads libonnxnorm_cuda_ops.so with ctypes and drives its C launcher (custom_ops/cuda/launch.h)
on torch CUDA tensors, on torch's current stream:

* ``check``: every catalogue op x dtype (float32, float16, bfloat16) x weight dtype (X's or
  float32) x rounding order x optional inputs x row widths (Q/K rows 64-256, hidden sizes up to
  beyond what the register path holds, widths that are not a multiple of the vector width,
  unaligned views, per-head weights, axis -2), against ``onnxnorm.ops.reference`` within its
  per-dtype tolerances; plus rows of mean 1e4 and std 1e-2 and NaN propagation.
* ``bench``: bytes moved over time (CUDA events around each launch, L2 flushed between
  repetitions by writing a buffer larger than L2, median of the repetitions) against a
  device-to-device copy of the same number of bytes measured in the same run; prints a
  markdown table with each target of issue 6.

    python -m onnxnorm.bench.cuda [--check] [--bench] [--quick] [--library PATH] [--json OUT]

The library is $ONNXNORM_CUDA_LIBRARY, else the one ``onnxnorm.runtime.cuda_library_path()``
finds.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import itertools
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import ml_dtypes
import numpy as np

from onnxnorm.ops import catalogue, reference

ENV_CUDA_LIBRARY = "ONNXNORM_CUDA_LIBRARY"
ABI_VERSION = 1
OP_CODES = {"LayerNorm": 0, "RMSNorm": 1, "SkipLayerNorm": 2, "SkipRMSNorm": 3,
            "SandwichLayerNorm": 4, "SandwichRMSNorm": 5}
WEIGHT_INPUTS = ("Scale", "Bias", "InnerScale", "InnerBias", "XBias")

#: issue 6's targets, percent of the copy bandwidth (bfloat16, 4096 x 4096 and 4096 x 8192;
#: Q/K-norm shapes: 75%)
TARGETS = {"RMSNorm": 90, "SkipRMSNorm": 90, "LayerNorm": 85, "SkipLayerNorm": 85}
QK_TARGET = 75


class CudaArgs(ctypes.Structure):
    """Mirror of OnnxNormCudaArgs (custom_ops/cuda/launch.h)."""

    _fields_ = [
        ("abi_version", ctypes.c_int32), ("op", ctypes.c_int32), ("x_type", ctypes.c_int32),
        ("weight_type", ctypes.c_int32), ("cast_before_scale", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("rows", ctypes.c_int64), ("cols", ctypes.c_int64),
        ("x", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p), ("inner_scale", ctypes.c_void_p),
        ("inner_bias", ctypes.c_void_p), ("xbias", ctypes.c_void_p), ("y", ctypes.c_void_p),
        ("sum", ctypes.c_void_p),
        ("scale_rows", ctypes.c_int64), ("bias_rows", ctypes.c_int64),
        ("inner_scale_rows", ctypes.c_int64), ("inner_bias_rows", ctypes.c_int64),
        ("xbias_rows", ctypes.c_int64),
        ("epsilon", ctypes.c_float), ("scale_offset", ctypes.c_float), ("alpha", ctypes.c_float),
        ("reserved_f", ctypes.c_float),
    ]


_FIELD = {"Scale": "scale", "Bias": "bias", "InnerScale": "inner_scale",
          "InnerBias": "inner_bias", "XBias": "xbias"}


def library_path() -> Path:
    """The CUDA library: $ONNXNORM_CUDA_LIBRARY, else where onnxnorm.runtime finds it."""
    override = os.environ.get(ENV_CUDA_LIBRARY)
    if override:
        return Path(override)
    from onnxnorm import runtime

    return runtime.cuda_library_path()


def _torch():
    import torch

    return torch


def _type_code(dtype) -> int:
    torch = _torch()
    return {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dtype]


def to_numpy(t) -> np.ndarray:
    """A torch tensor (any device) as numpy, bfloat16 as ml_dtypes.bfloat16."""
    torch = _torch()
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


class Kernels:
    """The C launchers of one loaded CUDA library."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else library_path()
        if not self.path.is_file():
            raise FileNotFoundError(f"the onnxnorm CUDA library is not built: {self.path}")
        lib = ctypes.CDLL(str(self.path))
        lib.onnxnorm_cuda_launch.argtypes = [ctypes.POINTER(CudaArgs), ctypes.c_void_p,
                                             ctypes.c_char_p, ctypes.c_size_t]
        lib.onnxnorm_cuda_launch.restype = ctypes.c_int
        lib.onnxnorm_cuda_kernel_name.argtypes = [ctypes.POINTER(CudaArgs), ctypes.c_char_p,
                                                  ctypes.c_size_t]
        lib.onnxnorm_cuda_kernel_name.restype = ctypes.c_int
        lib.onnxnorm_cuda_default_args.argtypes = [ctypes.POINTER(CudaArgs), ctypes.c_int32]
        lib.onnxnorm_cuda_default_args.restype = None
        lib.onnxnorm_cuda_build_info.restype = ctypes.c_char_p
        lib.onnxnorm_cuda_op_manifest.restype = ctypes.c_char_p
        self.lib = lib

    def build_info(self) -> str:
        return self.lib.onnxnorm_cuda_build_info().decode()

    def manifest(self) -> dict[str, Any]:
        return json.loads(self.lib.onnxnorm_cuda_op_manifest())

    def args(self, op: str, inputs: dict[str, Any], y, sum_=None, axis: int = -1,
             **attrs: Any) -> CudaArgs:
        """Launcher arguments for catalogue op ``op`` on torch CUDA tensors ``inputs`` (by
        parameter name; absent ones left out), outputs ``y`` and ``sum_``."""
        spec = catalogue.get(op)
        a = reference.check_attributes(spec, attrs)
        x = inputs["X"]
        rank = x.dim()
        ax = axis % rank if rank else 0
        cols = 1
        for d in x.shape[ax:]:
            cols *= d
        rows = x.numel() // cols if cols else 0
        args = CudaArgs()
        self.lib.onnxnorm_cuda_default_args(ctypes.byref(args), OP_CODES[op])
        args.x_type = _type_code(x.dtype)
        args.weight_type = args.x_type
        args.cast_before_scale = int(a["cast_before_scale"])
        args.rows, args.cols = rows, cols
        args.x = x.data_ptr()
        args.y = y.data_ptr()
        if sum_ is not None:
            args.sum = sum_.data_ptr()
        if "Residual" in inputs:
            args.residual = inputs["Residual"].data_ptr()
        for name in WEIGHT_INPUTS:
            w = inputs.get(name)
            if w is None:
                continue
            args.weight_type = _type_code(w.dtype)
            setattr(args, _FIELD[name], w.data_ptr())
            setattr(args, _FIELD[name] + "_rows", max(1, w.numel() // cols))
        args.epsilon = a["epsilon"]
        args.scale_offset = a.get("scale_offset", 0.0)
        args.alpha = a.get("alpha", 1.0)
        return args

    def kernel_name(self, args: CudaArgs) -> str:
        buf = ctypes.create_string_buffer(256)
        rc = self.lib.onnxnorm_cuda_kernel_name(ctypes.byref(args), buf, len(buf))
        if rc != 0:
            raise ValueError(buf.value.decode())
        return buf.value.decode()

    def launch(self, args: CudaArgs, stream: int | None = None) -> None:
        """Launches on ``stream`` (default: torch's current stream); raises ValueError on bad
        arguments and RuntimeError on a CUDA error, with the launcher's message."""
        if stream is None:
            stream = _torch().cuda.current_stream().cuda_stream
        buf = ctypes.create_string_buffer(512)
        rc = self.lib.onnxnorm_cuda_launch(ctypes.byref(args), ctypes.c_void_p(stream), buf,
                                           len(buf))
        if rc == 1:
            raise ValueError(buf.value.decode())
        if rc != 0:
            raise RuntimeError(buf.value.decode())

    def run(self, op: str, inputs: dict[str, Any], *, with_sum: bool = True, axis: int = -1,
            **attrs: Any):
        """Runs ``op`` and returns [Y] or [Y, Sum] as new torch tensors."""
        torch = _torch()
        x = inputs["X"]
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        s = (torch.empty(x.shape, dtype=x.dtype, device=x.device)
             if with_sum and catalogue.get(op).has_residual else None)
        self.launch(self.args(op, inputs, y, s, axis, **attrs))
        return [y] if s is None else [y, s]


# ---------------------------------------------------------------------------------------------
# Correctness
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

    def label(self) -> str:
        extra = "".join([f" axis={self.axis}" if self.axis != -1 else "",
                         f" w{list(self.weight_shape)}" if self.weight_shape else "",
                         " unaligned" if self.unaligned else "",
                         f" {self.kind}" if self.kind != "random" else "",
                         "" if self.with_sum else " no-Sum"])
        return (f"{self.op} {self.dtype}/{self.weight_dtype} {list(self.shape)} "
                f"[{','.join(self.present) or '-'}] {self.attrs}{extra}")


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
    widths = [(5, 64), (7, 128), (3, 256), (4, 768), (3, 1000), (3, 1001), (2, 4096), (2, 8192),
              (2, 16384)]
    if not quick:
        widths += [(9, 32), (3, 2048), (1, 24576), (1, 40000), (2, 1, 4, 8)]
    type_pairs = [("float32", "float32"), ("float16", "float16"), ("float16", "float32"),
                  ("bfloat16", "bfloat16"), ("bfloat16", "float32")]
    for op, spec in catalogue.OPS.items():
        rms = spec.norm == "rms"
        skip = spec.residual == "skip"
        for (dt, wt), order in itertools.product(type_pairs, (0, 1)):
            if dt == "float32" and order:
                continue
            attrs = {"cast_before_scale": order, "epsilon": 1e-5}
            if rms:
                attrs["scale_offset"] = 1.0 if order else 0.0
            if skip:
                attrs["alpha"] = 0.5 if order else 1.0
            for shape in widths:
                present_sets = _optional_sets(spec, quick) if shape[-1] <= 1000 else [
                    spec.optional_inputs]
                for present in present_sets:
                    out.append(Case(op, dt, wt, shape, present, dict(attrs)))
            all_in = spec.optional_inputs
            # per-head weights (Cohere Q/K norm), axis -2, unaligned views, no Sum output
            out.append(Case(op, dt, wt, (2, 3, 4, 128), all_in, dict(attrs), weight_shape=(4, 128)))
            out.append(Case(op, dt, wt, (3, 4, 64), all_in, dict(attrs), axis=-2))
            out.append(Case(op, dt, wt, (3, 512), all_in, dict(attrs), unaligned=True))
            if spec.has_residual:
                out.append(Case(op, dt, wt, (4, 256), all_in, dict(attrs), with_sum=False))
        for dt in ("float32", "float16", "bfloat16"):
            out.append(Case(op, dt, dt, (2, 31), spec.optional_inputs, {}, kind="nan"))
        if spec.norm == "layer":
            for width in (128, 4096, 3000):
                out.append(Case(op, "float32", "float32", (3, width), (), {}, kind="large-mean"))
    return out


def _make_inputs(case: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    spec = catalogue.get(case.op)
    npt = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
    t, w = np.dtype(npt[case.dtype]), np.dtype(npt[case.weight_dtype])
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
        if name in ("Scale", "InnerScale"):
            arrays[name] = (1 + 0.5 * rng.standard_normal(wshape)).astype(w)
        else:
            arrays[name] = (0.5 * rng.standard_normal(wshape)).astype(w)
    return arrays


def _to_device(a: np.ndarray, unaligned: bool = False):
    torch = _torch()
    if a.dtype == ml_dtypes.bfloat16:
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(a))
    if unaligned:  # a view one element into a larger buffer: not 16-byte aligned
        buf = torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")
        view = buf[1:].view(t.shape)
        view.copy_(t.cuda())
        return view
    return t.cuda()


def run_case(kernels: Kernels, case: Case, seed: int = 0) -> tuple[bool, str]:
    """Runs one case; returns (passed, message)."""
    torch = _torch()
    rng = np.random.default_rng(seed)
    spec = catalogue.get(case.op)
    arrays = _make_inputs(case, rng)
    attrs = dict(case.attrs)
    want = reference.run(case.op, *[arrays.get(p.name) for p in spec.inputs], axis=case.axis,
                         **attrs)
    dev = {k: _to_device(v, case.unaligned and k in ("X", "Residual")) for k, v in arrays.items()}
    x = dev["X"]
    y = torch.empty_like(x)
    s = torch.empty_like(x) if spec.has_residual and case.with_sum else None
    if case.unaligned:
        ybuf = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
        y = ybuf[1:].view(x.shape)
    args = kernels.args(case.op, dev, y, s, case.axis, **attrs)
    name = kernels.kernel_name(args)
    kernels.launch(args)
    torch.cuda.synchronize()
    got = [y] + ([s] if s is not None else [])
    rtol, atol = reference.tolerance(arrays["X"].dtype)
    for label, g, w in zip(("Y", "Sum"), got, want):
        g32 = to_numpy(g).astype(np.float32)
        w32 = w.astype(np.float32)
        if case.kind == "large-mean":
            rtol, atol = 1e-4, 1e-4  # float32 inputs of mean 1e4 carry 1e-3 absolute noise
        if not np.allclose(g32, w32, rtol=rtol, atol=atol, equal_nan=True) or \
                not np.array_equal(np.isnan(g32), np.isnan(w32)):
            bad = ~np.isclose(g32, w32, rtol=rtol, atol=atol, equal_nan=True)
            idx = np.argwhere(bad)[:3].tolist()
            err = np.nanmax(np.abs(g32 - w32)) if g32.size else 0
            return False, (f"FAIL {case.label()} [{name}] {label}: max abs err {err:.3g} "
                           f"(rtol {rtol}, atol {atol}); first bad {idx}")
    return True, f"ok   {case.label()} [{name}]"


def check(kernels: Kernels, quick: bool = False, verbose: bool = False,
          ops: Sequence[str] | None = None) -> list[str]:
    """Runs the correctness matrix; returns the failure messages (empty: all passed)."""
    failures = []
    selected = [c for c in cases(quick) if ops is None or c.op in ops]
    for i, case in enumerate(selected):
        try:
            ok, message = run_case(kernels, case, seed=i)
        except Exception as e:  # a launcher error is a failure of that case
            ok, message = False, f"FAIL {case.label()}: {type(e).__name__}: {e}"
        if verbose or not ok:
            print(message, flush=True)
        if not ok:
            failures.append(message)
    print(f"{len(selected) - len(failures)}/{len(selected)} CUDA kernel cases passed", flush=True)
    return failures


def check_bad_arguments(kernels: Kernels) -> list[str]:
    """Bad arguments are refused before any launch, with a message naming the op."""
    torch = _torch()
    x = torch.zeros(4, 64, device="cuda")
    y = torch.empty_like(x)
    problems = []
    bad = [
        ("RMSNorm", dict(epsilon=-1.0), "epsilon"),
        ("LayerNorm", dict(scale_offset=1.0), "scale_offset"),
        ("RMSNorm", dict(x=None), "X and Y"),
        ("SkipRMSNorm", dict(residual=None), "Residual"),
        ("RMSNorm", dict(cols=0), "no elements"),
        ("RMSNorm", dict(x_type=7), "float32, float16 or bfloat16"),
        ("RMSNorm", dict(abi_version=99), "abi_version"),
        ("RMSNorm", dict(scale=x.data_ptr(), scale_rows=0), "Scale rows"),
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


# ---------------------------------------------------------------------------------------------
# Bandwidth
# ---------------------------------------------------------------------------------------------
BENCH_SHAPES = [  # (label, rows, cols, is Q/K)
    ("4096x4096", 4096, 4096, False),
    ("4096x8192", 4096, 8192, False),
    ("Q/K 16384x32 heads x128", 16384 * 32, 128, True),
    ("Q/K 4096x8 heads x256", 4096 * 8, 256, True),
    ("Q/K 4096x32 heads x64", 4096 * 32, 64, True),
]


def _flush_l2(buffer) -> None:
    buffer.zero_()


def _time_ms(fn, flush, reps: int) -> float:
    torch = _torch()
    times = []
    for _ in range(reps):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench(kernels: Kernels, ops: Iterable[str] | None = None, dtype: str = "bfloat16",
          reps: int = 30, shapes=None) -> list[dict[str, Any]]:
    """Measures each op at each shape; returns rows with GB/s and % of copy."""
    torch = _torch()
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 64 << 20) or (64 << 20)
    flush_buf = torch.empty(max(4 * l2, 256 << 20) // 4, dtype=torch.float32, device="cuda")
    flush = lambda: _flush_l2(flush_buf)  # noqa: E731
    results = []
    for label, rows, cols, qk in shapes or BENCH_SHAPES:
        # the copy bound for this shape: read X, write Y (the bytes RMSNorm moves)
        src = torch.randn(rows, cols, device="cuda", dtype=tdt)
        dst = torch.empty_like(src)
        copy_ms = _time_ms(lambda: dst.copy_(src), flush, reps)
        copy_bytes = 2 * src.numel() * src.element_size()
        copy_gbs = copy_bytes / copy_ms / 1e6
        del dst
        for op in ops or catalogue.OPS:
            spec = catalogue.get(op)
            inputs = {"X": src}
            if spec.has_residual:
                inputs["Residual"] = torch.randn_like(src)
            for name in spec.optional_inputs:
                if name != "XBias":
                    inputs[name] = torch.randn(cols, device="cuda", dtype=tdt)
            y = torch.empty_like(src)
            s = torch.empty_like(src) if spec.has_residual else None
            args = kernels.args(op, inputs, y, s)
            kernels.launch(args)  # warm-up, and errors surface here
            torch.cuda.synchronize()
            ms = _time_ms(lambda: kernels.launch(args), flush, reps)
            moved = sum(t.numel() * t.element_size() for t in inputs.values()) + y.numel() * \
                y.element_size() * (2 if s is not None else 1)
            gbs = moved / ms / 1e6
            target = QK_TARGET if qk and spec.residual == "none" else (
                None if qk else TARGETS.get(op))
            pct = 100 * gbs / copy_gbs
            results.append(dict(op=op, dtype=dtype, shape=label, kernel=kernels.kernel_name(args),
                                ms=ms, gbs=gbs, copy_gbs=copy_gbs, pct_of_copy=pct, target=target,
                                met=None if target is None else pct >= target))
            del y, s
        del src
        torch.cuda.empty_cache()
    return results


def markdown(results: list[dict[str, Any]], device: str = "") -> str:
    lines = [f"CUDA kernels on {device}" if device else "CUDA kernels", "",
             "| op | dtype | shape | kernel | time (us) | GB/s | copy GB/s | % of copy | target | met? |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in results:
        target = f"{r['target']}%" if r["target"] is not None else "-"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(f"| {r['op']} | {r['dtype']} | {r['shape']} | {r['kernel'].split('/')[-1]} "
                     f"| {1000 * r['ms']:.1f} | {r['gbs']:.0f} | {r['copy_gbs']:.0f} "
                     f"| {r['pct_of_copy']:.1f}% | {target} | {met} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onnxnorm.bench.cuda", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="run the correctness matrix")
    parser.add_argument("--bench", action="store_true", help="measure bandwidth")
    parser.add_argument("--quick", action="store_true", help="a smaller correctness matrix")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--library", help=f"the CUDA library (default: ${ENV_CUDA_LIBRARY} or "
                                          "the installed one)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--json", help="write the bandwidth rows here")
    args = parser.parse_args(argv)
    if not (args.check or args.bench):
        args.check = args.bench = True
    torch = _torch()
    if not torch.cuda.is_available():
        print("onnxnorm.bench.cuda: torch sees no CUDA device", file=sys.stderr)
        return 2
    kernels = Kernels(args.library)
    device = torch.cuda.get_device_name(0)
    print(f"# {kernels.path} ({kernels.build_info()}) on {device}, torch {torch.__version__}",
          flush=True)
    status = 0
    if args.check:
        failures = check(kernels, quick=args.quick, verbose=args.verbose)
        problems = check_bad_arguments(kernels)
        for p in problems:
            print("FAIL bad-argument check:", p)
        status = 1 if failures or problems else 0
    if args.bench:
        results = bench(kernels, dtype=args.dtype, reps=args.reps)
        print(markdown(results, device))
        if args.json:
            Path(args.json).write_text(json.dumps(dict(device=device, results=results), indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())

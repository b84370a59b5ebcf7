"""CUDA kernel bandwidth: the onnxnorm CUDA kernels against a device-to-device copy.

It loads libonnxnorm_cuda_ops.so with ctypes and drives its C launcher
(custom_ops/include/onnxnorm/cuda_launch.h) with a ``NormArgs`` on torch CUDA tensors, on torch's
current stream, without onnxruntime-gpu: bytes moved over time (CUDA events around each launch,
L2 flushed between repetitions by writing a buffer larger than L2, median of the repetitions)
against a copy of the same shape measured in the same run; prints a markdown table with each
target (RMSNorm and SkipRMSNorm at least 90 % of the copy bandwidth, LayerNorm and SkipLayerNorm
85 %, Q/K-norm shapes 75 %; bfloat16).

    python -m onnxnorm.bench.cuda [--reps N] [--dtype D] [--library PATH] [--json OUT]

The library is the one ``onnxnorm.runtime.library_path("cuda")`` finds. The kernels' correctness
matrix is tests/cuda_harness.py (run by tests/test_cuda.py).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import ml_dtypes
import numpy as np

from onnxnorm.ops import catalogue, reference



def elem_type_name(onnx_type: str) -> str:
    """"tensor(float)" -> "float32", "tensor(bfloat16)" -> "bfloat16": the native names."""
    name = onnx_type[len("tensor("):-1]
    return "float32" if name == "float" else name


#: the element type codes of NormArgs (onnxnorm::ElemType: catalogue.DATA_TYPES in order)
ELEM_TYPES = {elem_type_name(t): i for i, t in enumerate(catalogue.DATA_TYPES)}
#: the op codes of NormArgs (onnxnorm::OpId: catalogue.OPS in order)
OP_IDS = {name: i for i, name in enumerate(catalogue.OPS)}
WEIGHT_INPUTS = ("Scale", "Bias", "InnerScale", "InnerBias", "XBias")

#: percent of the copy bandwidth (bfloat16, 4096 x 4096 and 4096 x 8192; Q/K-norm shapes: 75%)
TARGETS = {"RMSNorm": 90, "SkipRMSNorm": 90, "LayerNorm": 85, "SkipLayerNorm": 85}
QK_TARGET = 75


class NormArgs(ctypes.Structure):
    """Mirror of onnxnorm::NormArgs (custom_ops/include/onnxnorm/norm_args.h); the tests hold it
    to the layout the libraries export (onnxnorm_args_layout)."""

    _fields_ = [
        ("op", ctypes.c_int32), ("x_type", ctypes.c_int32), ("weight_type", ctypes.c_int32),
        ("cast_before_scale", ctypes.c_int32),
        ("rows", ctypes.c_int64), ("cols", ctypes.c_int64),
        ("x", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p), ("xbias", ctypes.c_void_p), ("inner_scale", ctypes.c_void_p),
        ("inner_bias", ctypes.c_void_p), ("y", ctypes.c_void_p), ("sum", ctypes.c_void_p),
        ("scale_rows", ctypes.c_int64), ("bias_rows", ctypes.c_int64),
        ("xbias_rows", ctypes.c_int64), ("inner_scale_rows", ctypes.c_int64),
        ("inner_bias_rows", ctypes.c_int64),
        ("epsilon", ctypes.c_float), ("scale_offset", ctypes.c_float), ("alpha", ctypes.c_float),
    ]

    def __init__(self, **fields: Any):
        # the C++ struct's defaults where they are not zero
        defaults = {f"{w}_rows": 1 for w in ("scale", "bias", "xbias", "inner_scale", "inner_bias")}
        defaults.update(epsilon=catalogue.EPSILON.default, alpha=catalogue.ALPHA.default)
        super().__init__(**{**defaults, **fields})


class CudaQuantArgs(ctypes.Structure):
    """Mirror of onnxnorm::CudaQuantArgs (custom_ops/include/onnxnorm/cuda_launch.h): a quantized
    op's quantized Y and where its scale and zero point live (device pointers)."""

    _fields_ = [
        ("q_type", ctypes.c_int32), ("q", ctypes.c_void_p), ("y_scale", ctypes.c_void_p),
        ("y_zero_point", ctypes.c_void_p), ("scratch", ctypes.c_void_p),
    ]


#: the quantized element type codes (onnxnorm::ElemType: after the float types)
QUANT_ELEM_TYPES = {elem_type_name(t): len(catalogue.DATA_TYPES) + i
                    for i, t in enumerate(catalogue.QUANT_TYPES)}
#: the numpy types of the quantized element types (float8e4m3fn: ml_dtypes')
QUANT_NP_TYPES = {"uint8": np.dtype(np.uint8), "int8": np.dtype(np.int8),
                  "float8e4m3fn": reference.FLOAT8_E4M3FN}


def layout(args_type: type[ctypes.Structure] = NormArgs) -> dict[str, Any]:
    """The mirror's layout in the form of onnxnorm_args_layout: size and [name, offset, size]."""
    return {"size": ctypes.sizeof(args_type),
            "fields": [[name, getattr(args_type, name).offset, getattr(args_type, name).size]
                       for name, _ in args_type._fields_]}


_FIELD = {"Scale": "scale", "Bias": "bias", "InnerScale": "inner_scale",
          "InnerBias": "inner_bias", "XBias": "xbias"}


def library_path() -> Path:
    from onnxnorm import runtime

    return runtime.library_path("cuda")


def _torch():
    import torch

    return torch


def _type_code(dtype) -> int:
    torch = _torch()
    return ELEM_TYPES[{torch.float32: "float32", torch.float16: "float16",
                       torch.bfloat16: "bfloat16"}[dtype]]


def quant_torch_dtype(name: str):
    """The torch type of a quantized element type ("uint8", "int8", "float8e4m3fn")."""
    torch = _torch()
    return {"uint8": torch.uint8, "int8": torch.int8, "float8e4m3fn": torch.float8_e4m3fn}[name]


def to_numpy(t) -> np.ndarray:
    """A torch tensor (any device) as numpy, bfloat16 and float8 e4m3fn as ml_dtypes' types."""
    torch = _torch()
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    return t.numpy()


def from_numpy(a: np.ndarray):
    """A numpy array as a (CPU) torch tensor, ml_dtypes' bfloat16 and float8 e4m3fn included."""
    torch = _torch()
    a = np.ascontiguousarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if a.dtype == ml_dtypes.float8_e4m3fn:
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(a)


class Kernels:
    """The C launchers of one loaded CUDA library."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else library_path()
        if not self.path.is_file():
            raise FileNotFoundError(f"the onnxnorm CUDA library is not built: {self.path}")
        lib = ctypes.CDLL(str(self.path))
        lib.onnxnorm_cuda_launch.argtypes = [ctypes.POINTER(NormArgs), ctypes.c_void_p,
                                             ctypes.c_char_p, ctypes.c_size_t]
        lib.onnxnorm_cuda_launch.restype = ctypes.c_int
        lib.onnxnorm_cuda_kernel_name.argtypes = [ctypes.POINTER(NormArgs), ctypes.c_char_p,
                                                  ctypes.c_size_t]
        lib.onnxnorm_cuda_kernel_name.restype = ctypes.c_int
        if hasattr(lib, "onnxnorm_cuda_launch_quantized"):  # (libraries built before it: none)
            lib.onnxnorm_cuda_launch_quantized.argtypes = [
                ctypes.POINTER(NormArgs), ctypes.POINTER(CudaQuantArgs), ctypes.c_void_p,
                ctypes.c_char_p, ctypes.c_size_t]
            lib.onnxnorm_cuda_launch_quantized.restype = ctypes.c_int
            lib.onnxnorm_cuda_quant_scratch_bytes.argtypes = [ctypes.POINTER(NormArgs)]
            lib.onnxnorm_cuda_quant_scratch_bytes.restype = ctypes.c_size_t
        lib.onnxnorm_cuda_build_info.restype = ctypes.c_char_p
        lib.onnxnorm_args_layout.restype = ctypes.c_char_p
        self.lib = lib

    def build_info(self) -> str:
        return self.lib.onnxnorm_cuda_build_info().decode()

    def layout(self) -> dict[str, Any]:
        """The library's NormArgs layout (onnxnorm_args_layout)."""
        return json.loads(self.lib.onnxnorm_args_layout())

    def args(self, op: str, inputs: dict[str, Any], y, sum_=None, axis: int = -1,
             **attrs: Any) -> NormArgs:
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
        args = NormArgs()
        args.op = OP_IDS[op]
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

    def kernel_name(self, args: NormArgs) -> str:
        buf = ctypes.create_string_buffer(256)
        rc = self.lib.onnxnorm_cuda_kernel_name(ctypes.byref(args), buf, len(buf))
        if rc != 0:
            raise ValueError(buf.value.decode())
        return buf.value.decode()

    def launch(self, args: NormArgs, stream: int | None = None) -> None:
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

    def quant_scratch_bytes(self, args: NormArgs) -> int:
        """The device scratch a dynamic quantized op's call needs (0 for the others)."""
        return int(self.lib.onnxnorm_cuda_quant_scratch_bytes(ctypes.byref(args)))

    def launch_quantized(self, args: NormArgs, quant: CudaQuantArgs, stream: int | None = None) -> None:
        """launch() for a quantized op (``args.y``: Y_float or 0, ``args.sum``: Sum or 0)."""
        if stream is None:
            stream = _torch().cuda.current_stream().cuda_stream
        buf = ctypes.create_string_buffer(512)
        rc = self.lib.onnxnorm_cuda_launch_quantized(ctypes.byref(args), ctypes.byref(quant),
                                                     ctypes.c_void_p(stream), buf, len(buf))
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
        for op in ops or catalogue.FLOAT_OPS:  # (the quantized ops: their norm kernels, another epilogue)
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
    parser = argparse.ArgumentParser(prog="python -m onnxnorm.bench.cuda",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--library", help="the CUDA library (default: the installed one)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--json", help="write the bandwidth rows here")
    args = parser.parse_args(argv)
    torch = _torch()
    if not torch.cuda.is_available():
        print("onnxnorm.bench.cuda: torch sees no CUDA device", file=sys.stderr)
        return 2
    kernels = Kernels(args.library)
    device = torch.cuda.get_device_name(0)
    print(f"# {kernels.path} ({kernels.build_info()}) on {device}, torch {torch.__version__}",
          flush=True)
    results = bench(kernels, dtype=args.dtype, reps=args.reps)
    print(markdown(results, device))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=device, results=results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

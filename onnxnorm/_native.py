"""The one Python binding of the native libraries (ctypes), for what ONNX Runtime does not do.

ONNX Runtime loads the libraries for sessions itself (``onnxnorm.runtime``); this module is how
Python reaches them directly: the codes of ``NormArgs`` (element types, op ids: the catalogue's
order, as ``tools/gen_native_ops.py`` writes them), the ctypes mirrors of ``NormArgs`` and
``CudaQuantArgs`` (custom_ops/include/onnxnorm/norm_args.h, cuda_launch.h), the CPU library's
manifest, argument layout and instruction set, and the CUDA library's C launcher on torch CUDA
tensors (:class:`Kernels`: the CUDA tests' harness and the bandwidth benchmark, without
onnxruntime-gpu). tests/kernels/test_native_ops.py holds the codes, the manifest and the mirrors
to the built libraries. torch is imported only by what takes torch tensors.
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from onnxnorm.ops import catalogue, reference


def elem_type_name(onnx_type: str) -> str:
    """ "tensor(float)" -> "float32", "tensor(bfloat16)" -> "bfloat16": the native names."""
    name = onnx_type[len("tensor(") : -1]
    return "float32" if name == "float" else name


#: the element type codes of NormArgs (onnxnorm::ElemType: catalogue.DATA_TYPES in order)
ELEM_TYPES = {elem_type_name(t): i for i, t in enumerate(catalogue.DATA_TYPES)}
#: the quantized element type codes (onnxnorm::ElemType: after the float types)
QUANT_ELEM_TYPES = {
    elem_type_name(t): len(catalogue.DATA_TYPES) + i for i, t in enumerate(catalogue.QUANT_TYPES)
}
#: the numpy types of the quantized element types (float8e4m3fn: ml_dtypes')
QUANT_NP_TYPES = {
    "uint8": np.dtype(np.uint8),
    "int8": np.dtype(np.int8),
    "float8e4m3fn": reference.FLOAT8_E4M3FN,
}
#: the op codes of NormArgs (onnxnorm::OpId: catalogue.OPS in order)
OP_IDS = {name: i for i, name in enumerate(catalogue.OPS)}
#: the weight inputs, each a pointer and a row count in NormArgs
WEIGHT_INPUTS = ("Scale", "Bias", "InnerScale", "InnerBias", "XBias")
_FIELD = {
    "Scale": "scale",
    "Bias": "bias",
    "InnerScale": "inner_scale",
    "InnerBias": "inner_bias",
    "XBias": "xbias",
}


class NormArgs(ctypes.Structure):
    """Mirror of onnxnorm::NormArgs (custom_ops/include/onnxnorm/norm_args.h); the tests hold it
    to the layout the libraries export (onnxnorm_args_layout)."""

    _fields_ = [
        ("op", ctypes.c_int32),
        ("x_type", ctypes.c_int32),
        ("weight_type", ctypes.c_int32),
        ("y_type", ctypes.c_int32),
        ("cast_before_scale", ctypes.c_int32),
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
        ("x", ctypes.c_void_p),
        ("residual", ctypes.c_void_p),
        ("scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("xbias", ctypes.c_void_p),
        ("inner_scale", ctypes.c_void_p),
        ("inner_bias", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("sum", ctypes.c_void_p),
        ("scale_rows", ctypes.c_int64),
        ("bias_rows", ctypes.c_int64),
        ("xbias_rows", ctypes.c_int64),
        ("inner_scale_rows", ctypes.c_int64),
        ("inner_bias_rows", ctypes.c_int64),
        ("epsilon", ctypes.c_float),
        ("scale_offset", ctypes.c_float),
        ("alpha", ctypes.c_float),
        ("gate", ctypes.c_void_p),
        ("activation", ctypes.c_int32),
        ("norm_before_gate", ctypes.c_int32),
    ]

    def __init__(self, **fields: Any):
        # the C++ struct's defaults where they are not zero
        defaults = {f"{w}_rows": 1 for w in ("scale", "bias", "xbias", "inner_scale", "inner_bias")}
        defaults.update(
            epsilon=catalogue.EPSILON.default,
            alpha=catalogue.ALPHA.default,
            activation=catalogue.ACTIVATION.default,
            norm_before_gate=catalogue.NORM_BEFORE_GATE.default,
        )
        super().__init__(**{**defaults, **fields})


class CudaQuantArgs(ctypes.Structure):
    """Mirror of onnxnorm::CudaQuantArgs (custom_ops/include/onnxnorm/cuda_launch.h): a quantized
    op's quantized Y and where its scale and zero point live (device pointers)."""

    _fields_ = [
        ("q_type", ctypes.c_int32),
        ("q", ctypes.c_void_p),
        ("y_scale", ctypes.c_void_p),
        ("y_zero_point", ctypes.c_void_p),
        ("scratch", ctypes.c_void_p),
    ]


def layout(args_type: type[ctypes.Structure] = NormArgs) -> dict[str, Any]:
    """The mirror's layout in the form of onnxnorm_args_layout: size and [name, offset, size]."""
    return {
        "size": ctypes.sizeof(args_type),
        "fields": [
            [name, getattr(args_type, name).offset, getattr(args_type, name).size]
            for name, *_ in args_type._fields_
        ],
    }


# ---------------------------------------------------------------------------------------------
# the CPU library


def library(path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """The CPU library (``onnxnorm.runtime.library_path()`` unless ``path``), its entry points
    for Python typed: onnxnorm_op_manifest, onnxnorm_args_layout and onnxnorm_active_isa return
    C strings (the first two JSON)."""
    from onnxnorm import runtime

    lib = ctypes.CDLL(str(path or runtime.library_path()))
    for name in ("onnxnorm_op_manifest", "onnxnorm_args_layout", "onnxnorm_active_isa"):
        getattr(lib, name).restype = ctypes.c_char_p
    return lib


def manifest(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The op table the library was built with (onnxnorm_op_manifest): domain, version, element
    types, and per op its id, inputs, outputs, attributes and type pairs per provider."""
    return json.loads(library(path).onnxnorm_op_manifest())


def args_layout(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The library's NormArgs layout (onnxnorm_args_layout), to compare with :func:`layout`."""
    return json.loads(library(path).onnxnorm_args_layout())


def active_isa(path: str | os.PathLike | None = None) -> str:
    """The instruction set of the library's CPU kernels on this machine: "avx512_bf16" (AVX-512
    with its bfloat16 conversion instruction), "avx512", "avx2" or "portable" (the library's
    onnxnorm_active_isa: the best the CPU has, unless ONNXNORM_CPU_ISA asks for a lesser one)."""
    return library(path).onnxnorm_active_isa().decode()


# ---------------------------------------------------------------------------------------------
# the CUDA library: its C launcher on torch CUDA tensors


def cuda_library_path() -> Path:
    """The CUDA library next to the CPU library (``onnxnorm.runtime.library_path("cuda")``)."""
    from onnxnorm import runtime

    return runtime.library_path("cuda")


def _torch():
    import torch

    return torch


def _type_code(dtype) -> int:
    torch = _torch()
    return ELEM_TYPES[
        {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    ]


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


def _raise(rc: int, buf) -> None:
    """The launcher's return code as Python's error: 1 bad arguments, else a CUDA error."""
    if rc == 1:
        raise ValueError(buf.value.decode())
    if rc != 0:
        raise RuntimeError(buf.value.decode())


class Kernels:
    """The C launchers of one loaded CUDA library."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else cuda_library_path()
        if not self.path.is_file():
            raise FileNotFoundError(f"the onnxnorm CUDA library is not built: {self.path}")
        lib = ctypes.CDLL(str(self.path))
        lib.onnxnorm_cuda_launch.argtypes = [
            ctypes.POINTER(NormArgs),
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        lib.onnxnorm_cuda_launch.restype = ctypes.c_int
        lib.onnxnorm_cuda_kernel_name.argtypes = [
            ctypes.POINTER(NormArgs),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        lib.onnxnorm_cuda_kernel_name.restype = ctypes.c_int
        if hasattr(lib, "onnxnorm_cuda_launch_quantized"):  # (libraries built before it: none)
            lib.onnxnorm_cuda_launch_quantized.argtypes = [
                ctypes.POINTER(NormArgs),
                ctypes.POINTER(CudaQuantArgs),
                ctypes.c_void_p,
                ctypes.c_char_p,
                ctypes.c_size_t,
            ]
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

    def args(
        self, op: str, inputs: dict[str, Any], y, sum_=None, axis: int = -1, **attrs: Any
    ) -> NormArgs:
        """Launcher arguments for catalogue op ``op`` on torch CUDA tensors ``inputs`` (by
        parameter name; absent ones left out), outputs ``y`` and ``sum_``. GatedRMSNorm's groups
        become rows as the ORT glue makes them (onnxnorm/norm_args.h): rows * (extent /
        group_size) rows of group_size values, a Scale of shape [group_size] shared by every
        group, one of the whole extent as extent / group_size weight rows."""
        spec = catalogue.get(op)
        a = reference.check_attributes(spec, attrs)
        x = inputs["X"]
        rank = x.dim()
        ax = axis % rank if rank else 0
        cols = 1
        for d in x.shape[ax:]:
            cols *= d
        rows = x.numel() // cols if cols else 0
        group = a.get("group_size", 0) or cols
        if cols and group != cols:
            if cols % group:
                raise ValueError(f"{op}: group_size {group} does not divide the extent {cols}")
            rows, cols = rows * (cols // group), group
        args = NormArgs()
        args.op = OP_IDS[op]
        args.x_type = _type_code(x.dtype)
        args.weight_type = args.x_type
        args.y_type = _type_code(y.dtype)
        args.cast_before_scale = int(a.get("cast_before_scale", 0))
        args.rows, args.cols = rows, cols
        if inputs.get("Gate") is not None:
            args.gate = inputs["Gate"].data_ptr()
        if spec.gated:
            args.activation = int(a["activation"])
            args.norm_before_gate = int(a["norm_before_gate"])
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
            # (a grouped op's Scale of the whole extent: a weight row per group)
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
        _raise(
            self.lib.onnxnorm_cuda_launch(
                ctypes.byref(args), ctypes.c_void_p(stream), buf, len(buf)
            ),
            buf,
        )

    def quant_scratch_bytes(self, args: NormArgs) -> int:
        """The device scratch a dynamic quantized op's call needs (0 for the others)."""
        return int(self.lib.onnxnorm_cuda_quant_scratch_bytes(ctypes.byref(args)))

    def launch_quantized(
        self, args: NormArgs, quant: CudaQuantArgs, stream: int | None = None
    ) -> None:
        """launch() for a quantized op (``args.y``: Y_float or 0, ``args.sum``: Sum or 0)."""
        if stream is None:
            stream = _torch().cuda.current_stream().cuda_stream
        buf = ctypes.create_string_buffer(512)
        _raise(
            self.lib.onnxnorm_cuda_launch_quantized(
                ctypes.byref(args), ctypes.byref(quant), ctypes.c_void_p(stream), buf, len(buf)
            ),
            buf,
        )

    def run(
        self,
        op: str,
        inputs: dict[str, Any],
        *,
        with_sum: bool = True,
        axis: int = -1,
        **attrs: Any,
    ):
        """Runs ``op`` and returns [Y] or [Y, Sum] as new torch tensors."""
        torch = _torch()
        x = inputs["X"]
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        s = (
            torch.empty(x.shape, dtype=x.dtype, device=x.device)
            if with_sum and catalogue.get(op).has_residual
            else None
        )
        self.launch(self.args(op, inputs, y, s, axis, **attrs))
        return [y] if s is None else [y, s]

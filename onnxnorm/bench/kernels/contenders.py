"""The contenders of ``onnxnorm bench kernels`` as calls to time: a model in an ONNX Runtime
session through IO binding (:func:`ort_runner`), the op in torch eager or as the graph
torch.onnx.export writes for it written out in torch ops (:func:`torch_fn`,
:func:`decomposed_model`), and a memory copy on as many threads as the kernels use."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

# torch's OpenMP threads spin after each call by default and would take the cores from the ORT
# contenders timed next; this must be set before torch starts its thread pool.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from onnxnorm.bench.kernels.cases import EPSILON, OP_SHAPES
from onnxnorm.bench.kernels.graphs import np_dtype, zero_point
from onnxnorm.ops import catalogue


def _torch_norm(norm: str, decomposed: bool):
    import torch
    import torch.nn.functional as F

    def layer(x, s, b):
        if not decomposed:
            return F.layer_norm(x, (x.shape[-1],), s, b, EPSILON)
        h = x.to(torch.float32)
        centred = h - h.mean(-1, keepdim=True)
        h = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + EPSILON)
        return h.to(x.dtype) * s + b

    def rms(x, s, b=None):
        if not decomposed:
            return F.rms_norm(x, (x.shape[-1],), s, EPSILON)
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPSILON)
        return s * h.to(x.dtype)

    return layer if norm == "layer" else rms


def _torch_gated(attrs: dict[str, Any]) -> Callable:
    """GatedRMSNorm as the models' torch code writes it (torch has no op for it, eager or not),
    over (X, Scale, Gate): Qwen3-Next's (the gate after the norm: each group of X upcast, RMS
    normalized, rounded to X's type and scaled, then times act(Gate) in float32 and rounded) or
    Mamba2's (X upcast times act(Gate) in float32, normalized in groups, rounded and scaled)."""
    import torch
    import torch.nn.functional as F

    epsilon = attrs.get("epsilon", EPSILON)
    group = attrs.get("group_size", 0)
    silu = attrs.get("activation", 0) == 0

    def act(g):
        g = g.to(torch.float32)
        return F.silu(g) if silu else torch.sigmoid(g)

    def normalize(h):  # float32, over groups of the last dimension
        shape = h.shape
        if group:
            h = h.reshape(*shape[:-1], shape[-1] // group, group)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + epsilon)
        return h.reshape(shape)

    def norm_then_gate(x, s, g):
        h = normalize(x.to(torch.float32)).to(x.dtype)
        if s.shape[-1] != x.shape[-1]:  # one group's Scale, shared by the groups
            h = h.reshape(*x.shape[:-1], x.shape[-1] // s.shape[-1], s.shape[-1])
        h = (s * h).reshape(x.shape)
        return (h * act(g)).to(x.dtype)

    def gate_then_norm(x, s, g):
        h = normalize(x.to(torch.float32) * act(g)).to(x.dtype)
        return s * h

    return norm_then_gate if attrs.get("norm_before_gate", 1) else gate_then_norm


def torch_l2(attrs: dict[str, Any]) -> Callable:
    """L2Norm as the gated delta-net's torch code writes it: x * rsqrt(sum(x^2) + eps) in float32
    (torch's F.normalize divides by max(norm, eps) instead)."""
    import torch

    epsilon = attrs.get("epsilon", EPSILON)

    def l2(x):
        h = x.to(torch.float32)
        return (h * torch.rsqrt((h * h).sum(-1, keepdim=True) + epsilon)).to(x.dtype)

    return l2


def torch_fn(op: str, decomposed: bool, attrs: dict[str, Any] | None = None) -> Callable:
    """The op in torch ops over the arrays of :func:`~.graphs.input_names`, returning
    (Y[, Sum]); ``attrs``: the node's (the ops of OP_SHAPES)."""
    spec = catalogue.get(op)
    if spec.gated:
        return _torch_gated(attrs or {})
    if spec.norm == "l2":
        return torch_l2(attrs or {})
    norm = _torch_norm(spec.norm, decomposed)
    layer = spec.norm == "layer"
    if spec.residual == "none":
        return (lambda x, s, b: norm(x, s, b)) if layer else (lambda x, s: norm(x, s))
    if spec.residual == "skip":

        def skip(x, r, s, b=None):
            total = x + r
            return norm(total, s, b), total

        return skip
    if layer:

        def sandwich_layer(x, r, s, b, si, bi):
            total = r + norm(x, si, bi)
            return norm(total, s, b), total

        return sandwich_layer

    def sandwich_rms(x, r, s, si):
        total = r + norm(x, si)
        return norm(total, s), total

    return sandwich_rms


def _torch_module(fn) -> Any:
    """A torch.nn.Module calling torch_fn (built lazily: torch is imported only when used)."""
    import torch

    class Wrapped(torch.nn.Module):
        def forward(self, *args):
            return fn(*args)

    return Wrapped()


#: the exported models by (op, dtype), and for the ops of OP_SHAPES by their shapes and
#: attributes too
_EXPORTS: dict[tuple[Any, ...], Any] = {}


def decomposed_model(
    op: str, dtype: str, arrays: dict[str, np.ndarray], attrs: dict[str, Any] | None = None
):
    """torch.onnx.export (dynamo) of the op written out in torch ops, dynamic in every dim (the
    ops of OP_SHAPES: for the shapes of ``arrays``, as their models export them)."""
    import torch

    key: tuple[Any, ...]
    if op in OP_SHAPES:
        key = (
            op,
            dtype,
            tuple(a.shape for a in arrays.values()),
            tuple(sorted((attrs or {}).items())),
        )
        if key not in _EXPORTS:
            module = _torch_module(torch_fn(op, decomposed=True, attrs=attrs)).eval()
            example = tuple(
                torch.from_numpy(np.ones(a.shape, np.float32)).to(getattr(torch, dtype))
                for a in arrays.values()
            )
            program = torch.onnx.export(
                module, example, dynamo=True, input_names=list(arrays), verbose=False
            )
            _EXPORTS[key] = program.model_proto
        return _EXPORTS[key]
    key = (op, dtype)
    if key not in _EXPORTS:
        names = list(arrays)
        rows = {n: arrays[n].ndim == 3 for n in names}  # X and Residual; the others are weights
        inputs = {
            n: torch.from_numpy(np.ones([2, 3, 8] if rows[n] else [8], np.float32)).to(
                getattr(torch, dtype)
            )
            for n in names
        }
        dims = [torch.export.Dim("b"), torch.export.Dim("s"), torch.export.Dim("d")]
        dynamic = tuple(
            {0: dims[0], 1: dims[1], 2: dims[2]} if rows[n] else {0: dims[2]} for n in names
        )
        module = _torch_module(torch_fn(op, decomposed=True))
        program = torch.onnx.export(
            module,
            tuple(inputs[n] for n in names),
            dynamo=True,
            dynamic_shapes=(dynamic,),
            input_names=names,
            verbose=False,
        )
        _EXPORTS[key] = program.model_proto
    return _EXPORTS[key]


def ortvalue(array: np.ndarray):
    """``array`` as an OrtValue; bfloat16 and float8 e4m3fn (ml_dtypes') by their bits."""
    import ml_dtypes
    import onnx
    import onnxruntime as ort

    if array.dtype == np_dtype("bfloat16"):
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            array.view(np.uint16), onnx.TensorProto.BFLOAT16
        )
    if array.dtype == np.dtype(ml_dtypes.float8_e4m3fn):  # (ORT takes its bits as uint8)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            array.view(np.uint8), onnx.TensorProto.FLOAT8E4M3FN
        )
    return ort.OrtValue.ortvalue_from_numpy(array)


def ort_runner(
    model,
    arrays: dict[str, np.ndarray],
    threads: int,
    with_library: bool,
    keep: list,
    output_shape: tuple[int, ...] | None = None,
    library: str | None = None,
    output_shapes: dict[str, tuple[int, ...]] | None = None,
) -> Callable[[], None]:
    """A call of the model through IO binding (inputs and outputs preallocated, so no call
    allocates or copies; ``keep`` holds them and the session alive); with_library registers the
    onnxnorm library, ``library`` (a path) another build of it instead. The outputs are of the
    first array's type and shape, or ``output_shape``, or by their name ``output_shapes``'."""
    import onnxruntime as ort

    from onnxnorm import runtime

    options = ort.SessionOptions()
    if library is not None:
        options.register_custom_ops_library(library)
        with_library = False
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Contenders run interleaved: a pool left spinning after its call would steal a core from
    # the next contender on a small machine, so no session spins (all alike).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    sess = runtime.session(model, options, with_library=with_library)
    binding = sess.io_binding()
    input_names = {i.name for i in sess.get_inputs()}
    x = next(iter(arrays.values()))
    for name, array in arrays.items():
        if name in input_names:
            value = ortvalue(array)
            keep.append(value)
            binding.bind_ortvalue_input(name, value)
    for out in sess.get_outputs():
        shape, dtype = (output_shapes or {}).get(out.name, output_shape or x.shape), x.dtype
        if out.name in ("ys_out", "yz_out"):  # DynamicQuantizeLinear's scalars
            shape, dtype = (), np.dtype(np.float32 if out.name == "ys_out" else np.uint8)
        elif out.type in ("tensor(int8)", "tensor(uint8)", "tensor(float8e4m3fn)"):
            dtype = zero_point(out.type[len("tensor(") : -1]).dtype
        value = ortvalue(np.empty(shape, dtype))
        keep.append(value)
        binding.bind_ortvalue_output(out.name, value)
    keep.append(sess)

    def call():
        sess.run_with_iobinding(binding)

    call()
    return call


def threaded_copy(
    pool: ThreadPoolExecutor, threads: int, source: np.ndarray, target: np.ndarray
) -> Callable[[], None]:
    """A copy of ``source`` into ``target`` in ``threads`` slices (64-byte multiples) at once: the
    calling thread copies the last one, ``pool``'s ``threads - 1`` workers the others."""
    step = -(-source.nbytes // threads // 64) * 64
    bounds = [(i, min(i + step, source.nbytes)) for i in range(0, source.nbytes, step)]
    head, last = bounds[:-1], bounds[-1]

    def call() -> None:
        futures = [pool.submit(np.copyto, target[a:b], source[a:b]) for a, b in head]
        np.copyto(target[last[0] : last[1]], source[last[0] : last[1]])
        for f in futures:
            f.result()

    return call

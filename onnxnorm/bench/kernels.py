"""``onnxnorm bench kernels``: the CPU kernels against everything else that computes the same math.

For each op, shape and dtype, in one process and with interleaved repetitions (each repetition
times every contender once, in a rotating order, so that a noisy neighbour hurts all of them
alike; each timed sample follows ``--warmup`` seconds of the same contender, untimed, so that it
sees the steady state of a loop of calls, not the slow first milliseconds after another
contender), the median time per call of:

- ``onnxnorm``: the onnxnorm node in ONNX Runtime with the library (weights of X's type; the
  residual ops also write Sum, as a Pre-Norm block needs);
- ``ort:<op>``: ONNX Runtime's built-in op(s) for the same math: LayerNormalization (opset 17),
  RMSNormalization (opset 23), SimplifiedLayerNormalization, com.microsoft SkipLayerNormalization
  and SkipSimplifiedLayerNormalization (the Sandwich ops: a norm followed by a Skip norm);
- ``decomposed``: the graph torch.onnx.export (dynamo) writes for the norm written out in torch
  ops, Hugging Face style (upcast to float32, pow/mean/rsqrt), run by ONNX Runtime with its
  default graph optimizations (which may fuse parts of it back);
- ``torch``: torch eager (F.layer_norm / F.rms_norm, plus the residual add);
- ``floor``: ONNX Runtime running one node that only copies the same bytes (Identity of X; for
  the residual ops Concat of X and Residual, which reads both and writes as much as Y and Sum):
  ORT's own cost of a call, the least any node of the same size can take;
- ``copy``: a memory copy of the same bytes (X [and Residual] read, Y [and Sum] written into
  preallocated memory): the faster of ``numpy.copyto`` on one thread (glibc memcpy) and the same
  split into ``--threads`` equal slices copied at once on as many threads (numpy lets go of the
  GIL while it copies), as the kernels split their rows: the memory-bandwidth bound. (A copy on
  one thread is not that bound: on a 2-core machine it moves 16 MiB at less than half the rate of
  two.)

The quantized ops' target is a speed-up instead: on the large shapes at least QUANT_SPEEDUP times
as fast as ORT's fastest norm followed by its quantizer, elsewhere no slower.

The quantized ops (a norm followed by QuantizeLinear or DynamicQuantizeLinear, Y_scale 0.02 and
an int8 zero point for the static ones, or the zero point of ``--quant-type``: uint8, int8 or
float8e4m3fn) run against ORT's built-in norm followed by ORT's QuantizeLinear to the same type
(opset 21, which takes X's type; and after Casts of the norm's output and the scale to float32,
for float16 / bfloat16: ORT's CPU QuantizeLinear has no bfloat16 kernel, for float8 as for the
integers) or DynamicQuantizeLinear (after a Cast to float32 for float16 / bfloat16: it takes
float32 only); they have no decomposed or torch contender.

ONNX Runtime sessions use ``--threads`` intra-op threads and IO binding with preallocated inputs
and outputs, so no call allocates or copies. The Q/K-norm shape (1, 512, 32, 128) normalized over
128 is run as (1, 16384, 128) for every contender (the same bytes and math; ORT's Skip ops want
rank 3).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

# torch's OpenMP threads spin after each call by default and would take the cores from the ORT
# contenders timed next; this must be set before torch starts its thread pool.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from onnxnorm.ops import catalogue

SHAPES: dict[str, tuple[int, ...]] = {
    "1x1x4096": (1, 1, 4096),
    "1x128x4096": (1, 128, 4096),
    "4x512x4096": (4, 512, 4096),
    "1x2048x8192": (1, 2048, 8192),
    "qk-1x512x32x128": (1, 512, 32, 128),
}
# The targets (docs/benchmarks.md), each held by the median times and by the best-of times:
# - every row: onnxnorm no slower than ORT's fastest built-in op for the same math;
# - the large shapes: onnxnorm at BANDWIDTH_FRACTION of the copy bandwidth or more;
# - single-token rows, where a call is almost all per-call overhead: onnxnorm within FLOOR_FACTOR
#   of ORT's floor (one node that only copies the same bytes).
BANDWIDTH_SHAPES = ("4x512x4096", "1x2048x8192")
BANDWIDTH_FRACTION = 0.90
SINGLE_TOKEN_SHAPES = ("1x1x4096",)
FLOOR_FACTOR = 1.2
# The quantized ops' target instead: on the large shapes at least QUANT_SPEEDUP times as fast as
# ORT's fastest norm followed by its quantizer (elsewhere no slower).
QUANT_SPEEDUP = 1.5
DTYPES = ("float32", "float16", "bfloat16")
EPSILON = 1e-5

# op -> [(label, builder)] of ORT's own ops for the same math
_ORT_BUILTINS = {
    "LayerNorm": ["LayerNormalization-17"],
    "RMSNorm": ["RMSNormalization-23", "SimplifiedLayerNormalization"],
    "SkipLayerNorm": ["SkipLayerNormalization"],
    "SkipRMSNorm": ["SkipSimplifiedLayerNormalization"],
    "SandwichLayerNorm": ["LayerNormalization+SkipLayerNormalization"],
    "SandwichRMSNorm": ["SimplifiedLayerNormalization+SkipSimplifiedLayerNormalization"],
}
# the quantized ops: each built-in of their norm followed by ORT's quantizer
_QUANTIZERS = {"static": "QuantizeLinear", "dynamic": "DynamicQuantizeLinear"}
for _name, _spec in catalogue.QUANTIZED_OPS.items():
    _ORT_BUILTINS[_name] = [f"{label}+{_QUANTIZERS[_spec.quantize]}"
                            for label in _ORT_BUILTINS[_spec.norm_op]]
    if _spec.quantize == "static":  # ORT's CPU QuantizeLinear has no bfloat16 kernel: cast first
        _ORT_BUILTINS[_name] += [f"{label}+Cast+QuantizeLinear" for label in _ORT_BUILTINS[_spec.norm_op]]
Y_SCALE = 0.02
Y_ZERO_POINT = -3
#: the static quantized ops' Y type (``--quant-type``) -> their zero point; int8 by default. A
#: float8 zero point's value is not used (it gives Y's type only).
QUANT_ZERO_POINTS = {"uint8": 125, "int8": Y_ZERO_POINT, "float8e4m3fn": 0.0}
QUANT_TYPE = "int8"


@dataclasses.dataclass
class Result:
    op: str
    shape: str
    dtype: str
    #: contender -> median seconds per call (None: not supported for this dtype)
    times: dict[str, float | None]
    notes: dict[str, str]
    #: contender -> fastest repetition's seconds per call (less sensitive to a busy machine)
    best: dict[str, float | None] = dataclasses.field(default_factory=dict)
    #: the static quantized ops' Y type (a key of QUANT_ZERO_POINTS); None for the other ops
    quant_type: str | None = None

    @property
    def onnxnorm(self) -> float | None:
        return self.times.get("onnxnorm")

    def best_ort(self, times: dict[str, float | None] | None = None) -> tuple[str | None, float | None]:
        times = self.times if times is None else times
        found = [(t, k) for k, t in times.items() if k.startswith("ort:") and t is not None]
        if not found:
            return None, None
        t, k = min(found)
        return k, t

    def targets(self, times: dict[str, float | None] | None = None) -> list[str]:
        """Misses of the kernel targets (docs/benchmarks.md) by the median (or the given) times; empty: all met."""
        times = self.times if times is None else times
        misses = []
        mine = times.get("onnxnorm")
        if mine is None:
            return ["no onnxnorm time"]
        name, best = self.best_ort(times)
        if catalogue.get(self.op).quantize != "none":
            if best is not None and self.shape in BANDWIDTH_SHAPES and best / mine < QUANT_SPEEDUP:
                misses.append(f"{best / mine:.2f}x as fast as {name[4:]} < {QUANT_SPEEDUP}x")
            elif best is not None and mine > best:
                misses.append(f"slower than {name[4:]} ({mine / best:.2f}x)")
            return misses
        if best is not None and mine > best:
            misses.append(f"slower than {name[4:]} ({mine / best:.2f}x)")
        copy = times.get("copy")
        if self.shape in BANDWIDTH_SHAPES and copy is not None and copy / mine < BANDWIDTH_FRACTION:
            misses.append(f"{100 * copy / mine:.0f}% of copy bandwidth < {100 * BANDWIDTH_FRACTION:.0f}%")
        floor = times.get("floor")
        if self.shape in SINGLE_TOKEN_SHAPES and floor is not None and mine > FLOOR_FACTOR * floor:
            misses.append(f"{mine / floor:.2f}x ORT's floor > {FLOOR_FACTOR}x")
        return misses

    def verdict(self) -> str:
        """"met", or the misses by the median times and by the best-of times."""
        by_median = self.targets()
        by_best = self.targets(self.best) if self.best else by_median
        if not by_median and not by_best:
            return "met"
        def kind(miss: str) -> str:
            if miss.startswith("slower"):
                return "slower"
            return "bandwidth" if "bandwidth" in miss else "speed-up" if " as fast as " in miss else miss

        parts = []
        if by_median:
            parts.append("MISSED: " + "; ".join(by_median))
        only_best = [m for m in by_best if kind(m) not in {kind(n) for n in by_median}]
        if only_best:
            parts.append("MISSED by best-of: " + "; ".join(only_best))
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        name, best = self.best_ort()
        mine = self.onnxnorm
        copy = self.times.get("copy")
        floor = self.times.get("floor")
        return {
            "op": self.op, "shape": self.shape, "dtype": self.dtype, "quant_type": self.quant_type,
            "median_seconds": self.times, "best_seconds": self.best, "notes": self.notes,
            "best_ort": name, "ratio_to_best_ort": (mine / best) if mine and best else None,
            "ratio_to_ort_floor": (mine / floor) if mine and floor else None,
            "fraction_of_copy_bandwidth": (copy / mine) if mine and copy else None,
            "target_misses": self.targets(),
            "target_misses_by_best_times": self.targets(self.best) if self.best else None,
        }


# --------------------------------------------------------------------------------------------
# models


def _onnx_type(dtype: str) -> int:
    import onnx

    return {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
            "bfloat16": onnx.TensorProto.BFLOAT16}[dtype]


def _np_dtype(dtype: str) -> np.dtype:
    import ml_dtypes

    return np.dtype({"float32": np.float32, "float16": np.float16,
                     "bfloat16": ml_dtypes.bfloat16}[dtype])


def _quant_onnx_type(quant_type: str) -> int:
    """"int8" -> TensorProto.INT8 (a key of QUANT_ZERO_POINTS)."""
    import onnx

    from onnxnorm.bench.cuda import QUANT_NP_TYPES

    return onnx.helper.np_dtype_to_tensor_dtype(QUANT_NP_TYPES[quant_type])


def _zero_point(quant_type: str) -> np.ndarray:
    """The static ops' zero point for Y of type ``quant_type`` (a numpy scalar array)."""
    from onnxnorm.bench.cuda import QUANT_NP_TYPES

    return np.array(QUANT_ZERO_POINTS[quant_type], QUANT_NP_TYPES[quant_type])


def _model(nodes, inputs: dict[str, tuple], outputs: list[str], dtype: str, opsets: dict[str, int]):
    import onnx
    from onnx import helper

    t = _onnx_type(dtype)
    graph = helper.make_graph(
        nodes, "bench",
        [helper.make_tensor_value_info(name, t, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, t, None) for name in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = min(model.ir_version, 10)
    return model


def _weights(op: str) -> dict[str, str]:
    """The onnxnorm inputs the benchmark feeds, mapped to array names."""
    spec = catalogue.get(op)
    names = {"X": "x"}
    if spec.quantize == "static":
        names.update(Y_scale="ys", Y_zero_point="yz")
    if spec.has_residual:
        names["Residual"] = "r"
    names["Scale"] = "s"
    if spec.norm == "layer":
        names["Bias"] = "b"
    if spec.residual == "sandwich":
        names["InnerScale"] = "si"
        if spec.norm == "layer":
            names["InnerBias"] = "bi"
    return names


def _outputs(op: str) -> list[str]:
    """The outputs the benchmark asks of an op (and of the ORT graphs for the same math)."""
    spec = catalogue.get(op)
    outputs = ["y", "ys_out", "yz_out"] if spec.quantize == "dynamic" else ["y"]
    return outputs + (["sum"] if spec.has_residual else [])


def _quantized_types(model, quantize: str, quant_type: str = QUANT_TYPE) -> None:
    """Sets the types and shapes of the quantized outputs (and of Y_scale and Y_zero_point) in
    ``model``'s graph; ``quantize``: catalogue.QUANTIZE_KINDS; ``quant_type``: the static Y's
    type (the dynamic one's is uint8)."""
    import onnx

    if quantize == "none":
        return
    q_type = _quant_onnx_type(quant_type) if quantize == "static" else onnx.TensorProto.UINT8
    for out in model.graph.output:
        t = out.type.tensor_type
        if out.name == "y":
            t.elem_type = q_type
        elif out.name in ("ys_out", "yz_out"):
            t.elem_type = onnx.TensorProto.FLOAT if out.name == "ys_out" else q_type
            t.shape.Clear()
            t.shape.SetInParent()
    for inp in model.graph.input:
        if inp.name in ("ys", "yz"):
            inp.type.tensor_type.shape.Clear()
            inp.type.tensor_type.shape.SetInParent()
            if inp.name == "yz":
                inp.type.tensor_type.elem_type = q_type


def _onnxnorm_model(op: str, dtype: str, x_shape, d: int, quant_type: str = QUANT_TYPE):
    from onnx import helper

    spec = catalogue.get(op)
    names = _weights(op)
    inputs = [names.get(p.name, "") for p in spec.inputs]
    while inputs and not inputs[-1]:
        inputs.pop()
    outputs = _outputs(op)
    node_outputs = outputs if spec.quantize == "none" or not spec.has_residual else (
        outputs[:-1] + ["sum"])
    node = helper.make_node(op, inputs, node_outputs, domain=catalogue.DOMAIN, epsilon=EPSILON)
    shapes = {n: (x_shape if n in ("x", "r") else (d,)) for n in names.values()}
    model = _model([node], shapes, outputs, dtype, {"": 18, catalogue.DOMAIN: catalogue.VERSION})
    _quantized_types(model, spec.quantize, quant_type)
    return model


def _ort_quantized_model(label: str, dtype: str, x_shape, d: int, quant_type: str = QUANT_TYPE):
    """ORT's built-in norm ``label`` (before the "+") followed by its quantizer (QuantizeLinear:
    to ``quant_type``, float8 included, which ORT's CPU kernel takes from opset 19 on, from
    float32 and float16)."""
    import onnx
    from onnx import helper

    norm_label, quantizer = label.rsplit("+", 1)
    cast = norm_label.endswith("+Cast")
    if cast:
        if dtype == "float32":
            raise ValueError("float32 needs no Cast before QuantizeLinear")
        norm_label = norm_label[:-len("+Cast")]
    model = _ort_builtin_model(norm_label, dtype, x_shape, d)
    graph = model.graph
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name == "y":
                node.output[i] = "y_float"
    y = "y_float"
    if quantizer == "DynamicQuantizeLinear":
        if dtype != "float32":
            graph.node.append(helper.make_node("Cast", [y], ["y_float32"], to=onnx.TensorProto.FLOAT))
            y = "y_float32"
        graph.node.append(helper.make_node("DynamicQuantizeLinear", [y], ["y", "ys_out", "yz_out"]))
    else:
        scale = "ys"
        if cast:  # the norm's output and the scale in float32 (QuantizeLinear divides in float32)
            graph.node.extend([
                helper.make_node("Cast", [y], ["y_float32"], to=onnx.TensorProto.FLOAT),
                helper.make_node("Cast", ["ys"], ["ys_float32"], to=onnx.TensorProto.FLOAT)])
            y, scale = "y_float32", "ys_float32"
        graph.node.append(helper.make_node("QuantizeLinear", [y, scale, "yz"], ["y"]))
        graph.input.extend([helper.make_tensor_value_info("ys", _onnx_type(dtype), []),
                            helper.make_tensor_value_info("yz", _quant_onnx_type(quant_type), [])])
        for imp in model.opset_import:
            if imp.domain == "":
                imp.version = max(imp.version, 21)
    outputs = {o.name: o for o in graph.output}
    names = ["y"] + (["ys_out", "yz_out"] if quantizer == "DynamicQuantizeLinear" else []) + (
        ["sum"] if "sum" in outputs else [])
    del graph.output[:]
    graph.output.extend(helper.make_tensor_value_info(n, _onnx_type(dtype), None) for n in names)
    _quantized_types(model, "dynamic" if quantizer == "DynamicQuantizeLinear" else "static",
                     quant_type)
    return model


def _ort_builtin_model(label: str, dtype: str, x_shape, d: int, quant_type: str = QUANT_TYPE):
    from onnx import helper

    if label.endswith(("+QuantizeLinear", "+DynamicQuantizeLinear")):
        return _ort_quantized_model(label, dtype, x_shape, d, quant_type)
    ms = "com.microsoft"
    xs = {"x": x_shape}
    w = {"s": (d,)}
    wb = {"s": (d,), "b": (d,)}
    if label == "LayerNormalization-17":
        node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=EPSILON)
        return _model([node], {**xs, **wb}, ["y"], dtype, {"": 17})
    if label == "RMSNormalization-23":
        node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=-1, epsilon=EPSILON)
        return _model([node], {**xs, **w}, ["y"], dtype, {"": 23})
    if label == "SimplifiedLayerNormalization":
        node = helper.make_node("SimplifiedLayerNormalization", ["x", "s"], ["y"], axis=-1, epsilon=EPSILON)
        return _model([node], {**xs, **w}, ["y"], dtype, {"": 17})
    rs = {"r": x_shape}
    if label == "SkipLayerNormalization":
        node = helper.make_node("SkipLayerNormalization", ["x", "r", "s", "b"], ["y", "", "", "sum"],
                                domain=ms, epsilon=EPSILON)
        return _model([node], {**xs, **rs, **wb}, ["y", "sum"], dtype, {"": 17, ms: 1})
    if label == "SkipSimplifiedLayerNormalization":
        node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "r", "s"], ["y", "", "", "sum"],
                                domain=ms, epsilon=EPSILON)
        return _model([node], {**xs, **rs, **w}, ["y", "sum"], dtype, {"": 17, ms: 1})
    if label == "LayerNormalization+SkipLayerNormalization":
        nodes = [helper.make_node("LayerNormalization", ["x", "si", "bi"], ["inner"], axis=-1, epsilon=EPSILON),
                 helper.make_node("SkipLayerNormalization", ["inner", "r", "s", "b"], ["y", "", "", "sum"],
                                  domain=ms, epsilon=EPSILON)]
        return _model(nodes, {**xs, **rs, **wb, "si": (d,), "bi": (d,)}, ["y", "sum"], dtype, {"": 17, ms: 1})
    if label == "SimplifiedLayerNormalization+SkipSimplifiedLayerNormalization":
        nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "si"], ["inner"], axis=-1,
                                  epsilon=EPSILON),
                 helper.make_node("SkipSimplifiedLayerNormalization", ["inner", "r", "s"], ["y", "", "", "sum"],
                                  domain=ms, epsilon=EPSILON)]
        return _model(nodes, {**xs, **rs, **w, "si": (d,)}, ["y", "sum"], dtype, {"": 17, ms: 1})
    raise KeyError(label)


def _ort_floor_model(op: str, dtype: str, x_shape):
    """One ONNX Runtime node that only moves the bytes of the op: Identity of X (read X, write Y);
    for the residual ops Concat of X and Residual (read both, write as much as Y and Sum)."""
    from onnx import helper

    if not catalogue.get(op).has_residual:
        return _model([helper.make_node("Identity", ["x"], ["y"])], {"x": x_shape}, ["y"], dtype, {"": 17})
    node = helper.make_node("Concat", ["x", "r"], ["y"], axis=0)
    return _model([node], {"x": x_shape, "r": x_shape}, ["y"], dtype, {"": 17})


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


def _torch_fn(op: str, decomposed: bool) -> Callable:
    """The op in torch ops over the arrays named by _weights(op), returning (Y[, Sum])."""
    spec = catalogue.get(op)
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


class _TorchModule:
    """A torch.nn.Module calling _torch_fn (built lazily: torch is imported only when used)."""

    def __new__(cls, fn):
        import torch

        class Wrapped(torch.nn.Module):
            def forward(self, *args):
                return fn(*args)
        return Wrapped()


_EXPORTS: dict[tuple[str, str], Any] = {}


def _decomposed_model(op: str, dtype: str, arrays: dict[str, np.ndarray]):
    """torch.onnx.export (dynamo) of the op written out in torch ops, dynamic in every dim."""
    import torch

    key = (op, dtype)
    if key not in _EXPORTS:
        names = list(arrays)
        example = {n: torch.from_numpy(np.ones([2, 3, 8] if arrays[n].ndim == 3 else [8], np.float32))
                   .to(getattr(torch, dtype)) for n in names}
        dims = [torch.export.Dim("b"), torch.export.Dim("s"), torch.export.Dim("d")]
        dynamic = tuple({0: dims[0], 1: dims[1], 2: dims[2]} if arrays[n].ndim == 3 else {0: dims[2]}
                        for n in names)
        module = _TorchModule(_torch_fn(op, decomposed=True))
        program = torch.onnx.export(module, tuple(example[n] for n in names), dynamo=True,
                                    dynamic_shapes=(dynamic,), input_names=names, verbose=False)
        _EXPORTS[key] = program.model_proto
    return _EXPORTS[key]


# --------------------------------------------------------------------------------------------
# runners


def _ortvalue(array: np.ndarray):
    import ml_dtypes
    import onnx
    import onnxruntime as ort

    if array.dtype == _np_dtype("bfloat16"):
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), onnx.TensorProto.BFLOAT16)
    if array.dtype == np.dtype(ml_dtypes.float8_e4m3fn):  # (ORT takes its bits as uint8)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint8),
                                                               onnx.TensorProto.FLOAT8E4M3FN)
    return ort.OrtValue.ortvalue_from_numpy(array)


def _ort_runner(model, arrays: dict[str, np.ndarray], threads: int, with_library: bool,
                keep: list, output_shape: tuple[int, ...] | None = None, library: str | None = None
                ) -> Callable[[], None]:
    """A call of the model through IO binding; with_library registers the onnxnorm library,
    `library` (a path) another build of it instead."""
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
            value = _ortvalue(array)
            keep.append(value)
            binding.bind_ortvalue_input(name, value)
    for out in sess.get_outputs():
        shape, dtype = output_shape or x.shape, x.dtype
        if out.name in ("ys_out", "yz_out"):  # DynamicQuantizeLinear's scalars
            shape, dtype = (), np.dtype(np.float32 if out.name == "ys_out" else np.uint8)
        elif out.type in ("tensor(int8)", "tensor(uint8)", "tensor(float8e4m3fn)"):
            dtype = _zero_point(out.type[len("tensor("):-1]).dtype
        value = _ortvalue(np.empty(shape, dtype))
        keep.append(value)
        binding.bind_ortvalue_output(out.name, value)
    keep.append(sess)

    def call():
        sess.run_with_iobinding(binding)
    call()
    return call


def _threaded_copy(pool: ThreadPoolExecutor, threads: int, source: np.ndarray, target: np.ndarray
                   ) -> Callable[[], None]:
    """A copy of ``source`` into ``target`` in ``threads`` slices (64-byte multiples) at once: the
    calling thread copies the last one, ``pool``'s ``threads - 1`` workers the others."""
    step = -(-source.nbytes // threads // 64) * 64
    bounds = [(i, min(i + step, source.nbytes)) for i in range(0, source.nbytes, step)]
    head, last = bounds[:-1], bounds[-1]

    def call() -> None:
        futures = [pool.submit(np.copyto, target[a:b], source[a:b]) for a, b in head]
        np.copyto(target[last[0]:last[1]], source[last[0]:last[1]])
        for f in futures:
            f.result()
    return call


def _time_interleaved(fns: dict[str, Callable[[], None]], repeats: int, min_sample: float, warmup: float = 0.0
                      ) -> tuple[dict[str, float], dict[str, float]]:
    """(median, minimum) seconds per call of each function over interleaved repetitions. Each timed
    sample follows `warmup` seconds (at least one call) of the same function, untimed: the first
    milliseconds of memory traffic after another contender ran, or after a pause, run slower
    (docs/benchmarks.md), and a sample should see the state a loop of calls keeps."""
    numbers = {}
    for name, fn in fns.items():
        start = time.perf_counter()
        fn()
        once = time.perf_counter() - start
        numbers[name] = max(1, min(10000, int(math.ceil(min_sample / max(once, 1e-7)))))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            fn, number = fns[name], numbers[name]
            start = time.perf_counter()
            fn()
            while time.perf_counter() - start < warmup:
                fn()
            start = time.perf_counter()
            for _ in range(number):
                fn()
            samples[name].append((time.perf_counter() - start) / number)
    return ({name: statistics.median(values) for name, values in samples.items()},
            {name: min(values) for name, values in samples.items()})


def bench_case(op: str, shape_name: str, dtype: str, threads: int, repeats: int, min_sample: float,
               rng: np.random.Generator, log: Callable[[str], None] = lambda s: None,
               warmup: float = 0.01, compare: dict[str, str] | None = None,
               quant_type: str = QUANT_TYPE) -> Result:
    """One row: ``op`` on ``shape_name`` in ``dtype`` (a static quantized op quantizing to
    ``quant_type``), every contender timed."""
    import torch

    shape = SHAPES[shape_name]
    if len(shape) == 4:  # Q/K-norm: [batch, seq, heads, head_dim] -> [batch, seq * heads, head_dim]
        shape = (shape[0], shape[1] * shape[2], shape[3])
    d = shape[-1]
    np_type = _np_dtype(dtype)
    arrays = {}
    for name in _weights(op).values():
        if name == "ys":
            arrays[name] = np.array(Y_SCALE, np_type)
        elif name == "yz":
            arrays[name] = _zero_point(quant_type)
        elif name in ("x", "r"):
            arrays[name] = rng.standard_normal(shape, np.float32).astype(np_type)
        else:
            base = 1.0 if name.startswith("s") else 0.0
            arrays[name] = (base + 0.1 * rng.standard_normal(d, np.float32)).astype(np_type)

    keep: list = []
    fns: dict[str, Callable[[], None]] = {}
    times: dict[str, float | None] = {}
    notes: dict[str, str] = {}

    def add(name, make):
        try:
            fns[name] = make()
        except Exception as error:  # the competitor lacks this dtype (or op): say so
            times[name] = None
            notes[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
            log(f"  {name}: n/a ({notes[name]})")

    add("onnxnorm", lambda: _ort_runner(_onnxnorm_model(op, dtype, shape, d, quant_type), arrays, threads, True,
                                        keep))
    for name, path in (compare or {}).items():  # other builds of the library, for before/after
        add(f"onnxnorm@{name}", lambda path=path: _ort_runner(_onnxnorm_model(op, dtype, shape, d, quant_type), arrays,
                                                              threads, False, keep, library=path))
    for label in _ORT_BUILTINS[op]:
        add("ort:" + label, lambda label=label: _ort_runner(_ort_builtin_model(label, dtype, shape, d, quant_type),
                                                            arrays, threads, False, keep))
    quantized = catalogue.get(op).quantize != "none"
    if not quantized:
        add("decomposed", lambda: _ort_runner(_decomposed_model(op, dtype, arrays), arrays, threads, False,
                                              keep))
    floor_shape = (2 * shape[0], *shape[1:]) if catalogue.get(op).has_residual else shape
    add("floor", lambda: _ort_runner(_ort_floor_model(op, dtype, shape), arrays, threads, False, keep,
                                     output_shape=floor_shape))

    torch.set_num_threads(threads)
    tensors = [torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16) if a.dtype == _np_dtype("bfloat16")
               else torch.from_numpy(a) for a in arrays.values()] if not quantized else []
    eager = _torch_fn(op, decomposed=False)

    def make_torch():
        with torch.inference_mode():
            eager(*tensors)

        def call():
            with torch.inference_mode():
                eager(*tensors)
        return call
    if not quantized:
        add("torch", make_torch)

    copies = 2 if catalogue.get(op).has_residual else 1
    nbytes = copies * arrays["x"].nbytes
    source = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)
    fns["copy:numpy"] = lambda: np.copyto(target, source)
    pool = ThreadPoolExecutor(threads - 1) if threads > 1 else None
    if pool is not None:
        fns["copy:threads"] = _threaded_copy(pool, threads, source, target)

    try:
        medians, best = _time_interleaved(fns, repeats, min_sample, warmup)
    finally:
        if pool is not None:
            pool.shutdown()
    times.update(medians)
    best = {**{k: None for k in times}, **best}
    for t in (times, best):
        t["copy"] = min(v for k, v in t.items() if k.startswith("copy:") and v is not None)
    del keep
    static = catalogue.get(op).quantize == "static"
    return Result(op, shape_name, dtype, times, notes, best, quant_type if static else None)


# --------------------------------------------------------------------------------------------
# report


def _us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:,.1f}"


def _dtype_cell(r: Result) -> str:
    """X's type, and for the static quantized ops Y's: "float16 -> float8e4m3fn"."""
    return f"{r.dtype} -> {r.quant_type}" if r.quant_type else r.dtype


def markdown_table(results: list[Result]) -> str:
    head = ("| op | shape | dtype | onnxnorm µs | fastest ORT built-in | ORT µs | onnxnorm / ORT | "
            "(best-of) | ORT floor µs | onnxnorm / floor | decomposed µs | torch µs | copy µs | "
            "% of copy bandwidth | targets |")
    lines = [head, "|" + "|".join(["---"] * 15) + "|"]
    for r in results:
        name, best = r.best_ort()
        mine = r.onnxnorm
        copy = r.times.get("copy")
        floor = r.times.get("floor")
        ratio = f"{mine / best:.2f}x" if mine and best else "n/a"
        bw = f"{100 * copy / mine:.0f}%" if mine and copy else "n/a"
        to_floor = f"{mine / floor:.2f}x" if mine and floor else "n/a"
        _, best_ort = r.best_ort(r.best)
        mine_best = r.best.get("onnxnorm")
        ratio_best = f"{mine_best / best_ort:.2f}x" if mine_best and best_ort else "n/a"
        lines.append(f"| {r.op} | {r.shape} | {_dtype_cell(r)} | {_us(mine)} | {name[4:] if name else 'none'} | "
                     f"{_us(best)} | {ratio} | {ratio_best} | {_us(floor)} | {to_floor} | "
                     f"{_us(r.times.get('decomposed'))} | {_us(r.times.get('torch'))} | {_us(copy)} | {bw} | "
                     f"{r.verdict()} |")
    return "\n".join(lines)


def comparison_table(results: list[Result], names: list[str]) -> str:
    """onnxnorm against other builds of the library (--compare-library) in the same run: median
    times, and the ratios to ORT's fastest built-in and to the copy bound."""
    head = "| op | shape | dtype | " + " | ".join(
        f"{n} µs | {n} / ORT | {n} % of copy" for n in [*names, "this build"]) + " |"
    lines = [head, "|" + "|".join(["---"] * (3 + 3 * (len(names) + 1))) + "|"]
    for r in results:
        _, best = r.best_ort()
        copy = r.times.get("copy")
        cells = []
        for key in [*(f"onnxnorm@{n}" for n in names), "onnxnorm"]:
            t = r.times.get(key)
            cells += [_us(t), f"{t / best:.2f}x" if t and best else "n/a",
                      f"{100 * copy / t:.0f}%" if t and copy else "n/a"]
        lines.append(f"| {r.op} | {r.shape} | {_dtype_cell(r)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[Result], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in catalogue.OPS if any(r.op == op for r in results)]
    contenders = ["best ORT built-in", "decomposed", "torch", "floor", "copy"]
    colors = {"best ORT built-in": "#d62728", "decomposed": "#9467bd", "torch": "#ff7f0e", "floor": "#1f77b4",
              "copy": "#7f7f7f"}
    fig, axes = plt.subplots(len(ops), 1, figsize=(14, 3.2 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        rows = [r for r in results if r.op == op]
        short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
        labels = [f"{'Q/K-norm' if r.shape.startswith('qk') else r.shape}\n{short.get(r.dtype, r.dtype)}"
                  for r in rows]
        x = np.arange(len(rows))
        width = 0.8 / len(contenders)
        for k, c in enumerate(contenders):
            values = []
            for r in rows:
                t = r.best_ort()[1] if c == "best ORT built-in" else r.times.get(c)
                values.append(t / r.onnxnorm if t and r.onnxnorm else np.nan)
            ax.bar(x + (k - (len(contenders) - 1) / 2) * width, values, width, label=c, color=colors[c])
        ax.axhline(1.0, color="black", lw=1)
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("time / onnxnorm time")
        ax.set_title(f"onnxnorm::{op}: above 1 = slower than onnxnorm (floor and copy: below 1 = the bounds)",
                     fontsize=9)
        ax.grid(axis="y", which="both", alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", fontsize=9, ncol=len(contenders))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (3.2 * len(ops))))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_results(path: str) -> list[Result]:
    """The results of a run from its JSON file (to redraw the plot or the table)."""
    with open(path) as f:
        data = json.load(f)
    return [Result(r["op"], r["shape"], r["dtype"], r["median_seconds"], r.get("notes", {}),
                   r.get("best_seconds") or {}, r.get("quant_type")) for r in data["results"]]


def active_isa() -> str:
    """The instruction set of the library's CPU kernels on this machine: "avx512_bf16" (AVX-512
    with its bfloat16 conversion instruction), "avx512", "avx2" or "portable" (the library's
    onnxnorm_active_isa: the best the CPU has, unless ONNXNORM_CPU_ISA asks for a lesser one)."""
    import ctypes

    from onnxnorm import runtime

    library = ctypes.CDLL(str(runtime.library_path()))
    library.onnxnorm_active_isa.restype = ctypes.c_char_p
    return library.onnxnorm_active_isa().decode()


def _load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages of the machine (None where the OS has none)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def environment(threads: int, warmup: float = 0.01) -> dict[str, Any]:
    import onnxruntime as ort
    import torch

    from onnxnorm import runtime

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average": _load_average(),
        "cpu": cpu, "cores": os.cpu_count(), "threads": threads, "warmup_seconds": warmup,
        "onnxruntime": ort.__version__, "torch": torch.__version__, "numpy": np.__version__,
        "python": platform.python_version(),
        "library": str(runtime.library_path()),
        "isa": active_isa(),
    }


def run(ops: list[str], shapes: list[str], dtypes: list[str], threads: int = 2, repeats: int = 9,
        min_sample: float = 0.002, json_path: str | None = None, plot_path: str | None = None,
        verbose: bool = True, warmup: float = 0.01, compare: dict[str, str] | None = None,
        quant_type: str = QUANT_TYPE) -> list[Result]:
    """Times every op, dtype and shape (the static quantized ops quantizing to ``quant_type``),
    prints the table, writes the JSON and the plot where asked; returns the rows."""
    if quant_type not in QUANT_ZERO_POINTS:
        raise ValueError(f"unknown quant_type {quant_type!r}; choose from {', '.join(QUANT_ZERO_POINTS)}")
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("torch").setLevel(logging.ERROR)
    log = print if verbose else (lambda s: None)
    rng = np.random.default_rng(0)
    env = environment(threads, warmup)
    env["quant_type"] = quant_type
    log(f"# onnxnorm bench kernels — {env['date']}, {env['cpu']}, {env['cores']} cores, "
        f"{threads} threads, onnxruntime {env['onnxruntime']}, torch {env['torch']}, kernels {env['isa']}, "
        f"load average {env['load_average']}")
    results = []
    for op in ops:
        for dtype in dtypes:
            for shape in shapes:
                start = time.perf_counter()
                result = bench_case(op, shape, dtype, threads, repeats, min_sample, rng, log, warmup, compare,
                                    quant_type)
                results.append(result)
                name, best = result.best_ort()
                log(f"{op} {shape} {_dtype_cell(result)}: onnxnorm {_us(result.onnxnorm)} µs, {name} {_us(best)} µs "
                    f"({time.perf_counter() - start:.1f} s)")
    env["load_average_after"] = _load_average()
    log(f"# load average at the end {env['load_average_after']}")
    table = markdown_table(results)
    print(table)
    if compare:
        env["compare_libraries"] = dict(compare)
        print()
        print(comparison_table(results, list(compare)))
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"environment": env, "results": [r.to_dict() for r in results]}, f, indent=1)
            f.write("\n")
    if plot_path:
        plot(results, plot_path)
    return results

"""ONNX Runtime's ``com.microsoft GatedRMSNorm`` as the ``ort`` target's op for a GatedRMSNorm
(``lowering.py``): whether the installed onnxruntime runs it, and whether it computes a node
exactly.

The op takes the RMS statistics of each run of len(scale) values of the last dim, times scale,
times the gate's SiLU or sigmoid, all in float32 and rounded once. So it computes a GatedRMSNorm
node exactly where the gate applies after the norm, in float32 or order B, over the last axis,
with a Gate and a Scale of X's type of one group's length (or a constant Scale, with its offset,
exactly of X's type: folded into a new one; no Scale: ones), and only where the installed
onnxruntime has the op and runs it on CPU (probed once per process and type, the way ``fuse``
checks that its output loads: :func:`ms_gated_rms_norm_problem`). Anything else is the node's
function body, with the reason :func:`scale_for` gives.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from onnx import TensorProto, helper

MS_DOMAIN = "com.microsoft"
#: GatedRMSNorm's ``activation`` -> ONNX Runtime's GatedRMSNorm ``activation``
MS_ACTIVATION_NAMES = {0: "silu", 1: "sigmoid"}


@functools.cache
def ms_gated_rms_norm_problem(elem_type: int = TensorProto.FLOAT) -> str | None:
    """Why the installed onnxruntime cannot run ``com.microsoft GatedRMSNorm`` for an X of
    ``elem_type`` in a CPU session (None: it can): it has no schema of it, or no CPU kernel
    for that type. ``fuse`` proves on CPU that its output loads, so the ``ort`` target writes
    the op only where this is None."""
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    version = f"onnxruntime {ort.__version__}"
    if not any(
        s.domain == MS_DOMAIN and s.name == "GatedRMSNorm" for s in state.get_all_operator_schema()
    ):
        return f"{version} has no {MS_DOMAIN} GatedRMSNorm"
    names = ("x", "scale", "gate")
    shapes = ([1, 4], [4], [1, 4])
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("GatedRMSNorm", list(names), ["y"], domain=MS_DOMAIN)],
            "probe",
            [helper.make_tensor_value_info(n, elem_type, d) for n, d in zip(names, shapes)],
            [helper.make_tensor_value_info("y", elem_type, [1, 4])],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS_DOMAIN, 1)],
        ir_version=8,
    )
    numpy_type = helper.tensor_dtype_to_np_dtype(elem_type)
    bits = np.uint16 if elem_type == TensorProto.BFLOAT16 else None
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        feeds = {}
        for name, dims in zip(names, shapes):
            array = np.ones(dims, numpy_type)
            feeds[name] = (
                ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(bits), elem_type)
                if bits
                else ort.OrtValue.ortvalue_from_numpy(array)
            )
        session.run_with_ort_values(None, feeds)
    except Exception as error:  # noqa: BLE001 - ORT's own words go in the note
        from onnxnorm.errors import first_line

        return (
            f"{version} has {MS_DOMAIN} GatedRMSNorm but does not run it on CPU "
            f"({first_line(error)})"
        )
    return None


def scale_for(
    attrs: Mapping[str, Any],
    args: Mapping[str, str | None],
    elem_type: int,
    dims: Mapping[str, list],
    types: Mapping[str, int],
    constant: Callable[[str], np.ndarray | None],
) -> tuple[str, str | np.ndarray | None]:
    """Why ONNX Runtime's GatedRMSNorm does not compute a GatedRMSNorm node exactly ("": it
    does), and the scale it takes then: the name of the node's own Scale, or the float32 values
    of a new constant one (ones for a node without Scale, or Scale + scale_offset). ``attrs``:
    the node's attributes, defaults included; ``args``: its inputs by catalogue name;
    ``elem_type``: X's element type; ``dims`` and ``types``: the values' dims and element types
    where known; ``constant``: the values of an initializer (None: not one held in the model)."""
    t, x = elem_type, args["X"]
    problem = ms_gated_rms_norm_problem(t)
    if problem:
        return problem, None
    if x is None:
        return "the node has no X", None
    if args["Gate"] is None:
        return "it takes a gate, the node has none", None
    if not attrs["norm_before_gate"]:
        return "it gates after the norm, the node before it (norm_before_gate 0)", None
    if t != TensorProto.FLOAT and attrs["cast_before_scale"]:
        return "it rounds once (order B), the node before the gate (order A)", None
    x_dims = dims.get(x)
    rank = None if x_dims is None else len(x_dims)
    if attrs["axis"] not in (-1, (rank or 0) - 1):
        return "it normalizes the last dim alone", None
    width = x_dims[-1] if x_dims else None
    width = width if isinstance(width, int) else None
    group = int(attrs["group_size"])
    scale, offset = args["Scale"], float(attrs["scale_offset"])
    if scale is None:
        length = group or width
        if length is None:
            return "the node has no Scale and X's last dim is not static", None
        return "", np.ones([length], np.float32)
    scale_dims = dims.get(scale)
    if scale_dims is None or len(scale_dims) != 1 or not isinstance(scale_dims[0], int):
        return "its scale is 1-D of a static length; the node's Scale is not", None
    if group and scale_dims[0] != group:
        return (
            f"its scale is one group's ({group}); the node's Scale spans {scale_dims[0]} values",
            None,
        )
    if not offset and types.get(scale) == t:
        return "", scale
    values = constant(scale)
    if values is None:
        why = "a scale offset" if offset else "a Scale of another type than X's"
        return f"the node has {why} and its Scale is not a constant to fold it into", None
    folded = values.astype(np.float32) + np.float32(offset)
    exact = folded.astype(helper.tensor_dtype_to_np_dtype(t)).astype(np.float32)
    if not np.array_equal(exact, folded, equal_nan=True):
        return "Scale + offset is not exactly of X's type", None
    return "", folded

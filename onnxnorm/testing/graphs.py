"""One-node ONNX models of the onnxnorm ops, each built from the op's definition in the catalogue:
what the tests run through ONNX Runtime (the function body, or the library's kernel), what the
CUDA harness runs on ORT's CUDA provider, and what a benchmark times.

A model's graph inputs are the op's inputs it is given, its outputs the op's outputs it asks
for, each of the type its type variable says: T (and Y of type U) X's type, U float32 where the
node's ``y_float32`` is 1, Q the type of the Y_zero_point given (else the op's first
quantized type, uint8), F float32. X's shape is every output's that is of X's type, and the
quantized Y's; the others (a dynamic op's Y_scale and Y_zero_point) are scalars. A rotary op's
Q stands for X; QOut has Q's shape and KOut K's, in the output's layout.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxnorm.ops import catalogue

if TYPE_CHECKING:
    import onnx


def elem_type(type_name: str) -> int:
    """A catalogue type ("tensor(float)", "tensor(float8e4m3fn)", ...) -> its TensorProto code."""
    from onnx import TensorProto

    return TensorProto.DataType.Value(type_name[len("tensor(") : -1].upper())


def numpy_type(type_name: str) -> np.dtype:
    """A catalogue type -> its numpy type (bfloat16 and float8 e4m3fn: ml_dtypes')."""
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type(type_name)))


def _dtype_and_shape(value: Any) -> tuple[np.dtype, tuple]:
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return np.dtype(value.dtype), tuple(value.shape)
    dtype, shape = value
    return np.dtype(dtype), tuple(shape)


def _rotary_dims(shape: tuple, attrs: Mapping[str, Any]) -> tuple:
    """The shape of a rotary op's output of an input of ``shape``: that shape, or with layout
    2 [batch, heads, seq, head_size] (a 3-D input's last dim split by head_size)."""
    if attrs.get("layout", 0) != 2:
        return shape
    if len(shape) == 3:
        return (shape[0], shape[2] // attrs["head_size"], shape[1], attrs["head_size"])
    return (shape[0], shape[2], shape[1], shape[3])


def single_node_model(
    op: str,
    inputs: Mapping[str, Any],
    attrs: Mapping[str, Any] | None = None,
    *,
    optional_outputs: bool | Collection[str] = True,
    opset: int = 18,
    functions: bool = True,
    bfloat16_as_float32: bool = True,
    input_names: Mapping[str, str] | None = None,
    output_names: Mapping[str, str] | None = None,
) -> onnx.ModelProto:
    """A model of one node of ``op`` (a catalogue op) with ``attrs``.

    ``inputs``: catalogue input name -> an array, or anything with a ``dtype`` and a ``shape``,
    or a (dtype, shape) pair: each a graph input, named after the input in lower case
    ("Y_zero_point" -> "y_zero_point") unless ``input_names`` names it. An optional input not
    given is absent (the node's input an empty name where a later one is given).

    ``optional_outputs``: True, every output; False, the required ones alone; a collection of
    names, the required ones and those optional ones. An output is named after it in lower
    case, and with "_out" in a quantized op (Y_scale and Y_zero_point are its inputs too),
    unless ``output_names`` names it. With ``bfloat16_as_float32`` a bfloat16 output is cast to
    float32 (exactly: ORT's Python API gives no bfloat16 arrays), the node's own output then
    declared in the graph's value_info.

    ``opset``: the standard domain's opset (a float8 e4m3fn Y_zero_point's body needs 19 or
    newer); ``functions``: the ops' function bodies attached (any ONNX runtime runs the model),
    else the node alone (ONNX Runtime with the onnxnorm library runs it)."""
    from onnx import TensorProto, helper

    spec = catalogue.get(op)
    attrs = dict(attrs or {})
    input_names = dict(input_names or {})
    output_names = dict(output_names or {})
    given = {name: _dtype_and_shape(value) for name, value in inputs.items()}
    unknown = set(given) - {p.name for p in spec.inputs}
    if unknown:
        raise ValueError(f"{op} has no input {', '.join(sorted(unknown))}")
    x_dtype, x_shape = given[spec.inputs[0].name]  # X (a rotary op's Q)
    x_type = helper.np_dtype_to_tensor_dtype(x_dtype)
    q_type: int
    if "Y_zero_point" in given:
        q_type = helper.np_dtype_to_tensor_dtype(given["Y_zero_point"][0])
    else:  # the op's first quantized type (none for a float op, which has no output of one)
        q_type = elem_type(spec.quant_types[0]) if spec.quant_types else TensorProto.UNDEFINED
    types = {
        "T": x_type,
        "U": TensorProto.FLOAT if attrs.get("y_float32") else x_type,
        "Q": q_type,
        "F": TensorProto.FLOAT,
    }
    quantized = spec.quantize != "none"

    def wanted(p: catalogue.Param) -> bool:
        if isinstance(optional_outputs, bool):
            return optional_outputs or not p.optional
        return not p.optional or p.name in optional_outputs

    node_inputs = [
        input_names.get(p.name, p.name.lower()) if p.name in given else "" for p in spec.inputs
    ]
    while node_inputs and not node_inputs[-1]:
        node_inputs.pop()
    node_outputs, nodes, graph_outputs, declared = [], [], [], []
    for p in spec.outputs:
        if not wanted(p):
            node_outputs.append("")
            continue
        name = output_names.get(p.name, p.name.lower() + ("_out" if quantized else ""))
        elem = types[p.type_var]
        dims = x_shape if p.type_var in ("T", "U") or p.name == "Y" else []
        if spec.rotary:  # QOut of Q's shape, KOut of K's, in the output layout
            dims = _rotary_dims(given.get(p.name[: -len("Out")], given["Q"])[1], attrs)
        if elem == TensorProto.BFLOAT16 and bfloat16_as_float32:
            node_outputs.append(name + "_raw")
            nodes.append(helper.make_node("Cast", [name + "_raw"], [name], to=TensorProto.FLOAT))
            declared.append(helper.make_tensor_value_info(name + "_raw", elem, dims))
            elem = TensorProto.FLOAT
        else:
            node_outputs.append(name)
        graph_outputs.append(helper.make_tensor_value_info(name, elem, dims))
    while node_outputs and not node_outputs[-1]:
        node_outputs.pop()
    nodes.insert(
        0, helper.make_node(op, node_inputs, node_outputs, domain=catalogue.DOMAIN, **attrs)
    )
    graph = helper.make_graph(
        nodes,
        op,
        [
            helper.make_tensor_value_info(
                input_names.get(p.name, p.name.lower()),
                helper.np_dtype_to_tensor_dtype(given[p.name][0]),
                given[p.name][1],
            )
            for p in spec.inputs
            if p.name in given
        ],
        graph_outputs,
        value_info=declared,
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", opset),
            helper.make_opsetid(catalogue.DOMAIN, catalogue.VERSION),
        ],
    )
    if functions:
        from onnxnorm import ops

        return ops.attach_functions(model)
    return model

"""Small builders shared by the tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxnorm import ops

NP_TO_ONNX = {np.dtype(np.float32): onnx.TensorProto.FLOAT,
              np.dtype(np.float16): onnx.TensorProto.FLOAT16}


def single_node_model(op: str, arrays: dict[str, np.ndarray], attrs: dict | None = None,
                      opset: int = 18, functions: bool = True) -> onnx.ModelProto:
    """A model holding one onnxnorm node of ``op``; each present input is a graph input named
    after its parameter (lower case); Sum is an output for Skip ops."""
    spec = ops.OPS[op]
    inputs = [p.name.lower() if p.name in arrays else "" for p in spec.inputs]
    while inputs and not inputs[-1]:
        inputs.pop()
    outputs = [p.name.lower() for p in spec.outputs]
    node = helper.make_node(op, inputs, outputs, domain=ops.DOMAIN, **(attrs or {}))
    x = arrays["X"]
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(p.name.lower(), NP_TO_ONNX[arrays[p.name].dtype],
                                       arrays[p.name].shape)
         for p in spec.inputs if p.name in arrays],
        [helper.make_tensor_value_info(name, NP_TO_ONNX[x.dtype], x.shape) for name in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(ops.DOMAIN, ops.VERSION)])
    return ops.attach_functions(model) if functions else model


def feeds_for(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name.lower(): value for name, value in arrays.items()}


def reference_outputs(op: str, arrays: dict[str, np.ndarray], attrs: dict | None = None):
    spec = ops.OPS[op]
    return ops.reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **(attrs or {}))

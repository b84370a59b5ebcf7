"""onnxnorm.testing.graphs: the one-node models that the tests, the CUDA harness and the
benchmarks build are typed as the catalogue types each op's inputs and outputs, for every op and
every type the op takes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxnorm.ops import catalogue
from onnxnorm.testing.graphs import elem_type, numpy_type, single_node_model

SHAPE = (2, 3, 8)


def _inputs(spec: catalogue.OpSpec, types: dict[str, str]) -> dict[str, tuple]:
    """(numpy type, shape) of every input of ``spec``: X's shape for X, Residual and Gate, one
    row for the weights, a scalar for Y_scale and Y_zero_point."""
    inputs = {}
    for p in spec.inputs:
        if p.name in ("Y_scale", "Y_zero_point"):
            shape = ()
        else:
            shape = SHAPE if p.type_var == "T" else SHAPE[-1:]
        inputs[p.name] = (numpy_type(types[p.type_var]), shape)
    return inputs


@pytest.mark.parametrize("op", list(catalogue.OPS))
def test_every_type_of_every_op_passes_the_checker(op):
    """Each (T, S, U) of the op and each quantized type, with every optional output and with the
    required ones alone: the model passes the checker with its function bodies (their type
    inference included), and its outputs are of the types the catalogue gives them (bfloat16
    cast to float32)."""
    spec = catalogue.get(op)
    for t, s, u in spec.type_sets:
        for q in spec.quant_types or ("",):
            types = {"T": t, "S": s, "U": u, "Q": q, "F": "tensor(float)"}
            attrs = {"y_float32": 1} if u != t else {}
            for optional in (True, False):
                model = single_node_model(
                    op, _inputs(spec, types), attrs, optional_outputs=optional, opset=21
                )
                onnx.checker.check_model(model, full_check=True)
                declared = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
                quantized = spec.quantize != "none"
                want = {
                    p.name.lower() + ("_out" if quantized else ""): elem_type(types[p.type_var])
                    for p in spec.outputs
                    if optional or not p.optional
                }
                bf16 = elem_type("tensor(bfloat16)")
                want = {
                    name: onnx.TensorProto.FLOAT if code == bf16 else code
                    for name, code in want.items()
                }
                assert declared == want, (op, t, s, u, q, optional)


def test_names_shapes_alone_and_bfloat16_outputs_kept():
    """A benchmark's form: inputs given by type and shape alone, named as it names them, some
    optional outputs, bfloat16 outputs as they are, no function bodies."""
    bf16 = numpy_type("tensor(bfloat16)")
    model = single_node_model(
        "SkipRMSNormDynamicQuantizeLinear",
        {"X": (bf16, (4, 16)), "Residual": (bf16, (4, 16)), "Scale": (bf16, (16,))},
        {"epsilon": 1e-5},
        optional_outputs={"Sum"},
        functions=False,
        bfloat16_as_float32=False,
        input_names={"X": "x", "Residual": "r", "Scale": "s"},
        output_names={"Y": "y", "Y_scale": "ys_out", "Y_zero_point": "yz_out", "Sum": "sum"},
    )
    (node,) = model.graph.node
    assert list(node.input) == ["x", "r", "s"]
    assert list(node.output) == ["y", "ys_out", "yz_out", "sum"]
    assert not model.functions and not model.graph.value_info
    outputs = {
        o.name: (o.type.tensor_type.elem_type, [d.dim_value for d in o.type.tensor_type.shape.dim])
        for o in model.graph.output
    }
    tp = onnx.TensorProto
    assert outputs == {
        "y": (tp.UINT8, [4, 16]),
        "ys_out": (tp.FLOAT, []),
        "yz_out": (tp.UINT8, []),
        "sum": (tp.BFLOAT16, [4, 16]),
    }
    with pytest.raises(ValueError, match="RMSNorm has no input Residual"):
        single_node_model("RMSNorm", {"X": np.ones(4, np.float32), "Residual": np.ones(4)})

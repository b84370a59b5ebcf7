"""The ONNX models ``onnxnorm bench kernels`` times: the onnxnorm node, ONNX Runtime's built-in
ops for the same math (:data:`ORT_BUILTINS`; for the quantized ops each followed by ORT's
quantizer) and ORT's floor, one node that only copies the same bytes. The arrays they read are
named by :func:`input_names`."""

from __future__ import annotations

import numpy as np

from onnxnorm import _native
from onnxnorm.bench.kernels.cases import EPSILON, QUANT_TYPE, QUANT_ZERO_POINTS
from onnxnorm.ops import catalogue
from onnxnorm.testing.graphs import elem_type, numpy_type, single_node_model

#: op -> labels of ORT's own ops for the same math (each a model of :func:`ort_builtin_model`)
ORT_BUILTINS = {
    "LayerNorm": ["LayerNormalization-17"],
    "RMSNorm": ["RMSNormalization-23", "SimplifiedLayerNormalization"],
    "SkipLayerNorm": ["SkipLayerNormalization"],
    "SkipRMSNorm": ["SkipSimplifiedLayerNormalization"],
    "SandwichLayerNorm": ["LayerNormalization+SkipLayerNormalization"],
    "SandwichRMSNorm": ["SimplifiedLayerNormalization+SkipSimplifiedLayerNormalization"],
    # com.microsoft GatedRMSNorm: the gate after the norm, groups of Scale's length (a form that
    # takes the gate first has no ORT op); ONNX's LpNormalization (p = 2): without an epsilon
    "GatedRMSNorm": ["GatedRMSNorm"],
    "L2Norm": ["LpNormalization"],
    # the rotary ops (Q and K; onnxnorm.bench.kernels.rotary): for each of Q and K the norm, then
    # com.microsoft RotaryEmbedding ("RotaryEmbedding") or ONNX's ("RotaryEmbedding-23")
    "RMSNormRotary": [
        "SimplifiedLayerNormalization+RotaryEmbedding",
        "RMSNormalization-23+RotaryEmbedding-23",
    ],
    "LayerNormRotary": [
        "LayerNormalization-17+RotaryEmbedding",
        "LayerNormalization-17+RotaryEmbedding-23",
    ],
    "L2NormRotary": ["LpNormalization+RotaryEmbedding", "LpNormalization+RotaryEmbedding-23"],
}
# the quantized ops: each built-in of their norm followed by ORT's quantizer
_QUANTIZERS = {"static": "QuantizeLinear", "dynamic": "DynamicQuantizeLinear"}
for _name, _spec in catalogue.QUANTIZED_OPS.items():
    ORT_BUILTINS[_name] = [
        f"{label}+{_QUANTIZERS[_spec.quantize]}" for label in ORT_BUILTINS[_spec.norm_op]
    ]
    if _spec.quantize == "static":  # ORT's CPU QuantizeLinear has no bfloat16 kernel: cast first
        ORT_BUILTINS[_name] += [
            f"{label}+Cast+QuantizeLinear" for label in ORT_BUILTINS[_spec.norm_op]
        ]


#: a dtype of ``--dtypes`` -> its catalogue type
_TYPE_NAMES = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "bfloat16": "tensor(bfloat16)",
}


def onnx_type(dtype: str) -> int:
    """ "float16" -> TensorProto.FLOAT16 (a dtype of ``--dtypes``)."""
    return elem_type(_TYPE_NAMES[dtype])


def np_dtype(dtype: str) -> np.dtype:
    """ "bfloat16" -> ml_dtypes' bfloat16 (a dtype of ``--dtypes``)."""
    return numpy_type(_TYPE_NAMES[dtype])


def quant_onnx_type(quant_type: str) -> int:
    """ "int8" -> TensorProto.INT8 (a key of QUANT_ZERO_POINTS)."""
    import onnx

    return onnx.helper.np_dtype_to_tensor_dtype(_native.QUANT_NP_TYPES[quant_type])


def zero_point(quant_type: str) -> np.ndarray:
    """The static ops' zero point for Y of type ``quant_type`` (a numpy scalar array)."""
    return np.array(QUANT_ZERO_POINTS[quant_type], _native.QUANT_NP_TYPES[quant_type])


def graph_model(
    nodes, inputs: dict[str, tuple], outputs: list[str], dtype: str, opsets: dict[str, int]
):
    """A model of ``nodes``: ``inputs`` (name -> shape) and ``outputs`` of X's type."""
    from onnx import helper

    t = onnx_type(dtype)
    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info(name, t, shape) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, t, None) for name in outputs],
    )
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = min(model.ir_version, 10)
    return model


def input_names(op: str) -> dict[str, str]:
    """The onnxnorm inputs the benchmark feeds: catalogue name -> the name of its array, which
    every contender's model takes as its graph input of that name."""
    spec = catalogue.get(op)
    inputs = {p.name for p in spec.inputs}
    names = {"X": "x"}
    if spec.quantize == "static":
        names.update(Y_scale="ys", Y_zero_point="yz")
    if spec.has_residual:
        names["Residual"] = "r"
    if "Scale" in inputs:
        names["Scale"] = "s"
    if "Gate" in inputs:
        names["Gate"] = "g"
    if spec.norm == "layer":
        names["Bias"] = "b"
    if spec.residual == "sandwich":
        names["InnerScale"] = "si"
        if spec.norm == "layer":
            names["InnerBias"] = "bi"
    return names


def output_names(op: str) -> list[str]:
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
    q_type = quant_onnx_type(quant_type) if quantize == "static" else onnx.TensorProto.UINT8
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


def _shapes(op: str, x_shape, d: int, scale_shape=None) -> dict[str, tuple]:
    """The shape of each array of input_names: X's for X, Residual and Gate, the weights' (d,)
    or ``scale_shape``."""
    weight = tuple(scale_shape) if scale_shape is not None else (d,)
    return {n: (x_shape if n in ("x", "r", "g") else weight) for n in input_names(op).values()}


def onnxnorm_model(
    op: str,
    dtype: str,
    x_shape,
    d: int,
    quant_type: str = QUANT_TYPE,
    attrs: dict | None = None,
    scale_shape=None,
):
    """The onnxnorm node of ``op`` alone (no function body: it needs the library), with the
    node's ``attrs`` (epsilon EPSILON unless given) and Scale of ``scale_shape`` (default (d,))."""
    names = input_names(op)
    shapes = _shapes(op, x_shape, d, scale_shape)
    t = np_dtype(dtype)
    inputs = {name: (t, shapes[array]) for name, array in names.items()}
    if catalogue.get(op).quantize == "static":
        inputs.update(Y_scale=(t, ()), Y_zero_point=(_native.QUANT_NP_TYPES[quant_type], ()))
    model = single_node_model(
        op,
        inputs,
        {"epsilon": EPSILON, **(attrs or {})},
        optional_outputs={"Sum"},
        functions=False,
        bfloat16_as_float32=False,
        input_names=names,
        output_names={"Y": "y", "Y_scale": "ys_out", "Y_zero_point": "yz_out", "Sum": "sum"},
    )
    model.ir_version = min(model.ir_version, 10)
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
        norm_label = norm_label[: -len("+Cast")]
    model = ort_builtin_model(norm_label, dtype, x_shape, d)
    graph = model.graph
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name == "y":
                node.output[i] = "y_float"
    y = "y_float"
    if quantizer == "DynamicQuantizeLinear":
        if dtype != "float32":
            graph.node.append(
                helper.make_node("Cast", [y], ["y_float32"], to=onnx.TensorProto.FLOAT)
            )
            y = "y_float32"
        graph.node.append(helper.make_node("DynamicQuantizeLinear", [y], ["y", "ys_out", "yz_out"]))
    else:
        scale = "ys"
        if cast:  # the norm's output and the scale in float32 (QuantizeLinear divides in float32)
            graph.node.extend(
                [
                    helper.make_node("Cast", [y], ["y_float32"], to=onnx.TensorProto.FLOAT),
                    helper.make_node("Cast", ["ys"], ["ys_float32"], to=onnx.TensorProto.FLOAT),
                ]
            )
            y, scale = "y_float32", "ys_float32"
        graph.node.append(helper.make_node("QuantizeLinear", [y, scale, "yz"], ["y"]))
        graph.input.extend(
            [
                helper.make_tensor_value_info("ys", onnx_type(dtype), []),
                helper.make_tensor_value_info("yz", quant_onnx_type(quant_type), []),
            ]
        )
        for imp in model.opset_import:
            if imp.domain == "":
                imp.version = max(imp.version, 21)
    outputs = {o.name: o for o in graph.output}
    names = (
        ["y"]
        + (["ys_out", "yz_out"] if quantizer == "DynamicQuantizeLinear" else [])
        + (["sum"] if "sum" in outputs else [])
    )
    del graph.output[:]
    graph.output.extend(helper.make_tensor_value_info(n, onnx_type(dtype), None) for n in names)
    _quantized_types(
        model, "dynamic" if quantizer == "DynamicQuantizeLinear" else "static", quant_type
    )
    return model


def ort_builtin_model(
    label: str,
    dtype: str,
    x_shape,
    d: int,
    quant_type: str = QUANT_TYPE,
    attrs: dict | None = None,
    scale_shape=None,
):
    """ONNX Runtime's own ops for an op's math, by their label in :data:`ORT_BUILTINS` (the
    onnxnorm node's ``attrs`` and Scale's shape for the ops of OP_SHAPES; a ValueError where
    the op has no ORT form)."""
    from onnx import helper

    if label.endswith(("+QuantizeLinear", "+DynamicQuantizeLinear")):
        return _ort_quantized_model(label, dtype, x_shape, d, quant_type)
    ms = "com.microsoft"
    attrs = attrs or {}
    epsilon = attrs.get("epsilon", EPSILON)
    if label == "GatedRMSNorm":
        if not attrs.get("norm_before_gate", 1):
            raise ValueError("ORT's GatedRMSNorm takes the gate after the norm only")
        group = attrs.get("group_size", 0) or x_shape[-1]
        if tuple(scale_shape or ()) != (group,):
            raise ValueError("ORT's GatedRMSNorm takes a Scale of one group only")
        activation = "silu" if attrs.get("activation", 0) == 0 else "sigmoid"
        node = helper.make_node(
            "GatedRMSNorm",
            ["x", "s", "g"],
            ["y"],
            domain=ms,
            epsilon=epsilon,
            activation=activation,
        )
        inputs = {"x": x_shape, "s": tuple(scale_shape), "g": x_shape}
        return graph_model([node], inputs, ["y"], dtype, {"": 17, ms: 1})
    if label == "LpNormalization":  # (no epsilon)
        node = helper.make_node("LpNormalization", ["x"], ["y"], axis=-1, p=2)
        return graph_model([node], {"x": x_shape}, ["y"], dtype, {"": 17})

    def norm(op: str, inputs: list[str], output: str = "y"):  # over the last axis
        return helper.make_node(op, inputs, [output], axis=-1, epsilon=EPSILON)

    def skip(op: str, inputs: list[str]):  # Sum is a Skip op's fourth output
        return helper.make_node(op, inputs, ["y", "", "", "sum"], domain=ms, epsilon=EPSILON)

    xs = {"x": x_shape}
    w = {"s": (d,)}
    wb = {"s": (d,), "b": (d,)}
    if label == "LayerNormalization-17":
        return graph_model(
            [norm("LayerNormalization", ["x", "s", "b"])], {**xs, **wb}, ["y"], dtype, {"": 17}
        )
    if label == "RMSNormalization-23":
        return graph_model(
            [norm("RMSNormalization", ["x", "s"])], {**xs, **w}, ["y"], dtype, {"": 23}
        )
    if label == "SimplifiedLayerNormalization":
        return graph_model(
            [norm("SimplifiedLayerNormalization", ["x", "s"])], {**xs, **w}, ["y"], dtype, {"": 17}
        )
    rs = {"r": x_shape}
    opsets = {"": 17, ms: 1}
    if label == "SkipLayerNormalization":
        return graph_model(
            [skip(label, ["x", "r", "s", "b"])], {**xs, **rs, **wb}, ["y", "sum"], dtype, opsets
        )
    if label == "SkipSimplifiedLayerNormalization":
        return graph_model(
            [skip(label, ["x", "r", "s"])], {**xs, **rs, **w}, ["y", "sum"], dtype, opsets
        )
    if label == "LayerNormalization+SkipLayerNormalization":
        nodes = [
            norm("LayerNormalization", ["x", "si", "bi"], "inner"),
            skip("SkipLayerNormalization", ["inner", "r", "s", "b"]),
        ]
        inputs = {**xs, **rs, **wb, "si": (d,), "bi": (d,)}
        return graph_model(nodes, inputs, ["y", "sum"], dtype, opsets)
    if label == "SimplifiedLayerNormalization+SkipSimplifiedLayerNormalization":
        nodes = [
            norm("SimplifiedLayerNormalization", ["x", "si"], "inner"),
            skip("SkipSimplifiedLayerNormalization", ["inner", "r", "s"]),
        ]
        return graph_model(nodes, {**xs, **rs, **w, "si": (d,)}, ["y", "sum"], dtype, opsets)
    raise KeyError(label)


def ort_floor_model(op: str, dtype: str, x_shape):
    """One ONNX Runtime node that only moves the bytes of the op: Identity of X (read X, write Y);
    for the residual ops Concat of X and Residual (read both, write as much as Y and Sum), and
    for a gated op Concat of X and Gate (reads both)."""
    from onnx import helper

    spec = catalogue.get(op)
    if not spec.has_residual and not spec.gated:
        node = helper.make_node("Identity", ["x"], ["y"])
        return graph_model([node], {"x": x_shape}, ["y"], dtype, {"": 17})
    second = "r" if spec.has_residual else "g"
    node = helper.make_node("Concat", ["x", second], ["y"], axis=0)
    return graph_model([node], {"x": x_shape, second: x_shape}, ["y"], dtype, {"": 17})

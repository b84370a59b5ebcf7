"""The rotary ops' contenders in ``onnxnorm bench kernels`` (RMSNormRotary, LayerNormRotary,
L2NormRotary: Q and K normalized per head and rotated in one node): their inputs, the onnxnorm
node, ONNX Runtime's norm followed by its RotaryEmbedding for each of Q and K in one graph, the
node's function body inlined (the decomposed graph), ORT's floor (Concat of Q and K) and torch
eager (the norm, then transformers' rotate_half rotary). The shapes are ``OP_SHAPES``'."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from onnxnorm.bench.kernels.cases import EPSILON, ROTARY_MAX_POSITION, ROTARY_THETA, OpShape
from onnxnorm.bench.kernels.graphs import ORT_BUILTINS, graph_model, np_dtype
from onnxnorm.ops import catalogue

#: catalogue input -> the name of its array (every contender's graph input of that name)
INPUT_NAMES = {
    "Q": "q",
    "K": "k",
    "QScale": "qs",
    "KScale": "ks",
    "QBias": "qb",
    "KBias": "kb",
    "Cos": "cos",
    "Sin": "sin",
    "PositionIds": "pos",
}
OUTPUT_NAMES = {"QOut": "q_out", "KOut": "k_out"}
#: the norm of each rotary op as ORT's ops: label -> (op, opset, takes Scale, takes Bias)
_NORMS = {
    "SimplifiedLayerNormalization": ("SimplifiedLayerNormalization", 17, True, False),
    "RMSNormalization-23": ("RMSNormalization", 23, True, False),
    "LayerNormalization-17": ("LayerNormalization", 17, True, True),
    "LpNormalization": ("LpNormalization", 17, False, False),
}


def _present(op: str, case: OpShape) -> dict[str, str]:
    """The op's inputs the benchmark gives (all of its inputs, the weights where the case has
    them): catalogue name -> array name."""
    weights = ("QScale", "KScale", "QBias", "KBias")
    return {
        p.name: INPUT_NAMES[p.name]
        for p in catalogue.get(op).inputs
        if case.scale is not None or p.name not in weights
    }


def _out_shape(shape: tuple[int, ...], layout: int) -> tuple[int, ...]:
    """QOut's (KOut's) shape for Q (K) of ``shape`` [batch, seq, heads, head_size]."""
    return (shape[0], shape[2], shape[1], shape[3]) if layout == 2 else shape


def output_shapes(case: OpShape) -> dict[str, tuple[int, ...]]:
    """The shape of each output of the onnxnorm node and of ORT's graphs."""
    layout = case.attrs.get("layout", 0)
    assert case.k is not None
    return {"q_out": _out_shape(case.x, layout), "k_out": _out_shape(case.k, layout)}


def floor_shape(case: OpShape) -> tuple[int, ...]:
    """The output of ORT's floor: Q and K concatenated over the heads."""
    assert case.k is not None
    return (*case.x[:2], case.x[2] + case.k[2], case.x[3])


def positions(case: OpShape) -> np.ndarray:
    """Each token's position, [batch, seq]: a prefill from 0, a decode step's tokens after 1000
    earlier ones."""
    batch, seq = case.x[:2]
    start = 0 if seq > 64 else 1000
    return np.broadcast_to(np.arange(start, start + seq, dtype=np.int64), (batch, seq)).copy()


def make_arrays(
    op: str, case: OpShape, dtype: str, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """The inputs by their array names (Q first): Q and K standard normal, the weights about 1
    (biases about 0), the caches one angle per rotated pair for ROTARY_MAX_POSITION positions
    (RoPE with base ROTARY_THETA), in Q's type."""
    t = np_dtype(dtype)
    assert case.k is not None
    arrays = {
        "q": rng.standard_normal(case.x, np.float32).astype(t),
        "k": rng.standard_normal(case.k, np.float32).astype(t),
    }
    names = _present(op, case)
    for name in ("QScale", "KScale", "QBias", "KBias"):
        if name in names and case.scale is not None:
            base = 1.0 if name.endswith("Scale") else 0.0
            w = base + 0.1 * rng.standard_normal(case.scale, np.float32)
            arrays[names[name]] = w.astype(t)
    head = case.x[-1]
    inv_freq = ROTARY_THETA ** (-np.arange(0, head, 2, dtype=np.float64) / head)
    angles = np.arange(ROTARY_MAX_POSITION, dtype=np.float64)[:, None] * inv_freq
    arrays["cos"] = np.cos(angles).astype(t)
    arrays["sin"] = np.sin(angles).astype(t)
    arrays["pos"] = positions(case)
    return arrays


def onnxnorm_model(op: str, dtype: str, case: OpShape, functions: bool = False):
    """The onnxnorm node alone, Q and K in one call (``functions``: with its function body)."""
    from onnxnorm.testing.graphs import single_node_model

    t = np_dtype(dtype)
    assert case.k is not None
    shapes = {
        "Q": case.x,
        "K": case.k,
        "Cos": (ROTARY_MAX_POSITION, case.x[-1] // 2),
        "PositionIds": case.x[:2],
    }
    names = _present(op, case)
    inputs = {}
    for name in names:
        shape = shapes.get(name, shapes["Cos"] if name == "Sin" else case.scale or ())
        inputs[name] = (np.int64 if name == "PositionIds" else t, shape)
    model = single_node_model(
        op,
        inputs,
        case.attrs,
        optional_outputs={"KOut"},
        functions=functions,
        bfloat16_as_float32=False,
        input_names=names,
        output_names=OUTPUT_NAMES,
    )
    model.ir_version = min(model.ir_version, 10)
    return model


def decomposed_model(op: str, dtype: str, case: OpShape):
    """The node's function body inlined in standard ONNX ops at opset 18 (what the lowering to
    ``onnx`` writes for a runtime without the library)."""
    from onnxnorm.fusion.lowering import lower

    return lower(onnxnorm_model(op, dtype, case), "onnx")


def ort_builtin_model(label: str, dtype: str, case: OpShape):
    """ONNX Runtime's ops for the op's math (a label of ``ORT_BUILTINS``), for Q and then K:
    the norm over each head, then RotaryEmbedding (com.microsoft's, or ONNX's of opset 23) with
    the same caches and positions; layout 0 through the 3-D [batch, seq, heads * head_size]
    form (a Reshape before and after), layout 2 through the 4-D [batch, heads, seq,
    head_size] form (a Transpose before)."""
    from onnx import TensorProto, helper, numpy_helper

    norm_label, rotary_label = label.split("+")
    norm_op, norm_opset, with_scale, with_bias = _NORMS[norm_label]
    ms = "com.microsoft"
    layout = case.attrs.get("layout", 0)
    epsilon = case.attrs.get("epsilon", EPSILON)
    assert case.k is not None
    nodes = []
    inputs: dict[str, tuple[int, ...]] = {}
    attrs: dict[str, Any]
    head = case.x[-1]
    for x, shape in (("q", case.x), ("k", case.k)):
        inputs[x] = shape
        norm_inputs = [x]
        if with_scale and case.scale is not None:
            norm_inputs.append(x + "s")
            inputs[x + "s"] = case.scale
        if with_bias and case.scale is not None:
            norm_inputs.append(x + "b")
            inputs[x + "b"] = case.scale
        if norm_op == "LpNormalization":  # (no epsilon)
            nodes.append(helper.make_node(norm_op, norm_inputs, [x + "_n"], axis=-1, p=2))
        else:
            nodes.append(
                helper.make_node(norm_op, norm_inputs, [x + "_n"], axis=-1, epsilon=epsilon)
            )
        if layout == 2:
            nodes.append(helper.make_node("Transpose", [x + "_n"], [x + "_r"], perm=[0, 2, 1, 3]))
            rotated, attrs = x + "_out", {}
        else:
            nodes.append(helper.make_node("Reshape", [x + "_n", "flat"], [x + "_r"]))
            rotated, attrs = x + "_rot", {"num_heads": shape[2]}
        if rotary_label == "RotaryEmbedding":
            rotary_inputs = [x + "_r", "pos", "cos", "sin"]
            node = helper.make_node("RotaryEmbedding", rotary_inputs, [rotated], domain=ms)
        else:
            rotary_inputs = [x + "_r", "cos", "sin", "pos"]
            node = helper.make_node("RotaryEmbedding", rotary_inputs, [rotated], **attrs)
        nodes.append(node)
        if layout != 2:
            nodes.append(helper.make_node("Reshape", [rotated, "heads"], [x + "_out"]))
    cache = (ROTARY_MAX_POSITION, head // 2)
    inputs.update(cos=cache, sin=cache)
    opset = 23 if "-23" in label else norm_opset
    model = graph_model(nodes, inputs, ["q_out", "k_out"], dtype, {"": opset, ms: 1})
    graph = model.graph
    graph.input.append(helper.make_tensor_value_info("pos", TensorProto.INT64, case.x[:2]))
    if layout != 2:
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flat"),
                numpy_helper.from_array(np.array([0, 0, -1, head], np.int64), "heads"),
            ]
        )
    return model


def floor_model(dtype: str, case: OpShape):
    """ORT's floor: Concat of Q and K over the heads (reads both, writes as much as QOut and
    KOut)."""
    from onnx import helper

    node = helper.make_node("Concat", ["q", "k"], ["y"], axis=2)
    assert case.k is not None
    return graph_model([node], {"q": case.x, "k": case.k}, ["y"], dtype, {"": 17})


def torch_call(op: str, case: OpShape, arrays: dict[str, np.ndarray]) -> Callable[[], Any]:
    """torch eager as a transformers attention layer computes it: each of Q and K normalized
    per head (``F.rms_norm`` / ``F.layer_norm``; the L2 norm as the gated delta-net's code),
    then ``q * cos + rotate_half(q) * sin`` with cos and sin of one value per rotated value,
    [batch, seq, head_size] in Q's type, as transformers' rotary embedding module hands every
    layer (gathered and duplicated once per forward, outside this call); layout 2 transposes to
    [batch, heads, seq, head_size] after the norm as the model does."""
    import torch
    import torch.nn.functional as F

    from onnxnorm.bench.kernels.contenders import torch_l2

    spec = catalogue.get(op)
    epsilon = case.attrs.get("epsilon", EPSILON)
    layout = case.attrs.get("layout", 0)

    def tensor(a: np.ndarray):
        if a.dtype == np_dtype("bfloat16"):
            return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
        return torch.from_numpy(a)

    t = {name: tensor(a) for name, a in arrays.items()}
    pos = t["pos"]
    cos = torch.cat([t["cos"][pos]] * 2, dim=-1)
    sin = torch.cat([t["sin"][pos]] * 2, dim=-1)
    l2 = torch_l2({"epsilon": epsilon})
    width = (case.x[-1],)

    def norm(x, s, b):
        if spec.norm == "rms":
            return F.rms_norm(x, width, s, epsilon)
        if spec.norm == "layer":
            return F.layer_norm(x, width, s, b, epsilon)
        return l2(x)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def layer(q, k, qs, ks, qb, kb):
        q, k = norm(q, qs, qb), norm(k, ks, kb)
        if layout == 2:
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        else:
            c, s = cos.unsqueeze(2), sin.unsqueeze(2)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s

    args = [t["q"], t["k"], t.get("qs"), t.get("ks"), t.get("qb"), t.get("kb")]

    def call():
        with torch.inference_mode():
            return layer(*args)

    call()
    return call


def add_contenders(
    op: str,
    dtype: str,
    case: OpShape,
    arrays: dict[str, np.ndarray],
    add: Callable[[str, Callable[[], Callable[[], Any]]], None],
    threads: int,
    keep: list,
    compare: dict[str, str] | None = None,
) -> None:
    """Hands ``add`` (name, a maker of the call to time) every contender of a row but the copy:
    the onnxnorm node (and the other builds of the library in ``compare``), ORT's built-in
    graphs, the decomposed graph, ORT's floor and torch eager."""
    from onnxnorm.bench.kernels.contenders import ort_runner

    outputs = output_shapes(case)

    def runner(model, **kw):
        return ort_runner(model, arrays, threads, False, keep, output_shapes=outputs, **kw)

    add(
        "onnxnorm",
        lambda: ort_runner(
            onnxnorm_model(op, dtype, case), arrays, threads, True, keep, output_shapes=outputs
        ),
    )

    def other_build(path: str):
        return runner(onnxnorm_model(op, dtype, case), library=path)

    def builtin(label: str):
        return runner(ort_builtin_model(label, dtype, case))

    for name, path in (compare or {}).items():
        add(f"onnxnorm@{name}", functools.partial(other_build, path))
    for label in ORT_BUILTINS[op]:
        add("ort:" + label, functools.partial(builtin, label))
    add("decomposed", lambda: runner(decomposed_model(op, dtype, case)))
    add(
        "floor",
        lambda: ort_runner(
            floor_model(dtype, case), arrays, threads, False, keep, output_shape=floor_shape(case)
        ),
    )
    add("torch", lambda: torch_call(op, case, arrays))

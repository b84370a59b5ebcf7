"""Rotary first, then the norm (Llama 4, nanochat), fused into one rotary node with
``rotary_first = 1``, and rotations by minus the angle (nanochat's ``rotate_half``,
``cat(x2, -x1)``) fused with Sin negated, in either order (onnxnorm/fusion/rotary.py).

Hand-built graphs of each spelling (half-split and interleaved partners, partial rotary, the
Transpose of the heads before the rotary, between the rotary and the norm or none, the rotation
in the model's type or in float32 with the Casts around it, angles unsqueezed or folded into
constants, float32 and float16), and exports with both exporters, dynamic batch and sequence
dims: transformers' NanoChat, and a Llama 4 attention written out in real arithmetic (its own
rotary multiplies complex numbers, which neither exporter of torch 2.13 translates: the dynamo
exporter has no translation of ``aten.unsqueeze`` on a complex tensor, TorchScript none of
``aten::polar`` nor of complex inputs). Each fused model holds exactly the expected nodes, one
rotary node with Q and K per layer, and gives the original's outputs in ONNX Runtime.
"""

from __future__ import annotations

import collections
import io

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxnorm.fusion import fuse
from onnxnorm.fusion.verify import verify

B, S, H, KH, D = 2, 5, 4, 2, 16
HIDDEN = 32
EPS = 1e-6


class _Graph:
    """The nodes and initializers of a hand-built graph."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, np.ndarray] = {}

    def const(self, name: str, values, dtype=np.int64) -> str:
        self.inits[name] = np.array(values, dtype)
        return name

    def add(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output


def _partner(g: _Graph, p: str, x: str, width: int, case: dict) -> str:
    """partner(x) over the last axis: rotate_half's cat(-x2, x1) or the pairs' (-x[2j + 1],
    x[2j]); negated (``case["negated"]``): cat(x2, -x1), or (x[2j + 1], -x[2j])."""
    negated = case["negated"]
    if case["interleaved"]:
        for name, value in (("zero", 0), ("one", 1), ("two", 2), ("end", width), ("last", -1)):
            g.const(f"{p}_{name}", [value])
        even = g.add("Slice", [x, f"{p}_zero", f"{p}_end", f"{p}_last", f"{p}_two"], f"{p}_even")
        odd = g.add("Slice", [x, f"{p}_one", f"{p}_end", f"{p}_last", f"{p}_two"], f"{p}_odd")
        if negated:
            first, second = odd, g.add("Neg", [even], f"{p}_neven")
        else:
            first, second = g.add("Neg", [odd], f"{p}_nodd"), even
        parts = [g.add("Unsqueeze", [v, f"{p}_last"], f"{v}_u") for v in (first, second)]
        stack = g.add("Concat", parts, f"{p}_stack", axis=-1)
        g.const(f"{p}_flat", [0, 0, 0, width])
        return g.add("Reshape", [stack, f"{p}_flat"], f"{p}_partner")
    g.nodes.append(helper.make_node("Split", [x], [f"{p}_x1", f"{p}_x2"], axis=-1, num_outputs=2))
    if negated:
        halves = [f"{p}_x2", g.add("Neg", [f"{p}_x1"], f"{p}_nx1")]
    else:
        halves = [g.add("Neg", [f"{p}_x2"], f"{p}_nx2"), f"{p}_x1"]
    return g.add("Concat", halves, f"{p}_partner", axis=-1)


def _rotary(g: _Graph, p: str, x: str, case: dict) -> str:
    """x rotated by the angles cos_u and sin_u (its leading ``case["rotary"]`` values, the rest
    after them); in float32 with the Casts around it where ``case["in_float32"]``."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(case["dtype"]))
    if case["in_float32"]:
        x = g.add("Cast", [x], f"{p}_wide", to=TensorProto.FLOAT)
    rotated, rest = x, None
    if case["rotary"] < D:
        for name, value in (("r0", 0), ("r1", case["rotary"]), ("r2", D), ("ax", -1)):
            g.const(f"{p}_{name}", [value])
        rotated = g.add("Slice", [x, f"{p}_r0", f"{p}_r1", f"{p}_ax"], f"{p}_rot")
        rest = g.add("Slice", [x, f"{p}_r1", f"{p}_r2", f"{p}_ax"], f"{p}_pass")
    partner = _partner(g, p, rotated, case["rotary"], case)
    c = g.add("Mul", [rotated, "cos_u"], f"{p}_c")
    s = g.add("Mul", [partner, "sin_u"], f"{p}_s")
    y = g.add("Add", [c, s], f"{p}_turned")
    if rest is not None:
        y = g.add("Concat", [y, rest], f"{p}_whole", axis=-1)
    if case["in_float32"]:
        y = g.add("Cast", [y], f"{p}_narrow", to=t)
    return y


def _norm(g: _Graph, p: str, x: str, case: dict) -> str:
    """The RMSNorm of x's heads (without weight, with one, or the L2 norm: ``case["norm"]``),
    in float32 as the models compute it (``x.float()``, then back to x's type)."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(case["dtype"]))
    wide = case["dtype"] != np.float32
    if wide:
        x = g.add("Cast", [x], f"{p}_xf", to=TensorProto.FLOAT)
    g.const(f"{p}_axes", [-1])
    square = g.add("Mul", [x, x], f"{p}_sq")
    reduce = "ReduceSum" if case["norm"] == "l2" else "ReduceMean"
    total = g.add(reduce, [square, f"{p}_axes"], f"{p}_ms")
    root = g.add("Sqrt", [g.add("Add", [total, "eps"], f"{p}_mse")], f"{p}_rms")
    y = g.add("Div", [x, root], f"{p}_normed")
    if case["norm"] == "rms_weight":
        g.inits[f"{p}_g"] = (np.random.default_rng(7).standard_normal(D) * 0.5 + 1).astype(
            np.float32
        )
        y = g.add("Mul", [y, f"{p}_g"], f"{p}_scaled")
    return g.add("Cast", [y], f"{p}_y", to=t) if wide else y


def _chain(g: _Graph, p: str, heads: int, case: dict) -> str:
    """One tensor's projection, view to heads, norm and rotary in the case's order, with the
    case's Transpose of the heads; returns the last value."""
    rng = np.random.default_rng(len(p) + heads)
    g.inits[f"{p}_w"] = (rng.standard_normal((HIDDEN, heads * D)) * 0.3).astype(case["dtype"])
    g.const(f"{p}_shape", [0, 0, heads, D])
    x = g.add("Reshape", [g.add("MatMul", ["h", f"{p}_w"], f"{p}_proj"), f"{p}_shape"], f"{p}_x")
    perm = {"perm": [0, 2, 1, 3]}
    if case["transpose"] == "before":
        x = g.add("Transpose", [x], f"{p}_heads", **perm)
    first, second = (_rotary, _norm) if case["first"] else (_norm, _rotary)
    y = first(g, p, x, case)
    if case["transpose"] == "between":
        y = g.add("Transpose", [y], f"{p}_between", **perm)
    return second(g, p, y, case)


def _head_axis(case: dict) -> int:
    """The axis of the heads where the rotary computes: [b, h, s, d] after a Transpose."""
    rotary_then = case["first"] and case["transpose"] == "between"
    return 1 if case["transpose"] and not rotary_then else 2


def _angles(case: dict) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [1, S, rotary], one angle per value: a pair's two values share theirs."""
    width = case["rotary"]
    pair = np.arange(width) // 2 if case["interleaved"] else np.arange(width) % (width // 2)
    freqs = np.arange(S)[:, None] / (10000 ** (2 * pair / width))
    return np.cos(freqs)[None], np.sin(freqs)[None]


def _model(case: dict, k_case: dict | None = None) -> onnx.ModelProto:
    """Q and K of one hidden state, each through the case's chain (K: ``k_case``'s, of the same
    type and angles, where given)."""
    t = np.dtype(case["dtype"])
    elem = helper.np_dtype_to_tensor_dtype(t)
    angle_type = np.float32 if case["in_float32"] else case["dtype"]
    g = _Graph()
    g.inits["eps"] = np.array(EPS, np.float32)
    inputs = [helper.make_tensor_value_info("h", elem, ["batch", "seq", HIDDEN])]
    cos, sin = _angles(case)
    axis = _head_axis(case)
    if case["folded"]:  # angles an exporter folded into constants, 1 at the head axis
        g.inits["cos_u"] = np.expand_dims(cos, axis).astype(angle_type)
        g.inits["sin_u"] = np.expand_dims(sin, axis).astype(angle_type)
        inputs[0] = helper.make_tensor_value_info("h", elem, [B, S, HIDDEN])
    else:
        angle_elem = helper.np_dtype_to_tensor_dtype(np.dtype(angle_type))
        for name in ("cos", "sin"):
            inputs.append(
                helper.make_tensor_value_info(name, angle_elem, [1, "seq", case["rotary"]])
            )
            g.add("Unsqueeze", [name, g.const(f"{name}_axis", [axis])], f"{name}_u")
    outputs = [_chain(g, "q", H, case), _chain(g, "k", KH, k_case or case)]
    values = [helper.make_tensor_value_info(name, elem, None) for name in outputs]
    tensors = [numpy_helper.from_array(v, n) for n, v in g.inits.items()]
    graph = helper.make_graph(g.nodes, "qk", inputs, values, tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _case(
    *,
    first: bool = True,
    interleaved: int = 0,
    negated: bool = False,
    transpose: str | None = None,
    rotary: int = D,
    folded: bool = False,
    dtype=np.float32,
    in_float32: bool = False,
    norm: str = "rms",
) -> dict:
    """A hand-built case: rotary first or not, the partner's form and sign, the Transpose of
    the heads ("before" the rotary, "between" the two, None), the values rotated, the angles
    folded into constants or not, the type, the rotation in float32, the norm."""
    return dict(locals())


CASES = [
    # Llama 4: interleaved pairs rotated in float32, then the weightless norm
    _case(interleaved=1),
    _case(interleaved=1, dtype=np.float16, in_float32=True),
    _case(interleaved=1, transpose="between", dtype=np.float16, in_float32=True, folded=True),
    # nanochat: the heads transposed, rotated in the model's type by minus the angle
    _case(transpose="before", negated=True),
    _case(transpose="before", negated=True, dtype=np.float16),
    _case(transpose="before", negated=True, folded=True),
    # the other spellings
    _case(transpose="between"),
    _case(transpose="between", dtype=np.float16),
    _case(interleaved=1, negated=True, transpose="between", folded=True, dtype=np.float16),
    _case(rotary=8, transpose="before"),
    _case(rotary=8, interleaved=1, dtype=np.float16, in_float32=True),
    _case(norm="l2", transpose="between"),
    _case(norm="rms_weight", interleaved=1, negated=True),
    # a rotation by minus the angle after the norm
    _case(first=False, negated=True, transpose="between"),
    _case(first=False, negated=True, interleaved=1, folded=True, dtype=np.float16),
]


def _case_id(case: dict) -> str:
    parts = [
        "rotfirst" if case["first"] else "normfirst",
        "interleaved" if case["interleaved"] else "half",
        *(["negated"] if case["negated"] else []),
        case["transpose"] or "untransposed",
        *([f"rotary{case['rotary']}"] if case["rotary"] < D else []),
        "folded" if case["folded"] else "unsqueezed",
        np.dtype(case["dtype"]).name + ("-in-float32" if case["in_float32"] else ""),
        case["norm"],
    ]
    return "-".join(parts)


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _expected_ops(case: dict, op: str) -> collections.Counter:
    """Every node of the fused graph: the projections and their views, one rotary node of Q
    and K, the views of folded angles, and where the rotation is by minus the angle one Neg
    of the angles it reads (folded angles: a negated constant, no node)."""
    expected = collections.Counter({("", "MatMul"): 2, ("", "Reshape"): 2, ("onnxnorm", op): 1})
    if case["folded"]:  # Cos and Sin, [1, S, 1, dim], viewed as [1, S, dim]
        expected.update({("", "Reshape"): 2, ("", "Constant"): 2})
    elif case["negated"]:
        expected[("", "Neg")] += 1
    return expected


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_rotary_and_norm_become_one_node(case):
    model = _model(case)
    fused, report = fuse(model, "function")
    op = "L2NormRotary" if case["norm"] == "l2" else "RMSNormRotary"
    ops = collections.Counter((n.domain, n.op_type) for n in fused.graph.node)
    assert ops == _expected_ops(case, op), (ops, str(report))
    (node,) = [n for n in fused.graph.node if n.op_type == op]
    attrs = _attributes(node)
    assert len([o for o in node.output if o]) == 2  # Q and K in one node
    assert attrs.get("rotary_first", 0) == int(case["first"])
    assert attrs.get("interleaved", 0) == case["interleaved"]
    assert attrs.get("layout", 0) == (2 if case["transpose"] else 0)
    assert attrs.get("rotary_dim", 0) == (0 if case["rotary"] == D else case["rotary"])
    in_t = case["dtype"] != np.float32 and not case["in_float32"]
    assert attrs.get("rotary_in_t", 0) == int(in_t)
    checks = verify(model, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_the_rotary_stage_alone_fuses_each_case(case):
    """What ``onnxnorm.export`` gives the rotary stage (the norms already onnxnorm nodes, the
    rotary the model's own ops, before or after them): ``may_fuse_rotary`` lets it through
    (the rotary's last op, an Add of two Muls or the Concat of a partial rotary, meets the norm
    through views) and ``fuse_rotary`` makes the one rotary node of Q and K."""
    from onnxnorm.fusion import pipeline, without_stages

    # (without the skip stage too, which would take the rotary's Add into the norm)
    with without_stages("rotary", "skip"):
        normed, _ = fuse(_model(case), "function")
    assert pipeline.may_fuse_rotary(normed)
    fused, report = pipeline.fuse_rotary(normed)
    op = "L2NormRotary" if case["norm"] == "l2" else "RMSNormRotary"
    ops = collections.Counter(n.op_type for n in fused.graph.node if n.domain == "onnxnorm")
    assert ops == {op: 1}, str(report)


@pytest.mark.parametrize("case", [c for c in CASES if c["dtype"] == np.float16], ids=_case_id)
def test_half_precision_nodes_give_the_graphs_values_bit_for_bit(case):
    """In float16 the fused node gives what the original graph means op by op (onnx's
    reference evaluator: each product and sum rounded to float16 where the model rotates in
    float16, minus the angle exactly), bit for bit but for rare ties of float32 values that
    the two compute in another order. ONNX Runtime 1.32's CPU provider does not round each
    step of a float16 chain of Mul and Add to float16, so the original as it runs there
    differs from both by a unit in the last place in up to 40% of the values: ``verify``
    holds it to a tolerance."""
    from onnx.reference import ReferenceEvaluator

    from onnxnorm.fusion.verify import generate_inputs

    model = _model(case)
    fused, _ = fuse(model, "function")
    feeds = generate_inputs(model, seed=3, sizes={"batch": 2, "seq": 64})
    want = ReferenceEvaluator(model).run(None, feeds)
    got = _session(fused).run(None, feeds)
    equal = sum(int((w == g).sum()) for w, g in zip(want, got, strict=True))
    assert equal >= 0.995 * sum(w.size for w in want)
    for w, g in zip(want, got, strict=True):  # the rest a unit apart at most
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-3)


def _session(model: onnx.ModelProto):
    import onnxruntime as ort

    from onnxnorm import runtime

    options = ort.SessionOptions()
    runtime.register(options)
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def test_negated_constant_angles_are_one_initializer_for_q_and_k():
    """Folded angles of a rotation by minus the angle: the node reads one negated copy of Sin,
    its values minus the model's."""
    case = _case(transpose="before", negated=True, folded=True)
    model = _model(case)
    fused, _ = fuse(model, "function")
    (node,) = [n for n in fused.graph.node if n.op_type == "RMSNormRotary"]
    inits = {t.name: numpy_helper.to_array(t) for t in fused.graph.initializer}
    views = {n.output[0]: n.input[0] for n in fused.graph.node if n.op_type == "Reshape"}
    sin = views.get(node.input[5], node.input[5])
    assert len([name for name in inits if name.endswith("/negated")]) == 1
    given = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(inits[sin], -given["sin_u"])


def test_a_rotary_read_outside_its_norm_is_left_with_the_reason():
    case = _case(interleaved=1)
    model = _model(case)
    model.graph.output.append(helper.make_tensor_value_info("q_turned", TensorProto.FLOAT, None))
    fused, report = fuse(model, "function")
    ops = collections.Counter(n.op_type for n in fused.graph.node if n.domain == "onnxnorm")
    assert ops["RMSNormRotary"] == 1  # K alone
    assert "q_turned" in str(report) and "graph output" in str(report)
    checks = verify(model, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


def test_a_rotary_first_node_is_not_paired_with_a_norm_first_one():
    """Q rotated then normalized, K normalized then rotated, by the same angles: two nodes of
    one tensor each."""
    model = _model(_case(), k_case=_case(first=False))
    fused, report = fuse(model, "function")
    nodes = [n for n in fused.graph.node if n.op_type == "RMSNormRotary"]
    assert sorted(_attributes(n).get("rotary_first", 0) for n in nodes) == [0, 1], str(report)
    assert all(len([o for o in n.output if o]) == 1 for n in nodes)
    checks = verify(model, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


# ---------------------------------------------------------------------------------------------
# Exports


def _llama4_attention():
    """A tiny two-layer stack of Llama 4's attention with its rotary in real arithmetic: the
    complex product (a + ib)(cos + i sin) of each pair is (a cos - b sin, a sin + b cos), so
    ``x * cos + pairs(x) * sin`` with each pair's angle repeated, computed in float32 and
    rounded back (``view_as_complex(xq.float())``, ``type_as``), then the weightless RMSNorm in
    float32 (``Llama4TextL2Norm``), then the transpose to [b, h, s, d]."""
    import torch

    hidden, heads, kv_heads, head = 64, 4, 2, 16

    def pairs(x):
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

    def norm(x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x)

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = torch.nn.Linear(hidden, heads * head, bias=False)
            self.k_proj = torch.nn.Linear(hidden, kv_heads * head, bias=False)
            self.v_proj = torch.nn.Linear(hidden, kv_heads * head, bias=False)
            self.o_proj = torch.nn.Linear(heads * head, hidden, bias=False)

        def forward(self, h, cos, sin):
            b, s, _ = h.shape
            q = self.q_proj(h).view(b, s, -1, head)
            k = self.k_proj(h).view(b, s, -1, head)
            v = self.v_proj(h).view(b, s, -1, head).transpose(1, 2)

            def rotate(x):
                xf = x.float()
                return (xf * cos + pairs(xf) * sin).type_as(x)

            q = norm(rotate(q)).transpose(1, 2)
            k = norm(rotate(k)).transpose(1, 2).repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            weights = torch.softmax(q @ k.transpose(2, 3) / head**0.5, dim=-1)
            return h + self.o_proj((weights @ v).transpose(1, 2).reshape(b, s, heads * head))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])
            inv_freq = 1.0 / (500000.0 ** (torch.arange(0, head, 2).float() / head))
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def forward(self, h):
            positions = torch.arange(h.shape[1], device=h.device)[None].float()
            freqs = positions[..., None] * self.inv_freq  # [1, s, head / 2], float32
            freqs = torch.stack((freqs, freqs), dim=-1).flatten(-2)  # each pair's angle twice
            cos, sin = freqs.cos().unsqueeze(2), freqs.sin().unsqueeze(2)
            for layer in self.layers:
                h = layer(h, cos, sin)
            return h

    torch.manual_seed(0)
    return Model().eval(), (torch.randn(2, 7, hidden),), ["h"]


def _nanochat():
    """transformers' NanoChat (2 layers): rotate_half is cat(x2, -x1), then F.rms_norm without
    weight, on [b, h, s, d] after the transpose."""
    import torch
    import transformers

    from onnxnorm.testing import hf

    if not hasattr(transformers, "NanoChatConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no NanoChat")
    config = transformers.NanoChatConfig(
        vocab_size=96,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        use_cache=False,
    )
    model = hf.model(config, "NanoChatModel")

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids, mask):
            return self.model(input_ids=ids, attention_mask=mask).last_hidden_state

    ids = torch.arange(2 * 7).reshape(2, 7) % 90
    return Hidden().eval(), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]


#: each model, the attributes of its rotary nodes, and the other onnxnorm nodes its norms become
MODELS = {
    "llama4": (
        _llama4_attention,
        {"interleaved": 1, "layout": 0, "rotary_in_t": 0},
        {},
    ),
    # the Transpose to [b, h, s, d] before the rotary taken in (layout 2); the decoder's norms
    # become RMSNorm (the embeddings', twice) and Skip ops
    "nanochat": (
        _nanochat,
        {"interleaved": 0, "layout": 2},
        {"RMSNorm": 2, "SkipRMSNorm": 4},
    ),
}


def _export(name: str, exporter: str, dtype: str) -> onnx.ModelProto:
    import torch

    from onnxnorm.nn.exporter import quiet_export

    module, inputs, names = MODELS[name][0]()
    module = module.to(getattr(torch, dtype))
    inputs = tuple(t.to(getattr(torch, dtype)) if t.is_floating_point() else t for t in inputs)
    with quiet_export(), torch.no_grad():
        if exporter == "dynamo":
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            program = torch.onnx.export(
                module,
                inputs,
                input_names=names,
                dynamo=True,
                opset_version=18,
                dynamic_shapes=tuple({0: batch, 1: seq} for _ in inputs),
            )
            return program.model_proto
        buffer = io.BytesIO()
        torch.onnx.export(
            module,
            inputs,
            buffer,
            input_names=names,
            dynamo=False,
            opset_version=17,
            dynamic_axes={n: {0: "batch", 1: "seq"} for n in names},
        )
        return onnx.load_from_string(buffer.getvalue())


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, exporter, dtype",
    [(n, e, "float32") for n in MODELS for e in ("dynamo", "torchscript")]
    + [(n, "dynamo", "float16") for n in MODELS],
)
def test_exports_fuse_each_layer_into_one_rotary_first_node(name, exporter, dtype):
    """Each of the two layers' rotary and norm of Q and K become one node with both, rotary
    first; every norm is fused; the only Neg left negates the angles a node reads (nanochat's
    rotation by minus the angle); the fused model gives the original's outputs."""
    pytest.importorskip("transformers")
    model = _export(name, exporter, dtype)
    fused, report = fuse(model, "function")
    _, attrs, others = MODELS[name]
    ours = collections.Counter(n.op_type for n in fused.graph.node if n.domain == "onnxnorm")
    assert ours == collections.Counter({"RMSNormRotary": 2, **others}), str(report)
    rotary = [n for n in fused.graph.node if n.op_type == "RMSNormRotary"]
    in_t = name == "nanochat" and dtype == "float16"
    for node in rotary:
        assert len([o for o in node.output if o]) == 2, str(report)
        got = _attributes(node)
        assert got["rotary_first"] == 1
        assert {k: got.get(k, 0) for k in attrs} == attrs
        assert got.get("rotary_in_t", 0) == int(in_t)
    sines = {n.input[5] for n in rotary}
    negations = [n for n in fused.graph.node if n.op_type == "Neg"]
    assert all(n.output[0] in sines for n in negations)
    assert len(negations) == (2 if name == "nanochat" else 0)
    left = {n.op_type for n in fused.graph.node} & {"ReduceMean", "Sqrt", "Reciprocal"}
    assert not left, left  # every norm fused
    checks = verify(model, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]

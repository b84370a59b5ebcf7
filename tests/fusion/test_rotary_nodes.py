"""A Q/K norm and the RotaryEmbedding node after it (ONNX Runtime's com.microsoft op and ONNX's,
opset 23) fused into one rotary op, Q and K in one node (onnxnorm/fusion/rotary_nodes.py): on
hand-built graphs of each form (onnxruntime-genai's builder's rows of [batch, seq * heads, head]
viewed back as a 3-D [batch, seq, heads * head]; the 4-D [batch, heads, seq, head] input, with
the Transpose after the norm or before it; a norm over the whole token), both cache forms,
partial and interleaved rotations, float32 and float16, a rotation in float32 between Casts.
The fused graph holds the expected ops and gives what ONNX Runtime gives for the original
(float16 nearly all bit for bit); what cannot be exact is left with the reason; a model the
lowering wrote with RotaryEmbedding fuses back into the rotary op."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxnorm.fusion import fuse
from onnxnorm.fusion.lowering import lower
from tests.support.helpers import run

B, S, H, KH, D, HIDDEN, POSITIONS = 2, 24, 4, 2, 32, 64, 64
MS = "com.microsoft"
RULE = "Q/K norm and RotaryEmbedding"
PAIRED = "Q/K norm and rotary: Q and K in one node"
#: the share of float16 values ONNX Runtime's graph and the fused op must give bit for bit
BIT_EXACT = 0.995


def _const(nodes: list, name: str, values) -> str:
    tensor = numpy_helper.from_array(np.array(values, np.int64), name)
    nodes.append(helper.make_node("Constant", [], [name], value=tensor))
    return name


def _angles(rotary: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of one angle per rotated pair: [rows, rotary / 2]."""
    inv = 1.0 / 10000 ** (np.arange(0, rotary, 2) / rotary)
    angle = np.arange(rows)[:, None] * inv[None, :]
    return np.cos(angle), np.sin(angle)


def _chain(prefix: str, heads: int, case: dict, nodes: list, inits: dict) -> str:
    """Projection, norm, views and RotaryEmbedding of Q or K; the graph output's name."""
    t, form, rotary = case["dtype"], case["form"], case["rotary"]
    rng = np.random.default_rng(len(prefix) + 3)
    width = heads * D
    inits[f"{prefix}_w"] = (rng.standard_normal((HIDDEN, width)) / 8).astype(t)
    nodes.append(helper.make_node("MatMul", ["h", f"{prefix}_w"], [f"{prefix}_proj"]))
    value = f"{prefix}_proj"
    if form == "genai":  # the builder's rows of one head each
        shape = _const(nodes, f"{prefix}_rows", [0, -1, D])
    elif form != "token":
        shape = _const(nodes, f"{prefix}_rows", [0, 0, heads, D])
    if form != "token":
        nodes.append(helper.make_node("Reshape", [value, shape], [f"{prefix}_x"]))
        value = f"{prefix}_x"
    if form == "heads-first":
        nodes.append(helper.make_node("Transpose", [value], [f"{prefix}_xt"], perm=[0, 2, 1, 3]))
        value = f"{prefix}_xt"
    size = width if form == "token" else D
    weights = rng.standard_normal(size) * 0.4 + 1 if case.get("weights", True) else np.ones(size)
    inits[f"{prefix}_g"] = weights.astype(t)
    norm = [value, f"{prefix}_g"]
    if case["norm"] == "layer":
        inits[f"{prefix}_b"] = (rng.standard_normal(size) * 0.2 * (weights != 1)).astype(t)
        norm.append(f"{prefix}_b")
    op = "LayerNormalization" if case["norm"] == "layer" else "SimplifiedLayerNormalization"
    nodes.append(helper.make_node(op, norm, [f"{prefix}_n"], axis=-1, epsilon=1e-6))
    value = f"{prefix}_n"
    if form == "genai":
        _const(nodes, f"{prefix}_flat", [0, -1, width])
        nodes.append(helper.make_node("Reshape", [value, f"{prefix}_flat"], [f"{prefix}_v"]))
        value = f"{prefix}_v"
    elif form == "transposed":
        nodes.append(helper.make_node("Transpose", [value], [f"{prefix}_t"], perm=[0, 2, 1, 3]))
        value = f"{prefix}_t"
    if case["float32"]:
        nodes.append(helper.make_node("Cast", [value], [f"{prefix}_f"], to=TensorProto.FLOAT))
        value = f"{prefix}_f"
    three_d = form in ("genai", "token")
    attrs = {"interleaved": case["interleaved"]}
    if rotary != D:
        attrs["rotary_embedding_dim"] = rotary
    if (three_d and case["domain"] == "") or (case["domain"] == MS and rotary != D):
        attrs["num_heads"] = heads  # (ONNX Runtime's op needs it for a partial rotation)
    attrs.update(case.get("attrs", {}))
    if case["domain"] == MS:
        inputs = [value, case.get("ids", "position_ids"), "cos", "sin"]
    else:
        inputs = [value, "cos", "sin"] + (["position_ids"] if case["cache"] == "ids" else [])
    out = f"{prefix}_rope" if case["float32"] else f"{prefix}_y"
    nodes.append(helper.make_node("RotaryEmbedding", inputs, [out], domain=case["domain"], **attrs))
    if case["float32"]:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(t))
        nodes.append(helper.make_node("Cast", [out], [f"{prefix}_y"], to=elem))
    return f"{prefix}_y"


def _model(**given) -> onnx.ModelProto:
    case = {
        "domain": MS,
        "form": "genai",
        "norm": "rms",
        "cache": "ids",
        "rotary": D,
        "interleaved": 0,
        "dtype": np.float32,
        "float32": False,
        **given,
    }
    t = case["dtype"]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(t))
    angle_type = np.float32 if case["float32"] else t
    angle_elem = helper.np_dtype_to_tensor_dtype(np.dtype(angle_type))
    nodes: list = []
    inits: dict = {}
    inputs = [helper.make_tensor_value_info("h", elem, ["batch", "seq", HIDDEN])]
    half = case["rotary"] // 2
    if case["cache"] == "ids":
        cos, sin = _angles(case["rotary"], POSITIONS)
        inits["cos"], inits["sin"] = cos.astype(angle_type), sin.astype(angle_type)
        ids = case.get("ids_shape", ["batch", "seq"])
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ids))
    else:  # ONNX's per-token caches
        inputs += [
            helper.make_tensor_value_info(n, angle_elem, ["batch", "seq", half])
            for n in ("cos", "sin")
        ]
    outputs = [_chain(p, n, case, nodes, inits) for p, n in (("q", H), ("k", KH))]
    graph = helper.make_graph(
        nodes,
        "qk_rope",
        inputs,
        [helper.make_tensor_value_info(o, elem, None) for o in outputs],
        [numpy_helper.from_array(v, n) for n, v in inits.items()],
    )
    imports = [helper.make_opsetid("", 23), helper.make_opsetid(MS, 1)]
    model = helper.make_model(graph, opset_imports=imports, ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Hidden states and, per token, a position gathered at random, or its angles."""
    rng = np.random.default_rng(11)
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    t = helper.tensor_dtype_to_np_dtype(types["h"])
    feeds = {"h": rng.standard_normal((B, S, HIDDEN)).astype(t)}
    if "position_ids" in types:
        feeds["position_ids"] = rng.integers(0, POSITIONS, (B, S)).astype(np.int64)
    if "cos" in types:
        angle = rng.uniform(-40, 40, (B, S, _half(model)))
        angle_t = helper.tensor_dtype_to_np_dtype(types["cos"])
        feeds["cos"], feeds["sin"] = np.cos(angle).astype(angle_t), np.sin(angle).astype(angle_t)
    return feeds


def _half(model: onnx.ModelProto) -> int:
    (cos,) = [i for i in model.graph.input if i.name == "cos"]
    return cos.type.tensor_type.shape.dim[2].dim_value


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(
        (n.domain, n.op_type) for n in model.graph.node if n.op_type != "Constant"
    )


def _rotary_node(model: onnx.ModelProto) -> tuple[onnx.NodeProto, dict]:
    (node,) = [n for n in model.graph.node if n.domain == "onnxnorm"]
    return node, {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _assert_same(original, fused) -> None:
    """Fused (onnxnorm's kernel) against the original in ONNX Runtime: float32 within 2e-5,
    float16 :data:`BIT_EXACT` of the values bit for bit and the rest within 2e-3."""
    feeds = _feeds(original)
    want = run(original, feeds)
    got = run(fused, feeds, with_library=True)
    same = []
    for w, g in zip(want, got):
        assert w.shape == g.shape and w.dtype == g.dtype
        if w.dtype == np.float32:
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
        else:
            np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), 2e-3, 2e-3)
        same.append(np.mean(w == g))
    share = float(np.mean(same))
    if want[0].dtype == np.float16:
        assert share >= BIT_EXACT, f"{share:.4%} of the values bit for bit"


def _fused_ok(model: onnx.ModelProto, op: str = "RMSNormRotary") -> tuple[onnx.ModelProto, dict]:
    """Fuses ``model``: one ``op`` node with Q and K, no RotaryEmbedding left."""
    fused, report = fuse(model, "fused")
    node, attrs = _rotary_node(fused)
    assert node.op_type == op, _ops(fused)
    assert len([o for o in node.output if o]) == 2, str(report)  # Q and K in one node
    assert report[RULE].fused == 2 and report[PAIRED].fused == 1, str(report)
    assert not [n for n in fused.graph.node if n.op_type == "RotaryEmbedding"]
    return fused, attrs


RESHAPE, TRANSPOSE = ("", "Reshape"), ("", "Transpose")
#: name: (the graph, the fused node's attributes, the ops left beside the projections and the
#: fused node: the views before the norm that the node's Q reads through)
CASES = {
    # onnxruntime-genai's model builder: the 3-D input, both views around the norm taken in
    "genai": ({}, {"layout": 0}, {}),
    "genai-partial-interleaved": (
        {"rotary": 8, "interleaved": 1},
        {"layout": 0, "rotary_dim": 8, "interleaved": 1},
        {},
    ),
    "onnx-genai-per-token": ({"domain": "", "cache": "token"}, {"layout": 0}, {}),
    "heads-first": ({"form": "heads-first"}, {"layout": 1}, {RESHAPE: 2, TRANSPOSE: 2}),
    "onnx-transposed-partial": (
        {"domain": "", "form": "transposed", "rotary": 16},
        {"layout": 2, "rotary_dim": 16},
        {RESHAPE: 2},
    ),
    "onnx-heads-first-per-token-interleaved": (
        {"domain": "", "form": "heads-first", "cache": "token", "interleaved": 1},
        {"layout": 1, "interleaved": 1},
        {RESHAPE: 2, TRANSPOSE: 2},
    ),
    "token-norm": ({"form": "token"}, {"layout": 0, "per_head": 0}, {}),
    "layer-norm": ({"norm": "layer", "form": "transposed"}, {"layout": 2}, {RESHAPE: 2}),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@pytest.mark.parametrize("name", list(CASES))
def test_norm_and_rotary_embedding_become_one_node(name, dtype):
    given, expected, views = CASES[name]
    model = _model(**given, dtype=dtype)
    op = "LayerNormRotary" if given.get("norm") == "layer" else "RMSNormRotary"
    fused, attrs = _fused_ok(model, op)
    assert attrs.get("rotary_in_t", 0) == 0
    # a 3-D Q (layout 0) needs head_size
    defaults = {"head_size": D if expected["layout"] == 0 else 0, "per_head": 1}
    for key, value in {**defaults, **expected}.items():
        assert attrs.get(key, 0) == value, (key, attrs)
    assert _ops(fused) == {("", "MatMul"): 2, ("onnxnorm", op): 1, **views}
    _assert_same(model, fused)


@pytest.mark.parametrize("domain", [MS, ""], ids=["ort", "onnx"])
def test_rotation_in_float32_between_casts(domain):
    """A float16 norm's output cast to float32, rotated with float32 caches and cast back: the
    Casts are taken in (the op rotates in float32 and rounds once either way)."""
    model = _model(domain=domain, form="transposed", dtype=np.float16, float32=True)
    fused, attrs = _fused_ok(model)
    assert attrs["layout"] == 2
    assert _ops(fused) == {("", "MatMul"): 2, ("onnxnorm", "RMSNormRotary"): 1, RESHAPE: 2}
    _assert_same(model, fused)


@pytest.mark.slow
@pytest.mark.parametrize("precision, provider", [("fp16", "cpu"), ("int4", "dml")])
def test_genai_builder_qwen3(tmp_path, precision, provider):
    """What onnxruntime-genai's model builder writes for Qwen3 in float16 for the CPU, and in
    int4 for DirectML (its projections MatMulNBits): the rotation a RotaryEmbedding node of its
    own before the attention. Each layer's Q/K norms and rotations become one node, and
    the model's outputs stay (the first layer's keys bit for bit)."""
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime_genai")
    import contextlib
    import io

    from models import pipelines
    from onnxnorm.fusion.verify import verify
    from onnxnorm.testing import hf

    checkpoint = pipelines.genai_checkpoint("qwen3", tmp_path / "hf")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        folder = hf.genai_build(checkpoint, tmp_path / precision, precision, provider)
    model = onnx.load(folder / "model.onnx")
    assert _ops(model)[(MS, "RotaryEmbedding")] == 4
    fused, report = fuse(model, "fused")
    nodes = [n for n in fused.graph.node if n.op_type == "RMSNormRotary"]
    assert len(nodes) == 2 and all(len(n.output) == 2 for n in nodes), str(report)
    assert not _ops(fused)[(MS, "RotaryEmbedding")]
    if provider != "cpu":  # (its GroupQueryAttention's cache layout is DirectML's)
        return
    checks = verify(model, fused, sizes={"past_sequence_length": 0})
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]
    # the first layer's keys: the fused node alone between the hidden state and the cache
    (key,) = [c for c in checks if c.name == "present.0.key"]
    assert key.max_abs == 0, str(key)


def _rejected(model: onnx.ModelProto) -> list[str]:
    """The reasons the rule gave for leaving the model's RotaryEmbeddings, which stay."""
    fused, report = fuse(model, "fused")
    assert [n.op_type for n in fused.graph.node if n.op_type == "RotaryEmbedding"] == [
        "RotaryEmbedding"
    ] * 2, str(report)
    assert report[RULE].fused == 0
    return [s.reason for s in report[RULE].skips]


@pytest.mark.parametrize(
    "given, reason",
    [
        ({"attrs": {"scale": 2.0}}, "scale is 2.0"),
        ({"attrs": {"is_packed_batching": 1}}, "is_packed_batching = 1"),
        ({"ids_shape": [1]}, "offset added to each token's index"),
        ({"rotary": 16, "attrs": {"rotary_embedding_dim": 8}}, "cos_cache holds 8 angles"),
        ({"domain": "", "attrs": {"num_heads": 1, "rotary_embedding_dim": D}}, "neither the"),
    ],
    ids=["scale", "packed", "offset-ids", "cache-width", "norm-axis"],
)
def test_what_cannot_be_exact_is_left_with_the_reason(given, reason):
    reasons = _rejected(_model(**given))
    assert len(reasons) == 2 and all(reason in r for r in reasons), reasons


def test_a_norm_read_elsewhere_is_left_with_the_reason():
    model = _model()
    model.graph.output.append(helper.make_tensor_value_info("q_n", TensorProto.FLOAT, None))
    fused, report = fuse(model, "fused")
    assert [n.op_type for n in fused.graph.node if n.domain == "onnxnorm"].count(
        "RMSNormRotary"
    ) == 1  # K alone
    assert any("'q_n' is a graph output" in s.reason for s in report[RULE].skips), str(report)
    _assert_same(model, fused)


@pytest.mark.parametrize(
    "target, given",
    [
        (target, {**given, "weights": weights})
        for target in ("ort", "onnx")
        for weights in (False, True)
        for given in (
            {},
            {"form": "transposed", "rotary": 16, "interleaved": 1},
            {"form": "heads-first", "dtype": np.float16},
            {"form": "token", "dtype": np.float16},
            {"norm": "layer", "dtype": np.float16},
        )
    ]
    # ONNX Runtime's op takes no per-token caches: the lowering inlines the node there
    + [("onnx", {"domain": "", "cache": "token", "dtype": np.float16, "weights": False})]
    + [(t, {"dtype": np.float16}) for t in ("ort", "onnx")],
    ids=lambda v: (
        v
        if isinstance(v, str)
        else "-".join(f"{k}={getattr(x, '__name__', x)}" for k, x in v.items())
    ),
)
def test_lowered_model_fuses_back(target, given):
    """fuse -> lower (ONNX Runtime's or ONNX's norm op and RotaryEmbedding) -> fuse gives the
    rotary op again, with the same attributes, and the values of the lowered model."""
    model = _model(**given)
    op = "LayerNormRotary" if given.get("norm") == "layer" else "RMSNormRotary"
    fused, attrs = _fused_ok(model, op)
    lowered = lower(fused, target)
    assert [n.op_type for n in lowered.graph.node].count("RotaryEmbedding") == 2
    assert not [n for n in lowered.graph.node if n.domain == "onnxnorm"]
    again, attrs_again = _fused_ok(lowered, op)
    assert attrs_again == attrs
    _assert_same(lowered, again)

"""The Q/K norm and its rotary fused into one rotary op (onnxnorm/fusion/rotary.py), Q and K in
one node: on hand-built graphs of each spelling (half-split and interleaved partners, partial
rotary, the transpose between the norm and the rotary or none, angles unsqueezed or folded into
constants, float32 and float16), and on the exports of the Q/K-norm families (both exporters,
dynamic batch and sequence dims, float32 and float16).
Each fused model holds the expected nodes and matches the original in ONNX Runtime."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxnorm.fusion import fuse
from onnxnorm.fusion.verify import verify

B, S, H, KH, D = 2, 5, 4, 2, 16
HIDDEN = 32


def _const(name: str, values, dtype=np.int64) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.array(values, dtype), name)
    )


def _chain(prefix: str, source: str, heads: int, case: dict, nodes: list, inits: dict) -> str:
    """The nodes of one tensor's projection, RMSNorm, optional transpose and rotary; returns
    the rotary's output."""
    t = case["dtype"]
    rng = np.random.default_rng(len(prefix))
    inits[f"{prefix}_w"] = (rng.standard_normal((HIDDEN, heads * D)) * 0.3).astype(t)
    inits[f"{prefix}_g"] = (rng.standard_normal(D) * 0.5 + 1).astype(t)
    nodes += [
        helper.make_node("MatMul", [source, f"{prefix}_w"], [f"{prefix}_proj"]),
        _const(f"{prefix}_shape", [0, 0, heads, D]),
        helper.make_node("Reshape", [f"{prefix}_proj", f"{prefix}_shape"], [f"{prefix}_x"]),
        helper.make_node("Mul", [f"{prefix}_x", f"{prefix}_x"], [f"{prefix}_sq"]),
        _const(f"{prefix}_axes", [-1]),
        helper.make_node("ReduceMean", [f"{prefix}_sq", f"{prefix}_axes"], [f"{prefix}_ms"]),
        helper.make_node("Add", [f"{prefix}_ms", "eps"], [f"{prefix}_mse"]),
        helper.make_node("Sqrt", [f"{prefix}_mse"], [f"{prefix}_rms"]),
        helper.make_node("Div", [f"{prefix}_x", f"{prefix}_rms"], [f"{prefix}_n"]),
        helper.make_node("Mul", [f"{prefix}_n", f"{prefix}_g"], [f"{prefix}_normed"]),
    ]
    head = f"{prefix}_normed"
    if case["transpose"]:
        nodes.append(helper.make_node("Transpose", [head], [f"{prefix}_t"], perm=[0, 2, 1, 3]))
        head = f"{prefix}_t"
    rotated = head
    rotary = case["rotary"]
    if rotary < D:
        nodes += [
            _const(f"{prefix}_r0", [0]),
            _const(f"{prefix}_r1", [rotary]),
            _const(f"{prefix}_r2", [D]),
            _const(f"{prefix}_ax", [3]),
            helper.make_node(
                "Slice",
                [head, f"{prefix}_r0", f"{prefix}_r1", f"{prefix}_ax"],
                [f"{prefix}_rot"],
            ),
            helper.make_node(
                "Slice",
                [head, f"{prefix}_r1", f"{prefix}_r2", f"{prefix}_ax"],
                [f"{prefix}_pass"],
            ),
        ]
        rotated = f"{prefix}_rot"

    if case["interleaved"]:
        nodes += [
            _const(f"{prefix}_e0", [0]),
            _const(f"{prefix}_o0", [1]),
            _const(f"{prefix}_end", [rotary]),
            _const(f"{prefix}_ax3", [3]),
            _const(f"{prefix}_two", [2]),
            helper.make_node(
                "Slice",
                [rotated, f"{prefix}_e0", f"{prefix}_end", f"{prefix}_ax3", f"{prefix}_two"],
                [f"{prefix}_even"],
            ),
            helper.make_node(
                "Slice",
                [rotated, f"{prefix}_o0", f"{prefix}_end", f"{prefix}_ax3", f"{prefix}_two"],
                [f"{prefix}_odd"],
            ),
            helper.make_node("Neg", [f"{prefix}_odd"], [f"{prefix}_nodd"]),
            _const(f"{prefix}_last", [-1]),
            helper.make_node("Unsqueeze", [f"{prefix}_nodd", f"{prefix}_last"], [f"{prefix}_u1"]),
            helper.make_node("Unsqueeze", [f"{prefix}_even", f"{prefix}_last"], [f"{prefix}_u2"]),
            helper.make_node(
                "Concat", [f"{prefix}_u1", f"{prefix}_u2"], [f"{prefix}_stack"], axis=-1
            ),
            _const(f"{prefix}_flat", [0, 0, 0, rotary]),
            helper.make_node("Reshape", [f"{prefix}_stack", f"{prefix}_flat"], [f"{prefix}_p"]),
        ]
    else:
        nodes += [
            helper.make_node(
                "Split", [rotated], [f"{prefix}_x1", f"{prefix}_x2"], axis=-1, num_outputs=2
            ),
            helper.make_node("Neg", [f"{prefix}_x2"], [f"{prefix}_nx2"]),
            helper.make_node("Concat", [f"{prefix}_nx2", f"{prefix}_x1"], [f"{prefix}_p"], axis=-1),
        ]
    nodes += [
        helper.make_node("Mul", [rotated, "cos_u"], [f"{prefix}_c"]),
        helper.make_node("Mul", [f"{prefix}_p", "sin_u"], [f"{prefix}_s"]),
        helper.make_node("Add", [f"{prefix}_c", f"{prefix}_s"], [f"{prefix}_y0"]),
    ]
    if rotary < D:
        nodes.append(
            helper.make_node("Concat", [f"{prefix}_y0", f"{prefix}_pass"], [f"{prefix}_y"], axis=-1)
        )
        return f"{prefix}_y"
    return f"{prefix}_y0"


def _model(case: dict) -> onnx.ModelProto:
    t = case["dtype"]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(t))
    nodes: list = []
    inits: dict = {"eps": np.array(1e-6, t)}
    rotary = case["rotary"]
    head_axis = 1 if case["transpose"] else 2
    angles_shape = [1, 1, S, rotary] if head_axis == 1 else [1, S, 1, rotary]
    positions = np.arange(S)[:, None] / (10000 ** (np.arange(rotary) % (rotary // 2) / rotary))
    inputs = [helper.make_tensor_value_info("h", elem, [B, S, HIDDEN])]
    if case["folded"]:  # angles an exporter folded into constants
        inits["cos_u"] = np.cos(positions).reshape(angles_shape).astype(t)
        inits["sin_u"] = np.sin(positions).reshape(angles_shape).astype(t)
    else:
        inputs += [
            helper.make_tensor_value_info("cos", elem, [B, S, rotary]),
            helper.make_tensor_value_info("sin", elem, [B, S, rotary]),
        ]
        nodes += [
            _const("head_axis", [head_axis]),
            helper.make_node("Unsqueeze", ["cos", "head_axis"], ["cos_u"]),
            helper.make_node("Unsqueeze", ["sin", "head_axis"], ["sin_u"]),
        ]
    q = _chain("q", "h", H, case, nodes, inits)
    k = _chain("k", "h", KH, case, nodes, inits)
    outputs = [helper.make_tensor_value_info(name, elem, None) for name in (q, k)]
    graph = helper.make_graph(
        nodes, "qk", inputs, outputs, [numpy_helper.from_array(v, n) for n, v in inits.items()]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


CASES = [
    {"interleaved": 0, "rotary": D, "transpose": True, "folded": False, "dtype": np.float32},
    {"interleaved": 1, "rotary": D, "transpose": True, "folded": False, "dtype": np.float32},
    {"interleaved": 0, "rotary": 8, "transpose": True, "folded": False, "dtype": np.float32},
    {"interleaved": 1, "rotary": 8, "transpose": False, "folded": False, "dtype": np.float32},
    {"interleaved": 0, "rotary": D, "transpose": False, "folded": True, "dtype": np.float32},
    {"interleaved": 0, "rotary": D, "transpose": True, "folded": True, "dtype": np.float16},
    {"interleaved": 1, "rotary": 8, "transpose": True, "folded": False, "dtype": np.float16},
]


def _case_id(case: dict) -> str:
    parts = [
        "interleaved" if case["interleaved"] else "half",
        f"rotary{case['rotary']}",
        "transposed" if case["transpose"] else "untransposed",
        "folded" if case["folded"] else "unsqueezed",
        np.dtype(case["dtype"]).name,
    ]
    return "-".join(parts)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_qk_norm_and_rotary_become_one_node(case):
    model = _model(case)
    fused, report = fuse(model, "function")
    ops = collections.Counter((n.domain, n.op_type) for n in fused.graph.node)
    assert ops[("onnxnorm", "RMSNormRotary")] == 1, (ops, str(report))
    assert not ops[("onnxnorm", "RMSNorm")], str(report)
    (node,) = [n for n in fused.graph.node if n.op_type == "RMSNormRotary"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert len([o for o in node.output if o]) == 2  # Q and K in one node
    assert attrs.get("interleaved", 0) == case["interleaved"]
    assert attrs.get("rotary_dim", 0) == (0 if case["rotary"] == D else case["rotary"])
    assert attrs.get("layout", 0) == (2 if case["transpose"] else 0)
    assert attrs.get("rotary_in_t", 0) == int(case["dtype"] != np.float32)
    checks = verify(model, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


def test_a_norm_read_outside_its_rotary_is_left_with_the_reason():
    model = _model(CASES[0])
    model.graph.output.append(helper.make_tensor_value_info("q_normed", TensorProto.FLOAT, None))
    fused, report = fuse(model, "function")
    ops = collections.Counter(n.op_type for n in fused.graph.node if n.domain == "onnxnorm")
    assert ops["RMSNormRotary"] == 1  # K alone
    assert "q_normed" in str(report) and "graph output" in str(report)
    checks = verify(model, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


def test_without_the_rotary_stage_the_norms_stay_norm_ops():
    """``without_stages("rotary")`` (what ``bench e2e``'s onnxnorm-fused-norotary measures):
    the Q/K norms become RMSNorm nodes and the rotary stays as the model has it; the context
    ends with the stage back; a stage that does not exist is a clear error."""
    from onnxnorm.fusion import without_stages

    model = _model(CASES[0])
    with without_stages("rotary"):
        unrotated, _ = fuse(model, "function")
    ops = collections.Counter(n.op_type for n in unrotated.graph.node if n.domain == "onnxnorm")
    assert ops == {"RMSNorm": 2}
    checks = verify(model, unrotated)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]
    fused, _ = fuse(model, "function")
    assert [n.op_type for n in fused.graph.node if n.domain == "onnxnorm"] == ["RMSNormRotary"]
    with pytest.raises(ValueError, match="no fusion stage"), without_stages("rotation"):
        pass


def test_the_stage_names_are_the_stages_in_order():
    """``pipeline.STAGES``, the names ``without_stages`` checks without building any rule, are
    the stages ``stage_rules`` builds, in its order."""
    from onnxnorm.fusion import Tracker, pipeline

    assert tuple(name for name, _ in pipeline.stage_rules(Tracker())) == pipeline.STAGES


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_the_rotary_pre_check_passes_each_norm_and_rotary(case, monkeypatch):
    """What the export of a Qwen3-style attention gives ``fuse_rotary`` (its Q/K norms onnxnorm
    nodes, its rotary the model's own ops) passes ``may_fuse_rotary``, and becomes one node of
    Q and K; the decomposed graph, whose norms only the norms stage would make nodes, cannot
    fuse there: it is returned as it is, never prepared (no shape inference)."""
    from onnxnorm.fusion import pipeline, without_stages

    model = _model(case)
    with without_stages("rotary"):
        normed, _ = fuse(model, "function")
    assert pipeline.may_fuse_rotary(normed)
    fused, report = pipeline.fuse_rotary(normed)
    ops = collections.Counter(n.op_type for n in fused.graph.node if n.domain == "onnxnorm")
    assert ops == {"RMSNormRotary": 1}, str(report)

    def prepared(_):
        raise AssertionError("fuse_rotary prepared a model it cannot fuse")

    monkeypatch.setattr(pipeline, "_prepare", prepared)
    assert not pipeline.may_fuse_rotary(model)
    same, report = pipeline.fuse_rotary(model)
    assert same is model and not report.fused_total


def test_the_rotary_pre_check_reads_odd_graphs_without_failing():
    """The pre-check walks raw protos: a norm without outputs, a view without inputs and a
    residual Add (not a rotary's sum) before a norm answer no, and do not raise."""
    from onnx import helper

    from onnxnorm.fusion import pipeline

    nodes = [
        helper.make_node("Mul", ["a", "b"], ["m"]),
        helper.make_node("Slice", ["m", "s", "e"], ["sl"]),
        helper.make_node("Concat", ["sl", "sl"], ["c"], axis=-1),
        helper.make_node("Add", ["c", "x"], ["residual"]),
        helper.make_node("Reshape", [], ["viewed"]),
        helper.make_node("RMSNorm", ["residual"], ["y"], domain="onnxnorm"),
        helper.make_node("RMSNorm", ["viewed"], [], domain="onnxnorm"),
        helper.make_node("MatMul", ["y", "w"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "odd", [], [])
    assert not pipeline.may_fuse_rotary(helper.make_model(graph))


#: the Q/K-norm families of transformers (onnxnorm.testing.hf), the config each needs, and the
#: rotary op their norms become
FAMILIES = {
    "qwen3": ({}, "RMSNormRotary"),
    "gemma3": ({}, "RMSNormRotary"),
    "olmo2": ({}, "RMSNormRotary"),
    # (without grouped-query attention: TorchScript fails to export Cohere's repeat of K/V)
    "cohere": ({"use_qk_norm": True, "kv_heads": 4}, "LayerNormRotary"),
    "phi": ({"qk_layernorm": True, "partial_rotary_factor": 0.5}, "LayerNormRotary"),
}


def _export(family: str, exporter: str, dtype: str = "float32") -> onnx.ModelProto:
    import io

    import torch

    from onnxnorm.nn.exporter import quiet_export
    from onnxnorm.testing import hf

    overrides, _ = FAMILIES[family]
    config = hf.config(family, hidden=64, heads=4, **{"kv_heads": 2, **overrides})
    config.use_cache = False
    model = hf.model(config, "base").to(getattr(torch, dtype))

    class Hidden(torch.nn.Module):
        """The model called as exports call it (an explicit mask), its last hidden state."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids, mask):
            return self.model(input_ids=ids, attention_mask=mask).last_hidden_state

    ids = torch.arange(2 * 7).reshape(2, 7) % 90
    inputs = (ids, torch.ones_like(ids))
    names = ["input_ids", "attention_mask"]
    # dynamic batch and sequence dims, as users export
    with quiet_export(), torch.no_grad():
        if exporter == "dynamo":
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            program = torch.onnx.export(
                Hidden(),
                inputs,
                input_names=names,
                dynamo=True,
                opset_version=18,
                dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}),
            )
            return program.model_proto
        buffer = io.BytesIO()
        torch.onnx.export(
            Hidden(),
            inputs,
            buffer,
            input_names=names,
            dynamo=False,
            opset_version=17,
            dynamic_axes={name: {0: "batch", 1: "seq"} for name in names},
        )
        return onnx.load_from_string(buffer.getvalue())


#: float16 exports: the rotation in float16 (Qwen3), in float32 with float32 angles (OLMo 2)
#: and in float32 from float16 angles (Cohere)
_HALF = [("qwen3", "dynamo"), ("olmo2", "dynamo"), ("cohere", "dynamo"), ("olmo2", "torchscript")]


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, exporter, dtype",
    [
        (f, e, "float32")
        for f in FAMILIES
        for e in ("dynamo", "torchscript")
        if (f, e) != ("cohere", "torchscript")  # (not a valid model: the test after this one)
    ]
    + [(f, e, "float16") for f, e in _HALF],
)
def test_exported_families_fuse_each_layer_into_one_rotary_node(family, exporter, dtype):
    """Each of the two layers' Q/K norms and rotary become one node with Q and K, and the
    fused model gives the original's outputs."""
    pytest.importorskip("transformers")
    model = _export(family, exporter, dtype)
    fused, report = fuse(model, "function")
    op = FAMILIES[family][1]
    nodes = [n for n in fused.graph.node if n.domain == "onnxnorm" and n.op_type == op]
    assert len(nodes) == 2, str(report)
    assert all(len([o for o in n.output if o]) == 2 for n in nodes), str(report)
    checks = verify(model, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


@pytest.mark.slow
def test_torchscript_cohere_export_is_refused_with_its_reason():
    """TorchScript's export of Cohere's attention is not a valid model (torch 2.13, transformers
    5.25): the views of Q, K and V reshape the 64 projected values of a token to [2, 16] (the
    source's view is ``(*input_shape, -1, head_dim)``), so ONNX Runtime loads it but cannot run
    it at any shape. The fusion's CSE makes the conflict visible to shape inference (Q's and K's
    shapes become one value, against K's [4, 16] norm weight), and ``fuse`` refuses with
    OutputDoesNotLoad, saying why, instead of writing a model that does not load."""
    pytest.importorskip("transformers")
    import onnxruntime as ort

    from onnxnorm.errors import OutputDoesNotLoad

    model = _export("cohere", "torchscript")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.arange(2 * 7, dtype=np.int64).reshape(2, 7) % 90
    with pytest.raises(Exception, match="cannot be reshaped"):
        session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    with pytest.raises(
        OutputDoesNotLoad, match="does not load in ONNX Runtime, although the input"
    ):
        fuse(model, "function")

"""The Q/K norms of com.microsoft GroupQueryAttention (onnxruntime-genai's Qwen3 folders):
written --for ort-cuda into GroupQueryAttention's q_norm_weight / k_norm_weight where exact
(onnxnorm/fusion/gqa_writer.py), and for no other runtime or target; left where ONNX Runtime's
norm computes otherwise, with the reason; the rotation GroupQueryAttention does itself reported
as a near miss of the rotary ops (onnxnorm/fusion/rotary_gqa.py), with the measurement behind
that: the positions GroupQueryAttention derives.

No GPU here: the CPU tests check the graphs, and run the norm weights expanded back into the
SimplifiedLayerNormalization per head that ONNX Runtime's schema defines them as, against the
original (the wiring of every projection, weight and epsilon). The GPU test (tools/gpu_check.sh,
step gqa) runs the --for ort-cuda folder on ONNX Runtime's CUDA provider against the library's
norms."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime_genai")

from models import pipelines
from onnxnorm import runtime
from onnxnorm.fusion import fuse, gqa_writer, rotary_gqa
from onnxnorm.fusion.lowering import lower_with_notes
from onnxnorm.fusion.pipeline import fuse_ir
from onnxnorm.fusion.verify import generate_inputs, verify
from onnxnorm.genai import dim_sizes, read_config
from onnxnorm.targets import RUNTIMES, TARGETS
from tests.support.gpu import needs_ort_cuda

MS = "com.microsoft"
#: the norm weights' inputs of GroupQueryAttention
Q_W, K_W = gqa_writer.Q_NORM_WEIGHT, gqa_writer.K_NORM_WEIGHT


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("genai_gqa")
    return {p: pipelines.genai_folder("qwen3", p, root) for p in ("fp16", "fp32")}


def _gqas(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _has_norm_weights(node: onnx.NodeProto) -> bool:
    return len(node.input) > K_W and bool(node.input[Q_W]) and bool(node.input[K_W])


def unfold(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each GroupQueryAttention's norm weights written out as what ONNX Runtime's
    schema defines them to be: a per-head SimplifiedLayerNormalization of Q and of K (float32
    statistics) before the op, with qk_norm_epsilon; runs on the CPU provider, which refuses the
    inputs themselves."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    sizes = {t.name: list(t.dims) for t in out.graph.initializer}
    nodes = []
    for node in out.graph.node:
        if node.op_type == "GroupQueryAttention" and _has_norm_weights(node):
            eps = _attr(node, "qk_norm_epsilon", 1e-6)
            for index, heads in ((0, _attr(node, "num_heads")), (1, _attr(node, "kv_num_heads"))):
                weight = node.input[Q_W + index]
                (size,) = sizes[weight]
                base = f"{node.name}/unfolded{index}"
                for name, values in (
                    (f"{base}/heads", [0, -1, size]),
                    (f"{base}/back", [0, -1, heads * size]),
                ):
                    out.graph.initializer.append(
                        numpy_helper.from_array(np.array(values, np.int64), name)
                    )
                nodes += [
                    helper.make_node(
                        "Reshape", [node.input[index], f"{base}/heads"], [f"{base}/x"]
                    ),
                    helper.make_node(
                        "SimplifiedLayerNormalization",
                        [f"{base}/x", weight],
                        [f"{base}/y"],
                        axis=-1,
                        epsilon=eps,
                        stash_type=1,
                    ),
                    helper.make_node("Reshape", [f"{base}/y", f"{base}/back"], [f"{base}/out"]),
                ]
                node.input[index] = f"{base}/out"
            inputs = list(node.input[:Q_W]) + [""] * 2 + list(node.input[K_W + 1 :])
            while inputs and not inputs[-1]:
                inputs.pop()
            del node.input[:]
            node.input.extend(inputs)
            kept = [a for a in node.attribute if a.name != "qk_norm_epsilon"]
            del node.attribute[:]
            node.attribute.extend(kept)
        nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _ok(checks):
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


# -- the genai folders ------------------------------------------------------------------------
def test_genai_float16_norms_go_into_group_query_attention(folders):
    folder = folders["fp16"]
    original = onnx.load(folder / "model.onnx")
    fused, report = fuse(original, base_dir=str(folder), runtime="ort-cuda")
    assert report.norms == 9 and not report.lowering, str(report)
    weights = {t.name: t for t in fused.graph.initializer}
    gqas = _gqas(fused)
    assert len(gqas) == 2
    for layer, node in enumerate(gqas):
        assert node.input[:2] == [
            f"/model/layers.{layer}/attn/qkv_proj/Split/output_{i}" for i in (0, 1)
        ]
        for index, which in ((Q_W, "q"), (K_W, "k")):
            name = node.input[index]
            assert name == f"model.layers.{layer}.attn.{which}_norm.layernorm.weight"
            assert weights[name].data_type == TensorProto.FLOAT16 and list(weights[name].dims) == [
                16
            ]
        assert _attr(node, "do_rotary") == 1
        assert _attr(node, "qk_norm_epsilon") == pytest.approx(1e-6)
    # the Q/K norms and their views are gone; the other norms stay onnxnorm ops (the library)
    assert not [n for n in fused.graph.node if "_norm/" in n.name]
    ops = [n.op_type for n in fused.graph.node if n.domain == "onnxnorm"]
    assert sorted(ops) == ["RMSNorm"] + ["SkipRMSNorm"] * 4
    # the wiring: the weights expanded back into ONNX Runtime's definition of them, on the CPU
    sizes = dim_sizes(read_config(folder), original, past=16)
    _ok(verify(original, unfold(fused), sizes=sizes))


@pytest.mark.parametrize("runtime_or_target", [*(f"for {r}" for r in RUNTIMES), *TARGETS])
def test_only_ort_cuda_takes_them(folders, runtime_or_target):
    given = runtime_or_target.removeprefix("for ")
    is_runtime = runtime_or_target.startswith("for ")
    kwargs = {"runtime": given} if is_runtime else {"target": given}
    model = onnx.load(folders["fp16"] / "model.onnx")
    fused, _ = fuse(model, base_dir=str(folders["fp16"]), **kwargs)
    takes = is_runtime and gqa_writer.ATTENTION in RUNTIMES[given].forms["rms"]
    assert takes == (given == "ort-cuda")
    assert len(_gqas(fused)) == 2
    assert all(_has_norm_weights(n) == takes for n in _gqas(fused))


def test_genai_float32_norms_stay_with_the_reason(folders):
    model = onnx.load(folders["fp32"] / "model.onnx")
    fused, report = fuse(model, base_dir=str(folders["fp32"]), runtime="ort-cuda")
    assert not any(_has_norm_weights(n) for n in _gqas(fused))
    lines = [line for line in report.lowering if "_norm/" in line]
    assert len(lines) == 4, report.lowering
    assert all(
        "-> onnxnorm op: not attention: Q is float32: GroupQueryAttention's CUDA kernel takes "
        "float16 and bfloat16 only" in line
        for line in lines
    )


def test_cpu_provider_refuses_the_norm_weights(folders):
    """What the runtime table relies on, measured: ONNX Runtime's CPU GroupQueryAttention loads a
    node with norm weights but refuses to run it (so --for ort-cpu keeps the norms)."""
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    folder = folders["fp16"]
    original = onnx.load(folder / "model.onnx")
    fused, _ = fuse(original, base_dir=str(folder), runtime="ort-cuda")
    feeds = generate_inputs(original, 0, dim_sizes(read_config(folder), original, past=4))
    session = runtime.session(fused)
    with pytest.raises(InvalidArgument, match="q_norm_weight"):
        session.run(None, feeds)


# -- one GroupQueryAttention written by hand: where the norm goes in, and where it stays --------
H, N, KV, MAX = 16, 4, 2, 64
F16, BF16, F32 = TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT


def _gqa_model(
    t=F16,
    *,
    q=None,
    k=None,
    weight_type=None,
    weights=(1.0, 1.0),
    offset=0.0,
    view=("rows", "rows"),
    gqa=None,
    norm_output=False,
) -> onnx.ModelProto:
    """Q and K of a GroupQueryAttention each from an RMSNorm (attributes ``q`` / ``k``) between
    the head view ``view`` ("rows": [0, -1, H] and back [0, -1, hidden]; "4d": [0, 0, heads, H]
    and back [0, 0, -1]); weights of ``weight_type`` (X's by default; None: absent)."""
    np_t = helper.tensor_dtype_to_np_dtype(t)
    dims = {"q": N * H, "k": KV * H, "v": KV * H}
    inputs = [helper.make_tensor_value_info(n, t, ["b", "s", d]) for n, d in dims.items()]
    inputs += [helper.make_tensor_value_info(n, t, ["b", KV, "p", H]) for n in ("pk", "pv")]
    inputs += [
        helper.make_tensor_value_info("seqlens", TensorProto.INT32, ["b"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    angles = np.outer(np.arange(MAX), 1.0 / 10000 ** (np.arange(0, H, 2) / H))
    inits = [
        numpy_helper.from_array(np.cos(angles).astype(np_t), "cos"),
        numpy_helper.from_array(np.sin(angles).astype(np_t), "sin"),
    ]
    nodes, infos = [], []
    for (name, heads), attrs, scale, form in zip(
        (("q", N), ("k", KV)), (q or {}, k or {}), weights, view
    ):
        there = [0, -1, H] if form == "rows" else [0, 0, heads, H]
        back = [0, -1, heads * H] if form == "rows" else [0, 0, -1]
        inits += [
            numpy_helper.from_array(np.array(there, np.int64), f"{name}_heads"),
            numpy_helper.from_array(np.array(back, np.int64), f"{name}_back"),
        ]
        norm_inputs = [f"{name}_x", ""]
        if scale is not None:
            w_type = weight_type or t
            values = np.full(H, scale, np.float32) if np.isscalar(scale) else np.asarray(scale)
            w = values.astype(helper.tensor_dtype_to_np_dtype(w_type))
            inits.append(numpy_helper.from_array(w, f"{name}_w"))
            norm_inputs[1] = f"{name}_w"
        attrs = {"epsilon": 1e-6, "scale_offset": offset, **attrs}
        nodes += [
            helper.make_node("Reshape", [name, f"{name}_heads"], [f"{name}_x"]),
            helper.make_node(
                "RMSNorm",
                norm_inputs,
                [f"{name}_y"],
                domain="onnxnorm",
                name=f"{name}_norm",
                **attrs,
            ),
            helper.make_node("Reshape", [f"{name}_y", f"{name}_back"], [f"{name}_n"]),
        ]
        view_dims = ["b", "sh", H] if form == "rows" else ["b", "s", heads, H]
        infos += [helper.make_tensor_value_info(f"{name}_{v}", t, view_dims) for v in "xy"]
    gqa_attrs = {"num_heads": N, "kv_num_heads": KV, "do_rotary": 1, **(gqa or {})}
    gqa_inputs = ["q_n", "k_n", "v", "pk", "pv", "seqlens", "total", "cos", "sin"]
    nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            gqa_inputs,
            ["o", "pko", "pvo"],
            domain=MS,
            name="gqa",
            **gqa_attrs,
        )
    )
    outputs = [helper.make_tensor_value_info(n, t, None) for n in ("o", "pko", "pvo")]
    if norm_output:
        outputs.append(helper.make_tensor_value_info("q_y", t, None))
    graph = helper.make_graph(nodes, "gqa", inputs, outputs, inits, value_info=infos)
    imports = [helper.make_opsetid(d, v) for d, v in (("", 21), (MS, 1), ("onnxnorm", 1))]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    return model


def _feeds(t, seed=1, batch=1, seq=3, past=5):
    rng = np.random.default_rng(seed)
    np_t = helper.tensor_dtype_to_np_dtype(t)

    def draw(*shape):
        return rng.standard_normal(shape).astype(np.float32).astype(np_t)

    return {
        "q": draw(batch, seq, N * H),
        "k": draw(batch, seq, KV * H),
        "v": draw(batch, seq, KV * H),
        "pk": draw(batch, KV, past, H),
        "pv": draw(batch, KV, past, H),
        "seqlens": np.full(batch, past + seq - 1, np.int32),
        "total": np.array(past + seq, np.int32),
    }


ODD = np.linspace(0.5, 1.5, H)  # (not all float16 values)

FOLDED = {
    "float16": {},
    "bfloat16": {"t": BF16},
    "4-D views": {"view": ("4d", "4d")},
    "float32 weights, float16 values": {"weight_type": F32, "weights": (0.75, 1.25)},
    "scale offset, exact": {"offset": 1.0, "weights": (-0.25, 0.5)},
    "no weights": {"weights": (None, None)},
}


@pytest.mark.parametrize("case", FOLDED)
def test_folded(case):
    model = _gqa_model(**FOLDED[case])
    lowered, notes = lower_with_notes(model, runtime="ort-cuda")
    assert not [n for n in lowered.graph.node if n.domain == "onnxnorm"]
    assert [n.emitted for n in notes] == [
        f"{MS}.GroupQueryAttention's {w}_norm_weight" for w in "qk"
    ] and not any(n.reason for n in notes)
    (node,) = _gqas(lowered)
    assert node.input[:2] == ["q", "k"] and _attr(node, "qk_norm_epsilon") == pytest.approx(1e-6)
    assert [n.op_type for n in lowered.graph.node] == ["GroupQueryAttention"]
    t = FOLDED[case].get("t", F16)
    weights = {w.name: w for w in lowered.graph.initializer}
    for index in (Q_W, K_W):
        assert weights[node.input[index]].data_type == t
    if t == BF16:  # (no bfloat16 GroupQueryAttention on the CPU to run the expansion on)
        return
    got = runtime.session(unfold(lowered)).run(None, _feeds(t))
    want = runtime.session(model).run(None, _feeds(t))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


LEFT = {
    "float32": ({"t": F32}, "Q is float32"),
    "order A": ({"q": {"cast_before_scale": 1}}, "Q's norm: rounding order A"),
    "epsilons differ": ({"k": {"epsilon": 1e-5}}, "Q's epsilon 1e-06 and K's 1e-05 differ"),
    "weight not float16": (
        {"weight_type": F32, "weights": (ODD, 1.0)},
        "Q's norm: its weight is not exactly a float16 tensor",
    ),
    "offset not float16": (
        {"offset": 1.0, "weights": (1e-4, 0.5)},
        "Q's norm: its weight plus scale offset is not exactly a float16 tensor",
    ),
    "per token": (
        {"view": ("4d", "4d"), "k": {"axis": -2}},
        "K's norm: it normalizes from axis -2",
    ),
    "no rotary": ({"gqa": {"do_rotary": 0}}, "does not rotate (do_rotary = 0)"),
    "quantized cache": ({"gqa": {"k_quant_type": "PER_TENSOR"}}, "quantizes the KV cache"),
}


@pytest.mark.parametrize("case", LEFT)
def test_left_with_the_reason(case):
    kwargs, reason = LEFT[case]
    model = _gqa_model(**kwargs)
    lowered, notes = lower_with_notes(model, runtime="ort-cuda")
    (node,) = _gqas(lowered)
    assert not _has_norm_weights(node) and node.input[:2] == ["q_n", "k_n"]
    assert [n.emitted for n in notes] == ["onnxnorm op"] * 2, notes
    assert all(n.reason.startswith("not attention: ") and reason in n.reason for n in notes), notes


def test_a_norm_read_elsewhere_stays_without_a_reason():
    lowered, notes = lower_with_notes(_gqa_model(norm_output=True), runtime="ort-cuda")
    assert not _has_norm_weights(_gqas(lowered)[0])
    assert [n.emitted for n in notes] == ["onnxnorm op"] * 2
    q_note = next(n for n in notes if n.node == "q_norm")
    k_note = next(n for n in notes if n.node == "k_norm")
    assert not q_note.reason and "the other has no norm of its own" in k_note.reason


# -- GroupQueryAttention's own rotary: the near miss, and its measurement -----------------------
def test_the_rotation_in_group_query_attention_is_a_reported_near_miss(folders):
    model = ir.serde.deserialize_model(onnx.load(folders["fp16"] / "model.onnx"))
    tracker = fuse_ir(model)
    assert rotary_gqa.report(model, tracker) == 2
    row = tracker.report()[rotary_gqa.TITLE]
    assert (row.found, row.fused, row.skipped) == (2, 0, 2)
    assert all(s.reason == rotary_gqa.REASON for s in row.skips)


def _rotary_outside(model: onnx.ModelProto) -> onnx.ModelProto:
    """The hand-written model with its norms and GroupQueryAttention's rotation in one
    RMSNormRotary by the positions GroupQueryAttention derives (max(seqlens_k + 1 - S, 0) + s),
    and do_rotary = 0: the fusion rotary_gqa.py does not make."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    norm = {n.name: n for n in out.graph.node}["q_norm"]
    eps = _attr(norm, "epsilon")
    for name, value in (("one", 1), ("zero", 0), ("axis1", [1])):
        out.graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), name))
    nodes = [
        helper.make_node("Cast", ["seqlens"], ["total64"], to=TensorProto.INT64),
        helper.make_node("Shape", ["q"], ["s1"], start=1, end=2),
        helper.make_node("Squeeze", ["s1"], ["s"]),
        helper.make_node("Add", ["total64", "one"], ["t"]),
        helper.make_node("Sub", ["t", "s"], ["t_s"]),
        helper.make_node("Max", ["t_s", "zero"], ["past"]),
        helper.make_node("Unsqueeze", ["past", "axis1"], ["past2"]),
        helper.make_node("Range", ["zero", "s", "one"], ["steps"]),
        helper.make_node("Add", ["past2", "steps"], ["positions"]),
        helper.make_node(
            "RMSNormRotary",
            ["q", "k", "q_w", "k_w", "cos", "sin", "positions"],
            ["q_n", "k_n"],
            domain="onnxnorm",
            epsilon=eps,
            head_size=H,
        ),
    ]
    gqa = _gqas(out)[0]
    del gqa.input[7:]
    for a in gqa.attribute:
        if a.name == "do_rotary":
            a.i = 0
    del out.graph.node[:]
    out.graph.node.extend([*nodes, gqa])
    return out


@pytest.mark.parametrize("t", [F16, F32], ids=["float16", "float32"])
def test_group_query_attention_positions(t):
    """What rotary_gqa.py's account relies on, measured on the CPU provider: a norm and
    rotation outside GroupQueryAttention by max(seqlens_k + 1 - S, 0) + s give its own results
    (float16 bit for bit; float32 within a unit in the last place) in a first prompt, a padded
    first prompt, a decode step and a decode step of mixed lengths."""
    model = _gqa_model(t, weights=(ODD, 0.75))
    outside = _rotary_outside(model)
    steps = {
        "first prompt": (2, 5, 0, [4, 4]),
        "padded first prompt": (2, 5, 0, [4, 2]),
        "decode": (2, 1, 9, [9, 5]),
        "decode from nothing": (2, 1, 9, [0, 6]),
    }
    inside, outside = runtime.session(model), runtime.session(outside)
    for batch, seq, past, seqlens in steps.values():
        feeds = _feeds(t, batch=batch, seq=seq, past=past)
        feeds["seqlens"] = np.array(seqlens, np.int32)
        feeds["total"] = np.array(max(seqlens) + 1, np.int32)
        for want, got in zip(inside.run(None, feeds), outside.run(None, feeds)):
            if t == F16:
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


# -- on a GPU (tools/gpu_check.sh, step gqa) -------------------------------------------------------
@needs_ort_cuda
def test_gpu_gqa_norms_match_the_library(folders, capsys):
    """The float16 Qwen3 folder written --for ort-cuda (Q/K norms in GroupQueryAttention) against
    the same folder with the library's norms (the default function target), both on ONNX
    Runtime's CUDA provider, in a prompt and a decode step: every output within float16's
    decoder tolerance, GroupQueryAttention on the CUDA provider; prints how many values agree
    bit for bit."""
    folder = folders["fp16"]
    original = onnx.load(folder / "model.onnx")
    attention, _ = fuse(original, base_dir=str(folder), runtime="ort-cuda")
    library, _ = fuse(original, base_dir=str(folder))
    assert all(_has_norm_weights(n) for n in _gqas(attention))
    rows = {}
    for past in (0, 16):
        feeds = generate_inputs(original, 0, dim_sizes(read_config(folder), original, past=past))
        got = runtime.session(attention, providers=runtime.CUDA_PROVIDERS).run(None, feeds)
        want = runtime.session(library, providers=runtime.CUDA_PROVIDERS).run(None, feeds)
        ran = runtime.executed_ops(attention, feeds, providers=[runtime.CUDA_PROVIDER])
        assert ran["GroupQueryAttention"] == 2 and ran["RMSNorm"] == 1, ran
        for info, g, w in zip(original.graph.output, got, want):
            g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
            np.testing.assert_allclose(g, w, rtol=1e-2, atol=1e-2, err_msg=info.name)
            rows[f"past {past}: {info.name}"] = float((g == w).mean())
    with capsys.disabled():
        print(json.dumps({"bitwise equal": rows}, indent=1))

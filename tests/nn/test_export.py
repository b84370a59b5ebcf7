"""onnxnorm.export: one node per norm module (or per residual add fused with a norm) in every
mode, dynamic batch and sequence axes, external data, parity with eager, clear errors; the gated
and L2 norms of hybrid LLMs and the hybrid decoders."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import onnxnorm
from onnxnorm import OnnxNormError, _native, ops, runtime
from onnxnorm.nn import (
    DeepNormBlock,
    GatedRMSNorm,
    L2Norm,
    LayerNorm,
    PostNormBlock,
    PreNormBlock,
    ResidualStream,
    RMSNorm,
    SandwichBlock,
    add_norm,
    decoder,
    families,
    sandwich_norm,
)
from onnxnorm.nn.exporter import count_norm_nodes
from onnxnorm.ops import reference
from tests.support.matrix import LOWERED_TARGETS, NODE_TARGETS, TARGETS, torch_to_numpy


@pytest.fixture(autouse=True)
def _seed():
    """Every test draws the same inputs, whatever ran before it."""
    torch.manual_seed(0)


NP = torch_to_numpy()


class TwoNorms(torch.nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.first = RMSNorm(hidden, eps=1e-6)
        self.linear = torch.nn.Linear(hidden, hidden)
        self.second = RMSNorm(hidden, eps=1e-5, scale_offset=1.0)
        with torch.no_grad():
            self.first.weight.copy_(1 + 0.3 * torch.randn(hidden))
            self.second.weight.copy_(0.3 * torch.randn(hidden))

    def forward(self, x):
        return self.second(self.linear(self.first(x)))


def test_drop_in_for_torch_rmsnorm():
    theirs = torch.nn.RMSNorm(16, eps=1e-6)
    ours = RMSNorm(16, eps=1e-6)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(16))
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(ours(x), theirs(x))
    # eps=None takes the input type's machine epsilon, as torch does
    torch.testing.assert_close(RMSNorm(16)(x), torch.nn.RMSNorm(16)(x))
    assert RMSNorm([4, 16], elementwise_affine=False).weight is None


def test_gemma_offset_starts_at_identity_scale():
    norm = RMSNorm(8, scale_offset=1.0)
    assert torch.equal(norm.weight, torch.zeros(8))
    x = torch.randn(2, 8)
    torch.testing.assert_close(norm(x), torch.nn.functional.rms_norm(x, (8,), eps=None))


def test_eager_matches_reference():
    norm = TwoNorms().second
    x = torch.randn(2, 5, 16)
    want = reference.run(
        "RMSNorm", x.numpy(), norm.weight.detach().numpy(), epsilon=1e-5, scale_offset=1.0
    )[0]
    np.testing.assert_allclose(norm(x).detach().numpy(), want, rtol=1e-5, atol=1e-5)


def test_wrong_input_shape_is_a_clear_error():
    with pytest.raises(ValueError, match=r"RMSNorm over \(16,\) got an input of shape \(2, 8\)"):
        RMSNorm(16)(torch.randn(2, 8))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = TwoNorms().eval()
    x = torch.randn(2, 5, 16)
    folder = tmp_path_factory.mktemp("export")
    paths = {}
    for mode in NODE_TARGETS:
        paths[mode] = folder / f"{mode}.onnx"
        onnxnorm.export(
            model, (x,), paths[mode], mode=mode, dynamic_shapes=({0: "batch", 1: "seq"},)
        )
    return model, paths


@pytest.mark.parametrize("mode", NODE_TARGETS)
def test_export_one_node_per_module(exported, mode):
    _, paths = exported
    model = onnx.load(paths[mode])
    norms = [n for n in model.graph.node if n.domain == ops.DOMAIN]
    assert [n.op_type for n in norms] == ["RMSNorm", "RMSNorm"]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in norms]
    assert attrs[0]["epsilon"] == pytest.approx(1e-6) and attrs[0]["axis"] == -1
    assert attrs[1]["scale_offset"] == 1.0
    assert not any(n.op_type in ("Pow", "ReduceMean", "Sqrt") for n in model.graph.node)
    functions = sorted((f.domain, f.name, f.overload) for f in model.functions)
    expected = [(ops.DOMAIN, "RMSNorm", "scale"), (ops.DOMAIN, "RMSNorm", "scale_offset")]
    assert functions == (expected if mode == "function" else [])
    assert [n.overload for n in norms] == (
        ["scale", "scale_offset"] if mode == "function" else ["", ""]
    )
    onnx.checker.check_model(model, full_check=True)


def test_exported_function_runs_in_plain_ort_with_dynamic_shapes(exported):
    model, paths = exported
    x = torch.randn(3, 7, 16)
    sess = ort.InferenceSession(str(paths["function"]), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_fused_mode_needs_the_library(exported):
    _, paths = exported
    with pytest.raises(Exception, match="RMSNorm"):
        ort.InferenceSession(str(paths["fused"]), providers=["CPUExecutionProvider"])


def test_a_model_without_rotary_skips_the_rotary_stage(monkeypatch):
    """Norms and no rotary: the export's rotary stage (``fusion.pipeline.fuse_rotary``) finds
    nothing it could fuse (``may_fuse_rotary``) and returns the export as it is, without
    preparing its graph (onnx's and ONNX Runtime's shape inference)."""
    from onnxnorm.fusion import pipeline

    def prepared(_):
        raise AssertionError("the rotary stage prepared a model without rotary")

    monkeypatch.setattr(pipeline, "_prepare", prepared)
    proto = onnxnorm.export(TwoNorms().eval(), (torch.randn(2, 5, 16),))
    assert count_norm_nodes(proto) == {"RMSNorm": 2}


def test_export_bad_arguments(tmp_path):
    with pytest.raises(OnnxNormError, match="unknown export mode 'bogus'"):
        onnxnorm.export(TwoNorms(), (torch.randn(1, 2, 16),), mode="bogus")
    with pytest.raises(OnnxNormError, match=r"must be a torch\.nn\.Module"):
        onnxnorm.export(lambda x: x, (torch.randn(1, 2, 16),))
    with pytest.raises(OnnxNormError, match="opset_version must be >= 15"):
        onnxnorm.export(TwoNorms(), (torch.randn(1, 2, 16),), opset_version=13)
    with pytest.raises(OnnxNormError, match="does not exist"):
        onnxnorm.export(TwoNorms(), (torch.randn(1, 2, 16),), tmp_path / "no" / "m.onnx")


# --- the configurable decoder in every mode ---------------------------------------------------

ORT_OPS = {
    "RMSNorm": "SimplifiedLayerNormalization",
    "SkipRMSNorm": "SkipSimplifiedLayerNormalization",
    "LayerNorm": "LayerNormalization",
    "SkipLayerNorm": "SkipLayerNormalization",
}
#: every target with the opset it is exported at: standard ONNX has RMSNormalization from 23 on
MODES = [(mode, 23 if mode == "onnx" else 18) for mode in TARGETS]


def _session(model: onnx.ModelProto, with_library: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return runtime.session(model, options, with_library=with_library)


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    """A Pre-Norm RMSNorm decoder (Q/K norm, embedding norm) exported once per mode."""
    config = decoder.DecoderConfig(
        norm="rms", position="pre", qk_norm=True, embedding_norm=True, cast_before_scale=1
    )
    model = decoder.build(config)
    x = decoder.example_input(config, batch=2, seq=6)
    folder = tmp_path_factory.mktemp("modes")
    exported = {}
    for mode, opset in MODES:
        path = folder / f"{mode}.onnx"
        onnxnorm.export(model, (x,), path, mode=mode, opset_version=opset)
        exported[mode] = onnx.load(path)
    return model, exported


@pytest.mark.parametrize("mode", [m for m, _ in MODES])
def test_decoder_one_node_per_norm_in_every_mode(decoders, mode):
    model, exported = decoders
    proto = exported[mode]
    expected = model.expected_nodes()
    # the Q/K norms and their rotary: one RMSNormRotary of Q and K per layer
    assert expected == {"RMSNorm": 1 + 1, "RMSNormRotary": 2, "SkipRMSNorm": 4}
    ours = collections.Counter(n.op_type for n in proto.graph.node if n.domain == ops.DOMAIN)
    counts = count_norm_nodes(proto)
    if mode in NODE_TARGETS:
        assert ours == expected
        assert bool(proto.functions) == (mode == "function")
    elif mode == "ort":
        assert not ours and not proto.functions
        # the rotary nodes are written in standard ops (no norm op of ORT's among them)
        assert counts == {ORT_OPS[op]: n for op, n in expected.items() if op in ORT_OPS}
    else:  # standard ONNX at opset 23: one RMSNormalization per norm module, adds apart
        assert not ours and not proto.functions
        assert all(n.domain in ("", "ai.onnx") for n in proto.graph.node)
        assert counts == {"RMSNormalization": model.count_norms()}
    # dynamic batch and sequence axes
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and dims[1].dim_param and dims[2].dim_value == 64
    if mode != "ort":  # ORT's SimplifiedLayerNormalization is no onnx schema
        onnx.checker.check_model(proto, full_check=True)


@pytest.mark.parametrize("mode", [m for m, _ in MODES])
def test_decoder_parity_with_eager_at_other_shapes(decoders, mode):
    model, exported = decoders
    x = decoder.example_input(model.config, batch=3, seq=5, seed=7)
    with torch.no_grad():
        want = model(x).numpy()
    sess = _session(exported[mode], with_library=(mode == "fused"))
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    rtol, atol = reference.tolerance(np.float32)
    np.testing.assert_allclose(got, want, rtol=10 * rtol, atol=10 * atol)


class NormChain(torch.nn.Module):
    """Norms and fused residual norms only: parity in half precision is a pure norm check."""

    def __init__(self, hidden=32):
        super().__init__()
        self.a = RMSNorm(hidden, eps=1e-6, cast_before_scale=1)
        self.b, self.c = LayerNorm(hidden), LayerNorm(hidden)
        self.d = RMSNorm(hidden, eps=1e-6, scale_offset=1.0)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))

    def forward(self, x, residual):
        y, total = add_norm(self.a, x, residual, alpha=1.5)
        y, total = sandwich_norm(self.b, self.c, y, total)
        return self.d(y), total


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_half_precision_parity_within_reference_tolerance(dtype, tmp_path):
    model = NormChain().to(dtype)
    x, r = torch.randn(2, 4, 32).to(dtype), torch.randn(2, 4, 32).to(dtype)
    proto = onnxnorm.export(model, (x, r))
    assert [n.op_type for n in proto.graph.node if n.domain == ops.DOMAIN] == [
        "SkipRMSNorm",
        "SandwichLayerNorm",
        "RMSNorm",
    ]
    sess = _session(proto)
    got = sess.run(None, {i.name: v.numpy() for i, v in zip(sess.get_inputs(), (x, r))})
    with torch.no_grad():
        want = model(x, r)
    rtol, atol = reference.tolerance(NP[dtype])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.astype(np.float32), w.float().numpy(), rtol=rtol, atol=atol)


def test_external_data(tmp_path):
    model = NormChain(hidden=512)
    x, r = torch.randn(2, 4, 512), torch.randn(2, 4, 512)
    path = tmp_path / "chain.onnx"
    proto = onnxnorm.export(model, (x, r), path, external_data=True)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer), (
        "the returned model must keep its weights"
    )
    assert (tmp_path / "chain.onnx.data").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.onnx", "chain.onnx.data"]
    loaded = onnx.load(path, load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.graph.initializer)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {i.name: v.numpy() for i, v in zip(sess.get_inputs(), (x, r))})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x, r)[0].numpy(), rtol=1e-5, atol=1e-5)


class Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.linear(x)


class OddNorm(torch.nn.Module):
    """A norm onnxnorm cannot express (max-abs scaling)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(16))

    def forward(self, x):
        return x / x.abs().amax(-1, keepdim=True) * self.weight


def test_model_without_norms_is_a_clear_error():
    with pytest.raises(OnnxNormError, match="the model has no norm modules"):
        onnxnorm.export(Plain(), (torch.randn(2, 3, 16),))
    proto = onnxnorm.export(Plain(), (torch.randn(2, 3, 16),), allow_no_norms=True)
    assert not any(n.domain == ops.DOMAIN for n in proto.graph.node)
    batch_norm = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16)).eval()
    with pytest.raises(
        OnnxNormError,
        match=r"no norm that onnxnorm exports: 1 \(BatchNorm1d\) "
        "have no onnxnorm op",
    ):
        onnxnorm.export(batch_norm, (torch.randn(4, 16),), convert=True)


def test_unsupported_norm_is_reported_and_left():
    model = torch.nn.Sequential(torch.nn.LayerNorm(16), OddNorm())
    proto = onnxnorm.export(model, (torch.randn(2, 3, 16),), convert=True)
    assert [n.op_type for n in proto.graph.node if n.domain == ops.DOMAIN] == ["LayerNorm"]
    assert isinstance(model[0], torch.nn.LayerNorm), "convert=True must leave the model as it was"
    with pytest.raises(OnnxNormError, match=r"not onnxnorm modules \(1 \(OddNorm\)\).*convert"):
        onnxnorm.export(torch.nn.Sequential(Plain(), OddNorm()), (torch.randn(2, 3, 16),))


def test_wrong_inputs_are_clear_errors():
    with pytest.raises(
        OnnxNormError,
        match=r"args\[0\] must be a torch\.Tensor, got numpy\.ndarray "
        r"\(convert it with torch\.from_numpy\)",
    ):
        onnxnorm.export(TwoNorms(), (np.zeros((2, 3, 16), np.float32),))
    with pytest.raises(
        OnnxNormError,
        match="the model fails on the given inputs: ValueError: "
        "RMSNorm over \\(16,\\) got an input of shape",
    ):
        onnxnorm.export(TwoNorms(), (torch.randn(2, 3, 8),))
    with pytest.raises(
        OnnxNormError,
        match="the model fails on the given inputs: TypeError: "
        "RMSNorm expects float32, float16 or bfloat16",
    ):
        onnxnorm.export(TwoNorms(), (torch.ones(2, 3, 16, dtype=torch.int64),))


def test_keyword_inputs_and_named_dynamic_axes():
    x, r = torch.randn(2, 4, 32), torch.randn(2, 4, 32)
    proto = onnxnorm.export(NormChain(), (x,), kwargs={"residual": r})
    shapes = [
        [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in proto.graph.input
    ]
    assert shapes == [["batch", "sequence", 32]] * 2
    with pytest.raises(
        OnnxNormError,
        match="forward does not take these inputs: missing a required argument: 'residual'",
    ):
        onnxnorm.export(NormChain(), (x,))


class BlockStack(torch.nn.Module):
    """The four block helpers in one stack, with a final norm."""

    def __init__(self, hidden=16):
        super().__init__()
        torch.manual_seed(0)
        norms = [RMSNorm(hidden, eps=1e-6) for _ in range(6)]
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for n in norms:
                n.weight.copy_(1 + 0.3 * torch.randn(hidden, generator=g))
        subs = [torch.nn.Linear(hidden, hidden) for _ in range(5)]
        self.blocks = torch.nn.ModuleList(
            [
                PreNormBlock(norms[0], subs[0]),
                SandwichBlock(norms[1], subs[1], norms[2]),
                PreNormBlock(norms[3], subs[2]),
                PostNormBlock(subs[3], norms[4]),
                DeepNormBlock(subs[4], norms[5], alpha=2.0),
            ]
        )
        self.final = LayerNorm(hidden)

    def forward(self, x):
        stream = ResidualStream(x)
        for block in self.blocks:
            stream = block(stream)
        return stream.finish(self.final)


def test_block_helpers_export_one_node_per_add_and_norm():
    model = BlockStack().eval()
    x = torch.randn(2, 5, 16)
    proto = onnxnorm.export(model, (x,))
    ours = [n.op_type for n in proto.graph.node if n.domain == ops.DOMAIN]
    # first norm; add + norm; post-norm + add + pre-norm; Post-Norm after a pending Pre-Norm add
    # (the add is done apart); DeepNorm with alpha; the final LayerNorm
    assert ours == [
        "RMSNorm",
        "SkipRMSNorm",
        "SandwichRMSNorm",
        "SkipRMSNorm",
        "SkipRMSNorm",
        "LayerNorm",
    ]
    deep = [n for n in proto.graph.node if n.op_type == "SkipRMSNorm"][-1]
    assert onnx.helper.get_attribute_value(
        next(a for a in deep.attribute if a.name == "alpha")
    ) == pytest.approx(2.0)
    sess = _session(proto)
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(
        sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0], want, rtol=1e-5, atol=1e-5
    )


# --- the gated and L2 norms of hybrid LLMs ------------------------------------------------------


def _library_has(*op_types: str) -> bool:
    """Whether the built onnxnorm library has kernels for these ops."""
    try:
        names = {op["name"] for op in _native.manifest()["ops"]}
    except Exception:  # noqa: BLE001 - no library built: no kernels
        return False
    return set(op_types) <= names


class HybridNorms(torch.nn.Module):
    """Every kind of gated norm and the L2 and weightless norms, as the hybrids use them."""

    def __init__(self):
        super().__init__()
        self.mamba = GatedRMSNorm(64, group_size=16, eps=1e-5, norm_before_gate=False)
        self.kimi = GatedRMSNorm(64, activation="sigmoid", cast_before_scale=0)
        self.heads = GatedRMSNorm(16, group_size=16, scale_offset=1.0)  # shared by 4 heads
        self.plain = GatedRMSNorm(64, group_size=32)  # no gate: a grouped RMSNorm
        self.l2 = L2Norm()
        self.llama4 = RMSNorm(None, eps=1e-5, elementwise_affine=False)
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g))

    def forward(self, x, gate):
        y = self.heads(self.kimi(self.mamba(x, gate), gate), gate)
        b, t, _ = y.shape
        heads = self.llama4(self.l2(self.plain(y).view(b, t, 4, 16)))
        return heads.reshape(b, t, 64)


#: (op, attributes) of each node of HybridNorms' export, in order
HYBRID_NODES = [
    ("GatedRMSNorm", dict(group_size=16, activation=0, norm_before_gate=0, cast_before_scale=1)),
    ("GatedRMSNorm", dict(group_size=0, activation=1, norm_before_gate=1, cast_before_scale=0)),
    ("GatedRMSNorm", dict(group_size=16, activation=0, norm_before_gate=1, scale_offset=1.0)),
    ("GatedRMSNorm", dict(group_size=32)),
    ("L2Norm", dict(axis=-1)),
    ("RMSNorm", dict(axis=-1)),
]


@pytest.mark.parametrize("mode", NODE_TARGETS)
def test_gated_and_l2_norms_export_one_node_each(mode):
    model = HybridNorms()
    x, gate = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    proto = onnxnorm.export(model, (x, gate), mode=mode)
    nodes = [n for n in proto.graph.node if n.domain == ops.DOMAIN]
    assert [n.op_type for n in nodes] == [op for op, _ in HYBRID_NODES]
    for node, (_, want) in zip(nodes, HYBRID_NODES):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert {k: attrs[k] for k in want} == want, node.op_type
    assert [len([i for i in n.input if i]) for n in nodes[:4]] == [3, 3, 3, 2]  # no gate last
    assert count_norm_nodes(proto) == {"GatedRMSNorm": 4, "L2Norm": 1, "RMSNorm": 1}
    assert bool(proto.functions) == (mode == "function")
    assert not any(n.op_type in ("Sigmoid", "ReduceSumSquare", "Sqrt") for n in proto.graph.node)


class InType(torch.nn.Module):
    """``inner`` run in ``dtype`` between float32 inputs and outputs (casts in the graph), so
    that ONNX Runtime's Python API, which has no bfloat16 arrays, can feed and read it."""

    def __init__(self, inner, dtype):
        super().__init__()
        self.inner, self.dtype = inner.to(dtype), dtype

    def forward(self, x, gate):
        return self.inner(x.to(self.dtype), gate.to(self.dtype)).float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_gated_and_l2_norms_parity_with_eager(dtype):
    """The function bodies in plain ONNX Runtime (and the kernels, where the built library has
    them) against eager torch at other shapes, within the reference's tolerance."""
    model = InType(HybridNorms(), dtype)
    proto = onnxnorm.export(model, (torch.randn(2, 5, 64), torch.randn(2, 5, 64)))
    x, gate = torch.randn(3, 7, 64), torch.randn(3, 7, 64)
    with torch.no_grad():
        want = model(x, gate).numpy()
    rtol, atol = reference.tolerance(NP[dtype])
    libraries = [False] + ([True] if _library_has("GatedRMSNorm", "L2Norm") else [])
    for with_library in libraries:
        sess = _session(proto, with_library=with_library)
        got = sess.run(None, {i.name: v.numpy() for i, v in zip(sess.get_inputs(), (x, gate))})
        np.testing.assert_allclose(got[0], want, rtol, atol, err_msg=f"{with_library=}")


@pytest.mark.parametrize("mode,opset", [m for m in MODES if m[0] in LOWERED_TARGETS])
def test_gated_and_l2_norms_lowered(mode, opset):
    """Modes ort and onnx: no onnxnorm node left, the same outputs in plain ONNX Runtime."""
    model = HybridNorms()
    x, gate = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    proto = onnxnorm.export(model, (x, gate), mode=mode, opset_version=opset)
    assert not any(n.domain == ops.DOMAIN for n in proto.graph.node) and not proto.functions
    x, gate = torch.randn(3, 7, 64), torch.randn(3, 7, 64)
    with torch.no_grad():
        want = model(x, gate).numpy()
    sess = _session(proto)
    got = sess.run(None, {i.name: v.numpy() for i, v in zip(sess.get_inputs(), (x, gate))})
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)


def test_hf_gated_norm_needs_convert():
    pytest.importorskip("transformers")
    from onnxnorm.testing import hf

    # a gated norm class of the installed transformers (found by reading its model modules)
    gated = next(n for n in hf.norms.norm_classes() if n.gated)

    class Mixer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = hf.norms.build(gated, 64)

        def forward(self, x, gate):
            return self.norm(x, gate)

    args = (torch.randn(2, 3, 64), torch.randn(2, 3, 64))
    with pytest.raises(OnnxNormError, match=rf"not onnxnorm modules \(norm \({gated.name}\)"):
        onnxnorm.export(Mixer(), args)
    proto = onnxnorm.export(Mixer(), args, convert=True)
    assert count_norm_nodes(proto) == {"GatedRMSNorm": 1}


@pytest.fixture(scope="module", params=["qwen3_next", "mamba2"])
def hybrid(request):
    """A hybrid family's decoder (2 layers: Qwen3-Next's a linear-attention and an attention
    layer), exported once in mode function."""
    config = families.decoder_config(request.param, hidden=32, heads=2, intermediate=64, layers=2)
    if request.param == "qwen3_next":
        config = dataclasses.replace(config, linear_head_dim=32)
    model = decoder.build(config)
    proto = onnxnorm.export(model, (decoder.example_input(config, seq=6),))
    return model, proto


def test_hybrid_decoder_one_node_per_norm(hybrid):
    model, proto = hybrid
    expected = model.expected_nodes()
    if model.config.mixer == "mamba2":
        # one sublayer per layer: first norm, a fused add + norm per layer, a gated norm in each
        assert expected == {"RMSNorm": 1, "SkipRMSNorm": 2, "GatedRMSNorm": 2}
    else:
        # Q/K norms in the attention layer, L2Norms of q and k and the gated norm in the other
        # the Q/K norms and their rotary in the attention layer (one node of Q and K), L2Norms
        # of q and k and the gated norm in the other
        assert expected == {
            "RMSNorm": 1,
            "RMSNormRotary": 1,
            "SkipRMSNorm": 4,
            "GatedRMSNorm": 1,
            "L2Norm": 2,
        }
    ours = collections.Counter(n.op_type for n in proto.graph.node if n.domain == ops.DOMAIN)
    assert ours == expected == count_norm_nodes(proto)
    # a Sandwich node holds two norms, a rotary node of Q and K two
    two = ("Sandwich", "RMSNormRotary", "LayerNormRotary")
    held = sum(n * (2 if op.startswith(two) else 1) for op, n in expected.items())
    assert held == model.count_norms()
    onnx.checker.check_model(proto, full_check=True)


def test_hybrid_decoder_parity_with_eager(hybrid):
    model, proto = hybrid
    x = decoder.example_input(model.config, batch=3, seq=5, seed=7)
    with torch.no_grad():
        want = model(x).numpy()
    rtol, atol = reference.tolerance(np.float32)
    libraries = [False]
    if _library_has(*(op for op in model.expected_nodes())):
        libraries.append(True)
    for with_library in libraries:
        sess = _session(proto, with_library=with_library)
        got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
        np.testing.assert_allclose(got, want, rtol=10 * rtol, atol=10 * atol)

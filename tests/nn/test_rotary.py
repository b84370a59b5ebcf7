"""The rotary ops (``catalogue.ROTARY_OPS``) on the torch side: their eager math against the
reference, :class:`onnxnorm.nn.QKNormRotary` against the reference and the decomposed torch math
of the models, the export (one node per call, K present or not) run in ONNX Runtime with and
without the library, and the reference decoder's Q/K norm with its rotary exported as one node,
as the fusion makes of its decomposed export."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import onnx
import pytest
import torch

import onnxnorm
from onnxnorm import ops, runtime
from onnxnorm.nn import QKNormRotary, decoder, families
from onnxnorm.nn.functional import call
from onnxnorm.nn.mixers import apply_rotary, rope_angles
from onnxnorm.ops import catalogue, reference
from tests.support.matrix import torch_to_numpy

NP = torch_to_numpy()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BATCH, SEQ, HEAD, Q_HEADS, K_HEADS = 2, 5, 8, 4, 2


def _numpy(t: torch.Tensor | None) -> np.ndarray | None:
    if t is None:
        return None
    t = t.detach()
    return t.numpy() if t.dtype == torch.int64 else t.float().numpy().astype(NP[t.dtype])


def _library_has(*op_types: str) -> bool:
    try:
        from onnxnorm import _native

        return set(op_types) <= {op["name"] for op in _native.manifest()["ops"]}
    except Exception:  # noqa: BLE001 - no library built: no kernels
        return False


def _inputs(
    op: str,
    dtype: torch.dtype,
    layout: int,
    three_d: bool,
    cache: str,
    with_k: bool,
    rotary_dim: int,
    weight_per_head: bool,
    seed: int = 0,
) -> tuple[list[torch.Tensor | None], dict]:
    """The inputs of ``op`` in catalogue order, and the attributes they need."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dt)

    def heads_tensor(heads: int) -> torch.Tensor:
        if three_d:
            return rand(BATCH, SEQ, heads * HEAD)
        if layout == 1:
            return rand(BATCH, heads, SEQ, HEAD)
        return rand(BATCH, SEQ, heads, HEAD)

    spec = catalogue.get(op)
    given: dict[str, torch.Tensor | None] = {"Q": heads_tensor(Q_HEADS)}
    given["K"] = heads_tensor(K_HEADS) if with_k else None
    for name, heads in (("Q", Q_HEADS), ("K", K_HEADS)):
        if name == "K" and not with_k:
            continue
        shape = (heads, HEAD) if weight_per_head else (HEAD,)
        given[name + "Scale"] = 1 + 0.3 * rand(*shape)
        given[name + "Bias"] = 0.3 * rand(*shape)
    pairs = rotary_dim // 2
    width = rotary_dim if cache == "per_token" else pairs
    if cache == "positions":
        angles = rand(16, width, dt=torch.float32) * 3
        given["PositionIds"] = torch.randint(0, 16, (BATCH, SEQ), generator=g)
    else:
        angles = rand(1, SEQ, width, dt=torch.float32) * 3
    given["Cos"], given["Sin"] = angles.cos().to(dtype), angles.sin().to(dtype)
    attrs = {"layout": layout, "rotary_dim": 0 if rotary_dim == HEAD else rotary_dim}
    if three_d:
        attrs["head_size"] = HEAD
    return [given.get(p.name) for p in spec.inputs], attrs


CASES = [
    # op, layout, 3-D, cache, K, rotary_dim, weight per head, other attributes
    ("RMSNormRotary", 2, False, "per_token", True, HEAD, False, {"cast_before_scale": 1}),
    ("RMSNormRotary", 0, False, "per_pair", False, HEAD, False, {"scale_offset": 1.0}),
    ("RMSNormRotary", 1, False, "positions", True, 4, True, {"interleaved": 1}),
    ("RMSNormRotary", 2, True, "per_token", True, HEAD, True, {"per_head": 0, "rotary_in_t": 0}),
    ("RMSNormRotary", 0, True, "positions", False, 4, False, {"rotary_first": 1}),
    ("LayerNormRotary", 2, False, "per_token", True, HEAD, True, {"interleaved": 1}),
    ("LayerNormRotary", 1, False, "per_pair", False, 4, False, {"cast_before_scale": 1}),
    ("L2NormRotary", 0, False, "per_token", True, HEAD, False, {"rotary_in_t": 0}),
    ("L2NormRotary", 2, True, "positions", False, HEAD, False, {"rotary_first": 1}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rotary_in_t", [0, 1])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-l{c[1]}-{c[3]}-k{int(c[4])}")
def test_eager_matches_reference(case, rotary_in_t, dtype):
    op, layout, three_d, cache, with_k, rotary_dim, per_head_weight, extra = case
    inputs, attrs = _inputs(op, dtype, layout, three_d, cache, with_k, rotary_dim, per_head_weight)
    attrs = {"epsilon": 1e-5, "rotary_in_t": rotary_in_t, **attrs, **extra}
    got = call(op, *inputs, **attrs)
    got = got if with_k else (got,)
    want = reference.run(op, *(_numpy(t) for t in inputs), **attrs)
    assert len(got) == len(want) == 1 + with_k
    rtol, atol = reference.tolerance(NP[dtype])
    for g, w in zip(got, want):
        assert g.dtype == dtype and tuple(g.shape) == w.shape
        np.testing.assert_allclose(g.float().numpy(), w.astype(np.float32), rtol=rtol, atol=atol)


def test_eager_errors_are_the_references():
    q, cos = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        call("RMSNormRotary", q, None, None, None, cos, cos, rotary_dim=3)
    with pytest.raises(ValueError, match="Cos's last dim"):
        call("RMSNormRotary", q, None, None, None, cos[..., :3], cos[..., :3])
    with pytest.raises(ValueError, match="KScale and KBias need K"):
        call("RMSNormRotary", q, None, None, torch.ones(8), cos, cos)
    with pytest.raises(ValueError, match="input Cos is required"):
        call("RMSNormRotary", q)
    with pytest.raises(TypeError, match="PositionIds must be int64"):
        call("L2NormRotary", q, None, cos[0], cos[0], torch.zeros(1, 3, dtype=torch.int32))


# --- QKNormRotary ------------------------------------------------------------------------------


def _hf_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm's forward (order A)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_module_is_qwen3s_norm_and_rotary(dtype):
    """Qwen3's attention: q_norm and k_norm on [b, s, h, d], the transpose, then
    ``apply_rotary_pos_emb``; the module with the same weights computes it to the bit."""
    module = QKNormRotary(
        "rms", HEAD, Q_HEADS, K_HEADS, cast_before_scale=1, layout="bshd_to_bhsd"
    ).to(dtype)
    assert set(module.state_dict()) == {"q_norm.weight", "k_norm.weight"}
    checkpoint = {
        "q_norm.weight": (1 + 0.3 * torch.randn(HEAD)).to(dtype),
        "k_norm.weight": (1 + 0.3 * torch.randn(HEAD)).to(dtype),
    }
    module.load_state_dict(checkpoint)
    q = torch.randn(BATCH, SEQ, Q_HEADS, HEAD).to(dtype)
    k = torch.randn(BATCH, SEQ, K_HEADS, HEAD).to(dtype)
    cos, sin = rope_angles(SEQ, HEAD, dtype)
    with torch.no_grad():
        got_q, got_k = module(q, k, cos, sin)
        want_q = apply_rotary(
            _hf_rms(q, checkpoint["q_norm.weight"], 1e-6).transpose(1, 2), cos, sin
        )
        want_k = apply_rotary(
            _hf_rms(k, checkpoint["k_norm.weight"], 1e-6).transpose(1, 2), cos, sin
        )
        torch.testing.assert_close(got_q, want_q, rtol=0, atol=0)
        torch.testing.assert_close(got_k, want_k, rtol=0, atol=0)
        assert torch.equal(module(q, None, cos, sin), got_q)


@pytest.mark.parametrize(
    "kind, options",
    [
        ("rms", dict(per_head=False, weight="heads", rotary_in_t=False)),  # OLMo 2
        ("layer", dict(weight="heads", interleaved=True, rotary_in_t=False)),  # Cohere
        ("layer", dict(bias=True, rotary_dim=4, layout="bhsd")),  # Phi
        ("rms", dict(weight=None, rotary_first=True, interleaved=True)),  # Llama 4
        ("l2", dict(weight=None)),
    ],
)
def test_module_matches_reference(kind, options):
    module = QKNormRotary(kind, HEAD, Q_HEADS, K_HEADS, eps=1e-5, **options)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(1 + 0.3 * torch.randn(p.shape))
    bhsd = options.get("layout") == "bhsd"
    shape = (BATCH, Q_HEADS, SEQ, HEAD) if bhsd else (BATCH, SEQ, Q_HEADS * HEAD)
    k_shape = (BATCH, K_HEADS, SEQ, HEAD) if bhsd else (BATCH, SEQ, K_HEADS * HEAD)
    q, k = torch.randn(shape).bfloat16(), torch.randn(k_shape).bfloat16()
    angles = torch.randn(16, options.get("rotary_dim", HEAD) // 2)
    cos, sin, positions = angles.cos(), angles.sin(), torch.randint(0, 16, (BATCH, SEQ))
    with torch.no_grad():
        got = module(q, k, cos, sin, positions)
    op = {"rms": "RMSNormRotary", "layer": "LayerNormRotary"}.get(kind, "L2NormRotary")
    spec = catalogue.get(op)
    weights = {
        "QScale": module.q_norm.weight if kind != "l2" else None,
        "KScale": module.k_norm.weight if kind != "l2" else None,
        "QBias": getattr(module.q_norm, "bias", None),
        "KBias": getattr(module.k_norm, "bias", None),
    }
    given = {"Q": q, "K": k, "Cos": cos, "Sin": sin, "PositionIds": positions, **weights}
    attrs = {
        "epsilon": 1e-5,
        "head_size": 0 if bhsd else HEAD,
        "layout": 1 if bhsd else 0,
        "per_head": int(options.get("per_head", True)),
        "rotary_dim": options.get("rotary_dim", 0),
        "interleaved": int(options.get("interleaved", False)),
        "rotary_first": int(options.get("rotary_first", False)),
        "rotary_in_t": int(options.get("rotary_in_t", True)),
    }
    inputs = [given.get(p.name) for p in spec.inputs]
    want = reference.run(op, *map(_numpy, inputs), **attrs)
    rtol, atol = reference.tolerance(NP[torch.bfloat16])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.float().numpy(), w.astype(np.float32), rtol=rtol, atol=atol)


def test_module_errors():
    with pytest.raises(ValueError, match="kind must be one of"):
        QKNormRotary("batch", HEAD, 2)
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        QKNormRotary("rms", HEAD, 2, rotary_dim=5)
    with pytest.raises(ValueError, match="per_head=False"):
        QKNormRotary("rms", HEAD, 2, per_head=False, layout="bhsd")
    module = QKNormRotary("rms", HEAD, 2, 0)
    assert module.k_norm is None and set(module.state_dict()) == {"q_norm.weight"}
    cos = torch.ones(1, 3, HEAD)
    with pytest.raises(ValueError, match="takes no k"):
        module(torch.randn(1, 3, 2, HEAD), torch.randn(1, 3, 2, HEAD), cos, cos)
    with pytest.raises(ValueError, match=r"got q of shape \(1, 3, 3, 8\)"):
        module(torch.randn(1, 3, 3, HEAD), None, cos, cos)


# --- export ------------------------------------------------------------------------------------


class TwoCalls(torch.nn.Module):
    """A Q/K norm and rotary of Q and K (Gemma 3's: 1 + weight, [b, h, s, d]) and one of Q
    alone with cached angles gathered by position (OLMo 2's norm of the whole projection)."""

    def __init__(self):
        super().__init__()
        self.both = QKNormRotary("rms", HEAD, Q_HEADS, K_HEADS, scale_offset=1.0, layout="bhsd")
        self.alone = QKNormRotary(
            "rms",
            HEAD,
            Q_HEADS,
            0,
            per_head=False,
            weight="heads",
            layout="bshd_to_bhsd",
            rotary_in_t=False,
        )
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.3 * torch.randn(p.shape) + float(p.shape != (HEAD,)))

    def forward(self, q, k, flat, cos, sin, cache, positions):
        q, k = self.both(q, k, cos, sin)
        return q, k, self.alone(flat, None, cache.cos(), cache.sin(), positions)


def _example(dtype: torch.dtype, batch: int = BATCH, seq: int = SEQ, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, Q_HEADS, seq, HEAD, generator=g).to(dtype)
    k = torch.randn(batch, K_HEADS, seq, HEAD, generator=g).to(dtype)
    flat = torch.randn(batch, seq, Q_HEADS * HEAD, generator=g).to(dtype)
    cos, sin = rope_angles(seq, HEAD, dtype)
    cache = torch.randn(32, HEAD // 2, generator=g)
    positions = torch.randint(0, 32, (batch, seq), generator=g)
    return (q, k, flat, cos, sin, cache, positions)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_export_one_node_per_call_and_parity(dtype):
    model = TwoCalls().to(dtype).eval()
    args = _example(dtype)
    shapes = (
        {0: "b", 2: "s"},
        {0: "b", 2: "s"},
        {0: "b", 1: "s"},
        {1: "s"},
        {1: "s"},
        None,
        {0: "b", 1: "s"},
    )
    proto = onnxnorm.export(model, args, dynamic_shapes=shapes)
    nodes = [n for n in proto.graph.node if n.domain == ops.DOMAIN]
    assert [n.op_type for n in nodes] == ["RMSNormRotary", "RMSNormRotary"]
    both, alone = ({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nodes)
    assert len(nodes[0].output) == 2 and all(nodes[0].input[:4])
    assert len(nodes[1].output) == 1 and nodes[1].input[1] == "" and nodes[1].input[6]
    assert both["scale_offset"] == 1.0 and both["layout"] == 1 and both["rotary_in_t"] == 1
    assert (alone["layout"], alone["per_head"], alone["head_size"]) == (2, 0, HEAD)
    assert alone["rotary_in_t"] == 0
    assert {f.name for f in proto.functions} == {"RMSNormRotary"}
    onnx.checker.check_model(proto, full_check=True)

    other = _example(dtype, batch=3, seq=7, seed=1)
    with torch.no_grad():
        want = [w.float().numpy() for w in model(*other)]
    rtol, atol = reference.tolerance(NP[dtype])
    for with_library in [False] + ([True] if _library_has("RMSNormRotary") else []):
        sess = runtime.session(proto, with_library=with_library)
        feed = {i.name: v.numpy() for i, v in zip(sess.get_inputs(), other)}
        for g, w in zip(sess.run(None, feed), want):
            np.testing.assert_allclose(
                g.astype(np.float32), w, rtol=2 * rtol, atol=2 * atol, err_msg=f"{with_library=}"
            )


@pytest.mark.parametrize("op", list(catalogue.ROTARY_OPS))
def test_every_rotary_op_exports_with_its_inputs(op):
    kind = {"RMSNormRotary": "rms", "LayerNormRotary": "layer"}.get(op, "l2")
    options = dict(weight=None) if kind == "l2" else dict(bias=kind == "layer")
    module = QKNormRotary(kind, HEAD, Q_HEADS, K_HEADS, interleaved=True, rotary_dim=4, **options)
    q, k = torch.randn(BATCH, SEQ, Q_HEADS, HEAD), torch.randn(BATCH, SEQ, K_HEADS, HEAD)
    cos, sin = torch.randn(1, SEQ, 2), torch.randn(1, SEQ, 2)
    proto = onnxnorm.export(module.eval(), (q, k, cos, sin), dynamic=False)
    (node,) = [n for n in proto.graph.node if n.domain == ops.DOMAIN]
    assert node.op_type == op and len(node.output) == 2
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["interleaved"], attrs["rotary_dim"]) == (1, 4)
    sess = runtime.session(proto, with_library=False)
    got = sess.run(None, {i.name: v.numpy() for i, v in zip(sess.get_inputs(), (q, k, cos, sin))})
    with torch.no_grad():
        for g, w in zip(got, module(q, k, cos, sin)):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)


# --- the reference decoder -----------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3", "olmo2", "cohere"])
def test_decoder_exports_what_the_fusion_makes_of_its_decomposed_export(family):
    """One rotary node of Q and K per attention layer (``expected_nodes``) in the onnxnorm
    impl's export; the decomposed impl's export, fused, has the same nodes, and both match the
    model in ONNX Runtime, with and without the library."""
    from onnxnorm.fusion import fuse
    from onnxnorm.nn.exporter import quiet_export

    config = families.decoder_config(
        family, hidden=32, heads=2, kv_heads=1, intermediate=64, layers=2
    )
    ours = decoder.build(config)
    plain = decoder.build(dataclasses.replace(config, impl="decomposed"))
    x = decoder.example_input(config, seq=6)
    exported = onnxnorm.export(ours, (x,))
    with quiet_export():
        program = torch.onnx.export(
            plain, (x,), dynamo=True, dynamic_shapes=({0: "batch", 1: "seq"},), optimize=True
        )
    fused, _ = fuse(program.model_proto, "function")
    counts = [
        collections.Counter(n.op_type for n in m.graph.node if n.domain == ops.DOMAIN)
        for m in (exported, fused)
    ]
    rotary = "LayerNormRotary" if config.norm == "layer" else "RMSNormRotary"
    assert counts[0] == counts[1] == ours.expected_nodes()
    assert counts[0][rotary] == config.layers
    for node in exported.graph.node:
        if node.op_type == rotary:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert len(node.output) == 2 and attrs["layout"] == 2
            assert attrs["per_head"] == int(family != "olmo2")
    other = decoder.example_input(config, batch=3, seq=5, seed=7)
    with torch.no_grad():
        want = ours(other).numpy()
    for model in (exported, fused):
        for with_library in [False] + ([True] if _library_has(rotary) else []):
            sess = runtime.session(model, with_library=with_library)
            got = sess.run(None, {sess.get_inputs()[0].name: other.numpy()})[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

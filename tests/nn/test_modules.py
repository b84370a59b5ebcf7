"""onnxnorm.nn modules and residual helpers in eager mode: drop-in for torch.nn, equal to the
numpy reference (the gated and L2 norms of hybrid LLMs included), DeepNorm's constants and
initialization, clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import onnxnorm
from onnxnorm import nn as onnxnorm_nn
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
    deepnorm_constants,
    deepnorm_init_,
    sandwich_norm,
)
from onnxnorm.ops import reference
from tests.support.matrix import BF16, torch_to_numpy


@pytest.fixture(autouse=True)
def _seed():
    """Every test draws the same inputs, whatever ran before it."""
    torch.manual_seed(0)


DTYPES = list(torch_to_numpy())


def to_np(t: torch.Tensor | None) -> np.ndarray | None:
    if t is None:
        return None
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(BF16)
    return t.numpy()


def assert_matches_reference(got: torch.Tensor, want: np.ndarray) -> None:
    rtol, atol = reference.tolerance(want.dtype)
    np.testing.assert_allclose(got.detach().float().numpy(), want.astype(np.float32), rtol, atol)


def randomized(norm, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
    return norm


@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, True)])
def test_layernorm_is_drop_in_for_torch(affine, bias):
    theirs = torch.nn.LayerNorm([4, 8], eps=1e-6, elementwise_affine=affine, bias=bias)
    ours = LayerNorm([4, 8], eps=1e-6, elementwise_affine=affine, bias=bias)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    randomized(theirs)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 5, 4, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ours(x), theirs(x))
    # torch rounds once (order B, our default); its kernel sums in another order, so a last-bit
    # difference is possible: the reference's bfloat16 tolerance
    x16 = x.to(torch.bfloat16)
    rtol, atol = reference.tolerance(BF16)
    torch.testing.assert_close(
        ours.to(torch.bfloat16)(x16), theirs.to(torch.bfloat16)(x16), rtol=rtol, atol=atol
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("order", [0, 1])
def test_modules_match_reference(dtype, order):
    x = (torch.randn(2, 3, 16) * 2 + 1).to(dtype)
    rms = randomized(RMSNorm(16, eps=1e-5, scale_offset=1.0, cast_before_scale=order)).to(dtype)
    want = reference.run(
        "RMSNorm",
        to_np(x),
        to_np(rms.weight),
        epsilon=1e-5,
        scale_offset=1.0,
        cast_before_scale=order,
    )[0]
    assert_matches_reference(rms(x), want)
    ln = randomized(LayerNorm(16, cast_before_scale=order)).to(dtype)
    want = reference.run(
        "LayerNorm", to_np(x), to_np(ln.weight), to_np(ln.bias), cast_before_scale=order
    )[0]
    assert_matches_reference(ln(x), want)


def test_per_head_norm_over_the_last_dim_only():
    """Cohere's Q/K LayerNorm: weight [heads, head_dim], statistics over head_dim."""
    norm = randomized(LayerNorm([4, 8], bias=False, axis=-1))
    x = torch.randn(2, 3, 4, 8)
    want = reference.run("LayerNorm", to_np(x), to_np(norm.weight), axis=-1)[0]
    assert_matches_reference(norm(x), want)
    with pytest.raises(ValueError, match="axis must be in"):
        LayerNorm([4, 8], axis=-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_add_norm_matches_skip_reference(dtype, kind):
    norm = randomized(
        RMSNorm(16, eps=1e-6, cast_before_scale=1) if kind == "rms" else LayerNorm(16)
    ).to(dtype)
    x, residual = torch.randn(2, 5, 16).to(dtype), torch.randn(2, 5, 16).to(dtype)
    x_bias = torch.randn(16).to(dtype)
    y, total = add_norm(norm, x, residual, alpha=1.7, x_bias=x_bias)
    op = "SkipRMSNorm" if kind == "rms" else "SkipLayerNorm"
    scale, bias = norm.parameters_for_op()
    want_y, want_sum = reference.run(
        op,
        to_np(x),
        to_np(residual),
        to_np(scale),
        to_np(bias),
        to_np(x_bias),
        alpha=1.7,
        **norm.attributes(dtype),
    )
    assert_matches_reference(y, want_y)
    assert_matches_reference(total, want_sum)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_sandwich_norm_matches_reference(dtype, kind):
    make = (
        (lambda s: RMSNorm(16, eps=1e-6, scale_offset=1.0))
        if kind == "rms"
        else (lambda s: LayerNorm(16))
    )
    inner, outer = randomized(make(0), 1).to(dtype), randomized(make(1), 2).to(dtype)
    x, residual = torch.randn(2, 5, 16).to(dtype), torch.randn(2, 5, 16).to(dtype)
    y, total = sandwich_norm(inner, outer, x, residual)
    op = "SandwichRMSNorm" if kind == "rms" else "SandwichLayerNorm"
    (si, bi), (so, bo) = inner.parameters_for_op(), outer.parameters_for_op()
    want_y, want_sum = reference.run(
        op,
        to_np(x),
        to_np(residual),
        to_np(si),
        to_np(bi),
        to_np(so),
        to_np(bo),
        **outer.attributes(dtype),
    )
    assert_matches_reference(y, want_y)
    assert_matches_reference(total, want_sum)


def test_sandwich_of_different_norms_falls_back_to_two_ops():
    inner, outer = randomized(RMSNorm(16, eps=1e-6)), randomized(RMSNorm(16, eps=1e-5), 1)
    x, residual = torch.randn(2, 16), torch.randn(2, 16)
    y, total = sandwich_norm(inner, outer, x, residual)
    torch.testing.assert_close(total, residual + inner(x))
    torch.testing.assert_close(y, outer(residual + inner(x)))


class Sub(torch.nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.linear = torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        return torch.tanh(self.linear(x))


def test_blocks_compute_their_placements():
    torch.manual_seed(0)
    n = [randomized(RMSNorm(16, eps=1e-6), i) for i in range(8)]
    s = [Sub() for _ in range(4)]
    x = torch.randn(2, 5, 16)
    blocks = [PreNormBlock(n[0], s[0]), SandwichBlock(n[1], s[1], n[2]), PreNormBlock(n[3], s[2])]
    stream = ResidualStream(x)
    for block in blocks:
        stream = block(stream)
    got = stream.finish(n[4])
    h = x + s[0](n[0](x))
    h = h + n[2](s[1](n[1](h)))
    h = h + s[2](n[3](h))
    torch.testing.assert_close(got, n[4](h))
    # Post-Norm and DeepNorm
    post = PostNormBlock(s[3], n[5])(x).value()
    torch.testing.assert_close(post, n[5](x + s[3](x)))
    deep = DeepNormBlock(s[3], n[6], alpha=2.5)(x).value()
    torch.testing.assert_close(deep, n[6](2.5 * x + s[3](x)))
    # no final norm: the pending add is done by itself
    torch.testing.assert_close(PreNormBlock(n[0], s[0])(x).finish(), x + s[0](n[0](x)))


def test_deepnorm_constants_follow_the_paper():
    # arXiv:2203.00555, Figure 2: encoder-only and decoder-only with 6 layers
    enc = deepnorm_constants("encoder", encoder_layers=6)["encoder"]
    assert enc.alpha == pytest.approx(12**0.25) and enc.beta == pytest.approx(48**-0.25)
    dec = deepnorm_constants("decoder", decoder_layers=6)["decoder"]
    assert dec.alpha == pytest.approx(12**0.25) and dec.beta == pytest.approx(48**-0.25)
    both = deepnorm_constants("encoder-decoder", encoder_layers=18, decoder_layers=12)
    assert both["encoder"].alpha == pytest.approx(0.81 * (18**4 * 12) ** (1 / 16))
    assert both["encoder"].beta == pytest.approx(0.87 * (18**4 * 12) ** (-1 / 16))
    assert both["decoder"].alpha == pytest.approx(36**0.25)
    assert both["decoder"].beta == pytest.approx(144**-0.25)
    # deeper stacks: larger alpha, smaller beta
    assert deepnorm_constants("decoder", decoder_layers=100)["decoder"].alpha > dec.alpha
    with pytest.raises(ValueError, match="unknown architecture"):
        deepnorm_constants("decoder-only", decoder_layers=6)
    with pytest.raises(ValueError, match="decoder_layers"):
        deepnorm_constants("decoder")


def test_deepnorm_init_scales_the_chosen_projections():
    torch.manual_seed(0)
    v, q = torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)
    beta = deepnorm_constants("decoder", decoder_layers=64)["decoder"].beta
    deepnorm_init_([v], beta, unscaled=[q])
    xavier = math.sqrt(2.0 / (256 + 256))
    assert v.weight.std().item() == pytest.approx(beta * xavier, rel=0.05)
    assert q.weight.std().item() == pytest.approx(xavier, rel=0.05)
    assert torch.count_nonzero(v.bias) == 0


def test_bad_inputs_are_clear():
    with pytest.raises(TypeError, match=r"onnxnorm\.nn\.RMSNorm or LayerNorm .*got LayerNorm"):
        PreNormBlock(torch.nn.LayerNorm(16), Sub())
    with pytest.raises(TypeError, match=r"expects a torch\.Tensor, got list"):
        RMSNorm(16)([1.0] * 16)
    with pytest.raises(TypeError, match=r"float32, float16 or bfloat16 input, got torch\.int64"):
        LayerNorm(16)(torch.ones(2, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="residual must be a tensor of x's shape"):
        add_norm(RMSNorm(16), torch.randn(2, 16), torch.randn(3, 16))
    with pytest.raises(TypeError, match=r"expected a torch\.Tensor or ResidualStream"):
        PreNormBlock(RMSNorm(16), Sub())("x")


# --- the gated and L2 norms of hybrid LLMs ------------------------------------------------------

#: (GatedRMSNorm keywords, input width): every activation, gate placement, grouping, rounding
#: order and offset, and one head's weight shared by the heads of a flattened input
GATED = {
    "qwen3next": (dict(hidden_size=32, eps=1e-6), 32),
    "kimi": (dict(hidden_size=32, activation="sigmoid", cast_before_scale=0), 32),
    "mamba2": (dict(hidden_size=64, group_size=16, eps=1e-5, norm_before_gate=False), 64),
    "falcon_h1": (dict(hidden_size=64, group_size=32, cast_before_scale=0), 64),
    "offset": (dict(hidden_size=64, group_size=8, scale_offset=1.0, norm_before_gate=False), 64),
    "shared": (dict(hidden_size=16, group_size=16, activation="sigmoid"), 64),
}


def _gated_reference(norm: GatedRMSNorm, x: torch.Tensor, gate: torch.Tensor | None):
    return reference.run(
        "GatedRMSNorm", to_np(x), to_np(norm.weight), to_np(gate), **norm.attributes(x)
    )[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(GATED))
def test_gated_rms_norm_matches_reference(case, dtype):
    kwargs, width = GATED[case]
    norm = randomized(GatedRMSNorm(**kwargs)).to(dtype)
    if kwargs.get("scale_offset"):
        assert torch.equal(GatedRMSNorm(**kwargs).weight, torch.zeros(kwargs["hidden_size"]))
    x = (2 * torch.randn(2, 5, width) + 0.5).to(dtype)
    gate = (2 * torch.randn(2, 5, width)).to(dtype)
    assert_matches_reference(norm(x, gate), _gated_reference(norm, x, gate))
    assert_matches_reference(norm(x), _gated_reference(norm, x, None))


def test_gated_norm_attributes_and_grouping():
    """Without a gate it is RMSNorm over each group; the node's group_size is 0 where one group
    covers the input's last dim, the group's size where the weight is one group's."""
    norm = randomized(GatedRMSNorm(64, group_size=16, eps=1e-5))
    x = torch.randn(3, 64)
    grouped = RMSNorm(16, eps=1e-5, elementwise_affine=False, cast_before_scale=1)
    want = grouped(x.view(3, 4, 16)).view(3, 64) * norm.weight
    torch.testing.assert_close(norm(x), want)
    assert norm.attributes(x)["group_size"] == 16
    whole = GatedRMSNorm(16)
    assert whole.attributes(torch.randn(2, 16))["group_size"] == 0
    assert whole.attributes(torch.randn(2, 64))["group_size"] == 16  # shared by 4 heads
    attrs = GatedRMSNorm(8, activation="sigmoid", norm_before_gate=False).attributes(x[:, :8])
    assert attrs["activation"] == 1 and attrs["norm_before_gate"] == 0
    assert attrs["cast_before_scale"] == 1 and attrs["axis"] == -1
    assert "group_size=16" in repr(norm) and "activation='silu'" in repr(norm)


def test_float32_input_with_a_half_gate_and_weight():
    """Mamba2's scan output is float32 and its gate and weight of the model's type: both are
    taken to float32 exactly, and the output is float32, as in the Hugging Face class."""
    half = randomized(GatedRMSNorm(64, group_size=8, norm_before_gate=False)).bfloat16()
    full = GatedRMSNorm(64, group_size=8, norm_before_gate=False)
    full.load_state_dict({"weight": half.weight.float()})
    x, gate = torch.randn(2, 3, 64), torch.randn(2, 3, 64).bfloat16()
    got = half(x, gate)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, full(x, gate.float()), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("axis", [-1, -2])
def test_l2_norm_matches_reference(dtype, axis):
    norm = L2Norm(eps=1e-6, axis=axis)
    x = (3 * torch.randn(2, 5, 4, 16)).to(dtype)
    want = reference.run("L2Norm", to_np(x), axis=axis, epsilon=1e-6)[0]
    assert_matches_reference(norm(x), want)
    assert not list(norm.parameters())
    # FLA's l2norm, as Qwen3-Next's modeling code writes it, bit for bit in float32
    xf = x.float()
    fla = xf * torch.rsqrt((xf * xf).sum(dim=tuple(range(axis, 0)), keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(xf), fla, rtol=0, atol=0)


def test_weightless_rms_norm_of_any_size():
    """Llama 4's Q/K norm: RMSNorm without weight over the last dim, whatever its size."""
    norm = RMSNorm(None, eps=1e-5, elementwise_affine=False)
    for width in (8, 16, 128):
        x = torch.randn(2, 3, width)
        torch.testing.assert_close(norm(x), torch.nn.functional.rms_norm(x, (width,), eps=1e-5))
    two = LayerNorm(None, elementwise_affine=False, axis=-2)
    x = torch.randn(2, 3, 4, 8)
    torch.testing.assert_close(two(x), torch.nn.functional.layer_norm(x, (4, 8)))
    with pytest.raises(ValueError, match="may be None only for a norm without weights"):
        RMSNorm(None)
    with pytest.raises(ValueError, match=r"over the last 2 dimension\(s\) got an input"):
        two(torch.randn(8))


def test_new_modules_are_public():
    for name in ("GatedRMSNorm", "L2Norm", "RMSNorm", "LayerNorm"):
        assert name in onnxnorm.__all__ and name in onnxnorm_nn.__all__
        assert getattr(onnxnorm, name) is getattr(onnxnorm_nn, name)
    assert set(onnxnorm.__all__) <= set(dir(onnxnorm))


def test_gated_and_l2_bad_inputs_are_clear():
    norm = GatedRMSNorm(64, group_size=16)
    with pytest.raises(ValueError, match="the gate must have the input's shape and type"):
        norm(torch.randn(2, 64), torch.randn(2, 32))
    with pytest.raises(ValueError, match="the gate must have the input's shape and type"):
        norm(torch.randn(2, 64).half(), torch.randn(2, 64))
    with pytest.raises(ValueError, match=r"over 64 \(groups of 16\) got an input of shape"):
        norm(torch.randn(2, 128))
    with pytest.raises(ValueError, match="group_size must be a positive divisor of hidden_size"):
        GatedRMSNorm(64, group_size=24)
    with pytest.raises(ValueError, match="activation must be one of"):
        GatedRMSNorm(64, activation="gelu")
    with pytest.raises(TypeError, match=r"float32, float16 or bfloat16 gate, got torch\.int64"):
        norm(torch.randn(2, 64), torch.ones(2, 64, dtype=torch.long))
    with pytest.raises(TypeError, match=r"L2Norm expects float32, float16 or bfloat16 input"):
        L2Norm()(torch.ones(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="axis must be negative"):
        L2Norm(axis=1)
    # no residual op fuses them
    with pytest.raises(TypeError, match=r"onnxnorm\.nn\.RMSNorm or LayerNorm .*got GatedRMSNorm"):
        PreNormBlock(GatedRMSNorm(16), Sub())

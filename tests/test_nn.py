"""onnxnorm.nn modules and residual helpers in eager mode: drop-in for torch.nn, equal to the
numpy reference, DeepNorm's constants and initialization, clear errors."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from onnxnorm.nn import (
    DeepNormBlock,
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


@pytest.fixture(autouse=True)
def _seed():
    """Every test draws the same inputs, whatever ran before it."""
    torch.manual_seed(0)


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NP = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16}


def to_np(t: torch.Tensor | None) -> np.ndarray | None:
    if t is None:
        return None
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
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
    rtol, atol = reference.tolerance(ml_dtypes.bfloat16)
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

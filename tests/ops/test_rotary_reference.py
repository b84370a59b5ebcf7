"""The rotary ops' reference (RMSNormRotary, LayerNormRotary, L2NormRotary): against the query
and key that transformers' own attention layers hand their attention kernel, family by family,
and its properties (the caches' forms, the layouts, K absent, partial rotary, NaN and Inf, the
errors)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from onnxnorm.ops import catalogue, reference
from tests.support.helpers import assert_close

F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)

# the tiny models: batch 2, seq 7, hidden 64, 4 query heads of 16, 2 key/value heads
BATCH, SEQ, HIDDEN, HEADS, KV_HEADS, HEAD = 2, 7, 64, 4, 2, 16
SIZES = {
    "vocab_size": 96,
    "hidden_size": HIDDEN,
    "num_hidden_layers": 1,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
#: the share of float16/bfloat16 values the reference must give bit for bit (the rest: ties
#: of the double rounding, the model rounding a float32 value the reference takes in float64)
EXACT = 0.995
#: the most the other rounding choice may give bit for bit: it must miss a clear share
FLIPPED = 0.97
#: the name the capturing attention function is registered under
CAPTURE = "onnxnorm_capture"


# ---------------------------------------------------------------------------------------------
# Parity with transformers' attention layers


@dataclasses.dataclass(frozen=True)
class Family:
    """A family's tiny model and the op call that reproduces its Q/K norm and rotary."""

    #: the model without its LM head, in float32, its norm weights random
    build: Callable[[], Any]
    op: str
    attrs: dict[str, Any]
    #: the other rounding choices, each of which must miss a clear share of the values
    flips: tuple[dict[str, Any], ...]
    #: the attention module's norm weights, in the op's order (QScale, KScale[, QBias, KBias])
    weights: Callable[[Any], tuple] = lambda attn: ()
    #: Q and K from q_proj's and k_proj's outputs (Qwen3-Next's Q holds a gate beside each
    #: head's query)
    projections: Callable[[Any, Any], tuple] = lambda q, k: (q, k)
    #: (Cos, Sin) from the position_embeddings the layer receives
    angles: Callable[[Any], tuple] = lambda pe: tuple(pe)
    #: the position ids the model is called with (None: [batch, seq], each row from its own
    #: offset, so that each row's cos and sin differ)
    positions: Callable[[], Any] | None = None


def _hf(family: str, **overrides) -> Callable[[], Any]:
    """A tiny model of a family of onnxnorm.testing.hf.FAMILIES."""

    def build():
        from onnxnorm.testing import hf

        fields = {"layers": 1, **overrides}
        config = hf.config(family, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, **fields)
        return hf.model(config, "base", attention=CAPTURE)

    return build


def _direct(config_class: str, model_class: str, **overrides) -> Callable[[], Any]:
    """A tiny model of a family that onnxnorm.testing.hf.FAMILIES does not list, built from
    transformers' own classes (skipped where this transformers lacks them)."""

    def build():
        import transformers

        from onnxnorm.testing import hf

        if not hasattr(transformers, config_class) or not hasattr(transformers, model_class):
            pytest.skip(f"this transformers has no {model_class}")
        config = getattr(transformers, config_class)(**{**SIZES, **overrides})
        return hf.model(config, model_class, attention=CAPTURE)

    return build


def _qk(attn, name: str = "norm") -> tuple:
    return getattr(attn, "q_" + name).weight, getattr(attn, "k_" + name).weight


def _qk_bias(attn, name: str = "norm") -> tuple:
    return (
        *_qk(attn, name),
        getattr(attn, "q_" + name).bias,
        getattr(attn, "k_" + name).bias,
    )


def _per_head_modules(attn) -> tuple:
    """StableLM's weights: one LayerNorm module per head, stacked to [heads, head_size]."""
    import torch

    return tuple(
        torch.stack([norm.weight for norm in getattr(attn, name).norms])
        for name in ("q_layernorm", "k_layernorm")
    )


def _gated_query(q, k):
    """Qwen3-Next's q_proj output holds each head's query, then its gate: the query half, and
    K as 4-D too."""
    return q.view(*q.shape[:-1], HEADS, 2 * HEAD)[..., :HEAD], k.view(*k.shape[:-1], -1, HEAD)


def _mrope_positions():
    """Qwen3-VL's text, temporal, height and width positions, [4, batch, seq], each different."""
    import torch

    base = torch.arange(SEQ)
    rows = [torch.stack([base + b + 3 * axis for b in range(BATCH)]) for axis in range(4)]
    return torch.stack(rows)


_A, _B = {"cast_before_scale": 1}, {"cast_before_scale": 0}
_3D = {"head_size": HEAD, "layout": 2}  # the flat projection in, [b, h, s, d] out
_IN_T, _IN_F32 = {"rotary_in_t": 1}, {"rotary_in_t": 0}

FAMILIES: dict[str, Family] = {
    "qwen3": Family(_hf("qwen3"), "RMSNormRotary", {**_A, **_3D, **_IN_T}, (_B,), _qk),
    "qwen3_next": Family(
        # layer 0 is a linear-attention layer, layer 1 the full-attention one; 1/4 rotated
        _hf("qwen3_next", layers=2),
        "RMSNormRotary",
        {**_B, "scale_offset": 1.0, "layout": 2, "rotary_dim": HEAD // 4, **_IN_T},
        (_A,),
        _qk,
        projections=_gated_query,
    ),
    "qwen3_vl": Family(
        _direct(
            "Qwen3VLTextConfig",
            "Qwen3VLTextModel",
            head_dim=HEAD,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [4, 2, 2],
                "mrope_interleaved": True,
            },
        ),
        "RMSNormRotary",
        {**_A, **_3D, **_IN_T},
        (_B,),
        _qk,
        positions=_mrope_positions,
    ),
    "gemma3": Family(
        _hf("gemma3"), "RMSNormRotary", {**_B, "scale_offset": 1.0, **_3D, **_IN_T}, (_A,), _qk
    ),
    "gemma3n": Family(_hf("gemma3n"), "RMSNormRotary", {**_B, **_3D, **_IN_T}, (_A,), _qk),
    "olmo2": Family(
        # the norm over each token's whole projection; cos and sin kept in float32
        _hf("olmo2"),
        "RMSNormRotary",
        {**_B, **_3D, "per_head": 0, **_IN_F32},
        (_A, _IN_T),
        _qk,
    ),
    "cohere": Family(
        # a weight per head; the pairs rotated in float32, cos and sin of Q's type
        _hf("cohere", use_qk_norm=True),
        "LayerNormRotary",
        {**_B, **_3D, "interleaved": 1, **_IN_F32},
        (_A, _IN_T),
        _qk,
    ),
    "stablelm": Family(
        _direct("StableLmConfig", "StableLmModel", qk_layernorm=True),
        "LayerNormRotary",
        {**_B, **_3D, "rotary_dim": HEAD // 4, **_IN_T},
        (_A,),
        _per_head_modules,
    ),
    "apertus": Family(
        _direct("ApertusConfig", "ApertusModel"),
        "RMSNormRotary",
        {**_A, **_3D, **_IN_T},
        (_B,),
        _qk,
    ),
    "phi": Family(
        _hf("phi", qk_layernorm=True),
        "LayerNormRotary",
        {**_B, **_3D, "rotary_dim": HEAD // 2, **_IN_T},
        (_A,),
        functools.partial(_qk_bias, name="layernorm"),
    ),
    "chameleon": Family(
        _direct(
            "ChameleonConfig",
            "ChameleonModel",
            vq_config={
                "embed_dim": 8,
                "num_embeddings": 16,
                "latent_channels": 32,
                "base_channels": 32,
                "channel_multiplier": [1],
                "num_res_blocks": 1,
                "resolution": 16,
            },
            vocabulary_map={"<image>": 95},
        ),
        "LayerNormRotary",
        {**_A, **_3D, **_IN_T},
        (_B,),
        _qk_bias,
    ),
    "llama4": Family(
        # rotated as complex numbers in float32, then the weightless norm
        _direct(
            "Llama4TextConfig",
            "Llama4TextModel",
            head_dim=HEAD,
            intermediate_size_mlp=64,
            num_local_experts=2,
            no_rope_layers=[1],  # layer 0 rotates (and so has its norm)
        ),
        "RMSNormRotary",
        {**_3D, "interleaved": 1, "rotary_first": 1, **_IN_F32},
        (_IN_T,),
        angles=lambda pe: (pe.real, pe.imag),
    ),
    "nanochat": Family(
        # rotate_half is cat(x2, -x1): the rotation by minus the angle
        _direct("NanoChatConfig", "NanoChatModel"),
        "RMSNormRotary",
        {**_3D, "rotary_first": 1, **_IN_T},
        (_IN_F32,),
        angles=lambda pe: (pe[0], -pe[1]),
    ),
}


@functools.cache
def _register_capture() -> list:
    """Registers the attention function that records each attention module's query and key
    (then computes SDPA); returns the list it records (module, query, key) into."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seen: list = []

    def capture(module, query, key, value, attention_mask, **kwargs):
        seen.append((module, query.detach().clone(), key.detach().clone()))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(CAPTURE, capture)
    return seen


@functools.cache
def _built(name: str):
    """The family's float32 model (built once); skips where this transformers cannot build
    it."""
    import transformers

    _register_capture()
    try:
        return FAMILIES[name].build()
    except (AttributeError, ImportError, KeyError, TypeError, ValueError) as error:
        pytest.skip(f"no tiny {name} model in transformers {transformers.__version__}: {error}")


def _attention(model):
    """The first attention module with a Q/K norm (layer 0's, or the first full-attention
    layer's of a hybrid)."""
    for module in model.modules():
        if hasattr(module, "q_proj") and any(
            hasattr(module, n) for n in ("q_norm", "q_layernorm", "qk_norm")
        ):
            return module
    raise AssertionError(f"{type(model).__name__} has no attention module with a Q/K norm")


def _numpy(t) -> np.ndarray:
    """A float32, float16 or bfloat16 torch tensor as a numpy array of its type."""
    import torch

    types = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}
    return t.detach().float().numpy().astype(types[t.dtype])


def _capture(name: str, dtype) -> dict[str, Any]:
    """Runs the family's model in ``dtype`` and returns what its attention module saw: q_proj
    and k_proj's outputs, the position embeddings and the query and key after norm and
    rotary."""
    import torch

    seen = _register_capture()
    family = FAMILIES[name]
    model = copy.deepcopy(_built(name)).to(dtype)
    attn = _attention(model)
    got: dict[str, Any] = {}

    def keep(key):
        return lambda module, args, output: got.__setitem__(key, output.detach().clone())

    def keep_angles(module, args, kwargs):
        got["pe"] = kwargs.get("position_embeddings", args[1] if len(args) > 1 else None)

    hooks = [
        attn.q_proj.register_forward_hook(keep("q")),
        attn.k_proj.register_forward_hook(keep("k")),
        attn.register_forward_pre_hook(keep_angles, with_kwargs=True),
    ]
    ids = torch.randint(
        0, SIZES["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(0)
    )
    if family.positions is None:  # each row its own positions: per-token Cos and Sin differ
        positions = torch.stack([torch.arange(SEQ) + 3 * b for b in range(BATCH)])
    else:
        positions = family.positions()
    seen.clear()
    try:
        with torch.no_grad():
            model(input_ids=ids, position_ids=positions, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    query, key = next((q, k) for module, q, k in seen if module is attn)
    names = ("QScale", "KScale", "QBias", "KBias")
    for weight in family.weights(attn):  # random, not their initial 1 (or 0)
        assert torch.unique(weight).numel() > 1, f"{name}: a norm weight is constant"
    inputs = dict(zip(("Q", "K"), family.projections(got["q"], got["k"]), strict=True))
    inputs.update(zip(names, family.weights(attn), strict=False))
    inputs.update(zip(("Cos", "Sin"), family.angles(got["pe"]), strict=True))
    return {
        "inputs": {role: _numpy(value) for role, value in inputs.items()},
        "want": (_numpy(query), _numpy(key)),
        "epsilon": _epsilon(attn),
    }


def _epsilon(attn) -> float:
    """The epsilon of the attention module's Q norm."""
    for name in ("q_norm", "q_layernorm", "qk_norm"):
        norm = getattr(attn, name, None)
        if norm is None:
            continue
        if hasattr(norm, "norms"):  # StableLM's module per head
            norm = norm.norms[0]
        for field in ("variance_epsilon", "eps", "epsilon"):
            if hasattr(norm, field):
                return float(getattr(norm, field))
    raise AssertionError(f"no epsilon on {type(attn).__name__}")


def _exact(name: str, captured: dict[str, Any], **changes) -> tuple[float, list[np.ndarray]]:
    """The share of QOut and KOut values equal to the model's, bit for bit, and the outputs,
    with the family's attributes and ``changes``."""
    family = FAMILIES[name]
    attrs = {**family.attrs, "epsilon": captured["epsilon"], **changes}
    named = {**captured["inputs"], **captured.get("replace", {})}
    inputs = [named.get(p.name) for p in catalogue.get(family.op).inputs]
    outputs = reference.run(family.op, *inputs, **attrs)
    equal = [
        (got.astype(np.float32) == want.astype(np.float32)) | (np.isnan(got) & np.isnan(want))
        for got, want in zip(outputs, captured["want"], strict=True)
    ]
    total = sum(e.size for e in equal)
    return sum(int(e.sum()) for e in equal) / total, outputs


def _dtypes():
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_reference_reproduces_transformers_attention(name, dtype):
    """Each family's tiny model: the query and key its attention layer hands the attention
    kernel, after its Q/K norm and its rotary, are the rotary op's QOut and KOut of the layer's
    q_proj and k_proj outputs, norm weights and cos and sin, with the attributes of the
    family's form (rounding order, layout, per-head or per-token norm, half-split or
    interleaved, partial rotary, the rotation in Q's type or in float32, rotary first): in
    float32 within tolerance, in float16 and bfloat16 bit for bit but for rare ties. The other
    rounding choice of each attribute that matters misses a clear share of the values."""
    pytest.importorskip("transformers")
    torch_dtype = _dtypes()[dtype]
    captured = _capture(name, torch_dtype)
    fraction, outputs = _exact(name, captured)
    if dtype == "float32":
        for got, want in zip(outputs, captured["want"], strict=True):
            assert_close(got, want)
        return
    worst = [
        float(np.abs(got.astype(np.float32) - want.astype(np.float32)).max())
        for got, want in zip(outputs, captured["want"], strict=True)
    ]
    assert fraction >= EXACT, f"{name} {dtype}: {fraction:.4%} exact, max abs diff {worst}"
    for flip in FAMILIES[name].flips:
        other, _ = _exact(name, captured, **flip)
        assert other <= FLIPPED, f"{name} {dtype} with {flip}: {other:.4%} exact ({fraction:.4%})"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_one_angle_per_pair_reproduces_transformers_caches(name):
    """The caches transformers computes hold each angle twice (the halves of cat(freqs,
    freqs), or the pairs of repeat_interleave): with one value per rotated pair (C =
    rotary_dim / 2, ONNX's RotaryEmbedding's caches), the rotary op gives the same bits
    (bfloat16). Llama 4's complex caches already hold one per pair."""
    pytest.importorskip("transformers")
    import torch

    family = FAMILIES[name]
    captured = _capture(name, torch.bfloat16)
    rotary_dim = family.attrs.get("rotary_dim") or HEAD
    cos, sin = captured["inputs"]["Cos"], captured["inputs"]["Sin"]
    if cos.shape[-1] != rotary_dim:
        assert cos.shape[-1] == rotary_dim // 2
        return
    interleaved = family.attrs.get("interleaved", 0)
    halves = [_one_per_pair(c, interleaved) for c in (cos, sin)]
    for full, half in zip((cos, sin), halves, strict=True):
        np.testing.assert_array_equal(_every_value(half, interleaved), full)
    _, full_width = _exact(name, captured)
    _, per_pair = _exact(name, {**captured, "replace": dict(zip(("Cos", "Sin"), halves))})
    for got, want in zip(per_pair, full_width, strict=True):
        np.testing.assert_array_equal(got, want)


def _one_per_pair(cache: np.ndarray, interleaved: int) -> np.ndarray:
    """A full-width cache (one angle per value) as one angle per rotated pair."""
    return cache[..., 0::2] if interleaved else cache[..., : cache.shape[-1] // 2]


def _every_value(cache: np.ndarray, interleaved: int) -> np.ndarray:
    """A cache of one angle per rotated pair as one per value: its halves duplicated
    (half-split) or its pairs (interleaved)."""
    if interleaved:
        return np.repeat(cache, 2, axis=-1)
    return np.concatenate([cache, cache], axis=-1)


# ---------------------------------------------------------------------------------------------
# Properties of the reference

#: each rotary op, and the plain norm op of its kind
NORM_OF = {"RMSNormRotary": "RMSNorm", "LayerNormRotary": "LayerNorm", "L2NormRotary": "L2Norm"}
DTYPES = {"float32": F32, "float16": F16, "bfloat16": BF16}


def _random(rng, shape, dtype, spread=1.0, offset=0.0) -> np.ndarray:
    return (offset + spread * rng.standard_normal(shape)).astype(dtype)


def _table(rng, positions: int, width: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Cos and Sin of random angles, [positions, width]."""
    theta = rng.uniform(-np.pi, np.pi, (positions, width))
    return np.cos(theta).astype(dtype), np.sin(theta).astype(dtype)


def _weights(op: str, rng, heads_q: int, heads_k: int, head: int, dtype) -> list:
    """QScale, KScale (and QBias, KBias) of the op, one head's and each head's."""
    if op == "L2NormRotary":
        return []
    scales = [_random(rng, (head,), dtype, 0.2, 1.0), _random(rng, (heads_k, head), dtype, 0.2, 1)]
    if op == "LayerNormRotary":
        scales += [_random(rng, (heads_q, head), dtype, 0.2), _random(rng, (head,), dtype, 0.2)]
    return scales


def _call(op: str, q, k, weights, cos, sin, positions=None, **attrs) -> list[np.ndarray]:
    """The op's outputs, its inputs given by role."""
    return reference.run(op, q, k, *weights, cos, sin, positions, **attrs)


@pytest.mark.parametrize("rotary_dim", [0, 8])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", list(NORM_OF))
def test_gathered_half_width_caches_equal_full_width_per_token(op, dtype, interleaved, rotary_dim):
    """A table of one angle per rotated pair (C = rotary_dim / 2) gathered by PositionIds
    gives the same bits as per-token caches of one angle per value: its halves duplicated
    (half-split) or its pairs repeated (interleaved); and as the per-token one-per-pair
    caches, given for every row of the batch or once for all."""
    rng = np.random.default_rng(7)
    t = DTYPES[dtype]
    rot = rotary_dim or HEAD
    q, k = _random(rng, (BATCH, SEQ, HEADS, HEAD), t), _random(rng, (BATCH, SEQ, 2, HEAD), t)
    weights = _weights(op, rng, HEADS, 2, HEAD, t)
    cos, sin = _table(rng, 32, rot // 2, t)
    positions = rng.integers(0, 32, (BATCH, SEQ)).astype(np.int64)
    attrs = {"interleaved": interleaved, "rotary_dim": rotary_dim, "rotary_in_t": 1}
    want = _call(op, q, k, weights, cos, sin, positions, **attrs)
    full = [_every_value(c[positions], interleaved) for c in (cos, sin)]
    per_pair = [c[positions] for c in (cos, sin)]
    for caches in (full, per_pair):
        got = _call(op, q, k, weights, *caches, **attrs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
    same = np.broadcast_to(positions[:1], positions.shape)  # one row for the whole batch
    once = [c[positions[:1]] for c in (cos, sin)]
    for g, w in zip(
        _call(op, q, k, weights, *once, **attrs),
        _call(op, q, k, weights, cos, sin, np.ascontiguousarray(same), **attrs),
        strict=True,
    ):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", list(NORM_OF))
def test_layouts_and_3d_inputs_give_the_same_values(op, dtype):
    """Layout 0 ([b, s, h, d] in and out), 1 ([b, h, s, d] in and out) and 2 ([b, s, h, d] in,
    [b, h, s, d] out) give the same values, transposed; a 3-D [b, s, h * d] Q and K with
    head_size give those of the 4-D ones (layout 0: 3-D out, layout 2: [b, h, s, d] out)."""
    rng = np.random.default_rng(11)
    t = DTYPES[dtype]
    q, k = _random(rng, (BATCH, SEQ, HEADS, HEAD), t), _random(rng, (BATCH, SEQ, 2, HEAD), t)
    weights = _weights(op, rng, HEADS, 2, HEAD, t)
    cos, sin = (c.reshape(BATCH, SEQ, 12) for c in _table(rng, BATCH * SEQ, 12, t))  # per token
    attrs = {"rotary_dim": 12, "rotary_in_t": 0, "cast_before_scale": 1}
    if op == "L2NormRotary":
        del attrs["cast_before_scale"]
    want = _call(op, q, k, weights, cos, sin, **attrs)
    assert [w.shape for w in want] == [q.shape, k.shape]

    def transposed(x):
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3))

    by_layout = {
        1: _call(op, transposed(q), transposed(k), weights, cos, sin, layout=1, **attrs),
        2: _call(op, q, k, weights, cos, sin, layout=2, **attrs),
    }
    flat = [x.reshape(BATCH, SEQ, -1) for x in (q, k)]
    three_d = {
        0: _call(op, *flat, weights, cos, sin, head_size=HEAD, **attrs),
        2: _call(op, *flat, weights, cos, sin, head_size=HEAD, layout=2, **attrs),
    }
    for i, w in enumerate(want):
        np.testing.assert_array_equal(by_layout[1][i], transposed(w))
        np.testing.assert_array_equal(by_layout[2][i], transposed(w))
        np.testing.assert_array_equal(three_d[0][i], w.reshape(BATCH, SEQ, -1))
        np.testing.assert_array_equal(three_d[2][i], transposed(w))


@pytest.mark.parametrize("rotary_first", [0, 1])
@pytest.mark.parametrize("op", list(NORM_OF))
def test_q_alone_is_q_of_the_call_with_k(op, rotary_first):
    """K absent (and KScale, KBias): QOut alone, the QOut of the call with K."""
    rng = np.random.default_rng(3)
    q, k = _random(rng, (BATCH, SEQ, HEADS, HEAD), BF16), _random(rng, (BATCH, SEQ, 2, HEAD), BF16)
    weights = _weights(op, rng, HEADS, 2, HEAD, BF16)
    alone = [None if i % 2 else w for i, w in enumerate(weights)]  # no KScale, KBias
    cos, sin = _table(rng, 16, HEAD // 2, np.float32)
    positions = rng.integers(0, 16, (BATCH, SEQ)).astype(np.int64)
    attrs = {"rotary_first": rotary_first, "rotary_in_t": 1}
    both = _call(op, q, k, weights, cos, sin, positions, **attrs)
    only = _call(op, q, None, alone, cos, sin, positions, **attrs)
    assert len(both) == 2 and len(only) == 1
    np.testing.assert_array_equal(only[0], both[0])


@pytest.mark.parametrize("per_head", [1, 0])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", list(NORM_OF))
def test_partial_rotary_leaves_the_tail_to_the_norm(op, dtype, per_head):
    """rotary_dim < head_size: the values past rotary_dim are those of the norm alone (the
    plain norm op over each head, or each token with per_head = 0), bit for bit; the rotated
    ones differ."""
    rng = np.random.default_rng(5)
    t = DTYPES[dtype]
    q = _random(rng, (BATCH, SEQ, HEADS, HEAD), t)
    scale, bias = _random(rng, (HEAD,), t, 0.2, 1.0), _random(rng, (HEAD,), t, 0.2)
    own = {"RMSNormRotary": (scale,), "LayerNormRotary": (scale, bias), "L2NormRotary": ()}[op]
    weights = [x for w in own for x in (w, None)]  # Q's, none for K
    cos, sin = _table(rng, 1, 4, t)
    cos, sin = cos[None].repeat(SEQ, 1), sin[None].repeat(SEQ, 1)  # [1, seq, 4]
    attrs: dict[str, Any] = {"epsilon": 1e-6, "per_head": per_head}
    if op != "L2NormRotary":
        attrs["cast_before_scale"] = 1
    (got,) = _call(op, q, None, weights, cos, sin, rotary_dim=8, rotary_in_t=1, **attrs)
    norm_attrs = {k: v for k, v in attrs.items() if k != "per_head"}
    if per_head:
        (normed,) = reference.run(NORM_OF[op], q, *own, axis=-1, **norm_attrs)
    else:  # a token's heads together: the weight repeated for each head
        tiled = [np.tile(w, HEADS) for w in own]
        flat = q.reshape(BATCH, SEQ, -1)
        (normed,) = reference.run(NORM_OF[op], flat, *tiled, axis=-1, **norm_attrs)
        normed = normed.reshape(q.shape)
    np.testing.assert_array_equal(got[..., 8:], normed[..., 8:])
    assert (got[..., :8] != normed[..., :8]).mean() > 0.5


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("rotary_first", [0, 1])
@pytest.mark.parametrize("per_head", [1, 0])
@pytest.mark.parametrize("op", list(NORM_OF))
def test_nan_and_inf_stay_in_their_head(op, per_head, rotary_first, value):
    """A NaN or an infinity in Q makes its head's values non-finite (its token's, with
    per_head = 0) and no others: not the token's other heads, nor other tokens, nor K."""
    rng = np.random.default_rng(9)
    q, k = _random(rng, (BATCH, SEQ, HEADS, HEAD), F16), _random(rng, (BATCH, SEQ, 2, HEAD), F16)
    weights = _weights(op, rng, HEADS, 2, HEAD, F16)
    q[1, 3, 2, 5] = value
    cos, sin = _table(rng, 16, HEAD // 2, F16)
    positions = rng.integers(0, 16, (BATCH, SEQ)).astype(np.int64)
    attrs = {"rotary_first": rotary_first, "per_head": per_head, "rotary_in_t": 1}
    q_out, k_out = _call(op, q, k, weights, cos, sin, positions, **attrs)
    bad = ~np.isfinite(q_out.astype(np.float32))
    reach = np.zeros(q.shape, bool)
    if per_head:
        reach[1, 3, 2] = True
    else:
        reach[1, 3] = True
    assert bad[reach].any() and not bad[~reach].any()
    assert np.isfinite(k_out.astype(np.float32)).all()


def _error_case(**changes):
    """The inputs and attributes of a valid RMSNormRotary call (float16), with ``changes``."""
    rng = np.random.default_rng(1)
    case: dict[str, Any] = {
        "Q": _random(rng, (BATCH, SEQ, HEADS, HEAD), F16),
        "K": _random(rng, (BATCH, SEQ, 2, HEAD), F16),
        "QScale": _random(rng, (HEAD,), F16, 0.2, 1.0),
        "KScale": None,
        "Cos": _table(rng, 16, HEAD // 2, F16)[0],
        "Sin": _table(rng, 16, HEAD // 2, F16)[1],
        "PositionIds": np.tile(np.arange(SEQ, dtype=np.int64), (BATCH, 1)),
    }
    attrs = {k: v for k, v in changes.items() if k not in case}
    case.update({k: v for k, v in changes.items() if k in case})
    return list(case.values()), attrs


def _cos_sin(width):
    return {"Cos": np.ones((16, width), F16), "Sin": np.zeros((16, width), F16)}


ERRORS = {
    "cos width": (ValueError, "last dim must be rotary_dim / 2", _cos_sin(5)),
    "cos width partial": (
        ValueError,
        "last dim must be rotary_dim / 2",
        {**_cos_sin(HEAD), "rotary_dim": 8},
    ),
    "odd rotary_dim": (ValueError, "rotary_dim must be even", {"rotary_dim": 7}),
    "rotary_dim past head": (ValueError, "at most head_size", {"rotary_dim": 2 * HEAD}),
    "position out of range": (
        ValueError,
        "position id is outside Cos's 16 rows",
        {"PositionIds": np.full((BATCH, SEQ), 16, np.int64)},
    ),
    "negative position": (
        ValueError,
        "position id is outside",
        {"PositionIds": np.full((BATCH, SEQ), -1, np.int64)},
    ),
    "per_head 0 layout 1": (
        ValueError,
        "per_head = 0 normalizes a token's heads together",
        {"per_head": 0, "layout": 1},
    ),
    "3-D without head_size": (
        ValueError,
        "needs head_size",
        {
            "Q": np.zeros((BATCH, SEQ, HEADS * HEAD), F16),
            "K": np.zeros((BATCH, SEQ, 2 * HEAD), F16),
        },
    ),
    "scale size": (ValueError, "must hold head_size", {"QScale": np.ones((HEAD + 1,), F16)}),
    "scale of heads": (ValueError, "must hold head_size", {"KScale": np.ones((HEADS, HEAD), F16)}),
    "mixed cos and sin": (
        TypeError,
        "Cos and Sin must share one type",
        {"Sin": np.zeros((16, HEAD // 2), np.float32)},
    ),
    "cos of another type": (
        TypeError,
        "Cos must be of Q's type",
        {"Cos": np.ones((16, HEAD // 2), BF16), "Sin": np.zeros((16, HEAD // 2), BF16)},
    ),
    "k of another type": (TypeError, "K must be of Q's type", {"K": np.zeros((2, 7, 2, 16))}),
    "k of another length": (
        ValueError,
        "does not match Q's",
        {"K": np.zeros((BATCH, SEQ + 1, 2, HEAD), F16)},
    ),
    "int32 positions": (
        TypeError,
        "PositionIds must be int64",
        {"PositionIds": np.zeros((BATCH, SEQ), np.int32)},
    ),
    "cos without positions": (
        ValueError,
        "without PositionIds, Cos is per token",
        {"PositionIds": None},
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_inputs_raise_clear_errors(case):
    """Each bad input or attribute raises an error that names what is wrong."""
    error, phrase, changes = ERRORS[case]
    inputs, attrs = _error_case(**changes)
    with pytest.raises(error, match=phrase):
        reference.run("RMSNormRotary", *inputs, **attrs)


def test_the_valid_error_case_runs():
    """The call the error cases change is valid."""
    inputs, attrs = _error_case()
    q_out, k_out = reference.run("RMSNormRotary", *inputs, **attrs)
    assert q_out.shape == inputs[0].shape and k_out.shape == inputs[1].shape

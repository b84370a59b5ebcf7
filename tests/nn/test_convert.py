"""onnxnorm.convert: norm modules of existing models replaced by onnxnorm's, outputs unchanged.

The Hugging Face models are tiny and random, built from configs in code: nothing is downloaded.
The gated norms of the hybrid models and Llama 4's L2 norm are instantiated from their classes.
"""

from __future__ import annotations

import collections
import copy
import dataclasses

import numpy as np
import pytest
import torch

import onnxnorm
from onnxnorm import OnnxNormError, ops
from onnxnorm.nn import GatedRMSNorm, L2Norm, LayerNorm, RMSNorm, decoder, families
from onnxnorm.nn.converter import convert
from onnxnorm.testing import hf
from tests.support.helpers import run

transformers = pytest.importorskip("transformers")

#: the sizes of every model here (hf.config's keywords)
COMMON = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=128)
#: model -> hf.config overrides
OVERRIDES = {
    "llama": {},
    "gemma": {},
    "gemma2": {},
    "qwen3": {},
    "cohere": dict(use_qk_norm=True, **hf.TOKEN_IDS),
    "olmo": dict(hf.TOKEN_IDS),
    "t5": dict(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2),
}


def _hf(name: str):
    """The model with its LM head, from seed 0, its norm weights random (hf.randomize_norms:
    away from their init, so that a wrong offset or order cannot pass)."""
    return hf.model(hf.config(name, **COMMON, **OVERRIDES[name]), attention=None)


#: model -> (the norm classes it holds, what each becomes)
EXPECTED = {
    "llama": ("LlamaRMSNorm", "RMSNorm([64], eps=1e-06, order A)"),
    "gemma": ("GemmaRMSNorm", "RMSNorm([64], eps=1e-06, scale_offset=1, order B)"),
    "gemma2": ("Gemma2RMSNorm", "RMSNorm([64], eps=1e-06, scale_offset=1, order B)"),
    "qwen3": ("Qwen3RMSNorm", "RMSNorm([64], eps=1e-06, order A)"),
    "cohere": ("CohereLayerNorm", "LayerNorm([64], eps=1e-05, no bias, order B)"),
    "olmo": ("OlmoLayerNorm", "LayerNorm([64], eps=1e-05, no weight, no bias, order B)"),
    "t5": ("T5LayerNorm", "RMSNorm([64], eps=1e-06, order A)"),
    "gpt2": ("LayerNorm", "LayerNorm([64], eps=1e-05, order B)"),
}


def _inputs(name):
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    return ids, ({"decoder_input_ids": ids} if name == "t5" else {})


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_hf_model_outputs_unchanged(name, dtype):
    model = _hf(name).to(dtype)
    keys = list(model.state_dict())
    ids, extra = _inputs(name)
    with torch.no_grad():
        before = model(ids, **extra).logits
    report = convert(model)
    with torch.no_grad():
        after = model(ids, **extra).logits
    assert not report.left, str(report)
    cls, replacement = EXPECTED[name]
    assert {r.original for r in report.replaced} == {cls}
    main = [r for r in report.replaced if "q_norm" not in r.name and "k_norm" not in r.name]
    assert {r.replacement for r in main} == {replacement}
    assert list(model.state_dict()) == keys, "state_dict keys changed"
    assert not [m for m in model.modules() if type(m).__name__ == cls and cls != "LayerNorm"]
    # the same rounding in the same order: bfloat16 bit for bit; float32 within its tolerance
    # (torch's fused layer_norm kernel sums in another order than the catalogue's math)
    tol = 0 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(after, before, rtol=tol, atol=tol)


def test_per_head_qk_norms_keep_their_weight_shape():
    model = _hf("cohere")
    report = convert(model)
    q = [r for r in report.replaced if r.name.endswith("q_norm")]
    assert q and q[0].replacement == "LayerNorm([4, 16], eps=1e-05, axis=-1, no bias, order B)"
    assert isinstance(model.model.layers[0].self_attn.q_norm, LayerNorm)


@pytest.mark.parametrize(
    "name, rotary_op, other",
    [
        ("qwen3", "RMSNormRotary", "RMSNorm"),
        ("cohere", "LayerNormRotary", "LayerNorm"),
        ("llama", None, "RMSNorm"),
    ],
)
def test_converted_hf_model_exports_one_node_per_norm(name, rotary_op, other, monkeypatch):
    """Each norm one node; a layer's Q and K norms and their rotary (transformers' own code)
    one rotary node (the export's rotary stage, which its pre-check lets run), with the model's
    logits in ONNX Runtime. Llama has norms and a rotary but no Q/K norm: the pre-check says
    no, and the export never prepares its graph for the rotary stage."""
    from onnxnorm.fusion import pipeline

    answers, check = [], pipeline.may_fuse_rotary

    def recorded(model):
        answers.append(check(model))
        return answers[-1]

    def prepared(_):
        raise AssertionError("the rotary stage prepared a model without Q/K norms")

    monkeypatch.setattr(pipeline, "may_fuse_rotary", recorded)
    if rotary_op is None:
        monkeypatch.setattr(pipeline, "_prepare", prepared)
    model = _hf(name)
    report = onnxnorm.convert(model)  # the package-level entry point
    ids, _ = _inputs(name)

    class Logits(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            return self.inner(ids, use_cache=False).logits

    proto = onnxnorm.export(Logits(model), (ids,), mode="fused")
    assert answers == [rotary_op is not None]
    nodes = [n for n in proto.graph.node if n.domain == ops.DOMAIN]
    norms = collections.Counter(n.op_type for n in nodes)
    layers = 2
    qk = 2 * layers if rotary_op else 0
    assert len(report.replaced) == (layers + 1 if name == "cohere" else 2 * layers + 1) + qk
    rotary_nodes = {rotary_op: layers} if rotary_op else {}
    assert norms == {other: len(report.replaced) - qk, **rotary_nodes}
    assert all(len(n.output) == 2 for n in nodes if n.op_type == rotary_op)
    with torch.no_grad():
        want = model(ids, use_cache=False).logits.numpy()
    (got,) = run(proto, {proto.graph.input[0].name: ids.numpy()}, with_library=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


class FixedEpsRMSNorm(torch.nn.Module):
    """An RMSNorm with its epsilon hard-coded: found by the probe, epsilon guessed."""

    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class WeirdNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = 1e-5

    def forward(self, x):
        return x / (x.abs().amax(-1, keepdim=True) + self.eps) * self.weight


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = torch.nn.RMSNorm(16, eps=1e-6)
        self.ln = torch.nn.LayerNorm(16, bias=False)
        self.no_eps = FixedEpsRMSNorm(16)
        self.weird = WeirdNorm(16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.linear = torch.nn.Linear(16, 16)
        self.again = self.shared

    def forward(self, x):
        x = self.ln(self.shared(x))
        x = self.weird(self.no_eps(self.linear(x)))
        return self.again(x)


def test_mixed_model_report():
    torch.manual_seed(0)
    model = Mixed().eval()
    hf.randomize_norms(model)
    with torch.no_grad():
        for m in (model.ln, model.no_eps, model.weird):
            m.weight.add_(0.3 * torch.randn(16))
    x = torch.randn(3, 16)
    with torch.no_grad():
        before = model(x)
    report = convert(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before)
    replaced = {r.name: r for r in report.replaced}
    assert set(replaced) == {"shared", "ln", "no_eps"}
    assert replaced["shared"].how == "direct" and replaced["ln"].how == "direct"
    # it takes its statistics in the input's type: half precision cannot match bit for bit
    assert replaced["no_eps"].how.startswith(
        "probe (epsilon 1e-06 guessed; not bit-exact in bfloat16/float16: "
    )
    assert model.shared is model.again and isinstance(model.again, RMSNorm)
    left = {item.name: item.reason for item in report.left}
    assert set(left) == {"weird", "bn"}
    assert "matches no onnxnorm configuration" in left["weird"]
    assert left["bn"].startswith("BatchNorm")
    assert isinstance(model.weird, WeirdNorm) and isinstance(model.bn, torch.nn.BatchNorm1d)
    text = str(report)
    assert "replaced 3 norm module(s), left 2" in text and "left weird: WeirdNorm" in text
    assert report.to_dict()["left"][0]["name"] in ("weird", "bn")


def test_no_norms_and_bad_input():
    report = convert(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    assert not report.found and str(report) == "no norm modules found: nothing to convert"
    with pytest.raises(OnnxNormError, match=r"model must be a torch\.nn\.Module, got str"):
        convert("model")
    # already converted: nothing more to do
    model = torch.nn.Sequential(RMSNorm(8))
    report = convert(model)
    assert report.already == ["0"] and not report.replaced


def test_meta_device_model_converts_before_its_weights_exist():
    """Big models: convert the skeleton on the meta device, then load the weights."""
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(hf.config("llama", **COMMON))
    report = convert(model)
    assert len(report.replaced) == 5 and not report.left
    assert isinstance(model.model.norm, RMSNorm) and model.model.norm.weight.is_meta
    assert model.model.norm.cast_before_scale == 1


class Fp32LayerNorm(torch.nn.LayerNorm):
    """A torch LayerNorm subclass that normalizes in float32 and scales after rounding: its
    forward is not torch's, so it is probed (and found to round in order A)."""

    def forward(self, x):
        y = torch.nn.functional.layer_norm(x.float(), self.normalized_shape, eps=self.eps)
        return y.to(x.dtype) * self.weight + self.bias


def test_subclass_with_its_own_forward_is_probed():
    model = torch.nn.Sequential(Fp32LayerNorm(16)).to(torch.bfloat16)
    hf.randomize_norms(model)
    with torch.no_grad():
        model[0].weight.add_(torch.randn(16).to(torch.bfloat16))
    x = torch.randn(3, 16).to(torch.bfloat16)
    with torch.no_grad():
        before = model(x)
    report = convert(model)
    assert report.replaced[0].how == "probe"
    assert report.replaced[0].replacement == "LayerNorm([16], eps=1e-05, order A)"
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)


class Float64RMSNorm(torch.nn.Module):
    """Statistics in float64: matches RMSNorm in float32, not bit for bit in half precision
    on every element, and the report says so."""

    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = 1e-6

    def forward(self, x):
        xd = x.double()
        y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.double()
        return y.to(x.dtype)


def test_inexact_rounding_is_reported():
    model = torch.nn.Sequential(Float64RMSNorm(512))
    report = convert(model)
    assert isinstance(model[0], RMSNorm)
    assert report.replaced[0].how == (
        "probe (not bit-exact in bfloat16/float16: 1 of 6144 elements differ)"
    )


# --- every norm class of the installed transformers ---------------------------------------------

#: the norm classes the installed transformers defines (found by reading its model modules: no
#: class name is typed here, so a class added or renamed upstream is covered as it comes)
NORM_CLASSES = hf.norms.norm_classes()


class Holder(torch.nn.Module):
    """Calls its norm as the models do: ``self.norm(hidden_states)``, or
    ``self.norm(hidden_states, gate)`` for a gated one."""

    def __init__(self, norm, gated: bool = True):
        super().__init__()
        self.norm = norm
        self.gated = gated

    def forward(self, x, gate=None):
        return self.norm(x, gate) if self.gated else self.norm(x)


def _same_outputs(model: Holder, original, gated: bool, width: int, dtype) -> bool | None:
    """Whether the converted ``model`` gives ``original``'s outputs in ``dtype``: to the bit in
    bfloat16 and float16, within float32's rounding in float32 (a norm written out by hand
    sums in another order than torch's kernels); None where the original does not run in
    ``dtype``."""
    generator = torch.Generator().manual_seed(3)
    x = (2 * torch.randn(2, 5, width, generator=generator) + 0.25).to(dtype)
    gate = (2 * torch.randn(2, 5, width, generator=generator)).to(dtype) if gated else None
    reference = Holder(original, gated).to(dtype)
    with torch.no_grad():
        try:
            want = reference(x, gate)
        except RuntimeError:  # a module that does not run in half precision (its report says)
            return None
        got = model.to(dtype)(x, gate)
    if dtype == torch.float32:
        return torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    return torch.equal(got, want)


def test_the_scan_finds_the_norm_classes():
    """The scan finds the transformers norm classes the catalogue's ops are for: RMS and layer
    norms by the hundred, the gated norms of the hybrid families and FLA's l2norm."""
    assert len(NORM_CLASSES) >= 200, len(NORM_CLASSES)
    assert sum(n.gated for n in NORM_CLASSES) >= 9
    assert sum(n.function for n in NORM_CLASSES) >= 3
    assert all(n.name.endswith(("Norm", "NormGated", "l2norm")) for n in NORM_CLASSES)


@pytest.mark.parametrize("norm", NORM_CLASSES, ids=str)
def test_every_transformers_norm_class_converts_bit_for_bit_or_says_why(norm):
    """Every way to build each norm class (hf.norms.variants: its defaults, each boolean
    argument flipped, groups): convert replaces it by an onnxnorm module that gives its outputs
    in float32 and to the bit in bfloat16 and float16 (the report's ``how`` is "probe" alone), or
    says in ``how`` what it could not settle, or leaves it with the reason, under the class's
    name. A gated norm is always replaced. Weightless replacements (Llama 4's L2 norm, the
    l2norm functions) are checked at other widths too. A class this test cannot build is a
    skip that names why."""
    try:
        variants = hf.norms.variants(norm)
    except ImportError as error:  # a model module that needs a package not installed here
        pytest.skip(f"{norm}: {error}")
    built, unbuildable = 0, []
    for variant in variants:
        try:
            original = hf.norms.build(variant, 16)
        except hf.norms.NotBuildable as why:
            unbuildable.append(f"{variant}: {why}")
            continue
        built += 1
        model = Holder(copy.deepcopy(original), norm.gated)
        report = convert(model)
        top = [r for r in report.replaced if r.name == "norm"]
        if not top:  # left, with the reason (the norms it may hold are converted on their own)
            assert not norm.gated or list(original.children()), f"{variant} left: {report}"
            [left] = [left for left in report.left if left.name == "norm"]
            assert left.original == type(original).__name__ and left.reason, f"{variant}: {report}"
            continue
        [replaced] = top
        assert replaced.original == type(original).__name__, variant
        assert isinstance(model.norm, (RMSNorm, LayerNorm, GatedRMSNorm, L2Norm)), variant
        widths = (
            (16, 8, 128) if replaced.replacement.startswith(("L2Norm", "RMSNorm(last")) else (16,)
        )
        for width in widths:
            same = {
                dtype: _same_outputs(model, original, norm.gated, width, dtype)
                for dtype in (torch.float32, torch.bfloat16, torch.float16)
            }
            assert same[torch.float32] is not False, (variant, width, replaced)
            if replaced.how == "probe":  # no note: bit for bit wherever the original runs
                assert all(s is not False for s in same.values()), (variant, width, same)
            else:  # the note says what was not settled
                assert replaced.how.startswith("probe ("), replaced.how
    if not built:
        pytest.skip("; ".join(unbuildable))


class TanhGatedNorm(torch.nn.Module):
    """A gate no GatedRMSNorm configuration computes."""

    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = 1e-6

    def forward(self, hidden_states, gate=None):
        x = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x * torch.tanh(gate)


def test_unknown_gated_norm_is_left_with_the_reason():
    model = Holder(TanhGatedNorm(16))
    report = convert(model)
    assert not report.replaced and isinstance(model.norm, TanhGatedNorm)
    assert report.left[0].reason.startswith(
        "its forward matches no onnxnorm configuration (GatedRMSNorm: SiLU or sigmoid gate"
    )


@pytest.mark.parametrize("family", ["qwen3_next", "mamba2"])
def test_decomposed_hybrid_decoder_converts_bit_for_bit(family):
    """The hybrid decoders with their norms spelled out as Hugging Face writes them (Qwen3-Next's
    zero-centred RMSNorm, Qwen3NextRMSNormGated / MambaRMSNormGated, FLA's l2norm): every norm is
    found by its probe and the bfloat16 output stays the same to the bit."""
    config = families.decoder_config(
        family, hidden=32, heads=2, intermediate=64, layers=2, impl="decomposed"
    )
    if family == "qwen3_next":
        config = dataclasses.replace(config, linear_head_dim=16)
    model = decoder.build(config).bfloat16()
    x = decoder.example_input(config, seq=5).bfloat16()
    with torch.no_grad():
        before = model(x)
    report = convert(model)
    assert not report.left, str(report)
    # FLA's l2norm takes its statistics in the input's type: not the op's in half precision,
    # which the report says; the hybrid calls it on float32 queries and keys only
    for r in report.replaced:
        if r.original == "DecomposedL2Norm":
            assert r.how.startswith("probe (not bit-exact in bfloat16/float16: "), r.how
        else:
            assert r.how == "probe", r
    found = collections.Counter((r.original, r.replacement) for r in report.replaced)
    if family == "qwen3_next":
        assert found == {
            ("DecomposedNorm", "RMSNorm([32], eps=1e-06, scale_offset=1, order B)"): 5,
            ("DecomposedNorm", "RMSNorm([16], eps=1e-06, scale_offset=1, order B)"): 2,
            (
                "DecomposedGatedNorm",
                "GatedRMSNorm([16], eps=1e-06, silu, norm then gate, order A)",
            ): 1,
            ("DecomposedL2Norm", "L2Norm(eps=1e-06)"): 2,
        }
    else:
        assert found == {
            ("DecomposedNorm", "RMSNorm([32], eps=1e-05, order A)"): 3,
            (
                "DecomposedGatedNorm",
                "GatedRMSNorm([64], eps=1e-05, group_size=8, silu, gate then norm, order A)",
            ): 2,
        }
    assert sum(isinstance(m, (GatedRMSNorm, L2Norm)) for m in model.modules()) == (
        3 if family == "qwen3_next" else 2
    )
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)


def _tiny_hybrid(name: str):
    """A tiny Qwen3-Next or Mamba2 with its LM head, every norm weight random."""
    if name == "qwen3_next":
        config = transformers.Qwen3NextConfig(
            hidden_size=64,
            num_hidden_layers=4,  # three linear-attention layers, then attention
            vocab_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
        )
        cls = transformers.Qwen3NextForCausalLM
    else:
        config = transformers.Mamba2Config(
            hidden_size=64,
            num_hidden_layers=2,
            vocab_size=128,
            num_heads=4,
            head_dim=32,
            n_groups=2,
            state_size=16,
            chunk_size=8,
        )
        cls = transformers.Mamba2ForCausalLM
    torch.manual_seed(0)
    model = hf.randomize_norms(cls(config).eval())
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # the gated norms' classes end in "Gated": not hf.is_norm
        for name_, parameter in model.named_parameters():
            if name_.endswith(("mixer.norm.weight", "linear_attn.norm.weight")):
                parameter.copy_(0.6 + 0.8 * torch.rand(parameter.shape, generator=generator))
    return model


@pytest.mark.parametrize("name", ["qwen3_next", "mamba2"])
def test_hybrid_hf_model_outputs_unchanged(name):
    """A whole hybrid model in bfloat16: its RMSNorms and gated norms replaced, the logits the
    same to the bit (Mamba2 hands its gated norm a float32 input with a bfloat16 gate)."""
    model = _tiny_hybrid(name).bfloat16()
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids, use_cache=False).logits
    report = convert(model)
    assert not report.left, str(report)
    gated = [r for r in report.replaced if r.replacement.startswith("GatedRMSNorm")]
    if name == "qwen3_next":
        assert len(report.replaced) == 14 and len(gated) == 3
        assert (
            gated[0].replacement == "GatedRMSNorm([16], eps=1e-06, silu, norm then gate, order A)"
        )
    else:
        assert len(report.replaced) == 5 and len(gated) == 2
        assert gated[0].replacement == (
            "GatedRMSNorm([128], eps=1e-05, group_size=64, silu, gate then norm, order A)"
        )
    assert all(r.how == "probe" for r in report.replaced), str(report)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, use_cache=False).logits, before, rtol=0, atol=0)

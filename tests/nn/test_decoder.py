"""onnxnorm.nn's configurable decoder (decoder.py), the families table (families.py, checked
against transformers' own norm classes) and docs/norms.md generated from it."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from pathlib import Path

import pytest
import torch

from onnxnorm.nn import decoder, families
from onnxnorm.nn.converter import convert, probe

ROOT = Path(__file__).resolve().parents[2]


def test_norms_page_covers_every_family_and_placement():
    """docs/norms.md (tools/gen_norms_doc.py; tests/packaging/test_generated.py holds it
    current)."""
    path = ROOT / "tools" / "gen_norms_doc.py"
    spec = importlib.util.spec_from_file_location("gen_norms_doc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.render()
    for family in families.FAMILIES:
        assert f"| {family.name} | {family.examples} |" in text
    for name in (
        "LayerNorm",
        "RMSNorm",
        "BatchNorm",
        "Pre-Norm",
        "Post-Norm",
        "Sandwich-Norm",
        "DeepNorm",
        "order A",
        "order B",
    ):
        assert name in text


@pytest.mark.parametrize("position", decoder.POSITIONS)
@pytest.mark.parametrize("norm", decoder.NORMS)
def test_both_impls_compute_the_same_function(position, norm):
    config = decoder.DecoderConfig(
        norm=norm,
        position=position,
        qk_norm=True,
        embedding_norm=True,
        bias=norm == "layer",
        kv_heads=2,
        scale_offset=1.0 if norm == "rms" else 0.0,
        cast_before_scale=int(position == "pre"),
    )
    ours = decoder.build(config)
    plain = decoder.build(dataclasses.replace(config, impl="decomposed"))
    assert ours.state_dict().keys() == plain.state_dict().keys()
    assert ours.count_norms() == plain.count_norms()
    x = decoder.example_input(config)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), plain(x), rtol=0, atol=0)
        ours, plain, xb = ours.bfloat16(), plain.bfloat16(), x.bfloat16()
        torch.testing.assert_close(ours(xb), plain(xb), rtol=0, atol=0)


def test_deepnorm_decoder_uses_the_paper_constants():
    config = decoder.DecoderConfig(norm="layer", position="deepnorm", layers=6, bias=True)
    model = decoder.build(config)
    assert model.layers[0].alpha == pytest.approx(12**0.25)
    assert config.deepnorm.beta == pytest.approx(48**-0.25)


def test_expected_nodes_count_every_norm_once():
    for position in decoder.POSITIONS:
        config = decoder.DecoderConfig(position=position, qk_norm=True)
        model = decoder.build(config)
        nodes = model.expected_nodes()
        # every norm module is in exactly one node; a Sandwich node holds two, and so does a
        # rotary node of Q and K
        two = ("Sandwich", "RMSNormRotary", "LayerNormRotary")
        held = sum(n * (2 if op.startswith(two) else 1) for op, n in nodes.items())
        assert nodes["RMSNormRotary"] == config.layers
        assert held == model.count_norms(), position


def test_token_model_and_config_errors():
    config = decoder.DecoderConfig(vocab=32, embedding_norm=True)
    model = decoder.build(config)
    ids = decoder.example_input(config, batch=2, seq=3)
    assert ids.dtype == torch.int64 and model(ids).shape == (2, 3, 32)
    assert decoder.size_in_parameters(config) == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="position must be one of"):
        decoder.DecoderConfig(position="middle")
    with pytest.raises(ValueError, match="scale_offset is for RMSNorm only"):
        decoder.DecoderConfig(norm="layer", scale_offset=1.0)


def test_decomposed_llama_decoder_converts_bit_for_bit():
    """The Llama-style decoder of the demo and of tools/fusion_page.py's timing (the Llama family's
    norms spelled out as Hugging Face writes them): onnxnorm.convert finds every norm by its
    probe, as RMSNorm in order A, and the bfloat16 output stays the same to the bit."""
    config = families.decoder_config(
        "llama", hidden=32, heads=2, intermediate=64, layers=2, impl="decomposed"
    )
    model = decoder.build(config).bfloat16()
    x = decoder.example_input(config, seq=3).bfloat16()
    with torch.no_grad():
        before = model(x)
    report = convert(model)
    assert len(report.replaced) == 5 and not report.left
    assert {(r.original, r.replacement, r.how) for r in report.replaced} == {
        ("DecomposedNorm", "RMSNorm([32], eps=1e-05, order A)", "probe")
    }
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)


@pytest.mark.parametrize("family", families.FAMILIES, ids=lambda f: f.key)
def test_every_family_builds_a_decoder(family):
    config = families.decoder_config(family, hidden=32, heads=2, intermediate=64, layers=1)
    model = decoder.build(config)
    assert model(decoder.example_input(config, seq=3)).shape == (2, 3, 32)
    assert families.get(family.name) is family


#: Hugging Face norm class -> its modeling module
HF_CLASSES = {
    "LlamaRMSNorm": "llama",
    "MistralRMSNorm": "mistral",
    "Qwen2RMSNorm": "qwen2",
    "Qwen3RMSNorm": "qwen3",
    "GemmaRMSNorm": "gemma",
    "Gemma2RMSNorm": "gemma2",
    "Gemma3RMSNorm": "gemma3",
    "Phi3RMSNorm": "phi3",
    "T5LayerNorm": "t5",
    "OlmoLayerNorm": "olmo",
    "Olmo2RMSNorm": "olmo2",
    "CohereLayerNorm": "cohere",
}


@pytest.mark.parametrize(
    "family", [f for f in families.FAMILIES if f.hf_norm_class in HF_CLASSES], ids=lambda f: f.key
)
def test_table_agrees_with_transformers(family):
    """The table's norm kind, scale offset, parameters and rounding order are what probing the
    family's own Hugging Face norm class finds."""
    pytest.importorskip("transformers")
    module = importlib.import_module(
        f"transformers.models.{HF_CLASSES[family.hf_norm_class]}."
        f"modeling_{HF_CLASSES[family.hf_norm_class]}"
    )
    norm = getattr(module, family.hf_norm_class)(16)
    found = probe(norm)
    assert found.kind == family.norm
    assert found.scale_offset == family.scale_offset
    assert found.weight == family.weight and found.bias == family.bias
    assert ("A" if found.cast_before_scale else "B") == family.order

"""Corpus: tiny random-weight transformers models (onnxnorm.testing.hf: configs in code,
nothing downloaded) and onnxnorm/nn/decoder.py blocks with decomposed norms (a Llama-style one,
and one in every norm position: Pre, Post, Sandwich, DeepNorm, reordered; RMS and Layer;
offsets, bias, no weight, Q/K norms, embedding norm), exported with both PyTorch exporters.
Every norm call of the torch model must end in an onnxnorm op, every residual add that can be
absorbed must be, and the fused model must match the original in onnxruntime (``--verify``'s
check)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from models import corpus
from onnxnorm.fusion import fuse
from onnxnorm.fusion.verify import verify
from tests.support.matrix import LOWERED_TARGETS
from tests.support.tools import load_tool

pytestmark = pytest.mark.slow

#: residual adds that can be absorbed, per model with 2 layers (see docs/fusion.md): the
#: pre-norm decoders absorb every add but the first norm's; GPT-2 and BERT also fuse their
#: embedding sums; parallel-block models (GPT-NeoX, Falcon, Cohere) share one sum between two
#: norms; OPT reshapes the sum to 2-D before two of its norms; BLOOM's first layer norms the
#: embedding norm's output.
ADDS = {
    "llama": 4,
    "mistral": 4,
    "qwen2": 4,
    "qwen3": 4,
    "gemma": 4,
    "gemma2": 4,
    "gemma3": 4,
    "phi3": 4,
    "gpt2": 5,
    "gpt_neox": 2,
    "bert": 5,
    "t5": 10,
    "bloom": 4,
    "opt": 1,
    "falcon": 2,
    "olmo": 4,
    "cohere": 2,
    "block_llama": 4,
}
#: exports that are broken before any fusion, with the reason
BROKEN = {
    ("cohere", "torchscript"): "the TorchScript export of Cohere does not load in "
    "onnxruntime (MatMul: incompatible dimensions)"
}
TORCHSCRIPT_ADDS: dict[str, int] = {}
FAST = ["llama", "gemma2", "gpt2", "bert", "t5", "block_llama", *corpus.BLOCKS]
MODELS = FAST + [name for name in corpus.ENTRIES if name not in FAST]


@pytest.fixture(scope="module")
def exported():
    cache = {}

    def get(name, exporter):
        if (name, exporter) not in cache:
            cache[(name, exporter)] = corpus.export(name, exporter)
        return cache[(name, exporter)]

    return get


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("name", MODELS)
def test_every_norm_fused_with_parity(exported, name, exporter):
    if (name, exporter) in BROKEN:
        pytest.skip(BROKEN[(name, exporter)])
    model, norm_calls = exported(name, exporter)
    fused, report = fuse(model, "function")
    assert report.norms == norm_calls, str(report)
    expected_adds = corpus.expected_adds(name)  # onnxnorm.nn.decoder: from the block itself
    if expected_adds is None:
        expected_adds = ADDS[name]
    if exporter == "torchscript":
        expected_adds = TORCHSCRIPT_ADDS.get(name, expected_adds)
    assert report.residual_adds == expected_adds, str(report)
    checks = verify(model, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


@pytest.mark.parametrize("target", LOWERED_TARGETS)
@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt2", "bert", "t5"])
def test_targets_run_in_plain_onnxruntime(exported, name, target):
    model, _ = exported(name, "dynamo")
    fused, _ = fuse(model, target)
    assert not any(n.domain == "onnxnorm" for n in fused.graph.node)
    checks = verify(model, fused)
    assert all(c.ok for c in checks), [str(c) for c in checks]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["llama", "gemma2", "cohere", "t5"])
def test_half_precision_exports(name, dtype):
    """float16/bfloat16 exports: the norms fuse with the rounding order of the model (Llama and
    T5: order A; Gemma and Cohere: order B)."""
    model, norm_calls = corpus.export(name, "dynamo", dtype=dtype)
    fused, report = fuse(model, "function")
    assert report.norms == norm_calls, str(report)
    orders = {
        a.i
        for n in fused.graph.node
        if n.domain == "onnxnorm"
        for a in n.attribute
        if a.name == "cast_before_scale"
    }
    assert orders == ({1} if name in ("llama", "t5") else {0}), str(report)
    if dtype == "float16":
        checks = verify(model, fused)
        assert all(c.ok for c in checks), [str(c) for c in checks]


def test_compare_report(tmp_path):
    """The page's writer (tools/fusion_page.py) runs all three tools and writes the markdown
    table."""
    out = tmp_path / "fusion.md"
    assert (
        load_tool("fusion_page").main(
            ["--models", "gpt2", "--exporters", "dynamo", "--no-timing", "-o", str(out)]
        )
        == 0
    )
    text = out.read_text()
    assert "| gpt2 | dynamo | 5 | 5 | 5 | 5 | ok" in text and "onnxruntime 1." in text


@pytest.mark.parametrize("exporter,opset", [("dynamo", 23), ("torchscript", 18)])
@pytest.mark.parametrize("name", ["llama", "gpt2", "gemma2"])
def test_other_opsets(name, exporter, opset):
    model, norm_calls = corpus.export(name, exporter, opset=opset)
    fused, report = fuse(model, "function")
    assert report.norms == norm_calls and report.residual_adds == ADDS[name], str(report)
    assert all(c.ok for c in verify(model, fused))

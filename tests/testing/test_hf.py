"""onnxnorm.testing.hf, the Hugging Face fixtures of the benchmarks and the tests: tiny configs,
the one randomization of norm weights (Gemma's ``1 + weight`` included), the KV-cache export,
the word-level tokenizer, ONNX Runtime's quantization, and the names the benchmark moved here."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from onnxnorm.testing import hf

transformers = pytest.importorskip("transformers")


def test_importing_the_fixtures_loads_nothing_heavy():
    code = (
        "import sys; import onnxnorm.testing.hf; "
        "print(sorted(m for m in ('torch', 'transformers', 'tokenizers', 'onnxruntime_genai', "
        "'onnxruntime.quantization') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_config_sizes_and_what_each_family_needs():
    config = hf.config("gemma2", hidden=64, heads=4, sliding_window=16)
    assert type(config).__name__ == "Gemma2Config"
    assert (
        config.vocab_size,
        config.hidden_size,
        config.num_hidden_layers,
        config.intermediate_size,
        config.max_position_embeddings,
    ) == (96, 64, 2, 64, 64)
    # head_dim and the key/value heads are a real Gemma's unless the tiny sizes give them
    assert (config.head_dim, config.num_key_value_heads, config.sliding_window) == (16, 4, 16)
    assert hf.config("qwen3", kv_heads=1, head_dim=8).head_dim == 8
    assert hf.config("qwen3", kv_heads=1).num_key_value_heads == 1
    assert hf.config("phi3").pad_token_id == 0  # its own default lies beyond the vocabulary
    llama = hf.config("llama", **hf.TOKEN_IDS)
    assert (llama.bos_token_id, llama.eos_token_id, llama.pad_token_id) == (1, 2, 0)
    with pytest.raises(ValueError, match="unknown family 'nosuch'; known: llama, mistral"):
        hf.config("nosuch")


def _norm_weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if "norm" in name}


def test_model_is_seeded_and_its_norm_weights_random():
    config = hf.config("llama")
    one, two = hf.model(config), hf.model(config)
    assert type(one).__name__ == "LlamaForCausalLM" and not one.training
    assert type(hf.model(config, "base")).__name__ == "LlamaModel"
    assert config._attn_implementation == "eager"
    for (name, a), b in zip(one.state_dict().items(), two.state_dict().values()):
        assert torch.equal(a, b), name
    weights = _norm_weights(one)
    assert len(weights) == 5  # 2 per layer and the final one
    for name, w in weights.items():
        assert w.min() >= 0.6 and w.max() < 1.4 and w.std() > 0.1, name
    other = _norm_weights(hf.model(config, seed=3))
    assert not any(torch.equal(weights[k], other[k]) for k in weights)
    kept = _norm_weights(hf.model(config, randomize=False))
    assert all(torch.equal(w, torch.ones_like(w)) for w in kept.values())


def test_randomization_is_of_the_scale_gemma_included():
    """The same draws give Llama's weights and Gemma's weights one less: the scale each norm
    applies (Gemma's is 1 + weight) is the same, uniform in [0.6, 1.4)."""
    llama = hf.model(hf.config("llama", head_dim=16), "base", randomize=False)
    gemma = hf.model(hf.config("gemma"), "base", randomize=False)
    before = torch.get_rng_state()
    hf.randomize_norms(llama, seed=7)
    hf.randomize_norms(gemma, seed=7)
    assert torch.equal(torch.get_rng_state(), before), "the global generator was used"
    ours, theirs = _norm_weights(llama), _norm_weights(gemma)
    assert list(ours) == list(theirs)
    for name in ours:
        torch.testing.assert_close(theirs[name], ours[name] - 1.0, rtol=0, atol=1e-6)
        assert theirs[name].min() >= -0.4 and theirs[name].max() < 0.4
    # what the norm computes: the unit-RMS input scaled by 1 + weight
    norm = gemma.norm
    x = torch.ones(1, 32)
    with torch.no_grad():
        torch.testing.assert_close(norm(x)[0], 1.0 + norm.weight, rtol=1e-5, atol=1e-5)
    assert hf.scale_offset(norm) == 1.0 and hf.scale_offset(llama.norm) == 0.0


def test_randomization_of_onnxnorm_modules_follows_their_offset():
    from onnxnorm.nn import LayerNorm, RMSNorm, decoder

    offset = hf.randomize_norms(RMSNorm(64, scale_offset=1.0), seed=5)
    plain = hf.randomize_norms(RMSNorm(64), seed=5)
    torch.testing.assert_close(offset.weight + 1.0, plain.weight, rtol=0, atol=1e-6)
    config = decoder.DecoderConfig(hidden=64, scale_offset=1.0, impl="decomposed")
    spelled = hf.randomize_norms(decoder.DecomposedNorm(64, config), seed=5)
    assert hf.scale_offset(spelled) == 1.0
    torch.testing.assert_close(spelled.weight, offset.weight, rtol=0, atol=0)
    layer = hf.randomize_norms(LayerNorm(64), seed=5)
    torch.testing.assert_close(layer.weight, plain.weight, rtol=0, atol=0)
    # the bias: the next 64 draws, shifted down by one
    assert layer.bias.min() >= -0.4 and layer.bias.max() < 0.4
    assert not torch.allclose(layer.bias + 1.0, layer.weight)


def test_kv_cache_export_runs_as_the_model_does(tmp_path):
    config = hf.config("qwen3", kv_heads=1, layers=2)
    model = hf.model(config)
    args, _, inputs, outputs = hf.cache_export_args(model, limit=16)
    assert inputs == [
        "input_ids",
        "attention_mask",
        "past_key_values.0.key",
        "past_key_values.0.value",
        "past_key_values.1.key",
        "past_key_values.1.value",
    ]
    assert outputs == [
        "logits",
        "present.0.key",
        "present.0.value",
        "present.1.key",
        "present.1.value",
    ]
    assert args[2].shape == (1, 1, 3, 16) and args[0].shape == (1, 4)
    proto = hf.export_with_cache(model, limit=16)
    assert [i.name for i in proto.graph.input] == inputs
    assert [o.name for o in proto.graph.output] == outputs
    # other lengths than the example's: a past of 5, 2 new tokens
    ids = torch.tensor([[7, 9]])
    mask = torch.ones(1, 7, dtype=torch.int64)
    past = [torch.randn(1, 1, 5, 16, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    with torch.no_grad():
        want = hf.with_cache(model)(ids, mask, *past)
    path = tmp_path / "qwen3.onnx"
    onnx.save(proto, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, dict(zip(inputs, [t.numpy() for t in (ids, mask, *past)])))
    assert got[0].shape == (1, 2, 96) and got[1].shape == (1, 1, 7, 16)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-4)
    # a model without LM head returns its last hidden state
    base = hf.model(config, "base")
    assert hf.cache_export_args(base, limit=16)[3][0] == "last_hidden_state"


def test_tokenizer_round_trips_and_saves_with_the_checkpoint(tmp_path):
    tokenizer = hf.tokenizer(12)
    assert len(tokenizer) == 12
    assert tokenizer("t5 t11 t3")["input_ids"] == [5, 11, 3]
    assert tokenizer.decode([5, 11, 3]) == "t5 t11 t3"
    assert tokenizer("t12 word")["input_ids"] == [0, 0]  # outside the vocabulary: <unk>
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 0)
    model = hf.model(hf.config("llama", vocab=12, **hf.TOKEN_IDS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        folder = hf.save_checkpoint(model, tmp_path / "ckpt")
    loaded = transformers.AutoTokenizer.from_pretrained(folder)
    assert loaded("t4 t9")["input_ids"] == [4, 9] and loaded.eos_token == "</s>"
    again = transformers.AutoModelForCausalLM.from_pretrained(folder)
    torch.testing.assert_close(again.model.norm.weight, model.model.norm.weight, rtol=0, atol=0)


def _matmul_model(path):
    weight = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor("w", TensorProto.FLOAT, [8, 8], weight.ravel())],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def test_quantize_dynamic_and_static(tmp_path):
    source = tmp_path / "float.onnx"
    _matmul_model(source)
    hf.quantize(source, tmp_path / "dynamic.onnx", "dynamic")
    ops = {n.op_type for n in onnx.load(tmp_path / "dynamic.onnx").graph.node}
    assert "DynamicQuantizeLinear" in ops and "MatMul" not in ops
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((1, 8)).astype(np.float32)} for _ in range(3)]
    hf.quantize(source, tmp_path / "static.onnx", "static", feeds)
    ops = [n.op_type for n in onnx.load(tmp_path / "static.onnx").graph.node]
    assert ops.count("QuantizeLinear") >= 1 and ops.count("DequantizeLinear") >= 2
    with pytest.raises(ValueError, match="static quantization needs calibration feeds"):
        hf.quantize(source, tmp_path / "x.onnx", "static")
    with pytest.raises(ValueError, match="kind must be 'dynamic' or 'static', got 'int4'"):
        hf.quantize(source, tmp_path / "x.onnx", "int4")


def test_genai_build_without_onnxruntime_genai_says_what_to_install(monkeypatch, tmp_path):
    from onnxnorm.errors import MissingDependency

    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)
    with pytest.raises(
        MissingDependency,
        match=r"building an onnxruntime-genai folder needs "
        r"onnxruntime_genai, .*onnxnorm\[genai\]",
    ):
        hf.genai_build(tmp_path / "ckpt", tmp_path / "out", "fp32")


def test_the_kv_cache_names():
    assert hf.past_names(2)[-1] == "past_key_values.1.value"
    assert hf.present_names(1) == ["present.0.key", "present.0.value"]


def test_the_family_table_is_what_transformers_computes():
    """onnxnorm.nn.families says, for each LLM family, which norm its transformers class
    computes; hf.FAMILIES builds tiny models of the same families under transformers'
    model_type. The two are tied here, through the installed transformers:

    - each family's ``hf_norm_class`` (a transformers class; torch's own LayerNorm aside)
      exists, found by reading transformers (a release that renames it fails here);
    - convert's probe of that class finds the family's norm kind, scale offset, rounding order,
      weight and bias (the table's facts are the code's);
    - its model type is the family's key in both tables, and the tiny model hf builds of it
      holds that class; every family transformers has a model of is keyed by its model_type.
    hf.weights' table of offset norms names existing classes too."""
    from onnxnorm.nn import families
    from onnxnorm.nn.converter import probe
    from onnxnorm.testing.hf.weights import OFFSET_NORMS

    found = {n.name: n for n in hf.norms.norm_classes()}
    tied = 0
    for family in families.FAMILIES:
        if family.hf_norm_class.startswith("torch."):
            continue
        assert family.hf_norm_class in found, (family.name, family.hf_norm_class)
        norm = found[family.hf_norm_class]
        config = probe(hf.norms.build(norm, 16))
        order = "A" if config.cast_before_scale else "B"
        assert (config.kind, config.scale_offset, order, config.weight, config.bias) == (
            family.norm,
            family.scale_offset,
            family.order,
            family.weight,
            family.bias,
        ), family.name
        assert family.key == norm.model_type and families.get(norm.model_type) is family
        assert norm.model_type in hf.FAMILIES, (family.name, norm.model_type)
        model = hf.model(hf.config(norm.model_type))
        assert any(type(m).__name__ == family.hf_norm_class for m in model.modules())
        tied += 1
    assert tied >= 12
    assert set(OFFSET_NORMS) <= set(found)
    # one key per family: transformers' model_type, in both tables (a family transformers has
    # no model of, DeepNet, keeps its name); the spellings from before still name the families
    from transformers import CONFIG_MAPPING

    for family in families.FAMILIES:
        assert family.key in hf.FAMILIES or family.key not in CONFIG_MAPPING, family.key
    assert families.get("qwen3next").key == "qwen3_next"
    assert families.get("gptneox").key == "gpt_neox"

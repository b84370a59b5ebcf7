"""`onnxnorm export` on the command line: model families (the hybrids' included), local Hugging
Face models (a directory or a config file, nothing downloaded), every kind of bad input."""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from onnxnorm import cli, ops
from onnxnorm.nn import decoder, families
from onnxnorm.testing import hf

transformers = pytest.importorskip("transformers")


def _norm_ops(path):
    model = onnx.load(path)
    return collections.Counter(
        n.op_type
        for n in model.graph.node
        if n.domain == ops.DOMAIN or "Normalization" in n.op_type
    )


def test_family_decoder(tmp_path, capsys):
    out = tmp_path / "gemma2.onnx"
    assert cli.main(["export", "gemma2", "-o", str(out), "--mode", "fused"]) == 0
    text = capsys.readouterr().out
    assert "Gemma 2-style decoder" in text and f"wrote {out}" in text
    assert _norm_ops(out) == {"RMSNorm": 1, "SandwichRMSNorm": 4}


def test_configurable_decoder_with_tokens(tmp_path, capsys):
    out = tmp_path / "deep.onnx"
    assert (
        cli.main(
            [
                "export",
                "decoder",
                "--norm",
                "layer",
                "--position",
                "deepnorm",
                "--vocab",
                "50",
                "--layers",
                "3",
                "-o",
                str(out),
                "--mode",
                "ort",
            ]
        )
        == 0
    )
    assert _norm_ops(out) == {"SkipLayerNormalization": 6}
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, 50, (3, 5), dtype=np.int64)
    assert sess.run(None, {sess.get_inputs()[0].name: ids})[0].shape == (3, 5, 50)


def test_hf_directory_matches_transformers(tmp_path, capsys):
    folder = tmp_path / "llama"
    config = hf.config("llama", hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=128)
    config.save_pretrained(folder)
    out, report = tmp_path / "llama.onnx", tmp_path / "report.json"
    assert (
        cli.main(
            [
                "export",
                str(folder),
                "-o",
                str(out),
                "--json",
                str(report),
                "--batch",
                "3",
                "--seq",
                "4",
            ]
        )
        == 0
    )
    assert _norm_ops(out) == {"RMSNorm": 5}
    data = json.loads(report.read_text())
    assert {r["original"] for r in data["convert"]["replaced"]} == {"LlamaRMSNorm"}
    assert data["norm_nodes"] == {"RMSNorm": 5}
    # random weights from seed 0, as the command makes them; dynamic axes: other sizes run
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(
        transformers.AutoConfig.from_pretrained(folder), attn_implementation="eager"
    ).eval()
    ids = torch.randint(0, 128, (2, 6))
    with torch.no_grad():
        want = model(ids, use_cache=False).logits.numpy()
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: ids.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_hf_config_file_encoder_decoder(tmp_path, capsys):
    config = tmp_path / "t5.json"
    transformers.T5Config(
        d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=128
    ).to_json_file(config)
    out = tmp_path / "t5.onnx"
    assert cli.main(["export", str(config), "-o", str(out), "--mode", "onnx", "--opset", "23"]) == 0
    assert _norm_ops(out) == {"RMSNormalization": 12}
    assert "T5LayerNorm -> RMSNorm([64], eps=1e-06, order A)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["nosuch"],
            "nosuch: not a directory or .json file, and unknown family 'nosuch'; known: llama",
        ),
        (["missing/config.json"], "missing/config.json: no such file or directory"),
        (["llama", "--norm", "layer"], "--norm, --position and --mixer are for MODEL 'decoder'"),
        (["qwen3next", "--mixer", "mamba2"], "--norm, --position and --mixer are for MODEL"),
        (
            ["decoder", "--mixer", "mamba2", "--norm", "layer"],
            "bad decoder configuration: mixer 'mamba2' is for Pre-Norm RMSNorm decoders",
        ),
        (["decoder", "--position", "middle"], "bad decoder configuration: position must be one of"),
        (["llama", "--seq", "0"], "--seq must be >= 1, got 0"),
        (["llama", "--batch", "1"], "with dynamic axes --batch and --seq must be >= 2"),
    ],
)
def test_bad_arguments(argv, message, tmp_path, capsys):
    assert cli.main(["export", *argv, "-o", str(tmp_path / "m.onnx")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("onnxnorm: error: ") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "m.onnx").exists()


def test_bad_files(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.json").write_text('{"a": 1}')
    (tmp_path / "weights.bin").write_bytes(b"\0")
    cases = [
        (tmp_path / "empty", "no config.json in this directory"),
        (tmp_path / "bad.json", "not a readable Hugging Face config"),
        (tmp_path / "weights.bin", "expected a Hugging Face model directory or a config"),
    ]
    for model, message in cases:
        assert cli.main(["export", str(model), "-o", str(tmp_path / "m.onnx")]) == 1
        err = capsys.readouterr().err
        assert message in err and len(err.splitlines()) == 1, err
    assert cli.main(["export", "llama", "-o", str(tmp_path / "no" / "m.onnx")]) == 1
    assert "folder" in capsys.readouterr().err


def test_console_error_is_one_line_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "onnxnorm", "export", "nosuch", "-o", str(tmp_path / "m.onnx")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    help_text = capsys.readouterr().out
    assert "--mode" in help_text and "--opset" in help_text and "config.json" in help_text


def test_family_export_needs_no_source_tree(tmp_path):
    """Run from a folder that holds a models/ package of its own: the families come from the
    installed package, never from whatever models/ is importable."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("raise RuntimeError('not onnxnorm')\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxnorm",
            "export",
            "qwen3",
            "-o",
            "m.onnx",
            "--hidden",
            "32",
            "--heads",
            "2",
            "--layers",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "Qwen3-style decoder" in result.stdout
    counts = collections.Counter(
        n.op_type for n in onnx.load(tmp_path / "m.onnx").graph.node if n.domain == "onnxnorm"
    )
    # Pre-Norm with Q/K norms over head_dim: the first norm, the residual adds fused into
    # SkipRMSNorm, the Q/K norms and their rotary one RMSNormRotary of Q and K per layer
    assert counts == {"RMSNorm": 1, "SkipRMSNorm": 2, "RMSNormRotary": 1}, counts


def test_output_checked_before_the_model_is_built(tmp_path, capsys):
    assert (
        cli.main(
            [
                "export",
                "llama",
                "-o",
                str(tmp_path / "m.onnx"),
                "--json",
                str(tmp_path / "no" / "r.json"),
            ]
        )
        == 1
    )
    captured = capsys.readouterr()
    assert captured.out == "" and "r.json: folder" in captured.err
    assert cli.main(["export", "llama", "-o", str(tmp_path)]) == 1
    assert "it is a directory" in capsys.readouterr().err


#: hybrid family -> the norm nodes of its 2-layer decoder
HYBRIDS = {
    "qwen3_next": {
        "RMSNorm": 1,
        "RMSNormRotary": 1,
        "SkipRMSNorm": 4,
        "GatedRMSNorm": 1,
        "L2Norm": 2,
    },
    "mamba2": {"RMSNorm": 1, "SkipRMSNorm": 2, "GatedRMSNorm": 2},
}


@pytest.mark.parametrize("family", list(HYBRIDS))
def test_hybrid_family_matches_torch(family, tmp_path, capsys):
    """The hybrid families' decoders: one node per norm, and the exported model in plain ONNX
    Runtime (function bodies) gives what the decoder gives in torch."""
    out, report = tmp_path / f"{family}.onnx", tmp_path / "report.json"
    sizes = ["--hidden", "32", "--heads", "2", "--layers", "2"]
    assert cli.main(["export", family, "-o", str(out), "--json", str(report), *sizes]) == 0
    assert f"{families.get(family).name}-style decoder" in capsys.readouterr().out
    assert _norm_ops(out) == HYBRIDS[family]
    assert json.loads(report.read_text())["norm_nodes"] == HYBRIDS[family]
    # the command builds the family's decoder from seed 0: the same model here
    config = families.decoder_config(family, hidden=32, heads=2, layers=2, intermediate=64)
    model = decoder.build(config)
    x = decoder.example_input(config, batch=3, seq=5, seed=3)
    with torch.no_grad():
        want = model(x).numpy()
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_configurable_decoder_with_a_hybrid_mixer(tmp_path):
    out = tmp_path / "mixer.onnx"
    argv = ["export", "decoder", "--mixer", "gated_deltanet", "--layers", "1", "--mode", "fused"]
    assert cli.main([*argv, "-o", str(out), "--hidden", "32", "--heads", "2"]) == 0
    assert _norm_ops(out) == {"RMSNorm": 1, "SkipRMSNorm": 2, "GatedRMSNorm": 1, "L2Norm": 2}

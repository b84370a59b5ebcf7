"""``--for RUNTIME`` on the command line: ``onnxnorm fuse``, ``onnxnorm export`` and
``onnxnorm lower`` write each norm in the runtime's form, say so, and refuse what they cannot
do in one line."""

from __future__ import annotations

import collections
import json

import numpy as np
import onnx
import pytest
import torch

from onnxnorm import cli
from onnxnorm.deploy import runners
from onnxnorm.nn import decoder, families
from onnxnorm.nn.exporter import quiet_export


@pytest.fixture(scope="module")
def decomposed(tmp_path_factory):
    """A 2-layer Llama-style decoder, its RMSNorms spelled out as Hugging Face writes them."""
    model = decoder.build(
        families.decoder_config(
            "llama", hidden=32, heads=2, intermediate=64, layers=2, impl="decomposed"
        )
    )
    path = tmp_path_factory.mktemp("for") / "llama.onnx"
    with quiet_export():
        torch.onnx.export(model, (torch.randn(1, 6, 32),), path, dynamo=True, input_names=["x"])
    return path


def _ops(path) -> collections.Counter:
    return collections.Counter(
        f"{n.domain}:{n.op_type}" if n.domain else n.op_type for n in onnx.load(path).graph.node
    )


def _feeds():
    return {"x": np.random.default_rng(0).standard_normal((1, 6, 32)).astype(np.float32)}


def test_fuse_for_openvino(decomposed, tmp_path, capsys):
    out, report = tmp_path / "ov.onnx", tmp_path / "report.json"
    argv = ["fuse", str(decomposed), "-o", str(out), "--for", "openvino", "--json", str(report)]
    assert cli.main([*argv, "--verify"]) == 0
    text = capsys.readouterr().out
    assert "lowered for openvino" in text, text
    assert "has no RMSNormalization (23)" in text, text
    ops = _ops(out)
    assert ops["SimplifiedLayerNormalization"] == 1
    assert ops["com.microsoft:SkipSimplifiedLayerNormalization"] == 4
    assert not any(k.startswith("onnxnorm:") for k in ops)
    assert json.loads(report.read_text())["runtime"] == "openvino"
    if runners.unavailable("openvino") is None:
        want = runners.open_runner("openvino", decomposed).run(_feeds())
        got = runners.open_runner("openvino", out).run(_feeds())
        np.testing.assert_allclose(got[0], want[0], atol=1e-5)


def test_fuse_for_a_library_runtime_keeps_the_ops(decomposed, tmp_path):
    out = tmp_path / "cpu.onnx"
    assert cli.main(["fuse", str(decomposed), "-o", str(out), "--for", "ort-cpu"]) == 0
    model = onnx.load(out)
    assert {n.op_type for n in model.graph.node if n.domain == "onnxnorm"} == {
        "RMSNorm",
        "SkipRMSNorm",
    }
    assert {f.name for f in model.functions} == {"RMSNorm", "SkipRMSNorm"}


def test_lower_an_onnxnorm_file(decomposed, tmp_path, capsys):
    fused, out = tmp_path / "fused.onnx", tmp_path / "trt.onnx"
    assert cli.main(["fuse", str(decomposed), "-o", str(fused), "--target", "fused"]) == 0
    before = fused.read_bytes()
    assert cli.main(["lower", str(fused), "-o", str(out), "--for", "tensorrt"]) == 0
    text = capsys.readouterr().out
    assert "5 node(s) -> " in text or "4 node(s) -> " in text, text
    ops = _ops(out)
    assert not any(k.startswith(("onnxnorm:", "com.microsoft:")) for k in ops)
    assert ops["ReduceMean"] == 5 and ops["Pow"] == 5, ops  # the plain RMS spelling
    assert fused.read_bytes() == before
    want = runners.open_runner("ort-plain", decomposed).run(_feeds())
    got = runners.open_runner("ort-plain", out).run(_feeds())
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--for", "openvno"], "invalid choice: 'openvno'"),
        (["--for", "tract", "--target", "onnx"], "give one of --for RUNTIME and --target"),
        ([], "give one of --for RUNTIME and --target"),
    ],
)
def test_lower_refuses_in_one_line(decomposed, tmp_path, capsys, argv, fragment):
    try:
        code = cli.main(["lower", str(decomposed), "-o", str(tmp_path / "x.onnx"), *argv])
    except SystemExit as exit:  # argparse's own refusal
        code = exit.code
    assert code != 0
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert not (tmp_path / "x.onnx").exists()


def test_export_for_tract(tmp_path, capsys):
    out = tmp_path / "tract.onnx"
    argv = ["export", "llama", "-o", str(out), "--for", "tract", "--hidden", "32", "--heads", "2"]
    assert cli.main([*argv, "--layers", "1"]) == 0
    assert "export: for tract" in capsys.readouterr().out
    ops = _ops(out)
    assert ops["com.microsoft:SkipSimplifiedLayerNormalization"] == 2, ops
    if runners.unavailable("tract") is None:
        x = {"x": np.random.default_rng(1).standard_normal((2, 5, 32)).astype(np.float32)}
        got = runners.open_runner("tract", out).run(x)
        want = runners.open_runner("ort", out).run(x)
        np.testing.assert_allclose(got[0], want[0], atol=1e-5)

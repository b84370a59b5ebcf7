"""`onnxnorm fuse` on the command line: the happy path and every kind of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

from models import llama
from onnxnorm import cli, ops
from onnxnorm.nn.export import quiet_export


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "onnxnorm", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def decomposed(tmp_path_factory):
    """A Llama-style decoder exported by torch.onnx.export with Hugging Face's RMSNorm."""
    model = llama.build(llama.LlamaConfig(hidden=32, heads=2, intermediate=64, layers=2))
    path = tmp_path_factory.mktemp("cli") / "llama.onnx"
    with quiet_export():
        torch.onnx.export(model, (torch.randn(1, 6, 32),), path, dynamo=True)
    return model, path


def test_fuse_command(decomposed, tmp_path):
    model, source = decomposed
    before = source.read_bytes()
    out, report = tmp_path / "fused.onnx", tmp_path / "report.json"
    result = _run("fuse", source, "-o", out, "--json", report)
    assert result.returncode == 0, result.stderr
    assert "fused" in result.stdout and f"wrote {out}" in result.stdout
    fused = onnx.load(out)
    norms = [n.op_type for n in fused.graph.node if n.domain == ops.DOMAIN]
    # every norm fused; every one after the first absorbs its residual add (Pre-Norm)
    assert norms == ["RMSNorm"] + ["SkipRMSNorm"] * (model.count_norms() - 1)
    assert json.loads(report.read_text())
    assert source.read_bytes() == before, "the input file was modified"


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("onnxnorm")
    result = subprocess.run([str(script), "fuse", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--target" in result.stdout


def _assert_one_line_error(result, *fragments):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_missing_input(tmp_path):
    result = _run("fuse", tmp_path / "absent.onnx", "-o", tmp_path / "out.onnx")
    _assert_one_line_error(result, "absent.onnx: no such file")
    assert not (tmp_path / "out.onnx").exists()


def test_truncated_input(decomposed, tmp_path):
    truncated = tmp_path / "truncated.onnx"
    data = decomposed[1].read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    result = _run("fuse", truncated, "-o", tmp_path / "out.onnx")
    _assert_one_line_error(result, "truncated.onnx", "not a")
    assert not (tmp_path / "out.onnx").exists()


def test_not_an_onnx_file(tmp_path):
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n")
    result = _run("fuse", text, "-o", tmp_path / "out.onnx")
    _assert_one_line_error(result, "notes.onnx", "not a")


@pytest.mark.parametrize("target", ["missing-folder", "a-folder"])
def test_unwritable_output(decomposed, tmp_path, target):
    out = tmp_path / "no" / "such" / "dir" / "out.onnx" if target == "missing-folder" else tmp_path
    result = _run("fuse", decomposed[1], "-o", out)
    _assert_one_line_error(result, "cannot write")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_failed_write_leaves_nothing_half_written(decomposed, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous content")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    assert cli.main(["fuse", str(decomposed[1]), "-o", str(out)]) == 1
    assert "cannot write" in capsys.readouterr().err
    assert out.read_bytes() == b"previous content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]


def test_unknown_target_is_refused(decomposed, tmp_path):
    result = _run("fuse", decomposed[1], "-o", tmp_path / "o.onnx", "--target", "tensorrt")
    assert result.returncode == 2 and "invalid choice" in result.stderr

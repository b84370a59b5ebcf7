"""``onnxnorm genai`` as a user meets it without building a model: help and bad folders need
neither torch nor onnxruntime-genai, ``--verify`` without onnxruntime-genai says so in one line,
and nothing is written for bad input (the conversion itself: tests/fusion/test_pipelines.py)."""

from __future__ import annotations

import json

import pytest

from tests.support.processes import assert_one_line, run_cli


def test_help_needs_neither_torch_nor_genai():
    result = run_cli("genai", "--help", hidden=("torch", "transformers", "onnxruntime_genai"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: onnxnorm genai") and "--overwrite" in result.stdout


def test_verify_without_genai_is_one_line(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "genai_config.json").write_text(
        json.dumps({"model": {"decoder": {"filename": "model.onnx"}}})
    )
    result = run_cli(
        "genai", str(folder), "-o", str(tmp_path / "out"), "--verify", hidden=("onnxruntime_genai",)
    )
    assert_one_line(
        result, "onnxnorm genai --verify needs onnxruntime_genai", "pip install 'onnxnorm[genai]'"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "no such folder"),
        ("file", "not a folder"),
        ("no_config", "no genai_config.json, not an onnxruntime-genai model folder"),
        ("bad_json", "not readable as JSON"),
        ("no_model", "names no ONNX model"),
        ("model_missing", "model.decoder names model.onnx, which is not there"),
    ],
)
def test_bad_folders_are_one_line(tmp_path, case, message):
    folder = tmp_path / "in"
    if case == "file":
        folder.write_text("x")
    elif case != "missing":
        folder.mkdir()
        config = {
            "no_config": None,
            "bad_json": "{",
            "no_model": json.dumps({"model": {"type": "llama"}}),
            "model_missing": json.dumps({"model": {"decoder": {"filename": "model.onnx"}}}),
        }[case]
        if config is not None:
            (folder / "genai_config.json").write_text(config)
    result = run_cli("genai", str(folder), "-o", str(tmp_path / "out"), hidden=("torch",))
    assert_one_line(result, message)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == (["in"] if case != "missing" else [])

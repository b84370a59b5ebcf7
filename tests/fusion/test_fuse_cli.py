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

from onnxnorm import cli, ops
from onnxnorm.nn import decoder, families
from onnxnorm.nn.exporter import quiet_export
from tests.support.helpers import fuse_peak_rss
from tests.support.matrix import TARGETS_WITHOUT_LIBRARY


def _run(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "onnxnorm", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def _llama():
    """A 2-layer Llama-style decoder, its RMSNorms spelled out as Hugging Face writes them."""
    return decoder.build(
        families.decoder_config(
            "llama", hidden=32, heads=2, intermediate=64, layers=2, impl="decomposed"
        )
    )


@pytest.fixture(scope="module")
def decomposed(tmp_path_factory):
    """A Llama-style decoder exported by torch.onnx.export with Hugging Face's RMSNorm."""
    model = _llama()
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


def test_directory_without_models_is_refused(tmp_path):
    """A folder is fused file by file (tests/fusion/test_optimum.py); one without .onnx files is
    refused in one line."""
    result = _run("fuse", tmp_path, "-o", tmp_path / "out")
    _assert_one_line_error(
        result, f"{tmp_path}: no .onnx file in this folder (nor in its subfolders)"
    )
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "case", ["missing-folder", "unwritable-folder", "output-is-input", "json-in-missing-folder"]
)
def test_bad_output_is_refused_before_any_work(decomposed, tmp_path, monkeypatch, capsys, case):
    from onnxnorm.fusion import files

    source = decomposed[1]
    argv = ["fuse", str(source), "-o", str(tmp_path / "out.onnx")]
    if case == "missing-folder":
        argv[3], expected = str(tmp_path / "no" / "out.onnx"), "does not exist"
    elif case == "unwritable-folder":
        # as root every folder is writable: make this one read-only as the check sees it
        readonly = tmp_path / "ro"
        readonly.mkdir()
        access = os.access
        monkeypatch.setattr(
            os,
            "access",
            lambda path, mode, **kw: (
                False if Path(path) == readonly and mode & os.W_OK else access(path, mode, **kw)
            ),
        )
        argv[3], expected = str(readonly / "out.onnx"), "is not writable"
    elif case == "output-is-input":
        argv[3], expected = str(source), "it is the input"
    else:
        argv += ["--json", str(tmp_path / "no" / "report.json")]
        expected = "report.json: folder"
    loads = []
    monkeypatch.setattr(files, "open_model", lambda *a, **k: loads.append(a))
    before = source.read_bytes()
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and loads == [], "work was done before the output was checked"
    assert len(captured.err.splitlines()) == 1 and expected in captured.err, captured.err
    assert source.read_bytes() == before
    assert not (tmp_path / "out.onnx").exists()


def test_fuse_and_verify_an_onnxnorm_export(tmp_path):
    """An `onnxnorm export --mode fused` output (onnxnorm nodes, residual adds left unfused)
    fused again with --verify: both models run with the library."""
    import onnxnorm

    exported, fused = tmp_path / "exported.onnx", tmp_path / "fused.onnx"
    model = _llama()
    onnxnorm.export(model, (torch.randn(2, 6, 32),), exported, mode="fused", convert=True)
    result = _run("fuse", exported, "-o", fused, "--verify", "--target", "fused")
    assert result.returncode == 0, result.stderr
    checks = [line for line in result.stdout.splitlines() if line.startswith("verify: ")]
    assert checks and all(line.endswith(" ok") for line in checks), result.stdout
    ops_before = [n.op_type for n in onnx.load(exported).graph.node if n.domain == ops.DOMAIN]
    ops_after = [n.op_type for n in onnx.load(fused).graph.node if n.domain == ops.DOMAIN]
    assert ops_before.count("RMSNorm") == len(ops_before) and "SkipRMSNorm" not in ops_before
    assert len(ops_after) == len(ops_before) and "SkipRMSNorm" in ops_after


def test_unknown_target_is_refused(decomposed, tmp_path):
    result = _run("fuse", decomposed[1], "-o", tmp_path / "o.onnx", "--target", "tensorrt")
    assert result.returncode == 2 and "invalid choice" in result.stderr


# --- verify, reports, bad input, external data -------------------------------------------------


def _layer_norm_model(hidden=16, weights=None, checker_ok=True, unknown_op=False):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Add", ["x", "r"], ["s"]),
        helper.make_node("LayerNormalization", ["s", "w", "b"], ["y"], epsilon=1e-5),
    ]
    inits = {
        "w": rng.random(hidden).astype(np.float32) + 0.5,
        "b": rng.random(hidden).astype(np.float32),
    }
    if weights:  # weight matrices after the norm (8 of them), to give the file its size
        width = weights // (8 * 4 * hidden)
        last = "y"
        for i in range(8):
            name = "big" if i == 0 else f"big{i}"
            shape = (hidden, width)
            inits[name] = rng.standard_normal(shape).astype(np.float32)
            nodes.append(helper.make_node("MatMul", ["y", name], [f"z{i}"]))
            last = f"z{i}"
        nodes.append(helper.make_node("Concat", [f"z{i}" for i in range(8)], ["z"], axis=-1))
        out = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
        del last
    else:
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, hidden])
    if unknown_op:
        nodes.append(helper.make_node("Frobnicate", ["x"], ["f"], domain="example.com"))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, hidden]) for n in "xr"]
    graph = helper.make_graph(
        nodes, "ln", inputs, [out], [numpy_helper.from_array(v, k) for k, v in inits.items()]
    )
    imports = [helper.make_opsetid("", 18)] + (
        [helper.make_opsetid("example.com", 1)] if unknown_op else []
    )
    model = helper.make_model(graph, opset_imports=imports, ir_version=10 if checker_ok else 3)
    return model


def test_verify_prints_errors_per_output(tmp_path):
    source = tmp_path / "ln.onnx"
    onnx.save(_layer_norm_model(), source)
    for target in TARGETS_WITHOUT_LIBRARY:
        result = _run(
            "fuse",
            source,
            "-o",
            tmp_path / f"{target}.onnx",
            "--target",
            target,
            "--verify",
            "--json",
            tmp_path / "r.json",
        )
        assert result.returncode == 0, result.stderr
        assert "verify: y (float32): max abs error" in result.stdout and " ok" in result.stdout
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["verify"][0]["ok"] and report["norms"] == 1 and report["residual_adds"] == 1


def test_verify_fails_over_tolerance(tmp_path, monkeypatch, capsys):
    """A fused model that computes something else is caught, and not kept."""
    from onnxnorm.fusion import pipeline

    source = tmp_path / "ln.onnx"
    onnx.save(_layer_norm_model(), source)
    real = pipeline.fuse_detached

    def wrong(*args, **kwargs):
        fused, weights, report = real(*args, **kwargs)
        for node in fused.graph.node:
            for attr in node.attribute:
                if attr.name == "epsilon":
                    attr.f = 10.0
        return fused, weights, report

    monkeypatch.setattr(pipeline, "fuse_detached", wrong)
    out = tmp_path / "out.onnx"
    assert cli.main(["fuse", str(source), "-o", str(out), "--verify"]) == 3
    captured = capsys.readouterr()
    assert "OVER TOLERANCE" in captured.out and "verify failed" in captured.err
    assert not out.exists()


def test_model_without_norms_says_nothing_to_fuse(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    source = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph), source)
    result = _run("fuse", source, "-o", tmp_path / "o.onnx", "--verify")
    assert result.returncode == 0 and "nothing to fuse" in result.stdout


def test_checker_failure_and_unknown_ops_are_reported(tmp_path):
    source = tmp_path / "odd.onnx"
    onnx.save(_layer_norm_model(unknown_op=True), source)
    result = _run("fuse", source, "-o", tmp_path / "o.onnx")
    assert result.returncode == 0, result.stderr
    assert "ops of unknown domains, left as they are: example.com::Frobnicate" in result.stdout
    assert "SkipLayerNorm" in result.stdout
    source = tmp_path / "old.onnx"
    onnx.save(_layer_norm_model(checker_ok=False), source)
    result = _run("fuse", source, "-o", tmp_path / "o2.onnx")
    assert result.returncode == 0 and "fails onnx.checker" in result.stdout


def test_external_data_stays_external(tmp_path):
    model = _layer_norm_model(weights=1 << 20)
    folder = tmp_path / "in"
    folder.mkdir()
    source = folder / "m.onnx"
    onnx.save_model(
        model, source, save_as_external_data=True, location="m.weights", size_threshold=0
    )
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    out = tmp_path / "out" / "fused.onnx"
    out.parent.mkdir()
    result = _run("fuse", source, "-o", out, "--verify", "--target", "ort")
    assert result.returncode == 0, result.stderr
    # the checker looks for m.weights in the model's folder, not in the working folder
    assert "Data of TensorProto" not in result.stdout and "m.weights" not in result.stdout
    assert sorted(p.name for p in out.parent.iterdir()) == ["fused.onnx", "fused.onnx.data"]
    fused = onnx.load(out, load_external_data=False)
    big = next(t for t in fused.graph.initializer if t.name == "big")
    assert big.data_location == onnx.TensorProto.EXTERNAL
    assert out.stat().st_size < 10_000  # the weights are in the data file, not the model
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # input untouched


def _peak_rss_mib(source, out) -> float:
    return fuse_peak_rss(str(source), "-o", str(out))[0]


@pytest.mark.slow
@pytest.mark.parametrize("external", [True, False])
def test_weights_are_not_held_twice(tmp_path, external):
    """Peak memory of `onnxnorm fuse` grows with the weights at most once (inline weights:
    read once; external data: never loaded, copied through in chunks)."""
    weights = 128 << 20
    small, big = tmp_path / "small.onnx", tmp_path / "big.onnx"
    kwargs = dict(save_as_external_data=True, size_threshold=0) if external else {}
    onnx.save_model(_layer_norm_model(), small, **kwargs)
    onnx.save_model(_layer_norm_model(weights=weights), big, **kwargs)
    base = _peak_rss_mib(small, tmp_path / "o1.onnx")
    peak = _peak_rss_mib(big, tmp_path / "o2.onnx")
    grown = peak - base
    # external data: a constant (the 16 MiB copy chunks); inline: nothing near the weights
    limit = 64 if external else 0.5 * weights / 2**20
    assert grown < limit, f"peak RSS grew by {grown:.0f} MiB for {weights >> 20} MiB of weights"


def test_fuse_again_recognises_onnxnorm_nodes(decomposed, tmp_path):
    """A function-target output fused again: onnxnorm's own function bodies are fused nodes,
    not model-local functions to inline first; nothing changes and nothing is skipped."""
    once, twice, report = tmp_path / "once.onnx", tmp_path / "twice.onnx", tmp_path / "r.json"
    assert _run("fuse", decomposed[1], "-o", once).returncode == 0
    result = _run("fuse", once, "-o", twice, "--json", report, "--verify")
    assert result.returncode == 0, result.stderr
    assert "inline it first" not in result.stdout
    skips = [s for rule in json.loads(report.read_text())["rules"] for s in rule["skips"]]
    assert skips == [], skips

    def nodes(path):
        return [(n.op_type, n.domain) for n in onnx.load(path).graph.node]

    assert nodes(twice) == nodes(once)

"""Optimum folders (``optimum-cli export onnx``: decoders with past key values, encoder-decoders
split into encoder, decoder, decoder-with-past and merged decoder files) fused in place of a
folder: ``onnxnorm fuse DIR -o OUT_DIR`` / :func:`onnxnorm.fusion.folder.fuse_folder`. The
folders are exported from tiny random-weight checkpoints built in code, by optimum-onnx in an
overlay of its own (models/pipelines.py: it requires an older transformers than the one here)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

pytest.importorskip("transformers")

from models import compare, pipelines
from onnxnorm.fusion.folder import fuse_folder
from onnxnorm.ops.functions import all_graphs

#: (family, file) -> (norms, residual adds): every norm (Qwen3's Q/K norms in its rotary ops),
#: and every residual add that feeds a norm (Gemma 2's as Sandwich ops; Whisper's decoder also
#: its token + position add, while its encoder's position add broadcasts a 2-D table over the
#: batch, which no Skip op does)
COUNTS = {
    ("llama", "model.onnx"): (5, 4),
    ("gemma2", "model.onnx"): (9, 4),
    ("qwen3", "model.onnx"): (9, 4),
    ("t5", "decoder_model.onnx"): (7, 6),
    ("t5", "decoder_model_merged.onnx"): (14, 12),
    ("t5", "decoder_with_past_model.onnx"): (7, 6),
    ("t5", "encoder_model.onnx"): (5, 4),
    ("whisper", "decoder_model.onnx"): (7, 7),
    ("whisper", "decoder_model_merged.onnx"): (14, 14),
    ("whisper", "decoder_with_past_model.onnx"): (7, 7),
    ("whisper", "encoder_model.onnx"): (5, 4),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return pipelines.optimum_folders(tmp_path_factory.mktemp("optimum"))


def _files(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _ops(path: Path) -> list[str]:
    model = onnx.load(path, load_external_data=False)
    return [n.op_type for g in all_graphs(model.graph) for n in g.node]


@pytest.mark.slow
@pytest.mark.parametrize("family", list(pipelines.OPTIMUM_FAMILIES))
def test_folder_fused_with_parity(folders, family, tmp_path):
    folder = folders[family]
    before = _files(folder)
    out = tmp_path / "out"
    report = fuse_folder(folder, out)
    assert _files(folder) == before, "the input folder was modified"
    assert report.written and report.ok, report.table()
    files = [f.name for f in report.files]
    assert files == list(pipelines.OPTIMUM_FAMILIES[family][1])
    for result in report.files:
        assert (result.report.norms, result.report.residual_adds) == COUNTS[family, result.name], (
            str(result.report)
        )
        names = [c.name for c in result.checks]
        if "merged" in result.name:  # both branches of the If ran, each output checked
            assert len(names) == 2 * len(onnx.load(folder / result.name).graph.output)
            assert sum("use_cache_branch=false" in n for n in names) == len(names) // 2
        # no decomposed norm and no ONNX or ORT norm op is left, in any branch
        left = [
            op
            for op in _ops(out / result.name)
            if op in ("ReduceMean", "Pow", "Sqrt") or "LayerNormalization" in op
        ]
        assert not left, (result.name, left)
    if family == "qwen3":  # each layer's Q/K norms and rotary: one node of Q and K
        rotary = [
            n
            for n in onnx.load(out / "model.onnx", load_external_data=False).graph.node
            if n.op_type == "RMSNormRotary"
        ]
        assert len(rotary) == 2 and all(len(n.output) == 2 for n in rotary)
    if family == "whisper":  # the one add left is reported with its reason
        skips = [
            s.reason
            for f in report.files
            if f.name == "encoder_model.onnx"
            for r in f.report.rules
            for s in r.skips
            if r.rule.endswith("(residual add)")
        ]
        assert len(skips) == 1 and "the Add broadcasts" in skips[0], skips
    # the other files are copied as they are, and nothing else is written
    fused = _files(out)
    assert sorted(fused) == sorted(before)
    assert all(
        fused[name] == digest for name, digest in before.items() if not name.endswith(".onnx")
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", list(pipelines.OPTIMUM_FAMILIES))
def test_at_least_as_many_as_other_tools(folders, family, tmp_path):
    """Per file, onnxnorm holds at least as many norms and residual adds in single ops as ORT's
    transformers optimizer and onnxscript's ort_fusions leave (inside an If's branches too)."""
    for name in pipelines.OPTIMUM_FAMILIES[family][1]:
        mine = COUNTS[family, name]
        for tool in ("ort", "onnxscript"):
            out = tmp_path / f"{tool}_{name}"
            try:
                compare.optimize_file(tool, folders[family] / name, family, out)
            except Exception:  # noqa: BLE001 - a tool that fails on the model fuses nothing
                continue
            theirs = compare.count_all(onnx.load(out))
            assert mine[0] >= theirs[0] and mine[1] >= theirs[1], (name, tool, mine, theirs)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "onnxnorm", "fuse", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_command_and_bad_input(folders, tmp_path):
    folder = folders["llama"]
    before = _files(folder)
    out = tmp_path / "llama-onnxnorm"
    result = _cli(folder, "-o", out, "--json", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(
        i for i, line in enumerate(lines) if line.split() == ["file", "norms", "adds", "parity"]
    )
    assert lines[header + 1].split()[:4] == ["model.onnx", "5", "4", "ok"]
    assert " ok (max abs error " in lines[header + 1] and lines[-1] == f"wrote {out}"
    data = json.loads((tmp_path / "r.json").read_text())
    assert (data["norms"], data["residual_adds"], data["ok"]) == (5, 4, True)
    assert len(data["files"][0]["verify"]) == 5  # the logits and each present key and value
    assert _files(folder) == before

    result = _cli(folder, "-o", out)  # exists
    assert (
        result.returncode == 1
        and result.stderr.strip()
        == f"onnxnorm: error: {out} exists; pass --overwrite to replace it"
    )
    result = _cli(folder, "-o", out, "--overwrite", "--no-verify")
    assert result.returncode == 0 and result.stdout.count("not verified") == 1

    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "config.json").write_text("{}")
    result = _cli(empty, "-o", tmp_path / "x")
    assert (
        result.returncode == 1
        and result.stderr.strip()
        == f"onnxnorm: error: {empty}: no .onnx file in this folder (nor in its subfolders)"
    )
    assert not (tmp_path / "x").exists()

    result = _cli(folder, "-o", folder / "inside")
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "the input is never modified" in result.stderr
    assert _files(folder) == before


@pytest.mark.slow
def test_external_data_kept(folders, tmp_path):
    """A file with external data (Optimum writes ``model.onnx_data`` for large models) is
    written with its own data file next to it; the input's data file is not copied."""
    folder = tmp_path / "llama"
    shutil.copytree(folders["llama"], folder)
    model = onnx.load(folder / "model.onnx")
    onnx.save(
        model,
        folder / "model.onnx",
        save_as_external_data=True,
        location="model.onnx_data",
        size_threshold=0,
    )
    out = tmp_path / "out"
    report = fuse_folder(folder, out)
    assert report.ok and (report.norms, report.residual_adds) == (5, 4)
    assert (out / "model.onnx.data").is_file() and not (out / "model.onnx_data").exists()
    fused = onnx.load(out / "model.onnx", load_external_data=False)
    locations = {
        e.value for t in fused.graph.initializer for e in t.external_data if e.key == "location"
    }
    assert locations == {"model.onnx.data"}


def test_docs_page_shows_what_the_tests_measure():
    text = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
    assert "optimum-cli export onnx --model ./llama-ckpt --task text-generation-with-past" in text
    for (family, name), (norms, adds) in COUNTS.items():
        assert f"| {family} | {name} | {norms} | {adds} | ok (" in text, (family, name)


def _branch(name: str, flat: bool):
    """A branch that defines s, z, e, w and y: ``s`` the shape of x ([2, 3, 8]) or, flat, of x
    reshaped to [6, 8]; z = ConstantOfShape(s)."""
    from onnx import TensorProto, helper

    source, nodes = "x", []
    if flat:
        nodes.append(helper.make_node("Reshape", ["x", "flat"], ["r"]))
        source = "r"
    nodes += [
        helper.make_node("Shape", [source], ["s"]),
        helper.make_node(
            "ConstantOfShape",
            ["s"],
            ["z"],
            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]),
        ),
        helper.make_node("Equal", ["z", source], ["e"]),
        helper.make_node("Where", ["e", "z", source], ["w"]),
        helper.make_node("Reshape", ["w", "full"], ["y"]),
    ]
    return helper.make_graph(
        nodes, name, [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )


def test_branches_that_share_names_keep_their_own_shapes(tmp_path):
    """The two branches of an If define the same names (as Optimum's merged decoders do) with
    values of other shapes: each keeps its own. onnx's data propagation, keyed by name, gave
    the flat branch's z the other branch's [2, 3, 8]; the fused model held those shapes."""
    from onnx import TensorProto, helper

    from onnxnorm.fusion import fuse
    from onnxnorm.fusion.folder import verify_file

    graph = helper.make_graph(
        [
            helper.make_node(
                "If",
                ["flag"],
                ["out"],
                then_branch=_branch("plain", False),
                else_branch=_branch("flat", True),
            )
        ],
        "m",
        [
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3, 8])],
        [
            helper.make_tensor("flat", TensorProto.INT64, [2], [6, 8]),
            helper.make_tensor("full", TensorProto.INT64, [3], [2, 3, 8]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    fused, _ = fuse(model)
    branches = {a.g.name: a.g for a in fused.graph.node[0].attribute}
    shapes = {
        name: {
            v.name.split("_")[0]: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
            for v in g.value_info
        }
        for name, g in branches.items()
    }
    # the flat branch's values are 2-D (the reshape's target is an outer constant, so its dims
    # stay symbolic), the other branch's [2, 3, 8]
    assert len(shapes["flat"]["z"]) == len(shapes["flat"]["e"]) == 2, shapes
    assert shapes["plain"]["z"] == shapes["plain"]["e"] == [2, 3, 8], shapes
    onnx.save(model, tmp_path / "m.onnx")
    onnx.save(fused, tmp_path / "f.onnx")
    checks = verify_file(tmp_path / "m.onnx", tmp_path / "f.onnx")
    assert [c.name for c in checks] == ["out [flag=false]", "out [flag=true]"]
    assert all(c.ok and c.max_abs == 0 for c in checks)


@pytest.mark.slow
def test_verify_failure_writes_nothing(folders, tmp_path, monkeypatch, capsys):
    """A file over tolerance (here: a tolerance of 0, which float32 rounding differences
    exceed) leaves no output folder and no temporary folder; the command exits 3."""
    from onnxnorm import cli
    from onnxnorm.fusion import files
    from onnxnorm.fusion.verify import verify

    def exact(original, fused):
        return verify(original, fused, tolerance={"float32": (0.0, 0.0)})

    monkeypatch.setattr(files, "compare", exact)
    out = tmp_path / "out"
    report = fuse_folder(folders["llama"], out)
    assert not report.written and not report.ok and report.files[0].checks
    assert "OVER TOLERANCE" in report.table()
    assert list(tmp_path.iterdir()) == []
    assert cli.main(["fuse", str(folders["llama"]), "-o", str(out)]) == 3
    err = capsys.readouterr().err.strip()
    assert err == (
        f"onnxnorm: verify failed: outputs over tolerance in model.onnx; {out} not written"
    )
    assert list(tmp_path.iterdir()) == []

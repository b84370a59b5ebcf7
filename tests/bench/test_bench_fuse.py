"""``onnxnorm bench fuse``: the three tools timed on given model files (one with its weights
inside, one with external data: onnxnorm once per --data mode), the tables and the JSON, the
inputs left as they were and no output left behind; the decoders built and timed through the
whole command; one-line argument errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxnorm import cli
from onnxnorm.bench.fuse import measure

HIDDEN = 128


def _model(path: Path, external: bool) -> Path:
    """A decomposed RMSNorm, a projection and the residual add."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(rng.random(HIDDEN, np.float32) + 0.5, "g"),
        numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN), np.float32), "w"),
    ]
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "last"], ["ms"]),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["n"]),
        helper.make_node("Mul", ["n", "g"], ["y0"]),
        helper.make_node("MatMul", ["y0", "w"], ["d"]),
        helper.make_node("Add", ["x", "d"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", HIDDEN])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save_model(model, path, save_as_external_data=external, location=f"{path.name}.data")
    return path


def _state(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_given_models_through_the_command(tmp_path, capsys):
    pytest.importorskip("onnxscript")
    inline = _model(tmp_path / "inline.onnx", external=False)
    external = _model(tmp_path / "external.onnx", external=True)
    before = _state(tmp_path)
    out_json = tmp_path.parent / f"{tmp_path.name}-bench.json"
    status = cli.main(
        [
            "bench",
            "fuse",
            "--model",
            str(inline),
            "--model",
            str(external),
            "--repeats",
            "2",
            "--data",
            "reference,copy,link",
            "--json",
            str(out_json),
        ]
    )
    assert status == 0
    text = capsys.readouterr().out
    assert _state(tmp_path) == before  # the inputs as they were, no output left
    data = json.loads(out_json.read_text())
    blocks = {b["model"]: b for b in data["models"]}
    assert not blocks["inline.onnx"]["external"] and blocks["external.onnx"]["external"]
    assert [r["contender"] for r in blocks["inline.onnx"]["rows"]] == [
        "onnxnorm fuse",
        "onnxscript optimize_for_ort",
        "ORT transformers optimizer",
    ]
    assert [r["contender"] for r in blocks["external.onnx"]["rows"]] == [
        "onnxnorm fuse",
        "onnxnorm fuse --data link",
        "onnxnorm fuse --data reference",
        "onnxscript optimize_for_ort",
        "ORT transformers optimizer",
    ]
    for block in blocks.values():
        assert block["filesystem"] and block["size_mib"] > 0
        for row in block["rows"]:
            assert "error" not in row, row
            assert len(row["runs"]) == 2 and row["seconds"] > 0 and row["peak_mib"] > 0
            assert row["process"] >= row["seconds"] and row["cpu"] >= 0
    rows = {r["contender"]: r for r in blocks["external.onnx"]["rows"]}
    # the unchanged weights (64 KiB) are not written again by link and reference
    assert rows["onnxnorm fuse"]["written_mib"] > 0.06
    assert rows["onnxnorm fuse --data reference"]["written_mib"] < 0.06
    assert rows["onnxnorm fuse --data link"]["written_mib"] < 0.06
    assert "| tool | pass s | runs (s) | CPU s | process s | peak RSS MiB | written MiB |" in text
    assert "**external.onnx**" in text and "external data" in text
    assert "| onnxnorm fuse --data reference | " in text
    assert "as fast as the faster other tool" in text
    assert data["environment"]["versions"]["onnxruntime"]


def test_a_failing_tool_is_a_row(tmp_path, capsys):
    """A mode that cannot write (reflink on a file system without clones, or any refusal) is a
    row with onnxnorm's own one line; the other rows go on."""
    external = _model(tmp_path / "external.onnx", external=True)
    block = measure.measure_model(
        external, ["onnxnorm"], ["copy", "reflink"], None, 1, log=lambda *_: None
    )
    rows = {r["contender"]: r for r in block["rows"]}
    assert "seconds" in rows["onnxnorm fuse"]
    reflink = rows["onnxnorm fuse --data reflink"]
    if block["clones"]:
        assert "seconds" in reflink
    else:
        assert reflink["error"].startswith("onnxnorm: error: cannot write ")
        assert "with --data reflink: the file system of" in reflink["error"]
        assert "fails: onnxnorm: error" in measure.markdown(
            [block], {**measure.environment(1), "load_after": None}
        )


def test_contenders_time_each_data_mode_on_external_data_only():
    names = [c[0] for c in measure.contenders(["onnxnorm", "ort"], ["link", "copy"], True, "ort")]
    assert names == [
        "onnxnorm fuse",
        "onnxnorm fuse --data link",
        "ORT transformers optimizer",
    ]
    assert measure.contenders(["onnxnorm"], ["link"], False, None) == [
        ("onnxnorm fuse", "onnxnorm", ["--data", "copy"])
    ]
    assert measure.contenders(["onnxnorm"], ["copy"], True, "fused")[0][2] == [
        "--target",
        "fused",
        "--data",
        "copy",
    ]


@pytest.mark.slow
def test_the_decoders_are_built_and_timed(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    status = cli.main(
        [
            "bench",
            "fuse",
            "--inline-size",
            "1x64",
            "--external-size",
            "1x64",
            "--repeats",
            "1",
            "--tools",
            "onnxnorm,onnxscript",
            "--data",
            "copy,reference",
            "--folder",
            str(tmp_path),
        ]
    )
    assert status == 0
    text = capsys.readouterr().out
    assert "**decoder_1x64.onnx**" in text and "**decoder_1x64_external.onnx**" in text
    assert "| onnxnorm fuse --data reference | " in text and "fails" not in text
    # the folder keeps the decoders for the next run, nothing else
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "decoder_1x64.onnx",
        "decoder_1x64_external.onnx",
        "decoder_1x64_external.onnx.data",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats", "0"], "onnxnorm: error: --repeats must be at least 1"),
        (["--model", "missing.onnx"], "onnxnorm: error: missing.onnx: no such file"),
        (["--memory-limit", "0"], "onnxnorm: error: --memory-limit must be more than 0 GiB"),
        (["--target", "nope"], "onnxnorm: error: unknown target 'nope'"),
    ],
)
def test_argument_errors_are_one_line(argv, message, capsys):
    assert cli.main(["bench", "fuse", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and len(err.splitlines()) == 1


def test_a_bad_size_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "fuse", "--external-size", "12"])
    assert "give LAYERSxHIDDEN, e.g. 12x2048" in capsys.readouterr().err

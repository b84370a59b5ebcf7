"""One way through a file: ``onnxnorm.fusion.fuse_file``, which the single-file command, folders
and onnxruntime-genai folders call; the input parsed and checked once at the door; named
results."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxnorm import cli
from onnxnorm.fusion import files

HIDDEN = 16


def _block(flag: bool = False) -> onnx.ModelProto:
    """A residual add and a LayerNormalization over it (one Skip op once fused); ``flag``: a
    boolean input choosing between the norm's output and the sum (as a merged decoder's
    ``use_cache_branch`` chooses a branch)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Add", ["x", "r"], ["s"]),
        helper.make_node("LayerNormalization", ["s", "w", "b"], ["n"], epsilon=1e-5),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, HIDDEN]) for n in "xr"]
    if flag:
        nodes.append(helper.make_node("Where", ["flag", "n", "s"], ["y"]))
        inputs.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    else:
        nodes.append(helper.make_node("Identity", ["n"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "block",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, HIDDEN])],
        [
            numpy_helper.from_array(rng.random(HIDDEN).astype(np.float32) + 0.5, "w"),
            numpy_helper.from_array(rng.random(HIDDEN).astype(np.float32), "b"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_fuse_file_names_what_it_did(tmp_path):
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_block(), source)
    result = files.fuse_file(source, out, verify=True)
    assert isinstance(result, files.FileResult)
    assert result.name == str(source) and result.output == out and out.is_file()
    assert (result.report.norms, result.report.residual_adds) == (1, 1)
    assert result.uses_onnxnorm and result.ok and result.kept and result.notes == []
    assert [c.name for c in result.checks] == ["y"] and result.checks[0].max_abs < 1e-5
    assert result.data_files == set()
    assert result.to_dict()["verify"][0]["name"] == "y"
    # the in-memory API's results have names too, and are still the tuples they were
    from onnxnorm.fusion import fuse
    from onnxnorm.fusion.pipeline import fuse_detached

    fused = fuse(_block())
    model, report = fused
    assert fused.model is model and fused.report is report and report.norms == 1
    detached = fuse_detached(_block())
    assert detached.model.graph.node[0].op_type == "SkipLayerNorm"
    assert {t.name for t in detached.weights} | {
        t.name for t in detached.model.graph.initializer
    } == {"w", "b"}


def test_the_input_is_parsed_and_checked_once(tmp_path, monkeypatch, capsys):
    """``onnxnorm fuse IN -o OUT --verify``: one parse of the input, one check of its graphs and
    one of its external data, and nothing read or checked again to verify (the opened files
    go to ONNX Runtime as they are); the output's path checked before any work, once more
    when written."""
    import onnxnorm._io
    import onnxnorm._validate
    from onnxnorm import runtime

    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_block(), source)
    calls: dict[str, list] = {}

    def count(module, name):
        real = getattr(module, name)

        def counted(*args, **kwargs):
            calls.setdefault(name, []).append(args[0] if args else None)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    count(onnxnorm._io, "load_weights_as_references")
    count(onnxnorm._validate, "check_model")
    count(onnxnorm._validate, "check_external_data")
    count(runtime, "_check_external_data")
    assert cli.main(["fuse", str(source), "-o", str(out), "--verify"]) == 0
    assert "verify: y (float32)" in capsys.readouterr().out
    assert calls["load_weights_as_references"] == [source]
    assert len(calls["check_model"]) == len(calls["check_external_data"]) == 1
    assert "_check_external_data" not in calls


def test_each_way_in_calls_fuse_file(tmp_path, monkeypatch):
    """The single-file command and a folder both go through fuse_file (the same report)."""
    real = files.fuse_file
    seen = []

    def recorded(source, output, **kwargs):
        seen.append((str(source), kwargs.get("verify")))
        return real(source, output, **kwargs)

    monkeypatch.setattr(files, "fuse_file", recorded)
    folder = tmp_path / "in"
    folder.mkdir()
    onnx.save(_block(), folder / "model.onnx")
    assert cli.main(["fuse", str(folder / "model.onnx"), "-o", str(tmp_path / "a.onnx")]) == 0
    assert cli.main(["fuse", str(folder), "-o", str(tmp_path / "b")]) == 0
    assert seen == [(str(folder / "model.onnx"), False), (str(folder / "model.onnx"), True)]


def test_a_single_file_with_a_flag_is_verified_in_both_branches(tmp_path, capsys):
    """As in a folder, a file with boolean inputs (a merged decoder) is compared with them all
    false and all true."""
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_block(flag=True), source)
    assert cli.main(["fuse", str(source), "-o", str(out), "--verify"]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("verify")]
    assert [line.split(" (")[0] for line in printed] == [
        "verify: y [flag=false]",
        "verify: y [flag=true]",
    ]


def test_an_output_over_tolerance_is_removed(tmp_path, monkeypatch):
    from onnxnorm.fusion.verify import OutputCheck

    monkeypatch.setattr(
        files, "compare", lambda original, fused: [OutputCheck("y", "float32", 1.0, 1.0, False)]
    )
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_block(), source)
    result = files.fuse_file(source, out, verify=True)
    assert not result.ok and not result.kept and not out.exists()
    assert result.parity() == "OVER TOLERANCE (max abs error 1.0e+00)"


def test_the_old_folder_fuse_file_still_works_and_warns(tmp_path):
    from onnxnorm.fusion import folder

    source = tmp_path / "in.onnx"
    onnx.save(_block(), source)
    with pytest.warns(DeprecationWarning, match="onnxnorm.fusion.fuse_file"):
        report, data = folder.fuse_file(source, tmp_path / "sub" / "out.onnx")
    assert report.norms == 1 and data == set() and (tmp_path / "sub" / "out.onnx").is_file()

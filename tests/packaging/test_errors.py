"""onnxnorm.errors: the error types in one public place, one check of target names, one way of
quoting another library's error."""

from __future__ import annotations

import pytest

from onnxnorm import errors, targets


def test_the_types_are_one_each_wherever_they_are_imported_from():
    import onnxnorm
    from onnxnorm import _deps, _io
    from onnxnorm.fusion import pipeline

    assert onnxnorm.OnnxNormError is _io.OnnxNormError is errors.OnnxNormError
    assert _deps.MissingDependency is errors.MissingDependency
    assert pipeline.OutputDoesNotLoad is errors.OutputDoesNotLoad
    assert issubclass(errors.UnknownTarget, errors.OnnxNormError)
    assert issubclass(errors.UnknownTarget, ValueError)  # as callers caught it before
    assert issubclass(errors.MissingDependency, ImportError)
    assert not issubclass(errors.OutputDoesNotLoad, errors.OnnxNormError)  # a bug: exit 2


@pytest.mark.parametrize(
    "error, fallback, line",
    [
        (ValueError("first\nsecond"), None, "first"),
        (ValueError("  padded  \n"), None, "padded"),
        (RuntimeError(""), None, "RuntimeError"),
        (RuntimeError(""), "failed", "failed"),
        (KeyError("k"), None, "'k'"),
    ],
)
def test_first_line(error, fallback, line):
    assert errors.first_line(error, fallback) == line


def _entry_points(tmp_path):
    """Every public entry point that takes a target (or an export mode) by name."""
    import onnx

    from onnxnorm.fusion import fuse, fuse_folder, lower
    from onnxnorm.genai import convert

    model = onnx.helper.make_model(onnx.helper.make_graph([], "empty", [], []))
    (tmp_path / "in").mkdir()
    onnx.save(model, tmp_path / "in" / "model.onnx")
    return {
        "fuse": lambda t: fuse(model, t),
        "lower": lambda t: lower(model, t),
        "fuse_folder": lambda t: fuse_folder(tmp_path / "in", tmp_path / "out", target=t),
        "genai.convert": lambda t: convert(tmp_path / "in", tmp_path / "out2", target=t),
        "targets.check": targets.check,
    }


def test_every_entry_point_checks_targets_one_way(tmp_path):
    for name, call in _entry_points(tmp_path).items():
        with pytest.raises(errors.UnknownTarget) as raised:
            call("fast")
        assert "'fast'; supported: function, fused, ort, onnx" in str(raised.value), name
    assert targets.check("ort") == "ort"

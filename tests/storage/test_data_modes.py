"""How a fused model gets the input's unchanged external data (``onnxnorm fuse --data``): a
copy of its own (``copy``, cloned where the file system can; ``reflink``, cloned or refused), a
hard link beside it (``link``) or the input's file named where it is (``reference``), the new
tensors alone written in the last two. In every mode the output runs in ONNX Runtime with the
results of every other mode, bit for bit, and the input is never written (its bytes and mtime
the same); what cannot be done is refused in one line, before the pass, with nothing written.

The models are built here with onnx's helpers (no torch): a decoder whose weights the pass
leaves as they are (a decomposed RMSNorm per layer, fused), and a Conv whose BatchNormalization
is folded into it (a new Conv weight and bias, the second Conv's weight unchanged).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from onnxnorm import _io, cli
from onnxnorm._storage import filesystem
from onnxnorm.fusion import files
from onnxnorm.fusion.verify import generate_inputs

HIDDEN = 256


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        location=f"{path.name}.data",
        size_threshold=1024,
    )
    return path


def _decoder(folder: Path, layers: int = 2) -> Path:
    """Per layer a decomposed RMSNorm, a projection in external data and the residual add."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
    ]
    nodes = []

    def rms_norm(x: str, name: str) -> str:
        inits.append(numpy_helper.from_array(rng.random(HIDDEN, np.float32) + 0.5, f"{name}.g"))
        nodes.extend(
            [
                helper.make_node("Pow", [x, "two"], [f"{name}.sq"]),
                helper.make_node("ReduceMean", [f"{name}.sq", "last"], [f"{name}.ms"]),
                helper.make_node("Add", [f"{name}.ms", "eps"], [f"{name}.mse"]),
                helper.make_node("Sqrt", [f"{name}.mse"], [f"{name}.rms"]),
                helper.make_node("Div", [x, f"{name}.rms"], [f"{name}.n"]),
                helper.make_node("Mul", [f"{name}.n", f"{name}.g"], [f"{name}.y"]),
            ]
        )
        return f"{name}.y"

    h = "x"
    for i in range(layers):
        n = rms_norm(h, f"l{i}.norm")
        weight = rng.standard_normal((HIDDEN, HIDDEN), np.float32) * HIDDEN**-0.5
        inits.append(numpy_helper.from_array(weight, f"l{i}.proj"))
        nodes += [
            helper.make_node("MatMul", [n, f"l{i}.proj"], [f"l{i}.d"]),
            helper.make_node("Add", [h, f"l{i}.d"], [f"l{i}.h"]),
        ]
        h = f"l{i}.h"
    y = rms_norm(h, "final")
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", HIDDEN])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["b", "s", HIDDEN])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return _save(model, folder / "model.onnx")


def _conv(folder: Path, channels: int = 32) -> Path:
    """Conv, BatchNormalization (folded into the Conv: new tensors), Conv (unchanged)."""
    rng = np.random.default_rng(1)

    def array(name: str, *shape: int, positive: bool = False):
        values = rng.random(shape, np.float32) + 0.5 if positive else rng.standard_normal(shape)
        return numpy_helper.from_array(np.asarray(values, np.float32) * 0.5, name)

    inits = [
        array("conv.w", channels, channels, 3, 3),
        array("conv.b", channels),
        array("bn.scale", channels, positive=True),
        array("bn.bias", channels),
        array("bn.mean", channels),
        array("bn.var", channels, positive=True),
        array("conv2.w", channels, channels, 3, 3),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["n"]
        ),
        helper.make_node("Conv", ["n", "conv2.w"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return _save(model, folder / "conv.onnx")


def _state(*paths: Path) -> dict[str, tuple[str, int]]:
    """Each file's sha256 and mtime (ns)."""
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in paths
    }


def _inputs(source: Path) -> list[Path]:
    return [source, source.with_name(source.name + ".data")]


def _locations(path: Path) -> dict[str, tuple[str, int, int | None]]:
    model = onnx.load(path, load_external_data=False)
    return {
        t.name: _io.external_location(t) for t in model.graph.initializer if uses_external_data(t)
    }


def _outputs(path: Path) -> list[np.ndarray]:
    """The model file's outputs in ONNX Runtime (onnxnorm's library registered) on fixed
    inputs."""
    from onnxnorm import runtime

    session = runtime.session(str(path))
    feeds = generate_inputs(onnx.load(path, load_external_data=False))
    return session.run(None, feeds)


def _fuse(capsys, source: Path, out: Path, *options: str) -> tuple[int, str, str]:
    status = cli.main(["fuse", str(source), "-o", str(out), *options])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture(params=["decoder", "conv"])
def source(request, tmp_path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    return (_decoder if request.param == "decoder" else _conv)(folder)


def test_every_mode_gives_the_same_results_and_leaves_the_input_as_it_was(source, tmp_path, capsys):
    """copy, link and reference (beside the input) run alike in ONNX Runtime, bit for bit, and
    within tolerance of the input; the input's bytes and mtime are the same after each, and
    after the output's own files are written to."""
    before = _state(*_inputs(source))
    expected = _outputs(source)
    results = {}
    for mode in ("copy", "link", "reference"):
        out = source.with_name(f"fused_{mode}.onnx")
        status, text, err = _fuse(capsys, source, out, "--data", mode, "--verify")
        assert status == 0, err
        assert "verify: " in text and " ok" in text and f"wrote {out}" in text
        results[mode] = _outputs(out)
        assert _state(*_inputs(source)) == before
    for mode, got in results.items():
        assert len(got) == len(expected)
        for have, want in zip(got, results["copy"]):
            assert np.array_equal(have, want), mode
        for have, want in zip(got, expected):
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4)
    # writing into the outputs' own files never reaches the input
    for name in ("fused_copy.onnx.data", "fused_reference.onnx.data", "fused_link.onnx.data"):
        own = source.with_name(name)
        if own.exists():
            with open(own, "r+b") as f:
                f.write(b"\xff" * 64)
    assert _state(*_inputs(source)) == before


def test_reference_names_the_inputs_data_file_relative_to_the_output(source, tmp_path, capsys):
    """Beside the input the output names the data file by its name; in a folder above, by its
    path from there. Only the new tensors are written (the decoder has none: no data file of
    the output's own); the unchanged ones keep their offsets in the input's file."""
    data = source.with_name(source.name + ".data")
    theirs = _locations(source)
    for out, location in (
        (source.with_name("fused.onnx"), data.name),
        (tmp_path / "fused_above.onnx", f"in/{data.name}"),
    ):
        status, text, err = _fuse(capsys, source, out, "--data", "reference")
        assert status == 0, err
        assert f"data: the unchanged weights are read from {location}" in text
        assert f"deleting or rewriting it breaks {out.name}" in text
        mine = _locations(out)
        unchanged = {name for name, where in mine.items() if where[0] == location}
        assert unchanged, mine
        for name in unchanged:
            assert mine[name][1:] == theirs[name][1:]
        new = {name for name in mine if name not in unchanged}
        own = out.with_name(out.name + ".data")
        if source.name == "model.onnx":
            assert not new and not own.exists()
        else:
            assert new == {"conv.w"} and own.exists()  # (the new bias is under 1 KiB: inline)
            assert {mine[name][0] for name in new} == {own.name}
            length = mine["conv.w"][2]
            assert length and own.stat().st_size < length + 4096  # the new tensor alone
        for have, want in zip(_outputs(out), _outputs(source)):
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4)


def test_reference_outside_the_data_files_folder_is_refused_before_the_pass(
    source, tmp_path, capsys, monkeypatch
):
    from onnxnorm.fusion import pipeline

    def no_pass(*args, **kwargs):
        raise AssertionError("the pass ran")

    monkeypatch.setattr(pipeline, "fuse_detached", no_pass)
    before = _state(*_inputs(source))
    for out in (tmp_path / "elsewhere" / "fused.onnx", source.parent / "sub" / "fused.onnx"):
        out.parent.mkdir()
        status, _, err = _fuse(capsys, source, out, "--data", "reference")
        assert status == 1
        assert err.strip().splitlines() == [
            f"onnxnorm: error: cannot write {out} with --data reference: the input's data file "
            f"{source.parent / (source.name + '.data')} is not in the output's folder "
            f"{out.parent} or below it, and a model reads external data only there; write "
            "the output beside it, or use --data link (the same file system) or --data copy"
        ]
        assert _listing(out.parent) == []
    assert _state(*_inputs(source)) == before


def test_link_is_a_hard_link_to_the_inputs_data_file(source, tmp_path, capsys):
    """In another folder of the same file system: ``<out>.linked.data`` is the input's data
    file under a second name, the new tensors are in ``<out>.data``; the output keeps its
    weights when the input is deleted."""
    data = source.with_name(source.name + ".data")
    before = _state(*_inputs(source))
    expected = _outputs(source)
    out = tmp_path / "deploy" / "fused.onnx"
    out.parent.mkdir()
    status, text, err = _fuse(capsys, source, out, "--data", "link")
    assert status == 0, err
    link = out.with_name("fused.onnx.linked.data")
    assert f"data: the unchanged weights are in {link.name}, a hard link to the input's" in text
    assert link.stat().st_ino == data.stat().st_ino and data.stat().st_nlink == 2
    has_new = source.name == "conv.onnx"
    assert _listing(out.parent) == sorted(
        ["fused.onnx", link.name] + (["fused.onnx.data"] if has_new else [])
    )
    assert {where[0] for where in _locations(out).values()} == (
        {link.name, "fused.onnx.data"} if has_new else {link.name}
    )
    assert _state(*_inputs(source)) == before
    for path in _inputs(source):
        path.unlink()
    for have, want in zip(_outputs(out), expected):
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4)


def test_link_across_file_systems_is_refused_before_the_pass(tmp_path, capsys):
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    folder = tmp_path / "in"
    folder.mkdir()
    source = _decoder(folder)
    out_dir = shm / f"onnxnorm-test-{os.getpid()}"
    out_dir.mkdir()
    try:
        if out_dir.stat().st_dev == folder.stat().st_dev:
            pytest.skip("/dev/shm is on the same file system here")
        out = out_dir / "fused.onnx"
        for mode, what in (("link", "hard link"), ("reflink", "clone")):
            status, _, err = _fuse(capsys, source, out, "--data", mode)
            assert status == 1
            line = err.strip()
            assert line.startswith(f"onnxnorm: error: cannot write {out} with --data {mode}:")
            assert f"another file system than {out_dir}, and a {what} cannot cross" in line
            assert _listing(out_dir) == []
        status, _, err = _fuse(capsys, source, out, "--data", "copy")  # the fallback
        assert status == 0, err
        assert _listing(out_dir) == ["fused.onnx", "fused.onnx.data"]
    finally:
        for path in out_dir.iterdir():
            path.unlink()
        out_dir.rmdir()


def test_reflink_clones_or_is_refused_with_nothing_written(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    source = _decoder(folder)
    out = folder / "fused.onnx"
    status, text, err = _fuse(capsys, source, out, "--data", "reflink")
    problem = filesystem.clone_problem(out)
    if problem is None:
        assert status == 0, err
        assert "a clone of the input's data file" in text
    else:
        assert status == 1
        assert err.strip() == (
            f"onnxnorm: error: cannot write {out} with --data reflink: the file system of "
            f"{folder} cannot clone files ({problem}); use --data copy, link or reference"
        )
        assert _listing(folder) == ["model.onnx", "model.onnx.data"]


def test_copy_says_whether_it_cloned_or_copied(tmp_path, capsys, monkeypatch):
    """Where the file system clones (FICLONE, emulated here by a copy in this process) the line
    says so; where it cannot, the kernel copies and the line names the modes that copy
    nothing."""
    import fcntl

    folder = tmp_path / "in"
    folder.mkdir()
    source = _decoder(folder)
    real = fcntl.ioctl

    def refuse(fd, request, arg, *rest):
        if request == filesystem.FICLONE:
            raise OSError(95, "Operation not supported")
        return real(fd, request, arg, *rest)

    def clone(fd, request, arg, *rest):
        if request != filesystem.FICLONE:
            return real(fd, request, arg, *rest)
        os.lseek(arg, 0, os.SEEK_SET)
        while chunk := os.read(arg, 1 << 20):
            os.write(fd, chunk)
        return 0

    for fake, words in ((refuse, "a copy of the input's"), (clone, "a clone of the input's")):
        monkeypatch.setattr(fcntl, "ioctl", fake)
        status, text, err = _fuse(capsys, source, tmp_path / "fused.onnx")
        assert status == 0, err
        assert f"data: fused.onnx.data, {words} data file" in text
    monkeypatch.setattr(fcntl, "ioctl", refuse)
    status, _, err = _fuse(capsys, source, tmp_path / "cloned.onnx", "--data", "reflink")
    assert status == 1 and "cannot clone files (Operation not supported)" in err
    assert not (tmp_path / "cloned.onnx").exists()


def test_a_new_output_replaces_the_old_ones_files_without_renaming_over_them(
    tmp_path, capsys, monkeypatch
):
    """Written again in another mode, the output's old files go (a stale data file or hard
    link, never the input's), and no file is renamed over another: on ext4 that rename would
    flush the new file to the disk first."""
    folder = tmp_path / "in"
    folder.mkdir()
    source = _decoder(folder)
    data = source.with_name("model.onnx.data")
    before = _state(*_inputs(source))
    real = os.replace

    def replace(src, dst):
        assert not os.path.lexists(dst), f"renamed over {dst}"
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    out = folder / "fused.onnx"
    expected = {
        "copy": ["fused.onnx", "fused.onnx.data"],
        "link": ["fused.onnx", "fused.onnx.linked.data"],
        "reference": ["fused.onnx"],
    }
    for mode in ("copy", "link", "copy", "reference", "link", "reference", "copy"):
        status, _, err = _fuse(capsys, source, out, "--data", mode)
        assert status == 0, err
        assert _listing(folder) == sorted(["model.onnx", "model.onnx.data", *expected[mode]])
        assert data.stat().st_nlink == (2 if mode == "link" else 1)
        for have, want in zip(_outputs(out), _outputs(source)):
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4)
    assert _state(*_inputs(source)) == before


def test_an_output_whose_files_are_the_inputs_is_refused(tmp_path, capsys):
    """An input whose data file is named as the output's would be (``fused.onnx.data``,
    ``fused.onnx.linked.data``): writing the output would replace or remove it."""
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("fused.onnx.data", "fused.onnx.linked.data"):
        model = onnx.load(_decoder(folder), load_external_data=True)
        source = folder / f"odd-{len(name)}.onnx"
        onnx.save_model(
            model, source, save_as_external_data=True, location=name, size_threshold=1024
        )
        before = _state(source, folder / name)
        out = folder / "fused.onnx"
        for mode in ("copy", "link", "reference"):
            status, _, err = _fuse(capsys, source, out, "--data", mode)
            assert status == 1
            assert err.strip() == (
                f"onnxnorm: error: cannot write {out}: {folder / name} is a file the input "
                "reads; the input is never modified, choose another output"
            )
            assert not out.exists()
        assert _state(source, folder / name) == before
        (folder / name).unlink()


def test_an_output_over_tolerance_is_removed_without_the_inputs_data(tmp_path, monkeypatch):
    """--verify that fails removes the output's files; a referenced data file is the input's
    and stays."""
    from onnxnorm.fusion.verify import OutputCheck

    folder = tmp_path / "in"
    folder.mkdir()
    source = _conv(folder)
    before = _state(*_inputs(source))
    monkeypatch.setattr(files, "compare", lambda *a: [OutputCheck("y", "float32", 1.0, 1.0, False)])
    for mode in ("reference", "link"):
        result = files.fuse_file(source, folder / "fused.onnx", verify=True, data=mode)
        assert not result.kept
        assert _listing(folder) == ["conv.onnx", "conv.onnx.data"]
    assert _state(*_inputs(source)) == before


def test_an_input_without_external_data_is_written_whole_in_every_mode(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    model = onnx.load(_decoder(folder), load_external_data=True)
    source = folder / "inline.onnx"
    onnx.save_model(model, source)
    for mode in ("copy", "reflink", "link", "reference"):
        out = tmp_path / f"fused_{mode}.onnx"
        status, text, err = _fuse(capsys, source, out, "--data", mode)
        assert status == 0, err
        assert "data: " not in text and not out.with_name(out.name + ".data").exists()
        assert not _locations(out)


def test_a_folder_takes_only_copy(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    _decoder(folder)
    status, _, err = _fuse(capsys, folder, tmp_path / "out", "--data", "reference")
    assert status == 1
    assert err.strip() == (
        "onnxnorm: error: --data reference applies to a model file; a folder's output is a "
        "folder of its own, with every file copied (--data copy)"
    )
    assert not (tmp_path / "out").exists()


def test_the_copy_runs_beside_the_pass(tmp_path, monkeypatch):
    """--data copy starts the output's data file as a copy of the input's on a thread before the
    pass and writes after it: the unchanged tensors keep their offsets, the replaced ones' bytes
    become holes, the output runs as the input does."""
    from onnxnorm import _io as io_module

    folder = tmp_path / "in"
    folder.mkdir()
    source = _conv(folder)
    begun = []
    real = io_module.CopyInBackground

    def spy(file, temps):
        begun.append(real(file, temps))
        return begun[-1]

    monkeypatch.setattr(io_module, "CopyInBackground", spy)
    out = tmp_path / "fused.onnx"
    result = files.fuse_file(source, out)
    assert len(begun) == 1 and begun[0].file == source.with_name("conv.onnx.data").resolve()
    assert result.written is not None and result.written.how == begun[0].how != ""
    theirs, mine = _locations(source), _locations(out)
    assert mine["conv2.w"][1:] == theirs["conv2.w"][1:]
    _, start, length = theirs["conv.w"]  # replaced by the folded weight: a hole now
    with open(out.with_name("fused.onnx.data"), "rb") as f:
        f.seek(start)
        assert length and f.read(length) == bytes(length)
    for have, want in zip(_outputs(out), _outputs(source)):
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4)
    assert _listing(tmp_path) == ["fused.onnx", "fused.onnx.data", "in"]


def test_a_pass_that_fails_stops_the_copy_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    from onnxnorm.errors import OnnxNormError
    from onnxnorm.fusion import pipeline

    folder = tmp_path / "in"
    folder.mkdir()
    source = _decoder(folder)

    def failing(*args, **kwargs):
        raise OnnxNormError("the pass failed")

    monkeypatch.setattr(pipeline, "fuse_detached", failing)
    out = tmp_path / "out" / "fused.onnx"
    out.parent.mkdir()
    status, _, err = _fuse(capsys, source, out)
    assert status == 1 and err.strip() == "onnxnorm: error: the pass failed"
    assert _listing(out.parent) == []


def test_a_copy_of_no_use_is_stopped_and_the_output_written_as_ever(tmp_path):
    """A copy begun of another file than the one the output's tensors lie in is not used (nor
    left behind)."""
    folder = tmp_path / "in"
    folder.mkdir()
    source = _decoder(folder)
    other = tmp_path / "other.bin"
    other.write_bytes(b"\x01" * (1 << 20))
    model = _io.load_model(source, load_weights=False)
    out = tmp_path / "fused.onnx"
    with filesystem.TempFiles(out) as temps:
        begun = filesystem.CopyInBackground(other, temps)
        written = _io.write_model(model, out, source=source, started=begun)
        begun.close()
    assert (
        written.how in ("cloned", "copied")
        and written.base == source.with_name("model.onnx.data").resolve()
    )
    assert _listing(tmp_path) == ["fused.onnx", "fused.onnx.data", "in", "other.bin"]
    for have, want in zip(_outputs(out), _outputs(source)):
        assert np.array_equal(have, want)

"""A model with its weights in external data, fused by the command line: the output's data
file starts as the input's (shared where the file system can, else copied by the kernel), the
unchanged weights keep their offsets, the output runs with parity, and the input is never
written to, nor through the output afterwards (no hard link: the files share no writes)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import external_data_helper

from onnxnorm import _io
from onnxnorm._storage import filesystem

pytest.importorskip("torch")

from models import corpus

pytestmark = pytest.mark.slow


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _offsets(path: Path) -> dict[str, tuple[str, int, int]]:
    model = onnx.load(path, load_external_data=False)
    return {
        t.name: _io.external_location(t)
        for t in model.graph.initializer
        if external_data_helper.uses_external_data(t)
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return corpus.decoder_export(
        tmp_path_factory.mktemp("external"), layers=2, hidden=256, external=True
    )


def _with_unused_tail(source: Path, tmp_path: Path) -> Path:
    """A copy of ``source`` whose data file ends in 40 MiB that no tensor uses."""
    folder = tmp_path / "in"
    folder.mkdir()
    copy = folder / source.name
    copy.write_bytes(source.read_bytes())
    Path(f"{copy}.data").write_bytes(Path(f"{source}.data").read_bytes() + b"\x01" * (40 << 20))
    return copy


def _fuse(source: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnxnorm", "fuse", str(source), "-o", str(out), "--verify"],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_output_shares_no_writes_with_the_input(source, tmp_path):
    data = Path(f"{source}.data")
    before = {p: _sha(p) for p in (source, data)}
    out = tmp_path / "fused.onnx"
    result = _fuse(source, out)
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stdout and "verify: " in result.stdout
    assert "5 norm(s) and 4 residual add(s) now in onnxnorm ops" in result.stdout
    out_data = Path(f"{out}.data")
    assert {p: _sha(p) for p in (source, data)} == before
    # every weight the fused graph still uses lies where it lay in the input's data file
    theirs, mine = _offsets(source), _offsets(out)
    assert mine and all(mine[name][1:] == theirs[name][1:] for name in mine if name in theirs)
    assert {location for location, _, _ in mine.values()} == {out_data.name}
    for path in (source, data, out, out_data):
        assert path.stat().st_nlink == 1
    assert out_data.stat().st_ino != data.stat().st_ino
    with open(out_data, "r+b") as f:  # writing the output never reaches the input
        f.write(b"\xff" * 8192)
    assert {p: _sha(p) for p in (source, data)} == before


def test_a_data_file_mostly_unused_is_not_copied_whole(source, tmp_path):
    """Tensors that fill less than 90% of their file are copied one by one, the rest left."""
    copy = _with_unused_tail(source, tmp_path)
    out = tmp_path / "fused.onnx"
    result = _fuse(copy, out)
    assert result.returncode == 0, result.stderr
    assert Path(f"{out}.data").stat().st_size < Path(f"{source}.data").stat().st_size + (1 << 20)
    theirs, mine = _offsets(copy), _offsets(out)
    assert mine and all(name in theirs for name in mine)


def test_a_clone_keeps_offsets_and_releases_unused_ranges(source, tmp_path, monkeypatch):
    """Where FICLONE works (XFS, btrfs) the data file is the input's, unused ranges become
    holes (read as zeros); emulated here by a copy where the file system has no clones."""
    import fcntl

    real = fcntl.ioctl

    def clone(fd, request, arg, *rest):
        if request != filesystem.FICLONE:
            return real(fd, request, arg, *rest)
        os.lseek(arg, 0, os.SEEK_SET)
        while chunk := os.read(arg, 1 << 20):
            os.write(fd, chunk)
        return 0

    monkeypatch.setattr(fcntl, "ioctl", clone)
    copy = _with_unused_tail(source, tmp_path)
    data = Path(f"{copy}.data")
    model = _io.load_model(copy, load_weights=False)
    out = tmp_path / "fused.onnx"
    from onnxnorm.fusion.pipeline import fuse_detached

    fused, weights, _ = fuse_detached(model, base_dir=str(copy.parent))
    _io.save_model(fused, out, source=copy, extra=weights)
    out_data = Path(f"{out}.data")
    theirs, mine = _offsets(copy), _offsets(out)
    assert all(mine[name][1:] == theirs[name][1:] for name in mine if name in theirs)
    end = Path(f"{source}.data").stat().st_size
    assert out_data.stat().st_size >= data.stat().st_size  # the input's file, new tensors after
    with open(out_data, "rb") as f:
        f.seek(end)
        tail = f.read(40 << 20)
    assert tail == bytes(40 << 20)  # the unused tail: a hole
    from onnxnorm.fusion.verify import verify

    checks = verify(onnx.load(copy), onnx.load(out))
    assert checks and all(c.ok for c in checks)


def _hub_snapshot(source: Path, root: Path) -> Path:
    """``source`` laid out as the Hugging Face hub caches a download: the files in
    ``<repo>/blobs`` under their hashes, linked from ``<repo>/snapshots/<revision>`` by name."""
    blobs, snapshot = (
        root / "models--org--name" / "blobs",
        root / "models--org--name" / "snapshots" / "0123abc",
    )
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in (source, Path(f"{source}.data")):
        blob = blobs / _sha(path)
        blob.write_bytes(path.read_bytes())
        os.symlink(os.path.relpath(blob, snapshot), snapshot / path.name)
    return snapshot / source.name


def test_a_hugging_face_cache_snapshot_is_read_through_its_links(source, tmp_path):
    """The links of a hub snapshot lead into the same repository's blobs folder: followed,
    the output has the input's values; a link to anywhere else is still refused."""
    model = _hub_snapshot(source, tmp_path / "hub")
    out = tmp_path / "fused.onnx"
    result = _fuse(model, out)
    assert result.returncode == 0, result.stderr
    assert "5 norm(s) and 4 residual add(s) now in onnxnorm ops" in result.stdout
    assert "verify: " in result.stdout and Path(f"{out}.data").stat().st_size > 0
    # the same layout whose blobs folder is itself a link is not the hub's: refused
    other = tmp_path / "elsewhere"
    (tmp_path / "hub" / "models--org--name" / "blobs").rename(other)
    os.symlink(other, tmp_path / "hub" / "models--org--name" / "blobs")
    result = _fuse(model, tmp_path / "refused.onnx")
    assert result.returncode != 0
    assert (
        "is a symbolic link to" in result.stderr and "outside the model's folder" in result.stderr
    )
    assert not (tmp_path / "refused.onnx").exists()

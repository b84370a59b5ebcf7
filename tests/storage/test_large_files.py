"""Models over 2 GB, full disks and interrupted writes.

A decoder with wide layers (MatMul weights of 128 MiB in external data, norms decomposed) is
built directly as ONNX, its data file written in chunks: at 2 layers (0.5 GiB) and at 9 layers
(2.25 GiB, over protobuf's 2 GB). Both are fused; the peak resident memory of `onnxnorm fuse`
is the same for both within a bound that does not grow with the weights, and the large one is
verified in ONNX Runtime. A write that fails for lack of space, or a run killed while writing,
leaves nothing at the output path; the temporary files a killed run leaves are removed by the
next write of the same output.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxnorm import ops
from tests.support.helpers import fuse_peak_rss

HIDDEN, WIDE = 1024, 32768  # each weight: 1024 x 32768 float32 = 128 MiB
SMALL_LAYERS, LARGE_LAYERS = 2, 9
#: how much more the peak resident memory of `fuse` may be on the 2.25 GiB model than on the
#: 0.5 GiB one (1.75 GiB more weights)
PEAK_GROWTH_LIMIT_MIB = 64
#: free space the slow test needs in the temporary folder: the large model and its fused copy
NEEDED_GIB = 6
_BLOCK = 1 << 22  # elements of the random block the weights repeat (16 MiB)


def _decoder(folder: Path, layers: int, hidden: int = HIDDEN, wide: int = WIDE) -> Path:
    """A Pre-Norm decoder: per layer a decomposed RMSNorm, an up and a down projection and the
    residual add; a final RMSNorm. The weights are written to model.onnx.data one chunk at a
    time (never all in memory)."""
    rng = np.random.default_rng(0)
    block = rng.standard_normal(_BLOCK, np.float32)
    scaled: dict[float, np.ndarray] = {}
    data_path = folder / "model.onnx.data"
    inits, nodes = [], []
    offset = 0

    def external(name: str, shape: tuple[int, int], scale: float, f) -> None:
        nonlocal offset
        count = shape[0] * shape[1]
        if scale not in scaled:
            scaled[scale] = block * np.float32(scale)
        written = 0
        while written < count:
            n = min(_BLOCK, count - written)
            f.write(scaled[scale][:n])
            written += n
        tensor = TensorProto(
            name=name, data_type=TensorProto.FLOAT, dims=shape, data_location=TensorProto.EXTERNAL
        )
        for key, value in (
            ("location", data_path.name),
            ("offset", str(offset)),
            ("length", str(count * 4)),
        ):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        inits.append(tensor)
        offset += count * 4

    def rms_norm(x: str, name: str) -> str:
        inits.append(numpy_helper.from_array(rng.random(hidden, np.float32) + 0.5, f"{name}.g"))
        nodes.extend(
            [
                helper.make_node("Pow", [x, "two"], [f"{name}.sq"]),
                helper.make_node("ReduceMean", [f"{name}.sq", "last"], [f"{name}.ms"], keepdims=1),
                helper.make_node("Add", [f"{name}.ms", "eps"], [f"{name}.mse"]),
                helper.make_node("Sqrt", [f"{name}.mse"], [f"{name}.rms"]),
                helper.make_node("Div", [x, f"{name}.rms"], [f"{name}.n"]),
                helper.make_node("Mul", [f"{name}.n", f"{name}.g"], [f"{name}.y"]),
            ]
        )
        return f"{name}.y"

    inits += [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
    ]
    h = "x"
    with open(data_path, "wb") as f:
        for i in range(layers):
            n = rms_norm(h, f"l{i}.norm")
            external(f"l{i}.up", (hidden, wide), hidden**-0.5, f)
            external(f"l{i}.down", (wide, hidden), wide**-0.5, f)
            nodes += [
                helper.make_node("MatMul", [n, f"l{i}.up"], [f"l{i}.u"]),
                helper.make_node("MatMul", [f"l{i}.u", f"l{i}.down"], [f"l{i}.d"]),
                helper.make_node("Add", [h, f"l{i}.d"], [f"l{i}.h"]),
            ]
            h = f"l{i}.h"
    out = rms_norm(h, "final")
    graph = helper.make_graph(
        nodes,
        "wide-decoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", hidden])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", "seq", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _fuse(source: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnxnorm", "fuse", str(source), "-o", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=900,
    )


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture(scope="module")
def large_model(tmp_path_factory):
    """The 2.25 GiB decoder, removed after the module's tests."""
    folder = tmp_path_factory.mktemp("large")
    free = shutil.disk_usage(folder).free
    if free < NEEDED_GIB << 30:
        pytest.skip(f"needs {NEEDED_GIB} GiB free in {folder}, has {free / 2**30:.1f} GiB")
    source = _decoder(folder, LARGE_LAYERS)
    assert (folder / "model.onnx.data").stat().st_size > 2**31
    yield source
    shutil.rmtree(folder)


@pytest.mark.slow
def test_a_model_over_2gb_is_fused_and_verified_in_bounded_memory(tmp_path, large_model):
    source = large_model
    small = tmp_path / "small"
    small.mkdir()
    peak_small, _ = fuse_peak_rss(
        str(_decoder(small, SMALL_LAYERS)), "-o", str(small / "fused.onnx")
    )
    shutil.rmtree(small)
    out = tmp_path / "fused" / "fused.onnx"
    out.parent.mkdir()
    peak_large, seconds = fuse_peak_rss(str(source), "-o", str(out))
    print(
        f"\nfuse: 0.5 GiB model peak {peak_small:.0f} MiB; 2.25 GiB model peak "
        f"{peak_large:.0f} MiB, {seconds:.1f} s"
    )
    assert peak_large - peak_small < PEAK_GROWTH_LIMIT_MIB, (
        f"peak RSS {peak_small:.0f} MiB (0.5 GiB of weights) -> {peak_large:.0f} MiB (2.25 GiB)"
    )

    fused = onnx.load(out, load_external_data=False)
    assert [n.op_type for n in fused.graph.node if n.domain == ops.DOMAIN] == (
        ["RMSNorm"] + ["SkipRMSNorm"] * LARGE_LAYERS
    )
    weights = [t for t in fused.graph.initializer if t.name.endswith((".up", ".down"))]
    assert len(weights) == 2 * LARGE_LAYERS
    assert all(t.data_location == TensorProto.EXTERNAL for t in weights)
    assert out.with_name("fused.onnx.data").stat().st_size >= 2 * LARGE_LAYERS * HIDDEN * WIDE * 4
    assert _temps(out.parent) == []

    # both models in ONNX Runtime on the same inputs (ORT holds the weights: not bounded)
    code = (
        "import sys, time; from onnxnorm.fusion.verify import verify; "
        "t = time.perf_counter(); checks = verify(sys.argv[1], sys.argv[2]); "
        "print(*checks, sep='\\n'); print(time.perf_counter() - t); "
        "sys.exit(0 if all(c.ok for c in checks) else 3)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(source), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    print(
        f"verify: {result.stdout.strip().splitlines()[0]}, {float(result.stdout.split()[-1]):.1f} s"
    )
    shutil.rmtree(out.parent)


@pytest.mark.slow
def test_a_killed_write_leaves_nothing_at_the_output(tmp_path, large_model):
    """SIGKILL while the data file is being written: neither the model nor its data file is
    at the output path; the temporary file left beside it goes with the next write."""
    source = large_model  # the copy of its data takes long enough to be caught
    out = tmp_path / "out" / "fused.onnx"
    out.parent.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "onnxnorm", "fuse", str(source), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    try:
        while not _temps(out.parent):
            assert process.poll() is None, "fuse ended before it was caught writing"
            assert time.monotonic() < deadline
            time.sleep(0.005)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    left = _temps(out.parent)
    assert left and all(name.startswith(f".fused.onnx.{process.pid}.") for name in left), left
    assert not out.exists() and not out.with_name("fused.onnx.data").exists()

    small = tmp_path / "small"
    small.mkdir()
    result = _fuse(_decoder(small, 1, wide=256), out)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["fused.onnx", "fused.onnx.data"]


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True
    )
    return probe.returncode == 0


@pytest.mark.parametrize("limit", ["full tmpfs", "file size limit"])
def test_a_full_disk_leaves_nothing_at_the_output(tmp_path, limit):
    """The output folder fills up while the data file is written: one line, exit 1, nothing at
    the output path and no temporary file (a 1 MiB tmpfs in a user namespace where the system
    allows it; RLIMIT_FSIZE, which fails writes past 1 MiB the same way, everywhere)."""
    folder, out_dir = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    out_dir.mkdir()
    source = _decoder(folder, 1, wide=1024)  # 8 MiB of weights
    out = out_dir / "fused.onnx"
    command = [sys.executable, "-m", "onnxnorm", "fuse", str(source), "-o", str(out)]
    if limit == "full tmpfs":
        if not _unshare_works():
            pytest.skip("unprivileged user namespaces are not allowed here")
        script = (
            f"mount -t tmpfs -o size=1m onnxnorm-test {out_dir} && "
            f"{' '.join(command)}; rc=$?; ls -A {out_dir}; exit $rc"
        )
        result = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=300,
        )
        reason = "No space left on device"
        listed = result.stdout.strip().splitlines()[-1:] if result.stdout.strip() else []
        assert all(not line.startswith("wrote") for line in listed)
        left = [line for line in result.stdout.splitlines() if line.startswith((".", "fused"))]
    else:
        import resource

        def limit_file_size():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

        result = subprocess.run(
            command, capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size
        )
        reason = "File too large"
        left = sorted(p.name for p in out_dir.iterdir())
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [f"onnxnorm: error: cannot write {out}: {reason}"], result.stderr
    assert left == [], left


def test_the_next_write_removes_only_dead_runs_temporary_files(tmp_path):
    """Temporary files of a process that has ended go; those of a live process (a run still
    writing the same output) and other files stay."""
    from onnxnorm._io import save_model

    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead, live = int(ended.stdout), os.getppid()
    names = [
        f".fused.onnx.{dead}.abc123.data.tmp",
        f".fused.onnx.{dead}.def456.tmp",
        f".fused.onnx.{live}.ghi789.data.tmp",
        ".other.onnx.1.x.tmp",
        "notes.txt",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"partial")
    model = onnx.load(_decoder(tmp_path, 1, hidden=16, wide=64), load_external_data=False)
    save_model(model, tmp_path / "fused.onnx", source=tmp_path / "model.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        names[2:] + ["fused.onnx", "fused.onnx.data", "model.onnx", "model.onnx.data"]
    )


def test_a_failed_rename_of_the_data_puts_the_old_model_back(tmp_path, monkeypatch, capsys):
    from onnxnorm import cli

    source = _decoder(tmp_path, 1, hidden=16, wide=64)
    out = tmp_path / "out" / "fused.onnx"
    out.parent.mkdir()
    out.write_bytes(b"previous model")
    out.with_name("fused.onnx.data").write_bytes(b"previous data")
    real = os.replace

    def failing(src, dst):
        if str(dst).endswith(".data"):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    assert cli.main(["fuse", str(source), "-o", str(out)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"onnxnorm: error: cannot write {out}: No space left on device"
    )
    assert out.read_bytes() == b"previous model"
    assert out.with_name("fused.onnx.data").read_bytes() == b"previous data"
    assert sorted(p.name for p in out.parent.iterdir()) == ["fused.onnx", "fused.onnx.data"]

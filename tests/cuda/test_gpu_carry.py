"""tools/gpu_carry.py: wheels cut into parts here and put together and installed on a machine
without a package registry (tools/gpu_check.sh's ONNX Runtime step), with small wheels made here
instead of onnxruntime-gpu and onnxruntime-genai-cuda."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gpu_carry.py"


def _wheel(folder: Path, name: str = "tinycarry", blob: int = 5 << 19) -> Path:
    """A pure-Python wheel of package ``name`` (VALUE = 42) with ``blob`` bytes of a stored,
    incompressible data file."""
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{name}/blob.bin": os.urandom(blob),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{info}/RECORD", record)
    return wheel


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300
    )


def test_parts_are_joined_checked_and_installed(tmp_path):
    wheels = [_wheel(tmp_path), _wheel(tmp_path, "tinycarry2", 1000)]
    dest = tmp_path / "carry"
    given = [arg for w in wheels for arg in ("--wheel", str(w))]
    done = _tool("--dest", str(dest), "prepare", *given, "--part-mib", "1")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["wheels"] == [w.name for w in wheels]
    names = [p["name"] for p in manifest["parts"]]
    assert names == [f"gpu-wheels.tar.part{i:02d}" for i in (1, 2, 3)]
    assert [p["size"] for p in manifest["parts"]][:2] == [1 << 20, 1 << 20]
    assert sum(p["size"] for p in manifest["parts"]) == manifest["size"]
    assert manifest["size"] > sum(w.stat().st_size for w in wheels)  # (a tar of both)
    assert "3 parts" in done.stdout and f"call 3: {dest / 'manifest.json'}" in done.stdout

    target = tmp_path / "site"
    # a part still on its way: exit 3, naming it, nothing installed
    held = dest / names[1]
    held.rename(tmp_path / "held")
    missing = _tool("--dest", str(dest), "install", "--target", str(target))
    assert missing.returncode == 3 and names[1] in missing.stderr, missing.stderr
    assert not (target / "tinycarry").exists()
    # a part damaged on the way: exit 1
    (tmp_path / "held").rename(held)
    good = held.read_bytes()
    held.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    corrupt = _tool("--dest", str(dest), "install", "--target", str(target))
    assert corrupt.returncode == 1 and f"{names[1]} is corrupt" in corrupt.stderr
    # all there: installed, importable from the target
    held.write_bytes(good)
    done = _tool("--dest", str(dest), "install", "--target", str(target))
    assert done.returncode == 0, done.stderr
    assert "installed tinycarry-1.0-py3-none-any.whl, tinycarry2-1.0" in done.stdout
    value = subprocess.run(
        [
            sys.executable,
            "-c",
            "import tinycarry, tinycarry2; print(tinycarry.VALUE + tinycarry2.VALUE)",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(target)},
        timeout=60,
    )
    assert value.stdout.strip() == "84", value.stderr


def test_install_without_prepare_says_what_to_do(tmp_path):
    done = _tool("--dest", str(tmp_path / "nothing"), "install", "--target", str(tmp_path / "s"))
    assert done.returncode == 3
    assert "manifest.json: run `prepare` first" in done.stderr


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_prepare_refuses_a_part_size_below_one_mib(tmp_path, bad):
    done = _tool(
        "--dest", str(tmp_path), "prepare", "--wheel", str(_wheel(tmp_path)), "--part-mib", bad
    )
    assert done.returncode == 1 and "--part-mib must be at least 1" in done.stderr

"""The native build's configure step tells a user what to do: where no ONNX Runtime headers can
be found (and fetching is forbidden), and where the headers are too old, the error names the
variable that fixes it and the real minimum version."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CMAKE = shutil.which("cmake")

pytestmark = pytest.mark.skipif(CMAKE is None, reason="needs cmake")


def _configure(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Configures a copy of the sources that has no third_party/ folder."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("CMakeLists.txt", "custom_ops", "tools"):
        (source / name).symlink_to(ROOT / name)
    environment = {
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(tmp_path),
        "ONNXNORM_CUDA": "OFF",
        **env,
    }
    return subprocess.run(
        [CMAKE, "-S", str(source), "-B", str(tmp_path / "build")],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )


@pytest.mark.skipif(
    Path("/usr/include/onnxruntime/onnxruntime_c_api.h").exists(),
    reason="the system has ONNX Runtime headers, so they are found",
)
def test_no_headers_and_no_fetch(tmp_path):
    result = _configure(tmp_path, ONNXNORM_FETCH_ORT_HEADERS="OFF")
    assert result.returncode != 0
    text = " ".join(result.stderr.split())
    assert "ONNX Runtime C/C++ API headers not found" in text
    assert "Set ONNXRUNTIME_INCLUDE_DIR" in text and "1.21 or newer" in text
    assert "ONNXNORM_FETCH_ORT_HEADERS=OFF" in text


def test_headers_too_old(tmp_path):
    include = tmp_path / "ort-1.17"
    include.mkdir()
    (include / "onnxruntime_c_api.h").write_text("#define ORT_API_VERSION 17\n")
    result = _configure(tmp_path, ONNXRUNTIME_INCLUDE_DIR=str(include))
    assert result.returncode != 0
    text = " ".join(result.stderr.split())
    assert "C API 17 (ONNX Runtime 1.17); onnxnorm needs 1.21 or newer" in text
    assert "Set ONNXRUNTIME_INCLUDE_DIR" in text


def test_include_dir_without_headers(tmp_path):
    result = _configure(tmp_path, ONNXRUNTIME_INCLUDE_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "does not hold onnxruntime_c_api.h" in " ".join(result.stderr.split())

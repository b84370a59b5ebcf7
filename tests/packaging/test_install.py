"""The package as pip installs it, outside the source tree: the sdist builds with no environment
variables (the build fetches ONNX Runtime's headers itself), auditwheel accepts the wheel as
manylinux, the wheel installs beside onnxruntime-gpu without pulling onnxruntime in, and every
documented command works from a folder that is not a checkout.

Slow (a wheel build and four virtual environments); needs PyPI and Debian's archive, as the
set-up does. To keep it short, the CUDA library is left out of this build (ONNXNORM_CUDA=OFF)
and the CPU library is built at -O0 without forced inlining (a Debug build with
``CMAKE_CXX_FLAGS_DEBUG=-O0 -DONNXNORM_NO_FORCE_INLINE``: the wheel takes 68 CPU-seconds where
the Release library takes 9 CPU-minutes): packaging and install are what is checked here,
the optimized kernels are what every other test runs. ``make wheel`` builds and checks the full
Release wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.support.versions import (
    MINIMUM_VERSIONS_CHECK,
    minimum_versions,
    normalized,
    same_version,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: the lock of the test environments (tools/lock.py): what the environments made here install
LOCK = ROOT / "requirements" / "dev.lock"


def _sh(*argv, cwd=None, env=None, check=True, timeout=900) -> subprocess.CompletedProcess:
    # The test environments are installed without byte-compiling (_pip_install): a module is
    # compiled when a command first imports it, and written beside it even where the caller's
    # environment says not to, or every command would compile it again (sympy alone, which
    # onnx-ir imports, takes 4 of the 7 seconds of a `onnxnorm fuse` call that way).
    result = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "", **(env or {})},
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{argv} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
            f"{result.stderr[-3000:]}"
        )
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """sdist -> wheel, as `pip install <sdist>` builds it: an isolated build environment, no
    ONNX Runtime headers in the sdist and none set by a variable."""
    out = tmp_path_factory.mktemp("dist")
    # the isolated build environments install the build requirements from the lock too
    locked = {"PIP_CONSTRAINT": str(LOCK)}
    _sh(sys.executable, "-m", "build", "--sdist", "-o", out, ROOT, env=locked)
    sdist = next(out.glob("onnxnorm-*.tar.gz"))
    env = {"ONNXNORM_CUDA": "OFF", "ONNXRUNTIME_INCLUDE_DIR": "", **locked}
    result = _sh(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-v",
        "--no-deps",
        "-w",
        out,
        "-C",
        "cmake.build-type=Debug",
        "-C",
        "cmake.define.CMAKE_CXX_FLAGS_DEBUG=-O0 -DONNXNORM_NO_FORCE_INLINE",
        sdist,
        env=env,
    )
    assert (
        "onnxnorm: ONNX Runtime headers from fetched by tools/get_ort_headers.sh"
        in result.stdout + result.stderr
    )
    return next(out.glob("onnxnorm-*.whl"))


def _venv(path: Path) -> Path:
    venv.create(path, with_pip=True)
    return path / "bin" / "python"


def _constraints(path: Path, leave_out: Iterable[str] = ()) -> Path:
    """The lock as a constraints file at ``path``, without the packages ``leave_out`` names
    (normalized: a test that pins them itself)."""
    out = {normalized(name) for name in leave_out}
    lines = [
        line
        for line in LOCK.read_text().splitlines()
        if line and not line.startswith("#") and normalized(line.split("==")[0]) not in out
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _pip_install(
    python: Path, *args, constraints: Path | None = LOCK
) -> subprocess.CompletedProcess:
    """pip install into a test environment, from the lock (``constraints``: the versions the
    suite was resolved with, so a new release upstream changes nothing here), without
    byte-compiling every module it installs (Python compiles the ones a test imports)."""
    locked = ["-c", str(constraints)] if constraints else []
    return _sh(
        python,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "-q",
        "install",
        "--no-compile",
        *locked,
        *args,
    )


def _installed(python: Path) -> dict[str, str]:
    listed = json.loads(_sh(python, "-m", "pip", "list", "--format", "json").stdout)
    return {p["name"].lower(): p["version"] for p in listed}


def test_wheel_contents_and_manylinux(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "onnxnorm/lib/libonnxnorm_ops.so" in names
    assert not any(n.startswith(("models/", "tests/", "custom_ops/")) for n in names)
    assert "onnxnorm/nn/families.py" in names and "onnxnorm/nn/decoder.py" in names
    info = json.loads(zipfile.ZipFile(wheel).read("onnxnorm/lib/build_info.json"))
    assert info["ort_api_version"] >= 21 and "libonnxruntime-dev" in info["ort_headers"]
    shown = _sh(sys.executable, "-m", "auditwheel", "show", wheel).stdout
    assert 'consistent with the\nfollowing platform tag: "manylinux_' in shown, shown


def test_beside_onnxruntime_gpu(wheel, tmp_path):
    """onnxnorm[gpu] in an environment that has onnxruntime-gpu: the CPU package is not pulled
    in, pip check is clean, and the CUDA execution provider is still offered."""
    python = _venv(tmp_path / "venv")
    _pip_install(python, "onnxruntime-gpu")
    _pip_install(python, f"{wheel}[gpu]")
    installed = _installed(python)
    assert "onnxruntime-gpu" in installed and "onnxruntime" not in installed, installed
    assert _sh(python, "-m", "pip", "check").returncode == 0
    code = (
        "import onnxruntime, onnxnorm.runtime as rt; "
        "print('CUDAExecutionProvider' in onnxruntime.get_available_providers()); "
        "print(rt.library_path().is_file())"
    )
    assert _sh(python, "-c", code, cwd=tmp_path).stdout.split() == ["True", "True"]


def _rms_model(path: Path) -> None:
    """A decomposed RMSNorm (what an exporter writes), built without torch."""
    hidden = 16
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(np.linspace(0.5, 1.5, hidden, dtype=np.float32), "w"),
    ]
    graph = helper.make_graph(
        nodes,
        "rms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, hidden])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def _one_line(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(f in lines[0] for f in fragments), lines[0]


def test_every_command_outside_the_checkout(wheel, tmp_path):
    """No ONNX Runtime: import fails in one line naming both extras. With onnxnorm[cpu] and no
    torch: fuse works, help works, export and bench say they need torch. With torch: export of
    a family, then fuse --verify of its output. All from a folder that holds a models/ package
    of its own, never the source tree."""
    python = _venv(tmp_path / "venv")
    bin_dir = python.parent
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    (work / "models" / "__init__.py").write_text("raise RuntimeError('not onnxnorm')\n")

    _pip_install(python, str(wheel))
    assert "onnxruntime" not in _installed(python)
    _one_line(
        _sh(python, "-c", "import onnxnorm", cwd=work, check=False),
        "onnxnorm[cpu]",
        "onnxnorm[gpu]",
    )
    _one_line(_sh(bin_dir / "onnxnorm", "fuse", "--help", cwd=work, check=False), "onnxnorm[cpu]")

    _pip_install(python, f"{wheel}[cpu]")
    assert "torch" not in _installed(python)
    onnxnorm = bin_dir / "onnxnorm"
    _rms_model(work / "rms.onnx")
    fused = _sh(onnxnorm, "fuse", "rms.onnx", "-o", "fused.onnx", "--verify", cwd=work)
    assert "verify: y (float32)" in fused.stdout and " ok" in fused.stdout
    ops = [n.op_type for n in onnx.load(work / "fused.onnx").graph.node]
    assert ops == ["RMSNorm"]
    lowered = _sh(onnxnorm, "lower", "fused.onnx", "-o", "ov.onnx", "--for", "openvino", cwd=work)
    assert "1 node(s) -> SimplifiedLayerNormalization" in lowered.stdout, lowered.stdout
    unavailable = _sh(
        python,
        "-c",
        "from onnxnorm.deploy import runners; print(runners.unavailable('tract'))",
        cwd=work,
    )
    assert unavailable.stdout.strip() == "tract is not installed"
    for command in ("export", "fuse", "bench", "lower"):
        assert _sh(onnxnorm, command, "--help", cwd=work).stdout.startswith(
            f"usage: onnxnorm {command}"
        )
    _one_line(
        _sh(onnxnorm, "export", "llama", "-o", "m.onnx", cwd=work, check=False),
        "needs torch",
        "onnxnorm[torch]",
    )
    _one_line(
        _sh(onnxnorm, "bench", "kernels", cwd=work, check=False), "needs torch", "onnxnorm[torch]"
    )
    (work / "empty").mkdir()
    _one_line(
        _sh(onnxnorm, "fuse", "empty", "-o", "out", cwd=work, check=False),
        "no .onnx file in this folder",
    )
    _one_line(
        _sh(onnxnorm, "fuse", str(work), "-o", "o.onnx", cwd=work, check=False),
        "lies inside the input folder",
    )
    assert not any((work / name).exists() for name in ("m.onnx", "o.onnx", "out"))

    # torch and transformers of the test environment, behind the wheel's own packages
    site = Path(
        _sh(
            python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        ).stdout.strip()
    )
    import torch

    (site / "zz_test_torch.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    _sh(
        onnxnorm,
        "export",
        "gemma2",
        "-o",
        "g.onnx",
        "--hidden",
        "32",
        "--heads",
        "2",
        "--layers",
        "1",
        cwd=work,
    )
    checked = _sh(onnxnorm, "fuse", "g.onnx", "-o", "g_fused.onnx", "--verify", cwd=work)
    assert checked.stdout.count(" ok") >= 1 and "OVER TOLERANCE" not in checked.stdout
    where = _sh(python, "-c", "import onnxnorm; print(onnxnorm.__file__)", cwd=work).stdout
    assert where.startswith(str(site)), where


def test_minimum_versions_work(wheel, tmp_path):
    """This wheel in an environment with exactly the declared minimum versions
    (tests/support/versions.py reads them from pyproject.toml); then the same environment with
    the first onnxruntime in which the library turns its output shape inference on (see
    tests/packaging/test_versions.py's docstring) in place of the minimum one: the fusion command,
    every target, its --verify and the kernels work with both."""
    bounds = minimum_versions()
    # the cpu extra's ONNX Runtime: onnxruntime-gpu is the same runtime, and needs a GPU
    pins = [
        f"{name}=={version}"
        for name, version in sorted(bounds.items())
        if name != "onnxruntime-gpu"
    ]
    python = _venv(tmp_path / "venv")
    work = tmp_path / "work"  # not the checkout: the installed package, not the tree's
    work.mkdir()
    (work / "check.py").write_text(MINIMUM_VERSIONS_CHECK)
    # the wheel with its own requirements and the pins together: pip refuses the pins if a
    # declared bound cannot be installed beside the others; what they pull in, from the lock
    locked = _constraints(tmp_path / "constraints.txt", bounds)
    _pip_install(python, "--only-binary=:all:", f"{wheel}[cpu]", *pins, constraints=locked)
    for runtime in (None, "1.24.1"):
        if runtime:
            _pip_install(
                python, "--only-binary=:all:", f"onnxruntime=={runtime}", constraints=locked
            )
            bounds["onnxruntime"] = runtime
        _sh(python, "-m", "pip", "check")
        installed = {normalized(name): version for name, version in _installed(python).items()}
        for name, version in bounds.items():
            if name != "onnxruntime-gpu":
                assert same_version(installed[name], version), (name, installed[name], version)
        result = _sh(python, "check.py", cwd=work, timeout=300)
        assert result.stdout.rstrip().endswith("CHECK OK"), (runtime, result.stdout)

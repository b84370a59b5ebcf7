"""What the two CUDA test files share (tests/cuda/test_cuda.py, the norm ops' kernels, and
tests/cuda/test_cuda_rotary.py, the rotary ops'): nvcc and the check that a few CUDA units
compile with it, what the host emulation needs, the run of a harness script or a glue script in
a child process, the test build of the CPU library whose CUDA rows run on the CPU provider, and
the GPU tests' fixture of the kernels' bindings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from onnxnorm import runtime
from tests.support import cuda_harness
from tests.support.gpu import cuda_library

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None
)

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on this machine")
needs_host_compiler = pytest.mark.skipif(
    cuda_harness.host_compiler() is None, reason="no host C++ compiler"
)
#: the glue tests: a host compiler for the emulated CUDA library, and /proc to see it loaded
needs_host_compiler_and_proc = pytest.mark.skipif(
    cuda_harness.host_compiler() is None or not Path("/proc/self/maps").is_file(),
    reason="needs a host C++ compiler and /proc",
)


def compile_with_nvcc(*names: str, timeout: float = 600) -> None:
    """Compiles the CUDA units ``names`` (of custom_ops/cuda) for sm_80 side by side, a quick
    check of the sources, and fails with the output of each that does not compile. Skipped where
    the installed build has the CUDA library: the package build compiled them all with this
    nvcc."""
    if runtime.build_info().get("cuda"):
        pytest.skip("the installed build compiled every CUDA source with this nvcc")
    assert NVCC is not None
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = {
            name: subprocess.Popen(
                [
                    NVCC,
                    "-std=c++17",
                    "-O1",
                    "-arch=sm_80",
                    "--expt-relaxed-constexpr",
                    f"-I{ROOT / 'custom_ops' / 'include'}",
                    "-c",
                    str(cuda_harness.CUDA_DIR / name),
                    "-o",
                    os.path.join(tmp, name + ".o"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for name in names
        }
        for name, job in jobs.items():
            out, _ = job.communicate(timeout=timeout)
            if job.returncode != 0:
                failed.append(f"{name}:\n{out}")
    assert not failed, "\n".join(failed)


def run_python(*args: str, timeout: float, library: Path | None = None) -> str:
    """``python ARGS`` run in the checkout (``library``: the onnxnorm library it registers, as
    ONNXNORM_LIBRARY); what it printed, once it has exited 0."""
    env = dict(os.environ, ONNXNORM_LIBRARY=str(library)) if library else None
    run = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    return run.stdout


def glue_library(folder: Path) -> Path:
    """The CPU library built with ONNXNORM_TEST_CUDA_ROWS_ON_CPU into ``folder``: its CUDA rows
    claim the CPU provider instead of its CPU rows (cuda_harness.build_glue_library). Fails the
    test with the compiler's output; skips it without ONNX Runtime's headers."""
    try:
        out = cuda_harness.build_glue_library(folder)
    except RuntimeError as e:
        pytest.fail(str(e)[-4000:])
    if out is None:
        pytest.skip("no ONNX Runtime headers")
    return out


def kernels_fixture(bindings: Callable[[Path | None], Any]) -> Any:
    """The module-scoped fixture ``kernels`` of a GPU test file: ``bindings`` (the ctypes
    bindings of a launcher) of the built CUDA library."""

    @pytest.fixture(scope="module", name="kernels")
    def kernels() -> Any:
        return bindings(cuda_library())

    return kernels

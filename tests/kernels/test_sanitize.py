"""The native library and the C++ kernel tests built with AddressSanitizer and
UndefinedBehaviorSanitizer, run by the test command (tools/sanitize.sh, docs/reliability.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from onnxnorm import ops
from tests.support.build import tool

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(
    any(tool(t) is None for t in ("cmake", "ctest", "g++")), reason="needs cmake, ctest and g++"
)
def test_sanitized_build_gives_no_reports():
    """make sanitize with a shorter campaign, built at -O0 without forced inlining (under half
    the compile time of -O0 with it, every access checked where it is written) in
    build/sanitize-test:
    ctest over every op, type pair, optional input, width and instruction set (without the
    stack-use-after-return detection of make sanitize, which makes it 1.5 times longer), then
    the property tests through ONNX Runtime against the sanitized library, which also drives
    the ORT glue. Any report fails it."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ONNXNORM_HYPOTHESIS", "ONNXNORM_FUZZ", "ONNXNORM_SANITIZE"))
    }
    env.update(
        PYTHON=sys.executable,
        ONNXNORM_HYPOTHESIS_EXAMPLES="25",
        ONNXNORM_SANITIZE_BUILD=str(ROOT / "build" / "sanitize-test"),
        ONNXNORM_SANITIZE_FLAGS="-O0 -g0 -DONNXNORM_NO_FORCE_INLINE",
        ASAN_OPTIONS="detect_stack_use_after_return=0",
    )
    result = subprocess.run(
        ["bash", str(ROOT / "tools" / "sanitize.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    # ctest all passed; the property tests all passed, none skipped, at least one per op
    summary = re.search(r"^(\d+) passed in [\d.]+s$", result.stdout, re.MULTILINE)
    assert "100% tests passed" in result.stdout and summary, output[-3000:]
    assert int(summary.group(1)) >= len(ops.OPS), output[-3000:]
    assert "ERROR: AddressSanitizer" not in output and "runtime error:" not in output
    assert result.stdout.rstrip().endswith("sanitize: no reports")

"""Peak resident memory of a variant: one generation in a fresh interpreter (:func:`memory_child`),
which imports only what it runs with, so its baseline is the interpreter, numpy and onnxruntime
(not onnx, not the fusion pass)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

from onnxnorm.bench.common import short_error
from onnxnorm.bench.e2e.config import Config
from onnxnorm.bench.e2e.genai import GenaiGenerator
from onnxnorm.bench.e2e.generation import Generator


def peak_memory(
    kind: str, path: str, library: bool, config: Config, device: str
) -> dict[str, float]:
    """Peak resident memory (VmHWM, MiB) of a fresh interpreter that loads the variant and
    generates once, and its resident memory before loading the model (the interpreter,
    numpy and onnxruntime)."""
    payload = json.dumps(
        {
            "kind": kind,
            "path": path,
            "library": library,
            "device": device,
            "config": dataclasses.asdict(config),
        }
    )
    child = (
        "import sys; from onnxnorm.bench.e2e.memory import memory_child; memory_child(sys.argv[1])"
    )
    result = subprocess.run(
        [sys.executable, "-c", child, payload], capture_output=True, text=True, timeout=3600
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("PEAK ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(
            short_error(
                RuntimeError(
                    result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "no result"
                )
            )
        )
    _, before, peak = lines[-1].split()
    return {"peak_rss_mib": float(peak), "baseline_rss_mib": float(before)}


def _vm(key: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def memory_child(payload: str) -> None:
    """The fresh interpreter of :func:`peak_memory`: loads the variant the JSON ``payload``
    names, generates once, prints ``PEAK <baseline MiB> <peak MiB>``."""
    job = json.loads(payload)
    config = Config(**job["config"])
    import onnxruntime  # noqa: F401 - counted in the baseline

    if job["kind"] == "genai":
        import onnxruntime_genai  # noqa: F401
    before = _vm("VmRSS")
    if job["kind"] == "genai":
        generator: Any = GenaiGenerator(job["path"], config)
    else:
        generator = Generator(job["path"], job["library"], config, job["device"])
    generator.generate(config.prompt_ids(), config.new_tokens)
    print(f"PEAK {before:.1f} {_vm('VmHWM'):.1f}", flush=True)

"""The serve venv (.venv-serve: Debian's Python 3.11 with PyTriton and tritonclient, made by
`make serve-venv`, which `make test` runs) as the tests reach it: its interpreter, Triton's
clients run in it (tests/support/triton_client.py), free loopback ports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the serve venv: make sets ONNXNORM_SERVE_VENV (make test-latest makes one of its own)
SERVE_VENV = Path(os.environ.get("ONNXNORM_SERVE_VENV") or ROOT / ".venv-serve")
CLIENT = Path(__file__).with_name("triton_client.py")


def serve_python() -> Path:
    """The serve venv's interpreter; skips the test where the venv is absent."""
    python = SERVE_VENV / "bin" / "python"
    if not (SERVE_VENV / ".deps").is_file() or not python.exists():
        pytest.skip("no serve venv (.venv-serve): `make serve-venv` makes it, `make test` too")
    return python


def serve_env(**extra: str) -> dict[str, str]:
    """The environment of a serve-venv process: the library the main venv built (the serve
    venv imports onnxnorm from this tree, without a build of its own)."""
    from onnxnorm import runtime

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["ONNXNORM_LIBRARY"] = str(runtime.library_path())
    env.update(extra)
    return env


def run_client(plan: list[dict], folder: Path, timeout: float = 300) -> list:
    """Runs triton_client.py (beside this file) on ``plan`` in the serve venv; its results, one
    per action."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"plan_{len(list(folder.glob('plan_*.json')))}.json"
    path.write_text(json.dumps(plan))
    result = subprocess.run(
        [str(serve_python()), str(CLIENT), str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=folder,
        env=serve_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_models(folder: Path) -> dict[str, Path]:
    """The served models: a Llama-style decoder exported in the fused target (onnxnorm nodes
    without function bodies: only the onnxnorm library runs them) and a BERT encoder fused into
    it, both with a free batch dim."""
    from models import corpus
    from onnxnorm.cli import main
    from onnxnorm.fusion import fuse

    decoder = folder / "decoder.onnx"
    assert (
        main(
            [
                "export",
                "llama",
                "-o",
                str(decoder),
                "--mode",
                "fused",
                "--vocab",
                "256",
                "--hidden",
                "128",
                "--heads",
                "4",
            ]
        )
        == 0
    )
    encoder = folder / "encoder.onnx"
    fused, report = fuse(corpus.export("bert_encoder", "torchscript")[0], target="fused")
    assert report.norms == 5
    onnx.save(fused, encoder)
    return {"decoder": decoder, "encoder": encoder}


SEQ = 32


def feeds(name: str, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the decoder (token ids below its vocabulary of 256) or the encoder (below
    BERT's 96)."""
    rng = np.random.default_rng(seed)
    if name.startswith("decoder"):
        return {"x": rng.integers(0, 256, (batch, SEQ), dtype=np.int64)}
    return {"input_ids": rng.integers(0, 96, (batch, 16), dtype=np.int64)}


def save(folder: Path, arrays: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)
    return folder


def specs(folder: Path, arrays: dict[str, np.ndarray]) -> list[dict]:
    """``arrays`` saved as a request's inputs for tests/support/triton_client.py."""
    types = {
        np.dtype(np.int64): "INT64",
        np.dtype(np.float32): "FP32",
        np.dtype(np.float64): "FP64",
        np.dtype(np.int32): "INT32",
    }
    save(folder, arrays)
    return [
        {"name": n, "file": str(folder / f"{n}.npy"), "datatype": types[a.dtype]}
        for n, a in arrays.items()
    ]


def local(path: Path, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The outputs of a local session with the onnxnorm library."""
    from onnxnorm import runtime

    session = runtime.session(path)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, arrays)))


def mapped_libraries(pid: int) -> set[str]:
    """The onnxnorm libraries mapped into process ``pid``."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {line.split()[-1] for line in maps.splitlines() if "libonnxnorm_ops" in line}


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        found += [int(p) for p in task.read_text().split()]
    return found

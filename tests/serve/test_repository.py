"""The model repository that ``onnxnorm triton`` writes, served unchanged by a real tritonserver:
the one in PyTriton's wheel (Triton 2.51), run from the serve venv. That build has the Python
backend only, no ONNX Runtime backend (and neither PyPI nor Debian has one): on its own it reads
the repository and stops at the missing backend. Given tests/serve/triton_ort_standin/model.py as a
Python-based backend named ``onnxruntime`` (for tests only: it registers the config's
op_library_filename into an ONNX Runtime session, as the C++ backend does), it serves the
repository: Triton's dynamic batcher stacks requests as the generated config says, the library
mapped into the backend's process is the repository's own copy, named by the config, and the
answers over HTTP and gRPC are a local session's."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from onnxnorm.cli import main
from tests.support.serve_harness import (
    SERVE_VENV,
    build_models,
    children,
    feeds,
    free_port,
    local,
    mapped_libraries,
    run_client,
    save,
    serve_env,
    serve_python,
    specs,
)

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

STANDIN = Path(__file__).with_name("triton_ort_standin") / "model.py"


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    folder = tmp_path_factory.mktemp("repository")
    served = build_models(folder)
    repo = folder / "repo"
    for name, path in served.items():
        assert main(["triton", str(path), "-o", str(repo), "--name", name]) == 0
    return served, repo


def _tritonserver() -> tuple[Path, Path]:
    """PyTriton's tritonserver folder and the folder of the libraries it links."""
    python = serve_python()
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    return Path(site) / "pytriton" / "tritonserver", Path(site) / "nvidia_pytriton.libs"


def _backends(folder: Path, standin: bool) -> Path:
    """A backend folder: Triton's Python backend with the stub for Python 3.11 (as PyTriton
    lays it out), and the stand-in ONNX Runtime backend where asked."""
    server, _ = _tritonserver()
    backends = folder / "backends"
    (backends / "python").mkdir(parents=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(server / "backends" / "python" / name, backends / "python" / name)
    shutil.copy2(
        server / "python_backend_stubs" / "3.11" / "triton_python_backend_stub",
        backends / "python" / "triton_python_backend_stub",
    )
    if standin:
        (backends / "onnxruntime").mkdir()
        shutil.copy2(STANDIN, backends / "onnxruntime" / "model.py")
    return backends


def _env() -> dict[str, str]:
    """tritonserver's environment as PyTriton sets it: its libraries, and the serve venv's
    interpreter first on PATH (the Python backend's stub finds its packages through it)."""
    _, libs = _tritonserver()
    env = serve_env()
    env["LD_LIBRARY_PATH"] = str(libs)
    env["PATH"] = f"{SERVE_VENV / 'bin'}:{env['PATH']}"
    return env


def _statuses(log: str, names) -> dict[str, str]:
    return {
        line.split("|")[1].strip(): line.split("|")[3].strip()
        for line in log.splitlines()
        if line.startswith("| ") and line.split("|")[1].strip() in names
    }


def test_without_an_onnxruntime_backend_tritonserver_stops_at_it(repository, tmp_path):
    served, repo = repository
    server, _ = _tritonserver()
    result = subprocess.run(
        [
            str(server / "bin" / "tritonserver"),
            "--model-repository",
            str(repo),
            "--backend-directory",
            str(_backends(tmp_path, standin=False)),
            "--allow-http",
            "false",
            "--allow-grpc",
            "false",
            "--allow-metrics",
            "false",
            "--exit-timeout-secs",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    missing = (
        "UNAVAILABLE: Invalid argument: unable to find backend library for backend "
        "'onnxruntime', try specifying runtime on the model configuration."
    )
    log = result.stdout + result.stderr
    assert result.returncode != 0
    assert _statuses(log, served) == dict.fromkeys(served, missing), log[-3000:]


@pytest.fixture(scope="module")
def standin_server(repository, tmp_path_factory):
    _, repo = repository
    folder = tmp_path_factory.mktemp("standin")
    server, _ = _tritonserver()
    http, grpc = free_port(), free_port()
    log = (folder / "tritonserver.log").open("w")
    process = subprocess.Popen(
        [
            str(server / "bin" / "tritonserver"),
            "--model-repository",
            str(repo),
            "--backend-directory",
            str(_backends(folder, standin=True)),
            "--http-address",
            "127.0.0.1",
            "--http-port",
            str(http),
            "--grpc-address",
            "127.0.0.1",
            "--grpc-port",
            str(grpc),
            "--allow-metrics",
            "false",
            "--exit-timeout-secs",
            "10",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_env(),
        cwd=folder,
    )
    began = time.perf_counter()
    ready = False
    while process.poll() is None and time.perf_counter() - began < 120:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{http}/v2/health/ready", timeout=2
            ) as response:
                ready = response.status == 200
        except OSError:
            pass
        if ready:
            break
        time.sleep(0.2)
    text = (folder / "tritonserver.log").read_text()
    if not ready:
        process.kill()
        process.wait(timeout=30)
        pytest.fail("tritonserver did not start:\n" + text[-4000:])
    yield process, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", folder
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)
    log.close()


def test_the_repository_is_served_unchanged(repository, standin_server, tmp_path):
    served, repo = repository
    process, http, grpc, folder = standin_server
    assert _statuses((folder / "tritonserver.log").read_text(), served) == {
        "decoder": "READY",
        "encoder": "READY",
    }
    plan, expected = [], {}
    for protocol, url in (("http", http), ("grpc", grpc)):
        for name in served:
            arrays = feeds(name, batch=2, seed=len(name))
            expected[protocol, name] = local(served[name], arrays)
            plan.append(
                {
                    "action": "infer",
                    "protocol": protocol,
                    "url": url,
                    "model": name,
                    "inputs": specs(tmp_path / f"{protocol}_{name}_in", arrays),
                    "save": str(tmp_path / f"{protocol}_{name}_out"),
                }
            )
    run_client(plan, tmp_path / "client")
    for (protocol, name), want in expected.items():
        for output, array in want.items():
            have = np.load(tmp_path / f"{protocol}_{name}_out" / f"{output}.npy")
            np.testing.assert_array_equal(have, array, err_msg=f"{protocol} {name} {output}")
    # the backend's processes (one Python stub per model instance) run the library the
    # repository holds, loaded from the path the config names
    stubs = {pid: mapped_libraries(pid) for pid in children(process.pid)}
    loaded = set().union(*stubs.values())
    assert loaded == {str((repo / name / "libonnxnorm_ops.so").resolve()) for name in served}


def test_dynamic_batching_as_the_config_says(repository, standin_server, tmp_path):
    served, _ = repository
    _, http, _, _ = standin_server
    arrays = feeds("decoder", batch=1, seed=11)
    want = save(tmp_path / "expected", local(served["decoder"], arrays))
    inputs = specs(tmp_path / "in", arrays)
    before, load, after = run_client(
        [
            {"action": "stats", "url": http, "model": "decoder"},
            {
                "action": "load",
                "protocol": "http",
                "url": http,
                "model": "decoder",
                "inputs": inputs,
                "expected": str(want),
                "clients": 8,
                "requests": 20,
                "rtol": 1e-5,
                "atol": 1e-5,
            },
            {"action": "stats", "url": http, "model": "decoder"},
        ],
        tmp_path / "client",
    )
    assert load["errors"] == [] and load["mismatches"] == 0 and load["answered"] == 160
    requests = after["inference_count"] - before["inference_count"]
    runs = after["execution_count"] - before["execution_count"]
    assert requests == 160 and runs < requests, (runs, requests)
    print(
        f"stand-in backend, 8 clients x 20 requests: p50 {load['p50_ms']:.1f} ms, p99 "
        f"{load['p99_ms']:.1f} ms, {load['throughput_rps']:.0f} requests/s, "
        f"{requests / runs:.2f} requests per run"
    )


def test_tritonserver_stops_cleanly(standin_server):
    process = standin_server[0]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0

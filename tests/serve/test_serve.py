"""A live Triton Inference Server on loopback ports: PyTriton's tritonserver serving an
onnxnorm-fused decoder (the fused target: onnxnorm nodes without function bodies, so nothing but
the onnxnorm library can run them) and a fused BERT encoder through ``python -m onnxnorm.serve``,
run by the serve venv's interpreter (Debian's Python 3.11, whose libpython PyTriton's Python
backend stub links). Triton's HTTP and gRPC clients get the outputs of a local session; the
library is mapped into the serving process; a bounded load of 8 concurrent clients completes
with no error with dynamic batching on and off (p50/p99 latency and throughput written to
build/serve/load.json); bad requests get clean errors and the server goes on; SIGTERM stops it
cleanly. The repository that onnxnorm triton writes is served in tests/serve/test_repository.py."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from onnxnorm import runtime
from tests.support.serve_harness import (
    ROOT,
    SEQ,
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

CLIENTS, REQUESTS = 8, 40  # the load: 8 concurrent clients, 40 requests each
#: the standard ops a norm decomposes into: none may be left in the served models
NORM_PIECES = {
    "LayerNormalization",
    "RMSNormalization",
    "SimplifiedLayerNormalization",
    "ReduceMean",
    "Sqrt",
    "Reciprocal",
    "Pow",
}


@dataclasses.dataclass
class Server:
    process: subprocess.Popen
    http: str
    grpc: str
    token: str
    ready: dict
    log: list
    start_s: float
    children: list
    home: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict[str, Path]:
    return build_models(tmp_path_factory.mktemp("served"))


def _reader(stream, lines: list):
    for line in stream:
        lines.append(line.rstrip("\n"))


@pytest.fixture(scope="module")
def server(served, tmp_path_factory):
    python = serve_python()
    http, grpc = free_port(), free_port()
    token = secrets.token_urlsafe(16)
    folder = tmp_path_factory.mktemp("server")
    ready = folder / "ready.json"
    # PyTriton's workspace holds its IPC sockets, whose paths must stay short (108 bytes)
    home = tempfile.mkdtemp(prefix="pytriton-", dir="/tmp")
    began = time.perf_counter()
    process = subprocess.Popen(
        [
            str(python),
            "-m",
            "onnxnorm.serve",
            f"decoder={served['decoder']}",
            f"decoder_unbatched={served['decoder']}",
            f"encoder={served['encoder']}",
            "--unbatched",
            "decoder_unbatched",
            "--http-port",
            str(http),
            "--grpc-port",
            str(grpc),
            "--metrics-port",
            "0",
            "--ready-file",
            str(ready),
        ],
        cwd=folder,
        env=serve_env(ONNXNORM_TRITON_ACCESS_TOKEN=token, PYTRITON_HOME=home),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines: list[str] = []  # the server's and tritonserver's output, interleaved
    threading.Thread(target=_reader, args=(process.stdout, lines), daemon=True).start()
    while not ready.exists() and process.poll() is None and time.perf_counter() - began < 120:
        time.sleep(0.1)
    start_s = time.perf_counter() - began
    if not ready.exists():
        process.kill()
        process.wait(timeout=30)
        pytest.fail("the server did not start:\n" + "\n".join(lines[-40:]))
    yield Server(
        process,
        f"127.0.0.1:{http}",
        f"127.0.0.1:{grpc}",
        token,
        json.loads(ready.read_text()),
        lines,
        start_s,
        children(process.pid),
        Path(home),
    )
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
    shutil.rmtree(home, ignore_errors=True)


def _local(served, name: str, arrays) -> dict[str, np.ndarray]:
    return local(served[name.removesuffix("_unbatched")], arrays)


def test_the_kernels_run_inside_the_server(served, server):
    """The served models hold onnxnorm nodes and no function body nor any op a norm is made
    of: ONNX Runtime without the onnxnorm library refuses them, so every answer the server
    gives (next tests) comes from the library's kernels, which are mapped into the serving
    process (the one that runs the ONNX Runtime sessions)."""
    norms = {"decoder": {"RMSNorm", "SkipRMSNorm"}, "encoder": {"LayerNorm", "SkipLayerNorm"}}
    for name, path in served.items():
        model = onnx.load(path)
        kinds = {(n.domain, n.op_type) for n in model.graph.node}
        assert not model.functions
        assert {op for domain, op in kinds if domain == "onnxnorm"} == norms[name], kinds
        assert not {op for _, op in kinds} & NORM_PIECES, kinds
        with pytest.raises(Exception, match="onnxnorm"):
            onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert mapped_libraries(server.process.pid) == {str(runtime.library_path().resolve())}
    assert server.ready["library"] == str(runtime.library_path())
    assert server.ready["models"]["decoder"]["max_batch_size"] == 8
    assert server.ready["models"]["decoder_unbatched"]["max_batch_size"] == 0
    assert server.ready["models"]["encoder"] == {
        "max_batch_size": 8,
        "inputs": ["input_ids"],
        "outputs": [o.name for o in onnx.load(served["encoder"]).graph.output],
    }


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_clients_get_the_outputs_of_a_local_session(served, server, tmp_path, protocol):
    plan, expected = [], {}
    for name in ("decoder", "decoder_unbatched", "encoder"):
        arrays = feeds(name, batch=2, seed=len(name))
        expected[name] = _local(served, name, arrays)
        plan.append(
            {
                "action": "infer",
                "protocol": protocol,
                "model": name,
                "url": server.http if protocol == "http" else server.grpc,
                "inputs": specs(tmp_path / f"{name}_in", arrays),
                "save": str(tmp_path / f"{name}_out"),
            }
        )
    results = run_client(plan, tmp_path / "client")
    for (name, want), result in zip(expected.items(), results):
        assert sorted(result["outputs"]) == sorted(want)
        for output, array in want.items():
            have = np.load(tmp_path / f"{name}_out" / f"{output}.npy")
            assert have.dtype == array.dtype and have.shape == array.shape
            np.testing.assert_array_equal(have, array, err_msg=f"{name} {output}")


def test_load_with_dynamic_batching_on_and_off(served, server, tmp_path):
    arrays = feeds("decoder", batch=1, seed=7)
    want = save(tmp_path / "expected", _local(served, "decoder", arrays))
    inputs = specs(tmp_path / "in", arrays)
    headers = {"triton-access-token": server.token}
    plan = []
    for name in ("decoder", "decoder_unbatched"):
        plan += [
            {"action": "stats", "url": server.http, "model": name, "headers": headers},
            {
                "action": "load",
                "protocol": "http",
                "url": server.http,
                "model": name,
                "inputs": inputs,
                "expected": str(want),
                "clients": CLIENTS,
                "requests": REQUESTS,
                "rtol": 1e-5,
                "atol": 1e-5,
            },
            {
                "action": "stats",
                "url": server.http,
                "model": name,
                "headers": headers,
                "settle": True,
            },
        ]
    results = run_client(plan, tmp_path / "client")
    measured = {}
    for i, name in enumerate(("decoder", "decoder_unbatched")):
        before, load, after = results[3 * i : 3 * i + 3]
        assert load["errors"] == [] and load["mismatches"] == 0, load
        assert load["answered"] == CLIENTS * REQUESTS
        assert 0 < load["p50_ms"] <= load["p99_ms"] and load["throughput_rps"] > 0
        requests = after["inference_count"] - before["inference_count"]
        runs = after["execution_count"] - before["execution_count"]
        assert requests == CLIENTS * REQUESTS and after["fail"] == before["fail"]
        if name == "decoder":  # requests stacked: fewer session runs than requests
            assert runs < requests, (runs, requests)
        else:  # one session run per request
            assert runs == requests
        measured[name] = dict(load, session_runs=runs, mean_batch=round(requests / runs, 2))
    out = ROOT / "build" / "serve"
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": os.cpu_count(),
        "server_start_s": round(server.start_s, 1),
        "input": f"int64 [1, {SEQ}] token ids per request",
        "load": measured,
    }
    (out / "load.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


def test_bad_requests_get_clean_errors_and_the_server_goes_on(served, server, tmp_path):
    good = feeds("decoder", batch=1, seed=3)
    want = save(tmp_path / "expected", _local(served, "decoder", good))
    cases = [
        ("wrong shape", {"x": np.zeros((1, 4, 2), np.int64)}),
        ("wrong dtype", {"x": np.zeros((1, 4), np.float32)}),
        ("missing input", {}),
        ("unknown input", {"y": np.zeros((1, 4), np.int64)}),
        ("out-of-range token id", {"x": np.full((1, 4), 999, np.int64)}),
    ]
    results = {}
    for protocol in ("http", "grpc"):
        (result,) = run_client(
            [
                {
                    "action": "bad",
                    "protocol": protocol,
                    "model": "decoder",
                    "url": server.http if protocol == "http" else server.grpc,
                    "good": specs(tmp_path / "good", good),
                    "expected": str(want),
                    "cases": [
                        {"label": label, "inputs": specs(tmp_path / label.replace(" ", "_"), f)}
                        for label, f in cases
                    ],
                }
            ],
            tmp_path / f"client_{protocol}",
        )
        assert result["server_live"]
        results[protocol] = {c["label"]: c for c in result["cases"]}
        for case in result["cases"]:
            assert case["error"] is not None, case
            assert case["next_request_ok"], case
    http = {label: case["error"]["message"] for label, case in results["http"].items()}
    assert (
        "unexpected shape for input 'x' for model 'decoder'. Expected [-1,-1], got [1,4,2]"
        in http["wrong shape"]
    )
    assert (
        "inference input 'x' data-type is 'FP32', but model 'decoder' expects 'INT64'"
        in http["wrong dtype"]
    )
    assert "expected 1 inputs but got 0 inputs for model 'decoder'" in http["missing input"]
    assert "unexpected inference input 'y' for model 'decoder'" in http["unknown input"]
    assert (
        "RequestFailed: model 'decoder': ONNX Runtime failed on 1 request(s)"
        in http["out-of-range token id"]
    )
    assert "indices element out of data bounds, idx=999" in http["out-of-range token id"]
    assert [results["http"][label]["error"]["status"] for label, _ in cases] == ["400"] * 4 + [
        "500"
    ]
    grpc = {label: case["error"]["message"] for label, case in results["grpc"].items()}
    assert "data-type is 'FP32', but model 'decoder' expects 'INT64'" in grpc["wrong dtype"]
    assert "ONNX Runtime failed on 1 request(s)" in grpc["out-of-range token id"]


def test_the_server_stops_cleanly(server):
    process = server.process
    assert process.poll() is None and server.children
    began = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, "\n".join(server.log[-40:])
    took = time.perf_counter() - began
    assert took < 30
    time.sleep(0.5)
    assert any(line.endswith('{"stopped": true}') for line in server.log), server.log[-20:]
    for child in server.children:  # tritonserver and PyTriton's helpers are gone
        assert (
            not Path(f"/proc/{child}").exists()
            or "zombie" in Path(f"/proc/{child}/status").read_text().lower()
        )
    assert server.home.is_dir() and not list(server.home.iterdir())  # its workspace: removed
    for address in (server.http, server.grpc):
        host, port = address.split(":")
        with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=2):
            pass
    print(f"server: started in {server.start_s:.1f} s, stopped in {took:.1f} s")

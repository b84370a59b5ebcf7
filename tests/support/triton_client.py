"""Triton's Python clients (tritonclient) for tests/serve/test_serve.py and
tests/serve/test_triton.py, run by the serve venv's interpreter (.venv-serve, made by
`make serve-venv`), which has tritonclient; the main venv does not (it would pin protobuf and
ml_dtypes to older releases).

    .venv-serve/bin/python tests/support/triton_client.py PLAN.json

PLAN.json is a list of actions; the results, one per action, are printed as one JSON list.
Arrays travel in .npy files. Actions:

- ``infer``: one request (``inputs``: [{name, file, datatype}]) over HTTP or gRPC; its outputs
  saved to ``save`` (a folder, one NAME.npy per output).
- ``load``: ``clients`` threads, each with its own client, send ``requests`` requests each and
  compare every answer with ``expected`` (rtol/atol): latencies (p50, p99), throughput, errors.
- ``bad``: each case sent once (its error kept), each followed by a good request whose answer
  must equal ``expected``.
- ``stats``: Triton's inference statistics of a model (inference and execution counts).
- ``schema``: config.pbtxt files parsed with Triton's model-config schema (model_config_pb2),
  returned as JSON.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

# run as a script: this folder, first on sys.path, holds modules that would shadow installed
# packages of the same names (build, for one); this script imports none of them
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import numpy as np


def _module(protocol: str):
    if protocol == "http":
        import tritonclient.http as module
    else:
        import tritonclient.grpc as module
    return module


def _client(protocol: str, url: str):
    return _module(protocol).InferenceServerClient(url)


def _inputs(protocol: str, specs: list[dict]) -> list:
    module = _module(protocol)
    made = []
    for spec in specs:
        array = np.load(spec["file"])
        value = module.InferInput(spec["name"], list(array.shape), spec["datatype"])
        value.set_data_from_numpy(array)
        made.append(value)
    return made


def _expected(folder: str) -> dict[str, np.ndarray]:
    return {p.stem: np.load(p) for p in sorted(Path(folder).glob("*.npy"))}


def _close(expected: dict, result, rtol: float, atol: float) -> float | None:
    """The largest abs difference to ``expected`` when every output is close, else None."""
    worst = 0.0
    for name, want in expected.items():
        have = result.as_numpy(name)
        if have is None or have.shape != want.shape or not np.allclose(have, want, rtol, atol):
            return None
        worst = max(worst, float(np.max(np.abs(have.astype(np.float64) - want))))
    return worst


def infer(action: dict) -> dict:
    client = _client(action["protocol"], action["url"])
    try:
        result = client.infer(action["model"], _inputs(action["protocol"], action["inputs"]))
        names = (
            [o["name"] for o in result.get_response()["outputs"]]
            if action["protocol"] == "http"
            else [o.name for o in result.get_response().outputs]
        )
        folder = Path(action["save"])
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            np.save(folder / f"{name}.npy", result.as_numpy(name))
        return {"outputs": names}
    finally:
        client.close()


def load(action: dict) -> dict:
    protocol, clients, count = action["protocol"], action["clients"], action["requests"]
    expected = _expected(action["expected"])
    latencies: list[float] = []
    errors: list[str] = []
    mismatches = [0]
    worst = [0.0]
    lock = threading.Lock()
    start_line = threading.Barrier(clients)

    def work():
        client = _client(protocol, action["url"])
        inputs = _inputs(protocol, action["inputs"])
        mine, bad, my_errors, my_worst = [], 0, [], 0.0
        try:
            start_line.wait()
            for _ in range(count):
                began = time.perf_counter()
                try:
                    result = client.infer(action["model"], inputs)
                except Exception as error:  # noqa: BLE001 - counted and reported
                    my_errors.append(str(error).splitlines()[0][:200])
                    continue
                mine.append(time.perf_counter() - began)
                diff = _close(expected, result, action["rtol"], action["atol"])
                if diff is None:
                    bad += 1
                else:
                    my_worst = max(my_worst, diff)
        finally:
            client.close()
        with lock:
            latencies.extend(mine)
            errors.extend(my_errors)
            mismatches[0] += bad
            worst[0] = max(worst[0], my_worst)

    threads = [threading.Thread(target=work) for _ in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    ms = np.array(latencies) * 1000
    return {
        "model": action["model"],
        "protocol": protocol,
        "clients": clients,
        "requests": clients * count,
        "answered": len(latencies),
        "errors": errors,
        "mismatches": mismatches[0],
        "max_abs_diff": worst[0],
        "wall_s": wall,
        "p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else None,
        "throughput_rps": len(latencies) / wall,
    }


def bad(action: dict) -> dict:
    protocol = action["protocol"]
    expected = _expected(action["expected"])
    client = _client(protocol, action["url"])
    results = []
    try:
        for case in action["cases"]:
            try:
                client.infer(action["model"], _inputs(protocol, case["inputs"]))
                error = None
            except Exception as failure:  # noqa: BLE001 - the error is what the test reads
                error = {
                    "type": type(failure).__name__,
                    "status": str(failure.status()) if hasattr(failure, "status") else None,
                    "message": str(failure),
                }
            good = client.infer(action["model"], _inputs(protocol, action["good"]))
            results.append(
                {
                    "label": case["label"],
                    "error": error,
                    "next_request_ok": _close(expected, good, 0, 0) is not None,
                }
            )
        return {"cases": results, "server_live": client.is_server_live()}
    finally:
        client.close()


def stats(action: dict) -> dict:
    """The counts; with ``settle``, read until three reads 50 ms apart agree (at most 10 s): the
    server may count a request just after its reply has gone, so a read right after a load can
    miss the last ones."""
    import tritonclient.http as http

    client = http.InferenceServerClient(action["url"])

    def read() -> dict:
        found = client.get_inference_statistics(
            action["model"], headers=action.get("headers") or None
        )
        entry = found["model_stats"][0]
        return {
            "inference_count": int(entry.get("inference_count", 0)),
            "execution_count": int(entry.get("execution_count", 0)),
            "success": int(entry["inference_stats"]["success"]["count"]),
            "fail": int(entry["inference_stats"]["fail"]["count"]),
        }

    try:
        counts = read()
        if action.get("settle"):
            same, deadline = 0, time.monotonic() + 10
            while same < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
                again = read()
                same = same + 1 if again == counts else 0
                counts = again
        return counts
    finally:
        client.close()


def schema(action: dict) -> dict:
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    parsed = {}
    for path in action["configs"]:
        config = text_format.Parse(Path(path).read_text(), model_config_pb2.ModelConfig())
        parsed[path] = json_format.MessageToDict(config, preserving_proto_field_name=True)
    return parsed


ACTIONS = {"infer": infer, "load": load, "bad": bad, "stats": stats, "schema": schema}


def main(argv: list[str]) -> int:
    plan = json.loads(Path(argv[1]).read_text())
    print(json.dumps([ACTIONS[a["action"]](a) for a in plan]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The onnxnorm library under many threads and many sessions, as a long-running server uses it.

Threads that run one shared session, and threads that each register the library and open their
own session, get the bits one thread gets. Sessions created and destroyed by the thousand (the
library registered into each, as users do) leave resident memory flat. CUDA: the same checks on
the CUDA provider where onnxruntime-gpu and the CUDA library are present.
"""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxnorm import ops, runtime
from onnxnorm.ops import reference

#: [batch, sequence, hidden]: 256 Ki elements, above the size where the CPU kernels split rows
#: over ORT's thread pool
SHAPE = (4, 128, 512)
THREADS = 8
ITERATIONS = 12
#: sessions created and destroyed after the warm-up, and the resident memory they may add
SESSIONS = 2000
WARM_UP = 200
GROWTH_LIMIT_MIB = 4.0

PROVIDERS = [
    pytest.param(["CPUExecutionProvider"], id="cpu"),
    pytest.param(
        list(runtime.CUDA_PROVIDERS),
        id="cuda",
        marks=pytest.mark.skipif(
            not runtime.cuda_available(), reason="no onnxruntime-gpu or CUDA library"
        ),
    ),
]


def _model() -> onnx.ModelProto:
    """SkipRMSNorm, then a LayerNorm of its output: y = LayerNorm(RMSNorm(x + r) * s) and the
    sum."""
    rng = np.random.default_rng(7)
    hidden = SHAPE[-1]
    weights = {
        "scale": rng.random(hidden, np.float32) + 0.5,
        "scale2": rng.random(hidden, np.float32) + 0.5,
        "bias2": rng.standard_normal(hidden).astype(np.float32),
    }
    nodes = [
        helper.make_node(
            "SkipRMSNorm", ["x", "r", "scale"], ["h", "sum"], domain=ops.DOMAIN, epsilon=1e-6
        ),
        helper.make_node(
            "LayerNorm", ["h", "scale2", "bias2"], ["y"], domain=ops.DOMAIN, epsilon=1e-5
        ),
    ]

    def value(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, SHAPE)

    graph = helper.make_graph(
        nodes,
        "chain",
        [value("x"), value("r")],
        [value("y"), value("sum")],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(ops.DOMAIN, ops.VERSION)],
    )
    return model


def _feeds(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    return [
        {"x": rng.standard_normal(SHAPE, np.float32), "r": rng.standard_normal(SHAPE, np.float32)}
        for _ in range(count)
    ]


def _session(model: bytes, providers, threads: int = 2):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return runtime.session(model, options, providers)


def _in_threads(work, count: int = THREADS) -> list:
    """Runs ``work(i)`` in ``count`` threads started together; their results, or re-raises the
    first error."""
    results, errors = [None] * count, []
    start = threading.Barrier(count)

    def body(i):
        try:
            start.wait()
            results[i] = work(i)
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.fixture(scope="module")
def case():
    model = _model()
    feeds = _feeds(4)
    return model.SerializeToString(), feeds


@pytest.mark.parametrize("providers", PROVIDERS)
def test_threads_get_the_bits_of_one_thread(case, providers):
    model, feeds = case
    alone = _session(model, providers)
    expected = [alone.run(None, f) for f in feeds]
    # the single-threaded results are the op's: checked against the numpy reference once
    proto = onnx.load_from_string(model)
    weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    for f, (y, total) in zip(feeds, expected):
        h, want_sum = reference.run("SkipRMSNorm", f["x"], f["r"], weights["scale"], epsilon=1e-6)
        (want_y,) = reference.run("LayerNorm", h, weights["scale2"], weights["bias2"], epsilon=1e-5)
        np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(total, want_sum, rtol=1e-6, atol=1e-6)

    def shared_work(i):
        # each thread walks the inputs in its own order, so different calls overlap
        order = [(i + k) % len(feeds) for k in range(ITERATIONS)]
        return [(k, alone.run(None, feeds[k])) for k in order]

    def own_work(i):
        mine = _session(model, providers)  # registers the library in this thread
        order = [(i * 3 + k) % len(feeds) for k in range(ITERATIONS // 2)]
        return [(k, mine.run(None, feeds[k])) for k in order]

    for work in (shared_work, own_work):
        runs = [run for thread in _in_threads(work) for run in thread]
        assert len(runs) >= THREADS * ITERATIONS // 2
        for k, outputs in runs:
            for got, want in zip(outputs, expected[k]):
                assert np.array_equal(got, want), f"{work.__name__}: input {k} differs"


def _resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_sessions_created_and_destroyed_leave_memory_flat():
    """Each session registers the library, runs once and is destroyed; ORT unloads the library
    with the last session that registered it. Before the library was linked to stay loaded, each
    load built a new custom-op domain that was never freed: 13 KiB a session, 26 MiB here."""
    hidden = 64
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("RMSNorm", ["x", "w"], ["y"], domain=ops.DOMAIN, epsilon=1e-5)],
            "rms",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, hidden])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, hidden])],
            [numpy_helper.from_array(np.ones(hidden, np.float32), "w")],
        ),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(ops.DOMAIN, ops.VERSION)],
    ).SerializeToString()
    x = np.random.default_rng(0).standard_normal((4, hidden)).astype(np.float32)
    (want,) = reference.run("RMSNorm", x, np.ones(hidden, np.float32), epsilon=1e-5)

    def cycle(count):
        for _ in range(count):
            session = runtime.session(model)
            (y,) = session.run(None, {"x": x})
            del session
        gc.collect()
        return y

    np.testing.assert_allclose(cycle(WARM_UP), want, rtol=1e-5, atol=1e-5)
    before = _resident_mib()
    cycle(SESSIONS)
    grown = _resident_mib() - before
    assert grown < GROWTH_LIMIT_MIB, (
        f"resident memory grew by {grown:.1f} MiB over {SESSIONS} sessions "
        f"({grown * 1024 / SESSIONS:.2f} KiB a session)"
    )

"""The pass builds its rules once per thread and strictness and reuses them from run to run
(``driver.drivers``): a run's report and output do not depend on what ran before, in this
thread or beside it in another, nor on a run that failed half-way."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from onnxnorm.fusion import driver, fuse, pipeline
from onnxnorm.fusion.lowering import lower
from onnxnorm.testing.graphs import single_node_model


def _decomposed(op: str, seed: int):
    """A model of ``op``'s function body inlined: decomposed norms for the rules to find."""
    rng = np.random.default_rng(seed)
    arrays = {"X": rng.standard_normal((2, 5, 16)).astype(np.float32)}
    if op.startswith("Skip"):
        arrays["Residual"] = rng.standard_normal((2, 5, 16)).astype(np.float32)
    arrays["Scale"] = rng.standard_normal(16).astype(np.float32)
    return lower(single_node_model(op, arrays, {}, functions=False), "onnx")


MODELS = {op: _decomposed(op, i) for i, op in enumerate(["RMSNorm", "LayerNorm", "SkipRMSNorm"])}


def _run(op: str, strict: bool = False) -> tuple[str, bytes]:
    fused, report = fuse(MODELS[op], "fused", strict_precision=strict)
    return str(report), fused.SerializeToString()


def test_runs_do_not_depend_on_the_runs_before():
    first = {op: _run(op) for op in MODELS}
    for op in reversed(list(MODELS)):
        assert _run(op) == first[op]
    assert _run("RMSNorm", strict=True)[0] == first["RMSNorm"][0]


def test_threads_get_their_own_rules():
    alone = {op: _run(op) for op in MODELS}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        runs = [(op, pool.submit(_run, op)) for op in list(MODELS) * 8]
        for op, future in runs:
            assert future.result() == alone[op]


def test_a_failed_run_leaves_nothing_behind(monkeypatch):
    before = _run("SkipRMSNorm")

    def broken(*args, **kwargs):
        raise RuntimeError("the load check broke")

    monkeypatch.setattr(pipeline, "_check_loads", broken)
    with pytest.raises(RuntimeError, match="the load check broke"):
        _run("SkipRMSNorm")
    monkeypatch.undo()
    assert _run("SkipRMSNorm") == before
    relay, _ = driver._BUILT.drivers[(pipeline.stage_rules, False)]
    assert all(getattr(rule, "_accepted", None) is None for rule in relay.rules)

"""onnxnorm's fusion in Olive (olive-ai) workflows run by Olive's own engine: the pass
OnnxNormFusion as a workflow step (Python API, ``onnxnorm olive run`` and plain ``olive run
--package-config``) and the surgeon OnnxNormFuse in a GraphSurgeries step, on the corpus Llama
(transformers' LlamaModel, 2 layers, random weights, dynamo export). The output holds exactly
the onnxnorm (or ORT) ops that replace the norms and residual adds, runs with parity in ONNX
Runtime, and a ``fused`` output runs in Olive's own evaluator; an unknown target is one line and
a non-zero exit, with nothing written and the input unchanged."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

pytest.importorskip("transformers")

from onnxnorm.fusion.verify import verify

pytestmark = pytest.mark.slow

#: Olive sends no telemetry where CI is set (its own opt-out variable still sends a heartbeat
#: first, which waits on the network at exit)
QUIET = {"CI": "1"}
DECOMPOSED = ("ReduceMean", "Pow", "Sqrt", "Reciprocal")
#: the corpus Llama: 2 layers, 2 norms each and the final one; 4 residual adds before a norm
NORMS, ADDS = 5, 4
ONNXNORM_OPS = {("onnxnorm", "SkipRMSNorm"): 4, ("onnxnorm", "RMSNorm"): 1}
#: ORT's kernels, SimplifiedLayerNormalization registered in the ONNX domain
ORT_OPS = {
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): 4,
    ("", "SimplifiedLayerNormalization"): 1,
}


@pytest.fixture(scope="module", autouse=True)
def no_telemetry():
    saved = os.environ.get("CI")
    os.environ.update(QUIET)
    yield
    if saved is None:
        os.environ.pop("CI", None)
    else:
        os.environ["CI"] = saved


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from models import corpus

    folder = tmp_path_factory.mktemp("olive_input")
    model, norms = corpus.export("llama", "dynamo")
    assert norms == NORMS
    onnx.save(model, folder / "llama.onnx")
    return folder / "llama.onnx"


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter((n.domain, n.op_type) for n in model.graph.node)


def _workflow(model: Path, passes: dict, root: Path, **extra) -> dict:
    return {
        "input_model": {"type": "ONNXModel", "model_path": str(model)},
        "passes": passes,
        "cache_dir": str(root / "cache"),
        "output_dir": str(root / "out"),
        **extra,
    }


def _assert_norms_replaced(llama: Path, fused: onnx.ModelProto, expected: dict) -> None:
    """Exactly ``expected`` norm ops, no decomposed norm left, and 9 Adds gone: the 5 epsilon
    adds inside the norms and the 4 residual adds."""
    before, after = _ops(onnx.load(llama)), _ops(fused)
    assert {k: after[k] for k in expected} == expected
    assert not [k for k in after if k[0] in ("onnxnorm", "com.microsoft") and k not in expected]
    for op in DECOMPOSED:
        assert (before[("", op)], after[("", op)]) == (NORMS, 0), op
    assert before[("", "Add")] - after[("", "Add")] == NORMS + ADDS


def _assert_parity(llama: Path, fused: Path) -> list:
    checks = verify(llama, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]
    return checks


def test_pass_fuses_with_parity_and_olive_evaluates_the_fused_model(llama, tmp_path):
    import onnxruntime as ort
    from olive.workflows import run

    from onnxnorm import olive as integration

    before = _files(llama.parent)
    evaluator = {
        "type": "OnnxEvaluator",
        "metrics": [
            {
                "name": "latency",
                "type": "latency",
                "sub_types": [{"name": "avg"}],
                "user_config": {"warmup_num": 1, "repeat_test_num": 3, "sleep_num": 0},
            }
        ],
    }
    config = _workflow(
        llama,
        {"fuse": {"type": "OnnxNormFusion", "target": "fused", "verify": True}},
        tmp_path,
        evaluators={"latency": evaluator},
        evaluator="latency",
        evaluate_input_model=False,
    )
    best = run(config, package_config=integration.package_config()).get_best_candidate()

    fused = onnx.load(best.model_path)
    _assert_norms_replaced(llama, fused, ONNXNORM_OPS)
    assert not fused.functions  # fused: no function bodies, the library runs them
    result = best.model_config["model_attributes"]["onnxnorm"]
    assert (result["report"]["norms"], result["report"]["residual_adds"]) == (NORMS, ADDS)
    assert result["verify"] and all(check["ok"] for check in result["verify"])
    _assert_parity(llama, Path(best.model_path))
    # Olive's evaluator ran the model, which a session without the library cannot even load
    assert best.model_type.lower() == "onnxnormmodel"
    assert best.metrics_value["latency-avg"]["value"] > 0
    with pytest.raises(Exception, match="onnxnorm"):
        ort.InferenceSession(best.model_path)
    # and a session of its own keeps the session options Olive's inference settings give
    settings = {
        "session_options": {
            "intra_op_num_threads": 1,
            "graph_optimization_level": 0,
            "extra_session_config": {"session.intra_op.allow_spinning": "0"},
        }
    }
    session = integration.OnnxNormModelHandler(
        model_path=best.model_path, inference_settings=settings
    ).prepare_session()
    options = session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert _files(llama.parent) == before


def test_surgeon_in_graph_surgeries_writes_ort_ops_with_parity(llama, tmp_path, capsys):
    from onnxnorm.cli import main

    before = _files(llama.parent)
    surgery = {"surgeon": "OnnxNormFuse", "target": "ort", "verify": True}
    config = tmp_path / "workflow.json"
    config.write_text(
        json.dumps(
            _workflow(
                llama, {"surgeries": {"type": "GraphSurgeries", "surgeries": [surgery]}}, tmp_path
            )
        )
    )
    assert main(["olive", "run", str(config)]) == 0
    output = tmp_path / "out" / "model.onnx"
    assert f"output model: {output}" in capsys.readouterr().out
    fused = onnx.load(output)
    _assert_norms_replaced(llama, fused, ORT_OPS)
    assert not any(n.domain == "onnxnorm" for n in fused.graph.node)
    _assert_parity(llama, output)
    assert _files(llama.parent) == before


def test_plain_olive_run_with_the_package_config(llama, tmp_path):
    from onnxnorm.cli import main

    packages = tmp_path / "olive_packages.json"
    assert main(["olive", "package-config", "-o", str(packages)]) == 0
    known = json.loads(packages.read_text())["passes"]
    assert known["OnnxNormFusion"]["module_path"] == "onnxnorm.olive.passes.OnnxNormFusion"
    assert "GraphSurgeries" in known  # Olive's own passes stay known
    config = tmp_path / "workflow.json"
    config.write_text(json.dumps(_workflow(llama, {"fuse": {"type": "OnnxNormFusion"}}, tmp_path)))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "olive",
            "run",
            "--config",
            str(config),
            "--package-config",
            str(packages),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **QUIET},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    output = tmp_path / "out" / "model.onnx"
    fused = onnx.load(output)
    _assert_norms_replaced(llama, fused, ONNXNORM_OPS)
    # the default target, function: each onnxnorm op with its body, which plain ORT runs
    assert {f.name for f in fused.functions} and all(
        f.domain == "onnxnorm" for f in fused.functions
    )
    import onnxruntime as ort

    ort.InferenceSession(str(output))
    _assert_parity(llama, output)


def test_strict_precision_report_says_why_a_norm_stays(llama, tmp_path):
    from olive.workflows import run

    from models import pipelines
    from onnxnorm import olive as integration

    half = tmp_path / "llama_fp16.onnx"
    onnx.save(pipelines.float16(onnx.load(llama), "occ"), half)
    config = _workflow(
        half, {"fuse": {"type": "OnnxNormFusion", "strict_precision": True}}, tmp_path
    )
    best = run(config, package_config=integration.package_config()).get_best_candidate()
    report = best.model_config["model_attributes"]["onnxnorm"]["report"]
    assert report["norms"] == 0
    skips = [s for rule in report["rules"] for s in rule["skips"]]
    assert len(skips) == NORMS
    assert all(
        "computed in FLOAT16; onnxnorm computes them in FLOAT (strict precision)" in s["reason"]
        for s in skips
    ), skips
    assert _ops(onnx.load(best.model_path)) == _ops(onnx.load(half))


UNKNOWN = (
    "pass 'fuse' (OnnxNormFusion): unknown target 'fast'; supported: function, fused, ort, onnx"
)


def test_unknown_target_is_one_line_and_nothing_is_written(llama, tmp_path):
    before = _files(llama.parent)
    config = tmp_path / "workflow.json"
    config.write_text(
        json.dumps(
            _workflow(llama, {"fuse": {"type": "OnnxNormFusion", "target": "fast"}}, tmp_path)
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "onnxnorm", "olive", "run", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, **QUIET},
        timeout=600,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"onnxnorm: error: {config}: {UNKNOWN}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["workflow.json"]
    assert _files(llama.parent) == before


def test_unknown_target_from_the_python_api(llama, tmp_path):
    from olive.workflows import run

    from onnxnorm import olive as integration

    before = _files(llama.parent)
    config = _workflow(llama, {"fuse": {"type": "OnnxNormFusion", "target": "fast"}}, tmp_path)
    with pytest.raises(
        ValueError,
        match="OnnxNormFusion: unknown target 'fast'; supported: function, fused, ort, onnx",
    ):
        run(config, package_config=integration.package_config())
    surgery = {"surgeon": "OnnxNormFuse", "target": "fast"}
    config = _workflow(
        llama, {"s": {"type": "GraphSurgeries", "surgeries": [surgery]}}, tmp_path / "surgeon"
    )
    with pytest.raises(integration.OliveSettingError) as error:
        run(config, package_config=integration.package_config())
    assert str(error.value) == (
        "OnnxNormFuse: unknown target 'fast'; supported: function, fused, ort, onnx"
    )
    assert _files(llama.parent) == before


def test_without_olive_the_command_names_the_extra(llama, tmp_path):
    from tests.support.processes import assert_one_line, run_cli

    config = tmp_path / "workflow.json"
    config.write_text(json.dumps(_workflow(llama, {"fuse": {"type": "OnnxNormFusion"}}, tmp_path)))
    result = run_cli("olive", "run", str(config), hidden=("olive",), cwd=tmp_path)
    assert_one_line(result, "needs olive, which is not installed: pip install 'onnxnorm[olive]'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["workflow.json"]


def test_verify_over_tolerance_stops_the_workflow_and_keeps_no_model(llama, tmp_path, monkeypatch):
    from olive.workflows import run

    from onnxnorm import olive as integration
    from onnxnorm.fusion import verify as checks

    monkeypatch.setitem(checks.TOLERANCE, "float32", (0.0, 0.0))  # 8e-07 is now too much
    config = _workflow(llama, {"fuse": {"type": "OnnxNormFusion", "verify": True}}, tmp_path)
    with pytest.raises(integration.OliveSettingError) as error:
        run(config, package_config=integration.package_config())
    assert str(error.value).startswith(
        "OnnxNormFusion: verify failed: the fused model's outputs "
        "differ beyond tolerance: mul_24 (float32): max abs error"
    )
    assert not list(tmp_path.rglob("*.onnx"))

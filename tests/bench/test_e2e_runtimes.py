"""``onnxnorm bench e2e --runtime``: a tiny decoder on each runner, its export against onnxnorm's
output written --for that runner's runtime (times, ratios, parity, placement), a runner that
cannot run here as a row with its reason, and the pieces the rows stand on."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

from onnxnorm import cli
from onnxnorm.bench.e2e import runtimes

TINY = ["--layers", "2", "--hidden", "64", "--vocab", "128", "--prompt", "8", "--repeats", "2"]
#: the runners measured: ONNX Runtime with the library and tract always, OpenVINO both ways where
#: they run here (the test of each says why not)
RUNNERS = ("ort", "tract", "openvino", "ort-openvino")
#: float32 outputs of a model and of its fused form on one runtime agree this closely
ATOL = 1e-4


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One run of the command on every runner of RUNNERS: (its JSON, its output, --keep)."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("runtimes")
    out_json, keep = folder / "runtimes.json", folder / "models"
    argv = ["bench", "e2e", "--runtime", ",".join(RUNNERS), "--models", "llama"]
    argv += ["--dtypes", "float32", *TINY, "--keep", str(keep), "--json", str(out_json)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtimes, "MIN_SAMPLE", 0.01)  # the tiny decoder's runs: under 1 ms
        status = cli.main(argv)
    assert status == 0
    return json.loads(out_json.read_text()), printed.getvalue(), keep


@pytest.mark.parametrize("runner", RUNNERS)
def test_each_runner_times_the_export_and_its_output_for_that_runtime(measured, runner):
    from onnxnorm.deploy import runners

    data, out, _ = measured
    (group,) = data["groups"]
    row = {r["runner"]: r for r in group["rows"]}[runner]
    assert row["for"] == runtimes.RUNTIME_RUNNERS[runner]
    why = runners.unavailable(runner)
    if why:
        assert why in row["error"] and "models" not in row
        pytest.skip(f"{runner} cannot run here: {why} (its row says so)")
    models = row["models"]
    for name in ("original", "for"):
        for shape in runtimes.SHAPES:
            ms = models[name][f"{shape}_ms"]
            assert math.isfinite(ms) and ms > 0, (name, shape)
            assert len(models[name][f"{shape}_ms_samples"]) == 2
    for shape in runtimes.SHAPES:
        ratio = models["for"]["ratio"][shape]
        assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"] < math.inf
        assert row["noise"][shape] >= 0
    assert models["for"]["max_abs_diff"] <= ATOL
    # the function file: on the runners that read onnxnorm's ops, as close as the output
    function = models["function"]
    if "error" not in function:
        assert function["max_abs_diff"] <= ATOL
    assert row["verdict"].split(" ")[0] in ("faster", "same", "SLOWER") and row["why"]
    # the 2-layer Llama's 5 norms: 4 with the residual add before them, the final one alone
    assert sum(models["for"]["norm_ops"].values()) == 5 and models["original"]["norm_ops"] == {}
    if runner == "ort":
        assert set(models["for"]["placement"]) == {"CPU"}
        assert models["for"]["placement"]["CPU"] < models["original"]["placement"]["CPU"]
    if runner == "openvino":
        assert models["for"]["placement"]["RMS"] == 5
    if runner == "ort-openvino":
        assert models["for"]["placement"] == {"OpenVINO": 1}  # the provider takes it whole
    if runner == "tract":
        assert "placement" not in models["for"] or not models["for"]["placement"]
    assert f"| {runner} | {row['for']} | " in out


def test_the_table_and_json_of_the_run(measured):
    data, out, _ = measured
    assert data["complete"] is True and data["runtimes"] == runtimes.RUNTIME_RUNNERS
    assert {"openvino", "tract", "onnxruntime", "cpu", "load_average"} <= set(data["environment"])
    assert "#### llama, float32: the export and onnxnorm's output --for each runtime" in out
    assert "| runner | --for | prefill ms: original |" in out
    assert "- original (the export): no norm op (" in out


def test_an_unavailable_runner_is_a_row_with_its_reason(measured, monkeypatch):
    from onnxnorm.deploy import runners

    _, _, keep = measured
    known = runners.unavailable
    monkeypatch.setattr(
        runners,
        "unavailable",
        lambda name: "not on this machine (a test)" if name == "tract" else known(name),
    )
    monkeypatch.setattr(runtimes, "MIN_SAMPLE", 0.01)
    printed = io.StringIO()
    argv = ["bench", "e2e", "--runtime", "tract,ort", "--models", "llama", "--dtypes", "float32"]
    with contextlib.redirect_stdout(printed):
        assert cli.main([*argv, *TINY, "--keep", str(keep)]) == 0  # the models made before
    out = printed.getvalue()
    assert "| tract | tract | n/a: unavailable here: not on this machine (a test) |" in out
    assert "| ort | ort-cpu | " in out


def test_verdict_calls_a_difference_only_beyond_the_noise():
    def ratios(prefill, decode):
        return {
            "prefill": {"median": prefill, "min": prefill, "max": prefill},
            "decode": {"median": decode, "min": decode, "max": decode},
        }

    noise = {"prefill": 0.05, "decode": 0.02}
    assert runtimes.verdict(ratios(0.90, 0.99), noise) == (
        "faster (prefill 0.900x faster, decode 0.990x same)"
    )
    assert runtimes.verdict(ratios(0.90, 1.03), noise).startswith("SLOWER (")
    assert runtimes.verdict(ratios(1.04, 0.985), noise).startswith("same (")
    # below the floor a difference is never one, however quiet the control
    assert runtimes.verdict(ratios(0.995, 1.0), {"prefill": 0.0, "decode": 0.0}).startswith("same")


def test_parity_is_the_largest_difference_of_any_output():
    import numpy as np

    def f32(*values: float) -> np.ndarray:
        return np.asarray(values, np.float32)

    a = {"prefill": {"y": f32(0, 0, 0)}, "decode": {"y": f32(1, 1)}}
    b = {"prefill": {"y": f32(0, 1e-3, 0)}, "decode": {"y": f32(1, 0.5)}}
    assert runtimes.max_abs_diff(a, b) == 0.5
    missing: dict[str, dict[str, np.ndarray]] = {"prefill": {}, "decode": b["decode"]}
    assert runtimes.max_abs_diff(a, missing) == math.inf
    nan = {"prefill": {"y": f32(0, np.nan, 0)}, "decode": a["decode"]}
    assert math.isnan(runtimes.max_abs_diff(a, nan))


def test_another_runtimes_error_is_the_lines_that_say_what_failed():
    openvino = RuntimeError(
        "Exception from src/inference/src/cpp/core.cpp:105:\n"
        "Check 'false' failed at src/frontends/common_translators/src/report.cpp:151:\n"
        "FrontEnd API failed with OpConversionFailure:\nModel wasn't fully converted.\n"
        "Summary:\n-- No conversion rule found for operations: onnxnorm.RMSNorm\n"
    )
    assert runtimes.describe(openvino) == (
        "Model wasn't fully converted. -- No conversion rule found for operations: onnxnorm.RMSNorm"
    )
    assert runtimes.describe(ValueError()) == "ValueError"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--runtime", "cuda"], "argument --runtime: unknown cuda"),
        (["--runtime", ","], "--runtime needs one or more of ort, ort-openvino, openvino"),
        (["--runtime", "ort", "--plot", "x.png"], "--plot draws the generation groups"),
    ],
)
def test_bad_runtime_arguments_are_one_line_errors(argv, message, capsys):
    status: object
    try:
        status = cli.main(["bench", "e2e", *argv])
    except SystemExit as exit_:  # argparse's own errors
        status = exit_.code
    assert status != 0
    err = capsys.readouterr().err
    assert message in err.strip().splitlines()[-1] and "Traceback" not in err

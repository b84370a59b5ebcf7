"""``onnxnorm bench cuda`` without a GPU: the rows, columns, bytes and targets of the bandwidth
benchmark (``onnxnorm.bench.cuda``) on CPU torch tensors, with a fake launcher that computes the
op in torch and a fake timer per contender; the torch contender for real, and ONNX Runtime's
contender for real on the CPU provider, bound to the torch tensors' memory (what the CUDA
session does with CUDA tensors); a contender that is absent or fails is n/a with its reason; the
options."""

from __future__ import annotations

import json

import pytest

from onnxnorm import _native
from onnxnorm.bench import timing
from onnxnorm.bench.cuda import (
    cases,
    cli as cuda_cli,
    clock,
    contenders,
    measure,
    runner,
    table,
)
from onnxnorm.bench.kernels.contenders import torch_fn

torch = pytest.importorskip("torch")

#: microseconds per call of each contender (the fake timer's answers), flushed and decode
US = {
    (False, "copy"): 2.0,
    (False, "onnxnorm"): 2.0,
    (False, "torch"): 5.0,
    (False, "ort"): 4.0,
    (True, "copy"): 1.0,
    (True, "onnxnorm"): 4.0,
    (True, "torch"): 8.0,
    (True, "ort"): 12.0,
}
SHAPES = [
    ("4x256", 4, 256, "rows"),
    ("qk 8x64", 8, 64, "qk"),
    ("decode 2x256", 2, 256, "decode"),
]


class FakeKernels:
    """The launcher's interface: computes the op in torch ops written out (not F.rms_norm or
    F.layer_norm: the other contenders are compared with its Y), or raises for the ops in
    ``failing``."""

    def __init__(self, failing=()):
        self.failing = set(failing)
        self.launches = 0

    def args(self, op, inputs, y, sum_=None, **attrs):
        if op in self.failing:
            raise ValueError(f"{op}: no kernel for this\nsecond line")
        return (op, inputs, y, sum_)

    def launch(self, args):
        op, inputs, y, sum_ = args
        out = torch_fn(op, decomposed=True)(*inputs.values())
        out = out if isinstance(out, tuple) else (out,)
        y.copy_(out[0])
        if sum_ is not None:
            sum_.copy_(out[1])
        self.launches += 1

    def kernel_name(self, args):
        return "onnxnorm/fake<" + args[0] + ">"


@pytest.fixture
def timer(monkeypatch):
    """The fake timer: runs the call once (ORT's session and torch really run) and answers
    US[(decode, contender)]; records what it timed."""
    timed = []

    def fake(who, fn, flush, reps, decode):
        fn()
        timed.append((who, decode, reps))
        return US[(decode, who)] / 1000

    monkeypatch.setattr(clock, "time_ms", fake)
    return timed


def _bench(ops, dtype="float32", shapes=SHAPES, kernels=None, **kw):
    return measure.bench(
        kernels or FakeKernels(), ops, dtype, reps=3, shapes=shapes, device="cpu", **kw
    )


def _row(rows, op, shape):
    (row,) = [r for r in rows if r["op"] == op and r["shape"] == shape]
    return row


def test_rows_count_bytes_and_time_every_contender(timer):
    ops = ["RMSNorm", "SkipLayerNorm", "SandwichRMSNorm"]
    rows = _bench(ops)
    assert [(r["op"], r["shape"]) for r in rows] == [(op, s[0]) for s in SHAPES for op in ops]
    # per shape the copy, then per op the kernel, torch and each ORT built-in of the op
    per_op = {"RMSNorm": 2, "SkipLayerNorm": 1, "SandwichRMSNorm": 1}
    want = []
    for _, _, _, kind in SHAPES:
        want.append(("copy", kind == "decode", 3))
        for op in ops:
            want += [("onnxnorm", kind == "decode", 3), ("torch", kind == "decode", 3)]
            want += [("ort", kind == "decode", 3)] * per_op[op]
    assert timer == want
    rms = _row(rows, "RMSNorm", "4x256")
    # float32: X 4 KiB and Scale 1 KiB read (no Bias: the RMS ops as ORT's have them), Y written
    assert rms["bytes"] == 4096 + 1024 + 4096
    skip = _row(rows, "SkipLayerNorm", "4x256")
    assert skip["bytes"] == 2 * 4096 + 2 * 1024 + 2 * 4096  # X, Residual, Scale, Bias; Y, Sum
    sandwich = _row(rows, "SandwichRMSNorm", "4x256")
    assert sandwich["bytes"] == 2 * 4096 + 2 * 1024 + 2 * 4096  # X, Residual, Scale, InnerScale
    assert rms["us"] == pytest.approx(2.0) and rms["ms"] == pytest.approx(0.002)
    assert rms["gbs"] == pytest.approx(9216 / 0.002 / 1e6)
    assert rms["copy_gbs"] == pytest.approx(2 * 4096 / 0.002 / 1e6)
    assert rms["pct_of_copy"] == pytest.approx(100 * 9216 / 8192)
    assert rms["kernel"] == "onnxnorm/fake<RMSNorm>" and rms["kind"] == "rows"
    assert rms["torch_us"] == pytest.approx(5.0) and rms["torch_speedup"] == pytest.approx(2.5)
    assert rms["torch_note"] is None and rms["ort_note"] is None
    # both of ORT's RMS ops ran (on the CPU provider here), the row keeps the faster
    assert set(rms["ort"]) == {"RMSNormalization-23", "SimplifiedLayerNormalization"}
    assert rms["ort_op"] in rms["ort"]
    assert rms["ort_us"] == pytest.approx(4.0) and rms["ort_speedup"] == pytest.approx(2.0)
    # the contenders computed what the kernel wrote: ORT wrote into the bound torch tensors
    for row in rows:
        assert row["torch_max_diff"] < 1e-5, row
        for label, result in row["ort"].items():
            assert result["max_diff"] < 1e-4, (row["op"], label, result)
    decode = _row(rows, "RMSNorm", "decode 2x256")
    assert decode["kind"] == "decode" and decode["us"] == pytest.approx(4.0)
    assert decode["copy_gbs"] == pytest.approx(2 * 2 * 1024 / 0.001 / 1e6)
    json.dumps(rows)  # every number kept, serializable


def test_targets_judged_met_and_missed(timer, monkeypatch):
    rows = _bench(["RMSNorm", "SkipLayerNorm"])
    rms = _row(rows, "RMSNorm", "4x256")
    assert [t["target"] for t in rms["targets"]] == [">= 90% of copy", "faster than ORT"]
    assert [t["met"] for t in rms["targets"]] == [True, True] and rms["met"] is True
    assert rms["targets"][0]["detail"] == "112.5%"
    assert rms["targets"][1]["detail"] == "2.00x, ORT 4.0 us"
    # Q/K rows: 75% for the ops without a residual, no copy target for the others
    assert _row(rows, "RMSNorm", "qk 8x64")["target"] == cases.QK_TARGET
    assert _row(rows, "SkipLayerNorm", "qk 8x64")["target"] is None
    assert _row(rows, "SkipLayerNorm", "4x256")["target"] == 85
    # decode: at most 5 us (met at 4), no copy target, faster than ORT (12 us)
    decode = _row(rows, "SkipLayerNorm", "decode 2x256")
    assert decode["target"] is None
    assert [(t["target"], t["met"]) for t in decode["targets"]] == [
        ("<= 5 us", True),
        ("faster than ORT", True),
    ]
    # missed: a slow kernel, a decode call over 5 us, slower than ORT
    US_SLOW = {**US, (False, "onnxnorm"): 3.0, (True, "onnxnorm"): 13.0}

    def slow(who, fn, flush, reps, decode):
        fn()
        return US_SLOW[(decode, who)] / 1000

    monkeypatch.setattr(clock, "time_ms", slow)
    rows = _bench(["RMSNorm"], shapes=[SHAPES[0], SHAPES[2]])
    rms = _row(rows, "RMSNorm", "4x256")
    assert rms["pct_of_copy"] == pytest.approx(75.0)
    assert [t["met"] for t in rms["targets"]] == [False, True] and rms["met"] is False
    decode = _row(rows, "RMSNorm", "decode 2x256")
    assert [(t["target"], t["met"]) for t in decode["targets"]] == [
        ("<= 5 us", False),
        ("faster than ORT", False),
    ]
    assert decode["targets"][0]["detail"] == "13.00 us"
    line = table.markdown_row(decode)
    assert "<= 5 us: MISSED (13.00 us); faster than ORT: MISSED (0.92x, ORT 12.0 us)" in line
    assert line.endswith("| **no** |")
    summary = table.summary(rows)
    assert summary.startswith("0 of 2 rows with targets met them all; missed: ")
    assert "RMSNorm 4x256 (>= 90% of copy)" in summary
    assert "RMSNorm decode 2x256 (<= 5 us, faster than ORT)" in summary


def test_ort_absent_is_na_with_its_reason(timer, monkeypatch):
    monkeypatch.setattr(contenders, "ort_unavailable", lambda device: "onnxruntime offers no CUDA")
    rows = _bench(["LayerNorm"], shapes=SHAPES[:1])
    (row,) = rows
    assert row["ort_us"] is None and row["ort_note"] == "onnxruntime offers no CUDA"
    assert "ort" not in row  # no session tried
    assert [t["target"] for t in row["targets"]] == [">= 85% of copy"]
    assert [w for w, _, _ in timer] == ["copy", "onnxnorm", "torch"]
    assert "| n/a: onnxruntime offers no CUDA | - |" in table.markdown_row(row)
    (row,) = _bench(["LayerNorm"], shapes=SHAPES[:1], ort=False)
    assert row["ort_note"] == "skipped (--no-ort)"


def test_ort_unavailable_says_why():
    ort = pytest.importorskip("onnxruntime")
    assert contenders.ort_unavailable("cpu") is None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        reason = contenders.ort_unavailable("cuda")
        assert reason == (
            f"onnxruntime {ort.__version__} offers no CUDAExecutionProvider (not -gpu)"
        )


def test_ort_failure_is_na_and_the_other_builtin_still_runs(timer, monkeypatch):
    real = contenders.ort_call

    def flaky(label, *args, **kwargs):
        if label == "RMSNormalization-23":
            raise RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : no bfloat16\nmore")
        return real(label, *args, **kwargs)

    monkeypatch.setattr(contenders, "ort_call", flaky)
    (row,) = _bench(["RMSNorm"], shapes=SHAPES[:1])
    assert row["ort"]["RMSNormalization-23"] == {
        "error": "[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : no bfloat16"
    }
    assert row["ort_op"] == "SimplifiedLayerNormalization" and row["ort_us"] == pytest.approx(4)

    def broken(label, *args, **kwargs):
        if label == "LayerNormalization-17":  # (the probe)
            return real(label, *args, **kwargs)
        raise RuntimeError(f"{label} has no CUDA kernel | for bfloat16")

    monkeypatch.setattr(contenders, "ort_call", broken)
    (row,) = _bench(["RMSNorm"], shapes=SHAPES[:1])
    assert row["ort_us"] is None and row["ort_speedup"] is None
    assert row["ort_note"] == (
        "RMSNormalization-23: RMSNormalization-23 has no CUDA kernel | for bfloat16; "
        "SimplifiedLayerNormalization: SimplifiedLayerNormalization has no CUDA kernel | for "
        "bfloat16"
    )
    assert [t["target"] for t in row["targets"]] == [">= 90% of copy"]  # no ORT target
    cells = table.markdown_row(row).split(" | ")
    ort_cell = cells[table.COLUMNS.index(("ORT CUDA (us)", "r"))]
    assert ort_cell.startswith("n/a: RMSNormalization-23: RMSNormalization-23 has no CUDA kernel /")
    assert ort_cell.endswith("...") and len(ort_cell) == 90  # one cell, no column bar


def test_ort_that_fails_its_probe_is_na_on_every_row(timer, monkeypatch):
    tried = []

    def no_ep(label, *args, **kwargs):
        tried.append(label)
        raise RuntimeError("the session has ['CPUExecutionProvider']: the CUDA EP did not load")

    monkeypatch.setattr(contenders, "ort_call", no_ep)
    rows = _bench(["RMSNorm", "SkipRMSNorm"])
    assert tried == ["LayerNormalization-17"]  # one probe, no session per row
    for row in rows:
        assert "ort" not in row and row["ort_us"] is None
        assert row["ort_note"] == (
            "ORT's LayerNormalization float32 probe failed: the session has "
            "['CPUExecutionProvider']: the CUDA EP did not load"
        )
        assert row["torch_us"] is not None


def test_torch_without_rms_norm_is_na(timer, monkeypatch):
    monkeypatch.delattr(torch.nn.functional, "rms_norm")
    rows = _bench(["RMSNorm", "LayerNorm"], shapes=SHAPES[:1])
    rms, layer = rows
    assert rms["torch_us"] is None
    assert rms["torch_note"].endswith("has no torch.nn.functional.rms_norm")
    assert rms["ort_us"] == pytest.approx(4.0)  # the other contenders still ran
    assert layer["torch_us"] == pytest.approx(5.0)


def test_a_failing_kernel_is_a_row_and_the_run_goes_on(timer):
    rows = _bench(["LayerNorm", "RMSNorm"], shapes=SHAPES[:1], kernels=FakeKernels({"LayerNorm"}))
    failed, rms = rows
    assert failed["us"] is None and failed["error"] == "LayerNorm: no kernel for this"
    assert failed["met"] is None and failed["targets"] == []
    assert "torch_max_diff" not in failed and failed["ort_us"] is None  # contenders not timed
    assert rms["us"] == pytest.approx(2.0) and rms["met"] is True
    assert "| n/a: LayerNorm: no kernel for this | - | - | - |" in table.markdown_row(failed)
    assert "not measured: LayerNorm 4x256" in table.summary(rows)


def test_bfloat16_rows_bind_ort_by_pointer(timer):
    """bfloat16 has no numpy type: ORT's inputs and outputs are bound as ONNX's BFLOAT16 by
    the tensors' pointers; Y within bfloat16's rounding of the kernel's."""
    rows = _bench(["SkipRMSNorm"], dtype="bfloat16", shapes=SHAPES[:1])
    (row,) = rows
    assert row["bytes"] == 2 * 2048 + 512 + 2 * 2048  # X, Residual, Scale; Y, Sum
    result = row["ort"]["SkipSimplifiedLayerNormalization"]
    assert "error" not in result and result["max_diff"] <= 0.0625


def test_markdown_table():
    row = measure.judge(
        measure._blank(
            dict(
                op="RMSNorm", dtype="bfloat16", shape="4096x4096", kernel="lib/rms<8x512>",
                bytes=1, ms=0.02, us=20.0, gbs=3400.0, copy_gbs=3600.0, pct_of_copy=94.44,
                target=90, kind="rows", torch_us=30.0, torch_speedup=1.5, ort_us=25.0,
                ort_speedup=1.25, ort_op="SimplifiedLayerNormalization",
            )
        )
    )  # fmt: skip
    lines = table.markdown([row], "NVIDIA H200").splitlines()
    assert lines[0] == "CUDA kernels on NVIDIA H200" and lines[1] == ""
    assert lines[2] == (
        "| op | dtype | shape | kernel | time (us) | GB/s | copy GB/s | % of copy | torch (us) "
        "| vs torch | ORT CUDA (us) | vs ORT | targets | met? |"
    )
    assert lines[3] == "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
    assert lines[4] == (
        "| RMSNorm | bfloat16 | 4096x4096 | rms<8x512> | 20.0 | 3400 | 3600 | 94.4% | 30.0 "
        "| 1.50x | 25.0 (SimplifiedLayerNormalization) | 1.25x "
        "| >= 90% of copy: met (94.4%); faster than ORT: met (1.25x, ORT 25.0 us) | yes |"
    )
    hybrid = measure.judge(
        measure._blank(dict(row, kind="hybrid", target=None, torch_us=None, ort_us=None))
    )
    assert table.markdown_row(hybrid).endswith("| - | - | - | - | - | - |")


def test_time_is_flushed_events_or_back_to_back(monkeypatch):
    calls = []
    monkeypatch.setattr(
        timing, "cuda_ms", lambda fn, flush, reps: calls.append(("events", flush, reps)) or 1.0
    )
    monkeypatch.setattr(
        clock, "back_to_back_ms", lambda fn, reps: calls.append(("back to back", reps)) or 2.0
    )
    flush = object()
    assert clock.time_ms("ort", lambda: None, flush, 7, decode=False) == 1.0
    assert clock.time_ms("ort", lambda: None, flush, 7, decode=True) == 2.0
    assert calls == [("events", flush, 7), ("back to back", 7)]


def test_report_prints_each_dtype_and_writes_json(monkeypatch, tmp_path, capsys):
    """report() on CPU: the launcher, the stream and the flush faked, the bench on CPU tensors;
    each dtype's table printed as measured, the JSON rewritten after each dtype."""
    real_bench = measure.bench
    seen = []

    class Kernels(FakeKernels):
        path = "/fake/libonnxnorm_cuda_ops.so"

        def __init__(self, library):
            super().__init__()

        def build_info(self):
            return "sm_90 fake"

    class Stream:
        cuda_stream = 1234

    def bench(kernels, **kw):
        seen.append((kw["dtype"], kw["stream"], kw["ort"]))
        kw.update(ops=["RMSNorm"], shapes=SHAPES[:1], device="cpu")
        return real_bench(kernels, **kw)

    monkeypatch.setattr(_native, "Kernels", Kernels)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: __import__("contextlib").nullcontext())
    monkeypatch.setattr(clock, "flusher", lambda: lambda: None)
    monkeypatch.setattr(measure, "bench", bench)
    monkeypatch.setattr(measure, "bench_hybrid", lambda *a, **kw: [])
    monkeypatch.setattr(clock, "time_ms", lambda who, fn, flush, reps, decode: (fn(), 0.002)[1])
    out = tmp_path / "bench.json"
    results = runner.report(None, "bfloat16,float16", 3, str(out), ort=False)
    assert seen == [("bfloat16", 1234, False), ("float16", 1234, False)]
    assert [r["dtype"] for r in results] == ["bfloat16", "float16"]
    printed = capsys.readouterr().out
    assert printed.startswith("# /fake/libonnxnorm_cuda_ops.so (sm_90 fake) on ")
    assert printed.count("| op | dtype | shape |") == 2
    assert (
        "| RMSNorm | bfloat16 | 4x256 |" in printed and "| RMSNorm | float16 | 4x256 |" in printed
    )
    assert printed.count("rows with targets met them all") == 2
    assert printed.endswith("\nfloat16: 1 of 1 rows with targets met them all\n")
    data = json.loads(out.read_text())
    assert [r["dtype"] for r in data["results"]] == ["bfloat16", "float16"]
    assert data["environment"]["torch"] == torch.__version__
    assert data["environment"]["library_build"] == "sm_90 fake"
    assert "onnxruntime" in data["environment"] and "torch_cuda" in data["environment"]
    assert data["results"][0]["ort_note"] == "skipped (--no-ort)"


def test_the_package_names_are_its_modules():
    """The names of ``onnxnorm.bench.cuda`` (imported on first use) are its modules'; the
    binding of the library is onnxnorm._native's alone."""
    import onnxnorm.bench.cuda as package

    assert package.report is runner.report and package.bench is measure.bench
    assert package.main is cuda_cli.main and package.TARGETS is cases.TARGETS
    assert sorted(set(dir(package)) & {"Kernels", "NormArgs", "library_path"}) == []
    with pytest.raises(AttributeError):
        package.Kernels  # noqa: B018


def test_options_dtypes():
    import argparse

    parser = argparse.ArgumentParser()
    cuda_cli.add_options(parser)
    assert cuda_cli.dtypes_of(parser.parse_args([])) == ["bfloat16", "float16"]
    assert cuda_cli.DEFAULT_DTYPES is cases.DEFAULT_DTYPES  # one default for both entry points
    args = parser.parse_args(["--dtypes", "float32, bfloat16", "--no-ort", "--reps", "5"])
    assert cuda_cli.dtypes_of(args) == ["float32", "bfloat16"] and args.no_ort and args.reps == 5
    assert cuda_cli.dtypes_of(parser.parse_args(["--dtype", "float16"])) == ["float16"]
    args = parser.parse_args(["--reps", "30", "--json", "x.json"])  # tools/gpu_check.sh's
    assert cuda_cli.dtypes_of(args) == ["bfloat16", "float16"] and not args.no_ort
    for bad in (["--dtypes", "float8"], ["--dtype", "float16", "--dtypes", "float16"]):
        with pytest.raises(SystemExit) as stop:
            parser.parse_args(bad)
        assert stop.value.code == 2


def test_without_a_gpu_the_command_fails_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    from onnxnorm import cli

    assert cli.main(["bench", "cuda", "--dtypes", "float16", "--reps", "1"]) == 1
    assert capsys.readouterr().err == (
        "onnxnorm: error: onnxnorm bench cuda: torch sees no CUDA device\n"
    )
    assert cuda_cli.main(["--dtypes", "bfloat16,float16"]) == 2
    assert capsys.readouterr().err == "onnxnorm.bench.cuda: torch sees no CUDA device\n"

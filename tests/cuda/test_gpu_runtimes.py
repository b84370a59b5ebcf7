"""tools/gpu_runtimes.py, the runtimes step of tools/gpu_check.sh: here, without a GPU, each GPU
runtime is a skipped row that says why, and the CPU stand-ins run every form it lowers (the
export, the lowering, the comparison, the placement checks and the table); a row whose nodes
ran where they must not fails. The dry run is tests/cuda/test_cuda.py's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.support.tools import load_tool

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gpu_runtimes.py"
DEVICE_ROWS = (
    "ONNX Runtime CUDA EP + onnxnorm library",
    "ONNX Runtime CUDA EP devices (plugin API) + onnxnorm library",
    "ONNX Runtime WebGPU plugin EP, no CPU fallback",
)
TENSORRT_ROWS = (
    "TensorRT",
    "ONNX Runtime TensorrtExecutionProvider",
    "ONNX Runtime TensorRT RTX plugin EP",
    "TensorRT ONNX parser (tensorrt package)",
)


def test_stand_ins_run_every_form_and_each_gpu_runtime_says_why_not(tmp_path):
    result = subprocess.run(
        [sys.executable, str(TOOL), "--stand-ins", "--work", str(tmp_path / "work"),
         "--markdown", str(tmp_path / "runtimes.md"), "--json", str(tmp_path / "runtimes.json")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    out = result.stdout
    rows = json.loads((tmp_path / "runtimes.json").read_text())["rows"]
    device = [r for r in rows if r["device"]]
    ran = [r for r in device if r["runs"]]
    # 0: a GPU runtime ran and none failed; 3: none is here (this machine)
    assert result.returncode == (0 if ran else 3), out + result.stderr
    assert {r["runtime"] for r in device} >= set(DEVICE_ROWS), rows
    assert {r["runtime"] for r in device} & set(TENSORRT_ROWS), rows
    for row in device:
        if not row["runs"]:
            assert row["outcome"].startswith("skipped: ") and len(row["outcome"]) > 20, row
            assert row["dtype"] == "-" and row["diff"] is None, row
    if not any(r["runtime"] in TENSORRT_ROWS[1:] for r in device):
        (trt,) = [r for r in device if r["runtime"] == "TensorRT"]
        for looked in ("TensorrtExecutionProvider", "onnxruntime-ep-nv-tensorrt-rtx", "tensorrt"):
            assert looked in trt["outcome"], trt
    stand_ins = [r for r in rows if not r["device"]]
    forms = [(r["form"], r["dtype"]) for r in stand_ins]
    assert forms == [
        (form, dtype)
        for form in ("ort-cuda", "tensorrt", "webgpu")
        for dtype in ("float32", "float16")
    ]
    for row in stand_ins:
        assert row["outcome"] == "ok" and row["loads"] and row["runs"], row
        assert row["diff"] <= (1e-5 if row["dtype"] == "float32" else 1e-2), row
        assert row["placement"].startswith("CPU "), row
    library = [r for r in stand_ins if r["form"] == "ort-cuda"]
    assert all(r["placement"].endswith("; onnxnorm 5/5 on CPU") for r in library), library
    # the forms, written next to the function form
    for dtype in ("float32", "float16"):
        assert f"lowered: {dtype} --for ort-cuda: RMSNorm x1, SkipRMSNorm x4" in out
        assert f"lowered: {dtype} --for tensorrt: no norm op (plain ops)" in out
        # (the webgpu form's SimplifiedLayerNormalization is ONNX Runtime's, unknown to onnx)
        for form in ("", "-ort-cuda", "-tensorrt"):
            onnx.checker.check_model(str(tmp_path / "work" / f"llama-{dtype}{form}.onnx"))
        assert onnx.load(tmp_path / "work" / f"llama-{dtype}-webgpu.onnx").graph.node
    table = (tmp_path / "runtimes.md").read_text().splitlines()
    assert table[0] == (
        "| runtime | --for | dtype | loads | runs | max abs diff | placement | outcome |"
    )
    assert len(table) == 2 + len(rows) and table[2:] == out.strip().splitlines()[-len(rows) :]


def test_a_node_off_its_provider_or_a_wrong_output_fails_the_row(tmp_path, capsys, monkeypatch):
    """The function form run on the CPU but judged as the CUDA rows judge theirs: the onnxnorm
    nodes ran on the CPU, a failure; the webgpu form judged as its plugin's row (every node
    on the provider); outputs off the reference; a row or a probe that breaks: each row FAILED,
    exit status 1."""
    tool = load_tool("gpu_runtimes")
    from onnxnorm import runtime

    def judged_as(form: str, provider: str, check: str):
        def run(row, case, work):
            model = case.forms[form]
            return tool.ort_row(
                row, case, model, lambda o: runtime.session(model, o), provider, check, work
            )

        return tool.Target(f"{form} as {provider}", form, lambda: None, run)

    def off(row, case, work):
        case.feeds = {k: v + 1 for k, v in case.feeds.items()}
        return judged_as("ort-cuda", tool.CPU, "library").run(row, case, work)

    monkeypatch.setattr(
        tool,
        "targets",
        lambda: [
            judged_as("ort-cuda", tool.CUDA, "library"),
            judged_as("webgpu", "WebGpuExecutionProvider", "whole"),
            tool.Target("off", "ort-cuda", lambda: None, off),
            tool.Target("broken", "webgpu", lambda: None, lambda row, case, work: 1 / 0),
            tool.Target("probe", "webgpu", lambda: {}["device"], None),
        ],
    )
    assert tool.main(["--dtypes", "float32", "--work", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert re.search(
        r"\| ort-cuda as CUDAExecutionProvider \| ort-cuda \| float32 \| yes \| yes \| 0 \| "
        r"CPU \d+; onnxnorm 0/5 on CUDA \| FAILED: onnxnorm nodes off CUDA: 5 on CPU \|",
        out,
    ), out
    assert re.search(r"\| CPU (\d+) \| FAILED: not all on WebGpu: \1 on CPU \|", out), out
    assert "| off | ort-cuda | float32 | yes | yes | " in out
    assert re.search(r"\| CPU \d+; onnxnorm 5/5 on CPU \| FAILED: max abs diff ", out), out
    assert "| broken | webgpu | float32 | - | - | - | - | FAILED: error: ZeroDivisionError(" in out
    assert "| probe | webgpu | - | - | - | - | - | FAILED: probe: KeyError(" in out


def test_the_plugin_api_row_opens_its_session_on_the_devices_given(tmp_path, capsys, monkeypatch):
    """The CUDA plugin row's session (the library registered, the devices added to the
    options) opened on the CPU provider's device of the same plugin API."""
    import onnxruntime

    tool = load_tool("gpu_runtimes")
    plugin = tool.CudaPlugin(provider=tool.CPU)
    plugin.devices = [d for d in onnxruntime.get_ep_devices() if d.ep_name == tool.CPU]
    plugin.kind = "CPU devices"
    api = tool.Target("api", "ort-cuda", lambda: None, plugin.run)
    monkeypatch.setattr(tool, "targets", lambda: [api])
    assert tool.main(["--dtypes", "float16", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"\| api \| ort-cuda \| float16 \| yes \| yes \| 0 \| CPU \d+; onnxnorm 5/5 on CPU "
        r"\| ok \(CPU devices\) \|",
        out,
    ), out


def _norm_model(count: int) -> onnx.ModelProto:
    nodes = [
        helper.make_node("RMSNorm", ["x", "w"], [f"y{i}"], domain="onnxnorm") for i in range(count)
    ]
    graph = helper.make_graph(nodes, "g", [], [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("onnxnorm", 1)])


def test_placement_checks():
    tool = load_tool("gpu_runtimes")
    model = _norm_model(2)
    cuda, cpu = tool.CUDA, tool.CPU
    ran = [("RMSNorm", cuda), ("RMSNorm", cuda), ("MatMul", cuda), ("Shape", cpu)]
    assert tool.placement_problem(ran, model, cuda, "library") == (
        "CUDA 3, CPU 1; onnxnorm 2/2 on CUDA",
        None,
    )
    # a body inlined instead of the kernel: its ops ran, the node's kernel did not
    inlined = [("RMSNorm", cuda), ("ReduceMean", cuda), ("Mul", cuda)]
    summary, problem = tool.placement_problem(inlined, model, cuda, "library")
    assert summary.endswith("onnxnorm 1/2 on CUDA") and "did not run the library" in problem
    summary, problem = tool.placement_problem(ran, model, cuda, "whole")
    assert problem == "not all on CUDA: 1 on CPU"
    trt = [("MemcpyFromHost", cuda), ("TRTKernel_graph_main", tool.TRT), ("MemcpyToHost", cuda)]
    assert tool.placement_problem(trt, model, tool.TRT, "whole") == ("CUDA 2, Tensorrt 1", None)
    assert tool.placement_problem([], model, tool.TRT, "whole")[1] == "no kernel ran"


def test_differences_tables_and_arguments():
    tool = load_tool("gpu_runtimes")
    a = np.array([1.0, np.nan, 3.0], np.float16)
    assert tool.max_abs_diff([a], [np.array([1.0, np.nan, 3.5])]) == 0.5
    assert np.isnan(tool.max_abs_diff([a], [np.array([1.0, 2.0, 3.0])]))
    assert np.isnan(tool.max_abs_diff([a], [np.zeros(2)]))
    row = tool.Row("a | b", "webgpu").skip("x")
    line = tool.table([row]).splitlines()[2]
    assert line == "| a \\| b | webgpu | - | - | - | - | - | skipped: x |"
    with pytest.raises(SystemExit) as stop:
        tool.parse_args(["--dtypes", "bfloat16"])
    assert stop.value.code == 2
    with pytest.raises(SystemExit):
        tool.parse_args(["--batch", "0"])
    args = tool.parse_args(["--dtypes", "float16", "--dynamic"])
    assert args.dtypes == ["float16"] and args.dynamic and not args.stand_ins

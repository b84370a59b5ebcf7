"""The CUDA kernels and their ORT glue.

On any machine: the CUDA library is built when nvcc is (without a runtime dependency on
libcudart), the CUDA sources compile with nvcc, importing onnxnorm and running CPU ops loads no
CUDA library (even with the CUDA kernels registered), the kernels' logic passes the correctness
matrix in a host emulation (custom_ops/cuda/emulation, tests/support/cuda_harness.py), and the
ORT glue of the CUDA kernels (the CPU library's: CUDA rows of its kernel table, the CUDA library
loaded on first use, its launcher) runs end to end in a CPU session against that emulation. On a GPU
machine (torch.cuda available and the library built): the correctness matrix through the C
launcher, bad arguments refused before launch, launches on the given stream, and, where
onnxruntime offers the CUDA execution provider, the ORT custom ops on it. The CUDA library is
never loaded into the test process on a machine without a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onnxnorm import OnnxNormError, _native, ops, runtime
from onnxnorm.testing.graphs import single_node_model
from tests.support import cuda_harness
from tests.support.cuda_common import (
    NVCC,
    compile_with_nvcc,
    glue_library,
    kernels_fixture,
    needs_host_compiler,
    needs_host_compiler_and_proc,
    needs_nvcc,
    run_python,
)
from tests.support.gpu import (
    cuda_library,
    gpu,
    needs_gpu,
    needs_ort_cuda,
    run_on_cuda_provider,
)
from tests.support.matrix import DTYPES


# ---------------------------------------------------------------------------------------------
# Any machine
# ---------------------------------------------------------------------------------------------
def test_cuda_library_built_when_nvcc_present():
    """With nvcc, the build (ONNXNORM_CUDA=AUTO) makes the CUDA library next to the CPU library:
    checked from its file, never loaded here. It holds the kernels and their C launcher; the ORT
    entry point is the CPU library's."""
    info = runtime.build_info()
    if not info.get("cuda"):
        if NVCC and os.environ.get("ONNXNORM_CUDA", "AUTO").upper() == "AUTO":
            pytest.fail("nvcc is on this machine but the installed build has no CUDA library")
        pytest.skip("the installed build was made without CUDA")
    path = cuda_library()
    assert path is not None and path.is_file() and path.parent == runtime.library_path().parent
    if not shutil.which("readelf"):
        pytest.skip("no readelf to inspect the library")
    symbols = subprocess.run(
        ["readelf", "--dyn-syms", "-W", str(path)], capture_output=True, text=True, check=True
    ).stdout
    exported = {
        line.split()[-1]
        for line in symbols.splitlines()
        if " GLOBAL " in line and " UND " not in line
    }
    assert {
        "onnxnorm_cuda_launch",
        "onnxnorm_cuda_kernel_name",
        "onnxnorm_cuda_build_info",
        "onnxnorm_args_layout",
    } <= exported, exported
    assert "RegisterCustomOps" not in exported
    needed = subprocess.run(
        ["readelf", "-d", "-W", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert "libcudart" not in needed, "the CUDA runtime must be linked statically"
    assert "libonnxruntime" not in needed


@needs_nvcc
def test_cuda_sources_compile_with_nvcc():
    """The launcher, one op's kernels, float and quantized, and the gated and L2 norms' kernels
    compile for sm_80 (a quick check of the sources). Where the installed build has the CUDA
    library, the package build compiled them all with this nvcc
    (test_cuda_library_built_when_nvcc_present checks it), and this adds nothing."""
    compile_with_nvcc(
        "launch.cu",
        "ops_skip_rms_norm.cu",
        "ops_skip_rms_norm_quantized.cu",
        "ops_gated_rms_norm.cu",
        "ops_gated_rms_norm_gate_first.cu",
        "ops_l2_norm.cu",
        timeout=300,
    )


_CPU_ONLY_RUN = r"""
import sys
import numpy as np
from onnx import helper, TensorProto
import onnxnorm
from onnxnorm import runtime
node = helper.make_node("RMSNorm", ["x"], ["y"], domain="onnxnorm")
graph = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                helper.make_opsetid("onnxnorm", 1)])
providers = runtime.CUDA_PROVIDERS if sys.argv[1] == "cuda-providers" else None
sess = runtime.session(model, providers=providers)
y = sess.run(None, {"x": np.ones((2, 8), np.float32)})[0]
assert np.allclose(y, 1 / np.sqrt(1 + 1e-5)), y
maps = open("/proc/self/maps").read()
bad = [name for name in ("onnxnorm_cuda", "libcudart", "libcuda.so", "libcublas") if name in maps]
print("LOADED:" + ",".join(bad))
"""


@pytest.mark.parametrize("providers", ["default", "cuda-providers"])
def test_importing_onnxnorm_and_running_cpu_ops_loads_no_cuda(providers):
    """The CPU library registers the CUDA kernels when their library is built, but loads it only
    when ORT creates a kernel on the CUDA provider: never in a CPU session, even one asking for
    the CUDA provider first (here without onnxruntime-gpu, the nodes land on the CPU)."""
    if not Path("/proc/self/maps").is_file():
        pytest.skip("needs /proc")
    if providers == "cuda-providers" and runtime.cuda_available():
        pytest.skip("onnxruntime offers the CUDA provider: the CUDA library is meant to load")
    result = subprocess.run(
        [sys.executable, "-c", _CPU_ONLY_RUN, providers],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "LOADED:", result.stdout


def test_runtime_cuda_helpers_without_loading():
    path = cuda_library()
    if path is None:
        with pytest.raises(OnnxNormError, match="CUDA library is not built"):
            runtime.library_path("cuda")
        assert runtime.cuda_available() is False
    else:
        assert path == runtime.library_path().parent / "libonnxnorm_cuda_ops.so"
    assert isinstance(runtime.cuda_available(), bool)


@pytest.mark.slow
@needs_host_compiler
def test_cuda_kernel_logic_in_host_emulation():
    """Without a GPU: the kernels of norm_kernels.cuh, their launch table and the real launcher
    (launch.cu), compiled by the host compiler with stand-ins for the CUDA headers
    (custom_ops/cuda/emulation: threads of a block are fibers, shuffles and __syncthreads
    barriers), run the harness's quick correctness matrix against the reference: every op, dtype,
    weight dtype, rounding order, kernel configuration and the general kernel, and the bad
    arguments. GPU-specific behaviour (memory model, speed) is left to the GPU tests."""
    out = run_python(str(cuda_harness.__file__), "--emulation", "--quick", timeout=1800)
    assert "CUDA kernel cases passed" in out


_GLUE_RUN = r"""
import itertools
import sys
import numpy as np
import onnxruntime as ort
sys.path.insert(0, ".")  # the checkout (the test runs this in it): tests.support
from tests.support.helpers import F8_ZERO_POINT, assert_float8_equal, run
from tests.support.matrix import F8
from onnxnorm import ops, runtime
from onnxnorm.testing.graphs import numpy_type, single_node_model

mode = sys.argv[1]
arrays = {"X": np.ones((2, 16), np.float32)}
if mode != "runs":
    try:
        run(single_node_model("RMSNorm", arrays, functions=False), arrays, with_library=True)
        print("RESULT: ran")
    except Exception as e:
        print("RESULT:", e)
    sys.exit(0)

rng = np.random.default_rng(0)
checked = mixed = 0
for op, spec in ops.catalogue.FLOAT_OPS.items():
    if spec.gated or spec.norm == "l2":  # (below)
        continue
    # every (T, S, U) row: U (Y's type) float32 for a 16-bit X with float32 weights is the mixed
    # form of the ops whose Y is of type U
    for type_set in spec.type_sets:
        t, s, u = map(numpy_type, type_set)
        # a 16-bit X in order A; the mixed form in both orders (B: Y rounded once, to float32)
        orders = (1, 0) if u != t else (int(t != np.float32),)
        # per-head weights [4, 64] for X [2, 3, 4, 64]: the register kernels; width 40: the
        # general one
        for order, (shape, wshape) in itertools.product(
                orders, (((2, 3, 4, 64), (4, 64)), ((3, 40), (40,)))):
            arrays = {"X": (rng.standard_normal(shape) * 2 + 0.5).astype(t)}
            if spec.has_residual:
                arrays["Residual"] = rng.standard_normal(shape).astype(t)
            for name in spec.optional_inputs:
                arrays[name] = (1 + 0.3 * rng.standard_normal(wshape)).astype(s)
            attrs = {"cast_before_scale": order, **({"y_float32": 1} if u != t else {})}
            attrs.update({k: v for k, v in (("scale_offset", 0.5), ("alpha", 0.75))
                          if k in spec.defaults})
            got = run(single_node_model(op, arrays, attrs, functions=False), arrays,
                      with_library=True)
            want = ops.reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **attrs)
            rtol, atol = ops.reference.tolerance(np.float32 if u != t and not order else t)
            if u != t:
                assert got[0].dtype == np.float32, (op, type_set, got[0].dtype)
                mixed += 1
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(np.asarray(g, np.float32), w.astype(np.float32),
                                           rtol, atol, err_msg=f"{op} {type_set} {attrs}")
            checked += 1
# GatedRMSNorm: every (T, S) row, no Gate or one with each activation on each side of the norm,
# in groups: X [2, 3, 256] in groups of 64 with one group's Scale [64] (the register kernels), X
# [3, 40] in groups of 10 with a Scale of the whole extent (four weight rows; the general kernel)
gated = 0
for type_set, gate, (shape, group, wshape) in itertools.product(
        ops.catalogue.get("GatedRMSNorm").type_sets, [None, (0, 1), (1, 1), (0, 0), (1, 0)],
        [((2, 3, 256), 64, (64,)), ((3, 40), 10, (40,))]):
    t, s = map(numpy_type, type_set[:2])
    arrays = {"X": (rng.standard_normal(shape) * 2 + 0.5).astype(t),
              "Scale": (1 + 0.3 * rng.standard_normal(wshape)).astype(s)}
    attrs = {"cast_before_scale": int(t != np.float32), "scale_offset": 0.5, "group_size": group}
    if gate is not None:
        arrays["Gate"] = (2 * rng.standard_normal(shape)).astype(t)
        attrs.update(activation=gate[0], norm_before_gate=gate[1])
    got = run(single_node_model("GatedRMSNorm", arrays, attrs, functions=False), arrays,
              with_library=True)
    want = ops.reference.run("GatedRMSNorm", arrays["X"], arrays["Scale"], arrays.get("Gate"),
                             **attrs)
    np.testing.assert_allclose(np.asarray(got[0], np.float32), want[0].astype(np.float32),
                               *ops.reference.tolerance(t), err_msg=f"{type_set} {attrs}")
    gated += 1
# L2Norm: every type, per-head rows of 64 and rows of 4 x 50 (axis -2): the register kernels;
# rows of 41: the general one
l2 = 0
for type_set, (shape, axis) in itertools.product(
        ops.catalogue.get("L2Norm").type_sets, [((2, 3, 4, 64), -1), ((3, 41), -1),
                                                ((2, 4, 50), -2)]):
    t = numpy_type(type_set[0])
    arrays = {"X": (rng.standard_normal(shape) * 2 + 0.5).astype(t)}
    attrs = {"axis": axis, "epsilon": 1e-6}
    got = run(single_node_model("L2Norm", arrays, attrs, functions=False), arrays,
              with_library=True)
    want = ops.reference.run("L2Norm", arrays["X"], **attrs)
    np.testing.assert_allclose(np.asarray(got[0], np.float32), want[0].astype(np.float32),
                               *ops.reference.tolerance(t), err_msg=f"{type_set} {attrs}")
    l2 += 1
# the quantized ops: Y_float and Sum bit for bit their float op's (through the same CUDA library),
# Y (and the dynamic Y_scale, Y_zero_point) exactly the reference quantizer's of that Y_float
quantized = 0
def same(a, b):
    return np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), equal_nan=True)

for op, spec in ops.catalogue.QUANTIZED_OPS.items():
    base = ops.catalogue.get(spec.base)
    zero_points = [None] if spec.quantize == "dynamic" else [
        None, np.uint8(131), np.int8(-7), F8_ZERO_POINT]
    for (t, s, _), zp in itertools.product(spec.type_sets, zero_points):
        t, s = numpy_type(t), numpy_type(s)
        for shape, wshape in (((2, 3, 4, 64), (4, 64)), ((3, 40), (40,))):
            arrays = {"X": (rng.standard_normal(shape) * 2 + 0.5).astype(t)}
            if base.has_residual:
                arrays["Residual"] = rng.standard_normal(shape).astype(t)
            for name in base.optional_inputs:
                arrays[name] = (1 + 0.3 * rng.standard_normal(wshape)).astype(s)
            attrs = {"cast_before_scale": int(t != np.float32)}
            attrs.update({k: v for k, v in (("scale_offset", 0.5), ("alpha", 0.75))
                          if k in spec.defaults})
            want = run(single_node_model(spec.base, arrays, attrs, functions=False), arrays,
                       with_library=True)
            quant = {}
            if spec.quantize == "static":
                quant["Y_scale"] = np.asarray(0.03, t)
                if zp is not None:
                    quant["Y_zero_point"] = np.asarray(zp)
            given = {**arrays, **quant}
            got = dict(zip([p.name for p in spec.outputs],
                           run(single_node_model(op, given, attrs, functions=False), given,
                               with_library=True)))
            assert same(got["Y_float"], want[0]), op
            if base.has_residual:
                assert same(got["Sum"], want[1]), op
            y_float = np.asarray(got["Y_float"]).astype(t)
            if spec.quantize == "static":
                want_q = ops.reference.quantize_linear(y_float, quant["Y_scale"],
                                                       quant.get("Y_zero_point", np.uint8(0)))
            else:
                want_q, scale, zero_point = ops.reference.dynamic_quantize_linear(y_float)
                assert got["Y_scale"].tobytes() == scale.tobytes(), (op, got["Y_scale"], scale)
                assert got["Y_zero_point"].tobytes() == zero_point.tobytes(), (
                    op, got["Y_zero_point"], zero_point)
            assert got["Y"].dtype == want_q.dtype, op
            if want_q.dtype == F8:
                assert_float8_equal(got["Y"], want_q)
            else:
                assert np.array_equal(got["Y"], want_q), op
            alone = run(single_node_model(op, given, attrs, functions=False,
                                          optional_outputs=False), given, with_library=True)
            assert alone[0].dtype == got["Y"].dtype and alone[0].tobytes() == got["Y"].tobytes(), op
            quantized += 1
try:
    bad = {"X": np.ones((2, 8), np.float32), "Scale": np.ones(7, np.float32)}
    run(single_node_model("RMSNorm", bad, functions=False), bad, with_library=True)
    print("bad Scale accepted")
except Exception as e:
    print("ERROR:", e)
loaded = sys.argv[2] in open("/proc/self/maps").read()
print(f"RESULT: {checked} checked ({mixed} mixed), {gated} gated, {l2} L2, "
      f"{quantized} quantized checked, CUDA library loaded: {loaded}")
"""


@pytest.mark.slow
@needs_host_compiler_and_proc
def test_cuda_glue_in_host_emulation(tmp_path):
    """The ORT glue of the CUDA kernels, end to end without a GPU: a CPU library whose CUDA rows
    claim the CPU provider (a test build) registers them only when a CUDA library sits next to
    it; with the host-emulated CUDA library there, ORT creates the CUDA kernels, which load it
    and launch through it, with the same shape checks and error texts as the CPU kernels; a CUDA
    library that cannot be loaded, or is another library, is a clear error naming it."""
    with_cuda, without, broken, foreign = (
        tmp_path / name for name in ("with", "without", "broken", "foreign")
    )
    for folder in (with_cuda, without, broken, foreign):
        folder.mkdir()
    cpu = glue_library(with_cuda)
    cuda_harness.build_emulation(with_cuda)
    for folder in (without, broken, foreign):
        shutil.copy(cpu, folder / cpu.name)
    (broken / "libonnxnorm_cuda_ops.so").write_bytes(b"")
    shutil.copy(cpu, foreign / "libonnxnorm_cuda_ops.so")

    def glue(folder: Path, mode: str) -> str:
        cuda = str(folder / "libonnxnorm_cuda_ops.so")
        return run_python("-c", _GLUE_RUN, mode, cuda, timeout=900, library=folder / cpu.name)

    out = glue(with_cuda, "runs")
    # two shapes for each row (T, S, U) of the registration table, the mixed ones (U float32
    # for a 16-bit T) in both orders; the static quantized ops without a zero point, with a
    # uint8, an int8 and a float8 one
    floats = mixed = 0
    for spec in ops.catalogue.FLOAT_OPS.values():
        if spec.gated or spec.norm == "l2":
            continue
        for t, _, u in spec.type_sets:
            floats += 2 * (2 if u != t else 1)
            mixed += 4 if u != t else 0
    assert mixed > 0  # (LayerNorm and RMSNorm, a float16 or bfloat16 X)
    # GatedRMSNorm: each (T, S) x 5 gates x 2 shapes; L2Norm: each type x 3 shapes
    gated = len(ops.catalogue.get("GatedRMSNorm").type_sets) * 5 * 2
    l2 = len(ops.catalogue.get("L2Norm").type_sets) * 3
    quantized = sum(
        (1 if spec.quantize == "dynamic" else 4) * len(spec.type_sets) * 2
        for spec in ops.catalogue.QUANTIZED_OPS.values()
    )
    assert (
        f"RESULT: {floats} checked ({mixed} mixed), {gated} gated, {l2} L2, "
        f"{quantized} quantized checked, CUDA library loaded: True"
    ) in out, out
    assert (
        "Status Message: onnxnorm::RMSNorm: Scale of shape [7] does not fit X of shape [2,8]" in out
    ), out
    # no CUDA library: no CUDA rows, and this build has no CPU rows: the domain holds no op
    assert "onnxnorm:RMSNorm(-1) is not a registered function/op" in glue(without, "error")
    out = glue(broken, "error")
    library = broken / "libonnxnorm_cuda_ops.so"
    assert f"onnxnorm::RMSNorm: cannot load the onnxnorm CUDA library {library}" in out, out
    out = glue(foreign, "error")
    assert (
        f"onnxnorm::RMSNorm: {foreign / 'libonnxnorm_cuda_ops.so'} is not the onnxnorm CUDA library"
        in out
    ), out


def _gpu_check(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """tools/gpu_check.sh in a dry run (GPU_CHECK_DRY_RUN=1), OUT=tmp_path/out."""
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "GPU_CHECK_DRY_RUN": "1",
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "out"),
        **env,
    }
    return subprocess.run(
        ["bash", str(root / "tools" / "gpu_check.sh"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def test_gpu_check_script_dry_run(tmp_path):
    """tools/gpu_check.sh with GPU_CHECK_DRY_RUN=1: every step up to the first that needs a GPU
    runs, the build commands are printed, the GPU tests are collected (not run) and the
    benchmarks' command lines are parsed, and the runtimes step exports and lowers its models
    (tools/gpu_runtimes.py --dry-run), so the script stays runnable between GPU sessions."""
    result = _gpu_check(tmp_path, str(tmp_path / "build"))
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    steps = ("machine", "build", "correctness", "bandwidth", "ort", "runtimes", "gqa", "e2e")
    for step in (*steps, "summary"):
        assert f"=== {step}" in out, out
    assert "dry run: cmake -S . -B" in out and "-DONNXNORM_CUDA=ON" in out
    collected = [
        line
        for line in out.splitlines()
        if line.startswith("dry run: ") and "tests/cuda/test_cuda.py" in line
    ]
    assert len(collected) == 2 and all(" tests collected" in line for line in collected), out
    assert "tests/cuda/test_cuda_ort.py" in collected[1]
    assert all("tests/cuda/test_cuda_rotary.py" in line for line in collected)
    assert "dry run: " + sys.executable + " -m onnxnorm.bench.cuda --reps 30" in out
    assert (
        f"dry run: {sys.executable} tests/support/cuda_rotary.py --bench --reps 30 --json " in out
    )
    gqa = "tests/fusion/test_rotary_gqa.py::test_gpu_gqa_norms_match_the_library"
    assert any(
        line.startswith("dry run: ") and gqa in line and "(1 test collected" in line
        for line in out.splitlines()
    ), out
    assert " -m onnxnorm bench e2e --models llama,gemma2 --dtypes float16 " in out
    assert "--devices cuda,cuda-graph --genai fp16 " in out
    runtimes = tmp_path / "build" / "runtimes"
    assert (
        f"dry run: {sys.executable} tools/gpu_runtimes.py --work {runtimes} --markdown "
        f"{runtimes}.md --json {runtimes}.json (6 forms lowered)"
    ) in out
    planned = json.loads((tmp_path / "build" / "runtimes.json").read_text())["rows"]
    assert {(r["form"], r["dtype"], r["outcome"]) for r in planned} == {
        (form, dtype, "not run (dry run)")
        for form in ("ort-cuda", "tensorrt", "webgpu")
        for dtype in ("float32", "float16")
    }
    for form in ("", "-ort-cuda", "-tensorrt", "-webgpu"):
        assert (runtimes / f"llama-float16{form}.onnx").is_file()
    assert not (tmp_path / "build" / "onnxnorm").exists()  # nothing built
    summary = (tmp_path / "out" / "summary.md").read_text()
    outcomes = [line.split("|")[1:3] for line in summary.splitlines()[2:]]
    assert [(s.strip(), o.strip()) for s, o in outcomes] == [
        (step, "ok (dry run)") for step in steps
    ]


def test_gpu_check_steps_run_on_after_a_failure(tmp_path):
    """A step that fails does not stop the next ones; the exit status says one failed; --steps
    runs a selection, in the script's order; an unknown step is refused."""
    result = _gpu_check(
        tmp_path, "--steps", "e2e,bandwidth", GPU_CHECK_E2E_ARGS="--models no-such-family"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    summary = (tmp_path / "out" / "summary.md").read_text().splitlines()[2:]
    assert [line.split("|")[1:3] for line in summary] == [
        [" bandwidth ", " ok (dry run) "],
        [" e2e ", " FAILED (options) "],
    ]
    assert "no-such-family" in result.stderr
    result = _gpu_check(tmp_path, "--steps", "nothing")
    assert result.returncode == 2 and "unknown step nothing" in result.stderr


def test_bench_cuda_is_a_command_and_a_module(capsys):
    """``onnxnorm bench cuda`` and ``python -m onnxnorm.bench.cuda`` (tools/gpu_check.sh) take the
    same options; without a GPU the command says so in one line."""
    from onnxnorm import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "cuda", "--help"])
    assert stop.value.code == 0 and "--library LIBRARY" in capsys.readouterr().out
    result = subprocess.run(
        [sys.executable, "-m", "onnxnorm.bench.cuda", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m onnxnorm.bench.cuda")
    assert "--reps" in result.stdout
    assert cli.main(["bench", "cuda", "--reps", "0"]) == 1
    assert capsys.readouterr().err == "onnxnorm: error: --reps must be at least 1\n"
    if not gpu():
        assert cli.main(["bench", "cuda", "--reps", "1"]) == 1
        assert capsys.readouterr().err == (
            "onnxnorm: error: onnxnorm bench cuda: torch sees no CUDA device\n"
        )


def test_bench_cuda_rows_count_every_byte_the_kernel_moves(monkeypatch):
    """A bandwidth row counts what the launch reads (every input given) and writes (Y, and Sum
    for the residual ops), and judges % of copy against its target; timing and launches faked."""
    import torch

    from onnxnorm.bench import timing
    from onnxnorm.bench.cuda import measure

    launched = []

    class FakeKernels:
        def args(self, op, inputs, y, sum_=None, **attrs):
            return (op, sorted(inputs), sum_ is not None, attrs)

        def launch(self, args):
            launched.append(args)

        def kernel_name(self, args):
            return "fake<" + args[0] + ">"

    monkeypatch.setattr(timing, "cuda_ms", lambda fn, flush, reps: 0.002)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    x = torch.zeros(4, 256, dtype=torch.bfloat16)  # 2 KiB
    scale = torch.zeros(256, dtype=torch.bfloat16)
    skip = measure._measure(
        FakeKernels(), "SkipRMSNorm", "bfloat16", "4x256",
        {"X": x, "Residual": x.clone(), "Scale": scale}, torch.empty_like(x),
        torch.empty_like(x), {}, copy_gbs=4.0, flush=None, reps=3, target=90,
    )  # fmt: skip
    # X, Residual and Scale read, Y and Sum written: 4 * 2048 + 512 bytes in 2 microseconds
    assert skip["gbs"] == pytest.approx((4 * 2048 + 512) / 0.002 / 1e6)
    assert skip["pct_of_copy"] == pytest.approx(100 * skip["gbs"] / 4.0)
    assert skip["kernel"] == "fake<SkipRMSNorm>" and skip["target"] == 90
    assert measure.judge(skip)["met"] is True
    gated = measure._measure(
        FakeKernels(), "GatedRMSNorm", "bfloat16", "4x256", {"X": x, "Gate": x.clone()},
        torch.empty_like(x), None, {"activation": 0, "norm_before_gate": 0},
        copy_gbs=100.0, flush=None, reps=3, target=None,
    )  # fmt: skip
    assert gated["gbs"] == pytest.approx(3 * 2048 / 0.002 / 1e6)
    assert measure.judge(gated)["met"] is None and gated["target"] is None
    # a warm-up launch and the attributes passed through
    attrs = {"activation": 0, "norm_before_gate": 0}
    assert launched[-1] == ("GatedRMSNorm", ["Gate", "X"], False, attrs)
    assert launched[0][2] is True


# ---------------------------------------------------------------------------------------------
# GPU machine
# ---------------------------------------------------------------------------------------------
kernels = kernels_fixture(_native.Kernels)


@needs_gpu
def test_cuda_library_has_the_args_layout_of_the_mirror(kernels):
    from onnxnorm import _native

    assert kernels.layout() == _native.layout()


@needs_gpu
@pytest.mark.parametrize("op", list(ops.catalogue.OPS))
def test_cuda_kernels_match_reference(kernels, op):
    failures = cuda_harness.check(kernels, ops=[op])
    assert not failures, "\n".join(failures[:20])


@needs_gpu
def test_cuda_bad_arguments_refused_before_launch(kernels):
    assert cuda_harness.check_bad_arguments(kernels) == []


@needs_gpu
def test_cuda_kernel_runs_on_the_given_stream(kernels):
    import torch

    from onnxnorm import _native

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    scale = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        args = kernels.args("RMSNorm", {"X": x, "Scale": scale}, y)
        kernels.launch(args, side.cuda_stream)
    side.synchronize()
    want = ops.reference.run("RMSNorm", _native.to_numpy(x[:8]), _native.to_numpy(scale))[0]
    np.testing.assert_allclose(
        _native.to_numpy(y[:8]).astype(np.float32),
        want.astype(np.float32),
        *ops.reference.tolerance(want.dtype),
    )
    assert "regs:" in kernels.kernel_name(args)


@needs_gpu
def test_cuda_empty_input_launches_nothing(kernels):
    import torch

    x = torch.empty(0, 64, device="cuda")
    assert kernels.run("LayerNorm", {"X": x})[0].shape == (0, 64)


def _cuda_provider_inputs(spec, t, s=None):
    """Random X (and Residual) of shape (3, 5, 256) and weights near 1 of type s (default X's
    type) for spec."""
    rng = np.random.default_rng(0)
    arrays = {"X": rng.standard_normal((3, 5, 256)).astype(t)}
    if spec.has_residual:
        arrays["Residual"] = rng.standard_normal((3, 5, 256)).astype(t)
    for name in spec.optional_inputs:
        arrays[name] = (1 + 0.1 * rng.standard_normal(256)).astype(t if s is None else s)
    return arrays


def _float_on_cuda_cases():
    """Every float op x (T, S, U) of its registration rows: a 16-bit X in order A, the mixed
    form (Y float32: U of LayerNorm and RMSNorm) in both orders. (GatedRMSNorm and L2Norm:
    test_ort_gated_and_l2_norms_on_cuda_provider.)"""
    for op, spec in ops.catalogue.FLOAT_OPS.items():
        if spec.gated or spec.norm == "l2":
            continue
        for type_set in spec.type_sets:
            t, s, u = (_native.elem_type_name(v) for v in type_set)
            orders = [1, 0] if u != t else [None if t == "float32" else 1]
            for order in orders:
                y = f"->{u}" if u != t else ""
                order_id = "" if order is None else "-" + "BA"[order]
                yield pytest.param(op, t, s, u, order, id=f"{op}-{t}/{s}{y}{order_id}")


@needs_ort_cuda
@pytest.mark.parametrize("op, dtype, weight_dtype, y_dtype, order", _float_on_cuda_cases())
def test_ort_custom_ops_on_cuda_provider(op, dtype, weight_dtype, y_dtype, order):
    spec = ops.OPS[op]
    t = DTYPES[dtype]
    arrays = _cuda_provider_inputs(spec, t, DTYPES[weight_dtype])
    attrs = {} if order is None else {"cast_before_scale": order}
    if y_dtype != dtype:
        attrs["y_float32"] = 1  # the mixed form: Y float32
    got = run_on_cuda_provider(op, arrays, attrs)
    want = ops.reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **attrs)
    # the mixed form in order B: one rounding, to float32; else X's type's tolerance
    rtol, atol = ops.reference.tolerance(np.float32 if y_dtype != dtype and not order else t)
    if y_dtype != dtype:
        assert got[0].dtype == np.float32, got[0].dtype
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float32), w.astype(np.float32), rtol, atol)


def _gated_and_l2_on_cuda_cases():
    """GatedRMSNorm x (T, S) x rounding order x gate (absent; SiLU or sigmoid, after or before
    the norm); L2Norm x T."""
    spec = ops.OPS["GatedRMSNorm"]
    gates = {"nogate": None, "silu": (0, 1), "sigmoid": (1, 1), "silu-first": (0, 0)}
    gates["sigmoid-first"] = (1, 0)
    for type_set in spec.type_sets:
        t, s = (_native.elem_type_name(v) for v in type_set[:2])
        for order in [0] if t == "float32" else [0, 1]:
            for gate_id, gate in gates.items():
                order_id = "" if t == "float32" else "-" + "BA"[order]
                yield pytest.param(
                    "GatedRMSNorm",
                    t,
                    s,
                    order,
                    gate,
                    id=f"GatedRMSNorm-{t}/{s}{order_id}-{gate_id}",
                )
    for type_set in ops.OPS["L2Norm"].type_sets:
        t = _native.elem_type_name(type_set[0])
        yield pytest.param("L2Norm", t, t, None, None, id=f"L2Norm-{t}")


@needs_ort_cuda
@pytest.mark.parametrize("op, dtype, weight_dtype, order, gate", _gated_and_l2_on_cuda_cases())
def test_ort_gated_and_l2_norms_on_cuda_provider(op, dtype, weight_dtype, order, gate):
    """GatedRMSNorm on the CUDA provider in Qwen3-Next's groups (X [3, 5, 512]: 4 heads of 128
    with one head's Scale) and Mamba2's (X [3, 4096]: 8 groups, a Scale of the whole extent);
    L2Norm over per-head rows [3, 5, 4, 128]; each against the reference."""
    t = DTYPES[dtype]
    rng = np.random.default_rng(0)
    if op == "L2Norm":
        arrays = {"X": rng.standard_normal((3, 5, 4, 128)).astype(t)}
        got = run_on_cuda_provider(op, arrays, {"epsilon": 1e-6})
        want = ops.reference.run(op, arrays["X"], epsilon=1e-6)
        np.testing.assert_allclose(
            np.asarray(got[0], np.float32), want[0].astype(np.float32), *ops.reference.tolerance(t)
        )
        return
    for shape, group, wshape in [((3, 5, 512), 128, (128,)), ((3, 4096), 512, (4096,))]:
        arrays = {
            "X": rng.standard_normal(shape).astype(t),
            "Scale": (1 + 0.1 * rng.standard_normal(wshape)).astype(DTYPES[weight_dtype]),
        }
        attrs = {"cast_before_scale": order, "group_size": group}
        if gate is not None:
            arrays["Gate"] = (2 * rng.standard_normal(shape)).astype(t)
            attrs.update(activation=gate[0], norm_before_gate=gate[1])
        got = run_on_cuda_provider(op, arrays, attrs)
        want = ops.reference.run(op, arrays["X"], arrays["Scale"], arrays.get("Gate"), **attrs)
        np.testing.assert_allclose(
            np.asarray(got[0], np.float32), want[0].astype(np.float32), *ops.reference.tolerance(t)
        )


@needs_ort_cuda
def test_ort_cuda_bad_input_is_an_ort_error():
    arrays = {"X": np.ones((2, 8), np.float32), "Scale": np.ones(7, np.float32)}
    good = {"X": arrays["X"], "Scale": np.ones(8, np.float32)}
    model = single_node_model("RMSNorm", good, functions=False)
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 7
    sess = runtime.session(model, providers=runtime.CUDA_PROVIDERS)
    with pytest.raises(Exception, match="Scale of shape \\[7\\] does not fit"):
        sess.run(None, {"x": arrays["X"], "scale": arrays["Scale"]})


def _quantized_on_cuda_cases():
    for op, spec in ops.catalogue.QUANTIZED_OPS.items():
        for q in ["int8", "float8e4m3fn"] if spec.quantize == "static" else ["uint8"]:
            yield pytest.param(op, q, id=f"{op}-{q}")


@needs_ort_cuda
@pytest.mark.parametrize("op, q", _quantized_on_cuda_cases())
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_ort_quantized_ops_on_cuda_provider(op, q, dtype):
    """A quantized op runs on the CUDA provider (its Y_scale, Y_zero_point inputs and outputs in
    device memory; the dynamic op's scratch from ORT's allocator), its Y exactly the reference
    quantizer's of its Y_float (float8 e4m3fn: the same bits, any NaN where the reference's is),
    and Y_float the float op's Y on the same provider bit for bit."""
    from tests.support.helpers import F8_ZERO_POINT, assert_float8_equal
    from tests.support.matrix import F8

    spec = ops.OPS[op]
    base = ops.OPS[spec.base]
    t = DTYPES[dtype]
    arrays = _cuda_provider_inputs(base, t)
    quant = {}
    if spec.quantize == "static":
        zero_point = F8_ZERO_POINT if q == "float8e4m3fn" else np.asarray(-3, np.int8)
        quant = {
            "Y_scale": np.asarray(0.02 if q == "int8" else 0.002, t),
            "Y_zero_point": zero_point,
        }

    want_float = run_on_cuda_provider(spec.base, arrays)
    got = dict(zip([p.name for p in spec.outputs], run_on_cuda_provider(op, {**arrays, **quant})))
    assert np.asarray(got["Y_float"]).tobytes() == np.asarray(want_float[0]).tobytes()
    if base.has_residual:
        assert np.asarray(got["Sum"]).tobytes() == np.asarray(want_float[1]).tobytes()
    y_float = np.asarray(got["Y_float"])  # bfloat16 comes back as uint16 bits or as float32
    y_float = y_float.view(t) if y_float.dtype == np.uint16 else y_float.astype(t)
    if spec.quantize == "static":
        want = ops.reference.quantize_linear(y_float, quant["Y_scale"], quant["Y_zero_point"])
    else:
        want, scale, zero_point = ops.reference.dynamic_quantize_linear(y_float)
        assert got["Y_scale"].tobytes() == scale.tobytes()
        assert got["Y_zero_point"].tobytes() == zero_point.tobytes()
    assert got["Y"].dtype == want.dtype
    if want.dtype == F8:
        assert_float8_equal(got["Y"], want)
    else:
        assert np.array_equal(got["Y"], want)

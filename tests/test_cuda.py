"""The CUDA kernels.

On any machine: the CUDA library is built when nvcc is (without a runtime dependency on
libcudart), the CUDA sources compile with nvcc, importing onnxnorm and running CPU ops loads no
CUDA library, and the kernels' logic passes the correctness matrix in a host emulation
(custom_ops/cuda/emulation). On a GPU machine (torch.cuda available and the library built): every op,
dtype, rounding order and optional input against the reference through the C launchers
(onnxnorm.bench.cuda), bad arguments refused before launch, launches on the given stream, and,
where onnxruntime offers the CUDA execution provider, the ORT custom ops on it. The CUDA library
is never loaded on a machine without a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from onnxnorm import OnnxNormError, ops, runtime

ROOT = Path(__file__).resolve().parents[1]
CUDA_DIR = ROOT / "custom_ops" / "cuda"
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)


def _cuda_library() -> Path | None:
    try:
        return runtime.cuda_library_path()
    except OnnxNormError:
        return None


def _gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


needs_gpu = pytest.mark.skipif(not (_gpu() and _cuda_library() is not None),
                               reason="needs a CUDA GPU visible to torch and the built CUDA library")


# ---------------------------------------------------------------------------------------------
# Any machine
# ---------------------------------------------------------------------------------------------
def test_cuda_library_built_when_nvcc_present():
    """With nvcc, the build (ONNXNORM_CUDA=AUTO) makes the CUDA library: checked from its file,
    never loaded here."""
    info = runtime.build_info()
    if not info.get("cuda"):
        if NVCC and os.environ.get("ONNXNORM_CUDA", "AUTO").upper() == "AUTO":
            pytest.fail("nvcc is on this machine but the installed build has no CUDA library")
        pytest.skip("the installed build was made without CUDA")
    path = _cuda_library()
    assert path is not None and path.is_file()
    if not shutil.which("readelf"):
        pytest.skip("no readelf to inspect the library")
    symbols = subprocess.run(["readelf", "--dyn-syms", "-W", str(path)], capture_output=True,
                             text=True, check=True).stdout
    for name in ("RegisterCustomOps", "onnxnorm_cuda_launch", "onnxnorm_cuda_kernel_name",
                 "onnxnorm_cuda_op_manifest"):
        assert name in symbols, f"{path} does not export {name}"
    needed = subprocess.run(["readelf", "-d", "-W", str(path)], capture_output=True, text=True,
                            check=True).stdout
    assert "libcudart" not in needed, "the CUDA runtime must be linked statically"
    assert "libonnxruntime" not in needed


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on this machine")
def test_cuda_sources_compile_with_nvcc():
    """The launcher and one op's kernels compile for sm_80 (a quick check of the sources; the
    package build compiles them all)."""
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [subprocess.Popen([NVCC, "-std=c++17", "-O1", "-arch=sm_80", "-c", str(CUDA_DIR / name),
                                  "-o", os.path.join(tmp, name + ".o")],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for name in ("launch.cu", "ops_skip_rms_norm.cu")]
        for job in jobs:
            out, _ = job.communicate(timeout=300)
            assert job.returncode == 0, out


def test_importing_onnxnorm_and_running_cpu_ops_loads_no_cuda():
    code = r"""
import numpy as np, onnxruntime as ort
from onnx import helper, TensorProto
import onnxnorm
from onnxnorm import runtime
node = helper.make_node("RMSNorm", ["x"], ["y"], domain="onnxnorm")
graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("onnxnorm", 1)])
sess = runtime.session(model)
sess.run(None, {"x": np.ones((2, 8), np.float32)})
maps = open("/proc/self/maps").read()
bad = [name for name in ("onnxnorm_cuda", "libcudart", "libcuda.so", "libcublas") if name in maps]
print("LOADED:" + ",".join(bad))
"""
    if not Path("/proc/self/maps").is_file():
        pytest.skip("needs /proc")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "LOADED:", result.stdout


def test_runtime_cuda_helpers_without_loading():
    path = _cuda_library()
    if path is None:
        with pytest.raises(OnnxNormError, match="CUDA library is not built"):
            runtime.cuda_library_path()
    else:
        assert path.name.startswith("libonnxnorm_cuda_ops")
    assert isinstance(runtime.cuda_available(), bool)


_EMULATION_RUN = r"""
import sys, types
import torch
from onnxnorm.bench import cuda
# the harness on host memory: CPU tensors, no streams
torch.Tensor.cuda = lambda self, *a, **k: self
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.current_stream = lambda *a, **k: types.SimpleNamespace(cuda_stream=0)
def _no_device(f):
    def g(*a, **k):
        k.pop("device", None)
        return f(*a, **k)
    return g
torch.empty = _no_device(torch.empty)
torch.zeros = _no_device(torch.zeros)
kernels = cuda.Kernels(sys.argv[1])
failures = cuda.check(kernels, quick=True)
problems = cuda.check_bad_arguments(kernels)

# the ORT glue: its op table says what the catalogue says, and RegisterCustomOps joins the CPU
# library's domain (the CPU kernels run; the CUDA ones would on the CUDA provider), twice
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
from onnxnorm import ops, runtime
for entry in kernels.manifest()["ops"]:
    spec = ops.OPS[entry["name"]]
    if (entry["inputs"], entry["optional_inputs"], entry["outputs"], sorted(entry["attributes"])) != (
            [p.name for p in spec.inputs], list(spec.optional_inputs), [p.name for p in spec.outputs],
            sorted(a.name for a in spec.attributes)):
        problems.append(f"glue op table differs from the catalogue for {entry['name']}: {entry}")
if sorted(e["name"] for e in kernels.manifest()["ops"]) != sorted(ops.OPS):
    problems.append("glue op table does not hold every catalogue op")
node = helper.make_node("SkipRMSNorm", ["x", "r"], ["y", "s"], domain="onnxnorm")
vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 16])
model = helper.make_model(helper.make_graph([node], "g", [vi("x"), vi("r")], [vi("y"), vi("s")]),
                          opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("onnxnorm", 1)])
x, r = np.random.default_rng(0).standard_normal((2, 2, 16)).astype(np.float32)
want = ops.reference.run("SkipRMSNorm", x, r)
for attempt in range(2):
    options = ort.SessionOptions()
    options.register_custom_ops_library(sys.argv[1])
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x, "r": r})
    if not all(np.allclose(g, w, 1e-5, 1e-5) for g, w in zip(got, want)):
        problems.append(f"registration {attempt}: CPU kernels through the CUDA glue's domain differ")
print("\n".join(failures[:30] + problems))
sys.exit(1 if failures or problems else 0)
"""


def _ort_headers() -> Path | None:
    for folder in (os.environ.get("ONNXRUNTIME_INCLUDE_DIR"), "/usr/include/onnxruntime",
                   str(ROOT / "third_party" / "onnxruntime" / "include")):
        if folder and (Path(folder) / "onnxruntime_c_api.h").is_file():
            return Path(folder)
    return None


@pytest.mark.slow
def test_cuda_kernel_logic_in_host_emulation():
    """Without a GPU: the kernels of norm_kernels.cuh and the real launcher (launch.cu), compiled
    by the host compiler with stand-ins for the CUDA headers (custom_ops/cuda/emulation: threads
    of a block are std::threads, shuffles and __syncthreads barriers), run the harness's quick
    correctness matrix against the reference: every op, dtype, weight dtype, rounding order,
    kernel configuration and the general kernel; and the ORT glue compiled with it registers into
    a CPU onnxruntime session by joining the CPU library's domain. GPU-specific behaviour (memory
    model, speed, the CUDA provider) is left to the GPU tests."""
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    headers = _ort_headers()
    if headers is None:
        pytest.skip("no ONNX Runtime headers")
    emulation = CUDA_DIR / "emulation"
    with tempfile.TemporaryDirectory() as tmp:
        library = os.path.join(tmp, "libonnxnorm_cuda_emulation.so")
        build = subprocess.run(
            [cxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", f"-I{emulation}", f"-I{CUDA_DIR}",
             f"-I{headers}", "-DONNXNORM_CUDA_HOST_EMULATION=1", "-DONNXNORM_CUDA_ARCHS=host-emulation",
             str(emulation / "host_emulation.cc"), str(CUDA_DIR / "ort_cuda_ops.cc"), "-x", "c++",
             str(CUDA_DIR / "launch.cu"), "-o", library, "-ldl"],
            capture_output=True, text=True, timeout=600)
        if build.returncode != 0 and "barrier" in build.stderr:
            pytest.skip("the host compiler lacks C++20 <barrier>")
        assert build.returncode == 0, build.stderr[-4000:]
        env = dict(os.environ, ONNXNORM_LIBRARY=str(runtime.library_path()))
        run = subprocess.run([sys.executable, "-c", _EMULATION_RUN, library], capture_output=True, text=True,
                             timeout=1200, cwd=ROOT, env=env)
        assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
        assert "CUDA kernel cases passed" in run.stdout


# ---------------------------------------------------------------------------------------------
# GPU machine
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernels():
    from onnxnorm.bench import cuda

    return cuda.Kernels(_cuda_library())


@needs_gpu
def test_cuda_manifest_matches_catalogue(kernels):
    manifest = kernels.manifest()
    assert manifest["domain"] == ops.DOMAIN
    assert sorted(e["name"] for e in manifest["ops"]) == sorted(ops.OPS)
    for entry in manifest["ops"]:
        spec = ops.OPS[entry["name"]]
        assert entry["inputs"] == [p.name for p in spec.inputs]
        assert entry["optional_inputs"] == list(spec.optional_inputs)
        assert entry["outputs"] == [p.name for p in spec.outputs]
        assert sorted(entry["attributes"]) == sorted(a.name for a in spec.attributes)


@needs_gpu
@pytest.mark.parametrize("op", list(ops.OPS))
def test_cuda_kernels_match_reference(kernels, op):
    from onnxnorm.bench import cuda

    failures = cuda.check(kernels, ops=[op])
    assert not failures, "\n".join(failures[:20])


@needs_gpu
def test_cuda_bad_arguments_refused_before_launch(kernels):
    from onnxnorm.bench import cuda

    assert cuda.check_bad_arguments(kernels) == []


@needs_gpu
def test_cuda_kernel_runs_on_the_given_stream(kernels):
    import torch

    from onnxnorm.bench import cuda

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    scale = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        args = kernels.args("RMSNorm", {"X": x, "Scale": scale}, y)
        kernels.launch(args, side.cuda_stream)
    side.synchronize()
    want = ops.reference.run("RMSNorm", cuda.to_numpy(x[:8]), cuda.to_numpy(scale))[0]
    np.testing.assert_allclose(cuda.to_numpy(y[:8]).astype(np.float32), want.astype(np.float32),
                               *ops.reference.tolerance(want.dtype))
    assert "regs:" in kernels.kernel_name(args)


@needs_gpu
def test_cuda_empty_input_launches_nothing(kernels):
    import torch

    x = torch.empty(0, 64, device="cuda")
    assert kernels.run("LayerNorm", {"X": x})[0].shape == (0, 64)


def _ort_cuda():
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


needs_ort_cuda = pytest.mark.skipif(not (_gpu() and _cuda_library() is not None and _ort_cuda()),
                                    reason="needs onnxruntime-gpu with the CUDA execution provider")


@needs_ort_cuda
@pytest.mark.parametrize("op", list(ops.OPS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_ort_custom_ops_on_cuda_provider(op, dtype):
    import ml_dtypes
    import onnx
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import BF16, single_node_model

    spec = ops.OPS[op]
    t = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(0)
    arrays = {"X": rng.standard_normal((3, 5, 256)).astype(t)}
    if spec.has_residual:
        arrays["Residual"] = rng.standard_normal((3, 5, 256)).astype(t)
    for name in spec.optional_inputs:
        arrays[name] = (1 + 0.1 * rng.standard_normal(256)).astype(t)
    attrs = {"cast_before_scale": 1} if dtype != "float32" else {}
    model = single_node_model(op, arrays, attrs, functions=False)
    options = ort.SessionOptions()
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = os.path.join(folder, "p")
        sess = runtime.cuda_session(model, options)
        feeds = {}
        for name, value in arrays.items():
            if value.dtype == BF16:
                feeds[name.lower()] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    value.view(np.uint16), onnx.TensorProto.BFLOAT16)
            else:
                feeds[name.lower()] = ort.OrtValue.ortvalue_from_numpy(value)
        got = [v.numpy() for v in sess.run_with_ort_values(None, feeds)]
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    providers = {e["args"].get("provider") for e in events
                 if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == op}
    assert providers == {"CUDAExecutionProvider"}, providers
    want = ops.reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **attrs)
    rtol, atol = ops.reference.tolerance(t)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float32), w.astype(np.float32), rtol, atol)


@needs_ort_cuda
def test_ort_cuda_bad_input_is_an_ort_error():
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import single_node_model

    arrays = {"X": np.ones((2, 8), np.float32), "Scale": np.ones(7, np.float32)}
    model = single_node_model("RMSNorm", {"X": arrays["X"], "Scale": np.ones(8, np.float32)},
                              functions=False)
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 7
    sess = runtime.cuda_session(model)
    with pytest.raises(Exception, match="Scale of shape \\[7\\] does not fit"):
        sess.run(None, {"x": arrays["X"], "scale": arrays["Scale"]})

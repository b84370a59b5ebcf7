"""The CUDA kernels of the rotary ops (RMSNormRotary, LayerNormRotary, L2NormRotary) and their ORT
glue.

On any machine: the kernels' logic passes the rotary correctness matrix in the host emulation
(custom_ops/cuda/emulation, tests/support/cuda_rotary.py), with the launcher's refusals and the
ctypes mirrors' layout; the ORT glue of the CUDA rows (the CPU library's rotary kernel with the
CUDA library's launcher) runs end to end in a CPU session against that emulation; the rotary
units compile with nvcc; the bandwidth rows' options parse. On a GPU machine (torch.cuda available
and the library built): the matrix through the C launcher, and, where onnxruntime offers the CUDA
execution provider, the rotary ops on it.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from onnxnorm import _native, ops
from tests.support import cuda_common, cuda_rotary
from tests.support.cuda_harness import build_emulation
from tests.support.gpu import needs_gpu, needs_ort_cuda, run_on_cuda_provider
from tests.support.matrix import DTYPES


# ---------------------------------------------------------------------------------------------
# Any machine
# ---------------------------------------------------------------------------------------------
@cuda_common.needs_host_compiler
def test_rotary_kernel_logic_in_host_emulation():
    """Without a GPU: the rotary kernels, their launch table and the launcher, compiled by the
    host compiler (a block's threads as fibers), pass the quick matrix against the reference
    (every op x type x layout form x half-split or interleaved x rotary_first, each kernel
    configuration and the general kernel, NaN and Inf, an out-of-range position id, an empty
    call), refuse bad arguments in the CPU kernel's words, and export the mirrors' layout."""
    out = cuda_common.run_python(str(cuda_rotary.__file__), "--emulation", "--quick", timeout=900)
    passed = [line for line in out.splitlines() if "CUDA rotary kernel cases passed" in line]
    assert passed and passed[0].split("/")[0] == passed[0].split("/")[1].split()[0], out[-3000:]


@cuda_common.needs_nvcc
def test_rotary_sources_compile_with_nvcc():
    """The launcher and one norm's rotary kernels compile for sm_80. Where the installed build
    has the CUDA library, the package build compiled them all with this nvcc."""
    cuda_common.compile_with_nvcc("launch.cu", "ops_rotary_rms_norm.cu")


def test_rotary_bench_options():
    """The bandwidth rows (tools/gpu_check.sh's bandwidth step) parse their options; without a
    GPU they say so."""
    script = str(cuda_rotary.__file__)
    result = subprocess.run(
        [sys.executable, script, "--bench", "--help"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "--reps" in result.stdout, result.stderr
    result = subprocess.run(
        [sys.executable, script, "--bench", "--reps", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "--reps must be at least 1" in result.stderr


_GLUE_RUN = r"""
import itertools
import sys
import numpy as np
sys.path.insert(0, ".")  # the checkout (the test runs this in it): tests.support
from tests.support.cuda_rotary import make_case
from tests.support.helpers import run
from tests.support.matrix import F32
from onnxnorm import ops
from onnxnorm.testing.graphs import numpy_type, single_node_model


def outputs(op, arrays, attrs, k_out=None):
    k_out = "K" in arrays if k_out is None else k_out
    model = single_node_model(op, arrays, attrs, functions=False,
                              optional_outputs=("KOut",) if k_out else False)
    return run(model, arrays, with_library=True)


def reference(op, arrays, attrs):
    spec = ops.catalogue.ROTARY_OPS[op]
    return ops.reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **attrs)


rng = np.random.default_rng(0)
checked = 0
# every (T, S, A) row of each op: heads of 64 with K in layout 0 (sub-warp rows); a 3-D Q in
# layout 2 normalized per token, interleaved and partial (a block per row); layout 1 rotated
# first with one angle per value per token
shapes = [dict(layout=0, heads=(4, 2)),
          dict(layout=2, rank3=True, per_head=0, heads=(8, 2), head_size=128, interleaved=1,
               rotary_dim=64, weights="per-head"),
          dict(layout=1, rotary_first=1, cache="value-token", with_k=False, rotary_in_t=1)]
for op, spec in ops.catalogue.ROTARY_OPS.items():
    for (t, s, _), a in itertools.product(spec.type_sets, (0, 1)):
        t, s = numpy_type(t), numpy_type(s)
        if a and t == F32:
            continue
        for kw in shapes:
            kw = {"w_type": s, "a_type": F32 if a else t, "order": int(t != F32), **kw}
            arrays, attrs = make_case(op, t, rng, **kw)
            got = outputs(op, arrays, attrs)
            want = reference(op, arrays, attrs)
            assert len(got) == len(want), (op, kw)
            for g, w in zip(got, want):
                assert g.shape == w.shape, (op, kw, g.shape, w.shape)
                np.testing.assert_allclose(np.asarray(g, np.float32), w.astype(np.float32),
                                           *ops.reference.tolerance(t), err_msg=f"{op} {kw}")
            checked += 1
# K without KOut: Q alone computed
arrays, attrs = make_case("RMSNormRotary", F32, rng)
got = outputs("RMSNormRotary", arrays, attrs, k_out=False)
assert len(got) == 1
np.testing.assert_allclose(got[0], reference("RMSNormRotary", arrays, attrs)[0], 1e-5, 1e-5)
# a position id past Cos's rows: on the CUDA rows, the token's rotated values NaN, no error
arrays, attrs = make_case("RMSNormRotary", F32, rng)
arrays["PositionIds"][1, 2] = 40
got = outputs("RMSNormRotary", arrays, attrs)
print("NaN token:", bool(np.isnan(got[0][1, 2]).all()), "others finite:",
      bool(np.isfinite(got[0][0]).all()))
# an odd rotary_dim: the glue's own error, as on the CPU
arrays, attrs = make_case("RMSNormRotary", F32, rng, rotary_dim=6, head_size=16)
attrs["rotary_dim"] = 7
try:
    outputs("RMSNormRotary", arrays, attrs)
    print("odd rotary_dim accepted")
except Exception as e:
    print("ERROR:", e)
loaded = sys.argv[1] in open("/proc/self/maps").read()
print(f"RESULT: {checked} checked, CUDA library loaded: {loaded}")
"""


@cuda_common.needs_host_compiler_and_proc
def test_rotary_glue_in_host_emulation(tmp_path):
    """The ORT glue of the rotary ops' CUDA rows, end to end without a GPU: a CPU library whose
    CUDA rows claim the CPU provider (a test build) creates the rotary kernels of its CUDA rows,
    which load the host-emulated CUDA library and launch through its rotary launcher: every
    (T, S, A) row of each op against the reference, K without KOut, an out-of-range position id
    (NaN, no error: the ids are device memory there), the shape checks' errors as on the CPU."""
    cpu = cuda_common.glue_library(tmp_path)
    cuda = build_emulation(tmp_path)
    out = cuda_common.run_python("-c", _GLUE_RUN, str(cuda), timeout=900, library=cpu)
    rows = sum(
        len(spec.type_sets) + sum(1 for t, _, _ in spec.type_sets if t != "tensor(float)")
        for spec in ops.catalogue.ROTARY_OPS.values()
    )
    assert f"RESULT: {3 * rows} checked, CUDA library loaded: True" in out, out
    assert "NaN token: True others finite: True" in out, out
    assert "rotary_dim must be even and at most head_size 16, got 7" in out, out


# ---------------------------------------------------------------------------------------------
# GPU machine
# ---------------------------------------------------------------------------------------------
kernels = cuda_common.kernels_fixture(cuda_rotary.RotaryKernels)


@needs_gpu
def test_cuda_rotary_mirrors_have_the_library_layout(kernels):
    assert cuda_rotary.check_layout(kernels) == []


@needs_gpu
def test_cuda_rotary_kernels_match_reference(kernels):
    failures = cuda_rotary.check(kernels)
    assert not failures, "\n".join(failures[:20])


@needs_gpu
def test_cuda_rotary_bad_arguments_refused_before_launch(kernels):
    assert cuda_rotary.check_bad_arguments(kernels) == []


def _rotary_on_cuda_cases():
    for op, spec in ops.catalogue.ROTARY_OPS.items():
        for t, s, _ in spec.type_sets:
            t, s = _native.elem_type_name(t), _native.elem_type_name(s)
            for a in dict.fromkeys((t, "float32")):
                yield pytest.param(op, t, s, a, id=f"{op}-{t}/{s}/{a}")


@needs_ort_cuda
@pytest.mark.parametrize("op, dtype, weight_dtype, angle_dtype", _rotary_on_cuda_cases())
def test_ort_rotary_ops_on_cuda_provider(op, dtype, weight_dtype, angle_dtype):
    """Each (T, S, A) row of the rotary ops runs on the CUDA provider (Qwen3's decode shape: 32
    query and 8 key heads of 128, the half-width cache by position), within the reference's
    tolerance."""
    rng = np.random.default_rng(0)
    t = DTYPES[dtype]
    arrays, attrs = cuda_rotary.make_case(
        op,
        t,
        rng,
        w_type=DTYPES[weight_dtype],
        a_type=DTYPES[angle_dtype],
        heads=(32, 8),
        head_size=128,
        batch=1,
        seq=4,
    )
    got = run_on_cuda_provider(op, arrays, attrs)
    spec = ops.catalogue.ROTARY_OPS[op]
    want = ops.reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **attrs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(
            np.asarray(g, np.float32), w.astype(np.float32), *ops.reference.tolerance(t)
        )

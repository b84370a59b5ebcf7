"""The native library in ONNX Runtime: registration, the RMSNorm kernel against the reference,
and the same file running through the function body (plain ORT) or the kernel (library)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import onnxnorm
from onnxnorm import OnnxNormError, ops, runtime
from onnxnorm.testing.graphs import single_node_model
from tests.support.helpers import reference_outputs, run

BODY_OPS = {"ReduceMean", "Sqrt", "Div", "Flatten", "LayerNormalization", "RMSNormalization"}


def _run_kernel(op, arrays, attrs=None, threads=1):
    model = single_node_model(op, arrays, attrs, functions=False)
    return run(model, arrays, with_library=True, threads=threads)


def test_library_is_built_and_registers():
    path = runtime.library_path()
    assert path.is_file()
    options = runtime.register()
    assert isinstance(options, ort.SessionOptions)
    assert runtime.build_info()["ort_api_version"] >= 21


def test_library_paths_of_both_kinds(monkeypatch, tmp_path):
    cpu = runtime.library_path("cpu")
    assert cpu == runtime.library_path() and cpu.name == "libonnxnorm_ops.so"
    try:
        cuda = runtime.library_path("cuda")
    except OnnxNormError as e:
        assert "CUDA library is not built" in str(e) and not runtime.build_info().get("cuda")
    else:
        assert cuda == cpu.parent / "libonnxnorm_cuda_ops.so" and cuda.is_file()
    with pytest.raises(ValueError, match="library kind"):
        runtime.library_path("gpu")
    # $ONNXNORM_LIBRARY names the CPU library; the CUDA library is the one next to it
    own = tmp_path / "libonnxnorm_ops.so"
    own.write_bytes(b"")
    monkeypatch.setenv(runtime.ENV_LIBRARY, str(own))
    assert runtime.library_path() == own
    with pytest.raises(OnnxNormError, match=str(tmp_path / "libonnxnorm_cuda_ops.so")):
        runtime.library_path("cuda")
    (tmp_path / "libonnxnorm_cuda_ops.so").write_bytes(b"")
    assert runtime.library_path("cuda") == tmp_path / "libonnxnorm_cuda_ops.so"


def test_one_registration_for_every_provider_list_leaves_the_environment_alone(rng):
    """register() and session() are one call whatever the providers; asking for CUDA on an
    onnxruntime without it runs the CPU kernel. Nothing is written into os.environ."""
    import os

    before = dict(os.environ)
    arrays = {"X": rng.standard_normal((3, 16)).astype(np.float32)}
    model = single_node_model("RMSNorm", arrays, functions=False)
    want = reference_outputs("RMSNorm", arrays)[0]
    for providers in (None, runtime.CUDA_PROVIDERS):
        if providers and runtime.cuda_available():
            continue  # runs on the GPU there: tests/cuda/test_cuda.py
        got = runtime.session(model, providers=providers).run(None, {"x": arrays["X"]})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert runtime.executed_ops(model, {"x": arrays["X"]}, providers=providers) == {
            "RMSNorm": 1
        }
    assert isinstance(runtime.register(), ort.SessionOptions)
    assert dict(os.environ) == before


def test_runtime_older_than_headers_is_refused_by_name():
    built = runtime.build_info()["ort_api_version"]
    with pytest.raises(
        OnnxNormError,
        match=rf"onnxruntime 1\.{built - 1}\.0 provides C API "
        rf"version {built - 1}, older than .* {built}",
    ):
        runtime.check_compatible(f"1.{built - 1}.0")
    runtime.check_compatible(f"1.{built}.0")


RMS_CASES = {
    "scale": ({"Scale": (16,)}, {}),
    "no-scale": ({}, {}),
    "scale-bias": ({"Scale": (16,), "Bias": (16,)}, {"epsilon": 1e-3}),
    "gemma-offset": ({"Scale": (16,)}, {"scale_offset": 1.0}),
    "offset-no-scale": ({}, {"scale_offset": 0.5}),
    "axis-2": ({"Scale": (5, 16)}, {"axis": -2}),
    "per-head-scale": ({"Scale": (5, 16)}, {}),
    "broadcast-leading-ones": ({"Scale": (1, 1, 16)}, {}),
    "order-a-float32": ({"Scale": (16,)}, {"cast_before_scale": 1}),
}


@pytest.mark.parametrize("case", RMS_CASES)
def test_rms_norm_kernel_matches_reference(case, rng):
    shapes, attrs = RMS_CASES[case]
    arrays = {"X": rng.standard_normal((3, 5, 16)).astype(np.float32)}
    arrays.update({k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()})
    got = _run_kernel("RMSNorm", arrays, attrs)[0]
    np.testing.assert_allclose(
        got, reference_outputs("RMSNorm", arrays, attrs)[0], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("rows, cols", [(4096, 512), (1, 4096), (7, 3)])
def test_rms_norm_kernel_threaded(rows, cols, rng):
    arrays = {
        "X": rng.standard_normal((rows, cols)).astype(np.float32),
        "Scale": rng.standard_normal(cols).astype(np.float32),
    }
    got = _run_kernel("RMSNorm", arrays, threads=2)[0]
    np.testing.assert_allclose(got, reference_outputs("RMSNorm", arrays)[0], rtol=1e-5, atol=1e-5)


def test_empty_batch_gives_empty_output():
    arrays = {"X": np.zeros((0, 16), np.float32), "Scale": np.ones(16, np.float32)}
    assert _run_kernel("RMSNorm", arrays)[0].shape == (0, 16)


def test_nan_and_inf_propagate_as_in_reference():
    x = np.ones((3, 8), np.float32)
    x[0, 1], x[1, 2] = np.nan, np.inf
    got = _run_kernel("RMSNorm", {"X": x})[0]
    want = reference_outputs("RMSNorm", {"X": x})[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[2], want[2], rtol=1e-6)


@pytest.mark.parametrize(
    "arrays, attrs, message",
    [
        ({"X": (2, 16)}, {"axis": 2}, "axis"),
        ({"X": (2, 16)}, {"axis": -3}, "axis"),
        ({"X": (2, 16), "Scale": (8,)}, {}, "Scale"),
        ({"X": (2, 16), "Bias": (2, 8)}, {}, "Bias"),
        ({"X": (2, 16)}, {"epsilon": -1.0}, "epsilon"),
        ({"X": (2, 16)}, {"cast_before_scale": 3}, "cast_before_scale"),
        ({"X": (2, 0)}, {}, "zero"),
    ],
)
def test_rms_norm_kernel_bad_input_is_a_clear_error(arrays, attrs, message):
    arrays = {k: np.ones(s, np.float32) for k, s in arrays.items()}
    with pytest.raises(
        Exception, match=rf"onnxnorm::RMSNorm.*{message}|{message}.*onnxnorm::RMSNorm"
    ):
        _run_kernel("RMSNorm", arrays, attrs)


def test_same_file_runs_body_without_library_and_kernel_with_it(tmp_path, rng):
    """The exported file holds onnxnorm nodes with their function bodies: plain ORT inlines the
    body; ORT with the library runs the kernel. ORT's profiler shows which one ran."""
    torch.manual_seed(0)
    norm = onnxnorm.nn.RMSNorm(64, eps=1e-6).eval()
    with torch.no_grad():
        norm.weight.copy_(1 + 0.2 * torch.randn(64))
    x = rng.standard_normal((2, 9, 64)).astype(np.float32)
    path = tmp_path / "norm.onnx"
    onnxnorm.export(norm, (torch.from_numpy(x),), path)
    feeds = {"x": x}
    want = ops.reference.run("RMSNorm", x, norm.weight.detach().numpy(), epsilon=1e-6)[0]

    plain = runtime.executed_ops(path, feeds, with_library=False)
    assert plain["RMSNorm"] == 0 and BODY_OPS & set(plain), plain
    with_library = runtime.executed_ops(path, feeds, with_library=True)
    assert with_library == {"RMSNorm": 1}, with_library

    for use_library in (False, True):
        got = runtime.session(path, with_library=use_library).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

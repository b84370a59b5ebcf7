"""What the GPU tests need: whether there is a GPU, the CUDA library and ONNX Runtime's CUDA
provider (each a skip marker), and a one-node model run on that provider."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from onnxnorm import OnnxNormError, runtime
from onnxnorm.testing.graphs import single_node_model


def cuda_library() -> Path | None:
    """The built CUDA library, or None."""
    try:
        return runtime.library_path("cuda")
    except OnnxNormError:
        return None


def gpu() -> bool:
    """Whether torch sees a CUDA GPU."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def ort_cuda() -> bool:
    """Whether the installed ONNX Runtime offers the CUDA execution provider."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


needs_gpu = pytest.mark.skipif(
    not (gpu() and cuda_library() is not None),
    reason="needs a CUDA GPU visible to torch and the built CUDA library",
)
needs_ort_cuda = pytest.mark.skipif(
    not (gpu() and cuda_library() is not None and ort_cuda()),
    reason="needs onnxruntime-gpu with the CUDA execution provider",
)


def run_on_cuda_provider(op, arrays, attrs=None):
    """A one-node model of op run on ORT's CUDA provider with the onnxnorm library; its outputs,
    after checking from ORT's profile that the node ran on the CUDA provider."""
    import onnxruntime as ort

    from tests.support.helpers import run_session

    model = single_node_model(op, arrays, attrs, functions=False)
    options = ort.SessionOptions()
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = os.path.join(folder, "p")
        sess = runtime.session(model, options, providers=runtime.CUDA_PROVIDERS)
        got = run_session(sess, arrays)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    providers = {
        e["args"].get("provider")
        for e in events
        if e.get("cat") == "Node" and e.get("args", {}).get("op_name") == op
    }
    assert providers == {"CUDAExecutionProvider"}, providers
    return got

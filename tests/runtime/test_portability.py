"""The portability matrix (tests/support/portability.py): every target and ``--for`` form of the
fusion tests' decoders on ONNX Runtime with and without the library, on the OpenVINO plugin
execution provider, OpenVINO, tract and onnx's reference evaluator: loads, runs, parity with
the original model, and where the nodes ran. A runtime that cannot run on this machine makes
its cells skip with the reason, never pass."""

from __future__ import annotations

import pytest

from onnxnorm import targets
from onnxnorm.deploy import runners
from tests.support import portability as P

pytestmark = pytest.mark.slow

#: parity: the decoders' outputs are O(1); float32 throughout, norms in float32, so every
#: runtime agrees to a few units of float32 rounding of the sums the layers take. The quantized
#: decoder rounds activations to uint8 steps, and a runtime that orders a sum otherwise may
#: land one step away. The float16 decoder: one float16 unit at the outputs' magnitude (2 to
#: 4): ONNX Runtime's kernels and the original's decomposed float16 ops round differently
#: (measured 2.9e-3 on ONNX Runtime, 0 on OpenVINO and tract).
TOLERANCE = {"llama_qdq": 0.1, "gemma2_fp16": 4e-3}


def _skip_unavailable(runner: str) -> None:
    why = runners.unavailable(runner.removesuffix("+ext"))
    if why:
        pytest.skip(f"{runner}: {why}")


@pytest.mark.parametrize("runner", P.RUNNERS)
@pytest.mark.parametrize("file", P.FILES)
@pytest.mark.parametrize("decoder", P.DECODERS)
def test_cell(decoder, file, runner):
    _skip_unavailable(runner)
    if runner == "reference" and decoder == "llama_qdq":
        pytest.skip("onnx's reference evaluator: too slow for the quantized decoder here")
    cell = P.run_cell(decoder, file, runner)
    expected = P.EXPECTED[(decoder, file, runner)]
    if expected == "ok":
        assert cell.outcome == "ok", cell
        assert cell.max_error <= TOLERANCE.get(decoder, 1e-4), cell
    else:
        assert cell.outcome != "ok", f"{file} on {runner} now runs: update EXPECTED ({cell})"


@pytest.mark.parametrize("decoder", P.DECODERS)
def test_openvino_provider_takes_its_form_whole(decoder):
    """Written --for ort-openvino, the model is one OpenVINO partition: no node falls back to
    the CPU provider (the session is opened with CPU fallback disabled)."""
    _skip_unavailable("ort-openvino")
    cell = P.run_cell(decoder, "for ort-openvino", "ort-openvino")
    assert cell.outcome == "ok", cell
    assert cell.placement == {"OpenVINOExecutionProvider": 1}, cell


@pytest.mark.parametrize("decoder", ["llama", "gemma2", "qwen3", "gpt2", "deepnet"])
def test_openvino_compiles_each_norm_into_one_layer(decoder):
    """Written --for openvino, every norm of the decoder is one RMS (or MVN) layer of the
    compiled model: none is left as the Reduce and Eltwise layers of a decomposition."""
    _skip_unavailable("openvino")
    models, _ = P.files(decoder)
    nodes = [n.op_type for n in models["function"].graph.node if n.domain == "onnxnorm"]
    norms = sum(2 if op.startswith("Sandwich") else 1 for op in nodes)  # two norms a Sandwich
    cell = P.run_cell(decoder, "for openvino", "openvino")
    assert cell.outcome == "ok", cell
    assert cell.placement.get("RMS", 0) + cell.placement.get("MVN", 0) >= norms, cell


def test_function_target_splits_the_openvino_provider_with_the_library():
    """Why the plugin session registers the library only where a node has no body: with it,
    every onnxnorm node goes to the CPU provider and the graph falls into pieces."""
    _skip_unavailable("ort-openvino")
    from onnxnorm import runtime

    models, feeds = P.files("llama")
    counts = runtime.placement(
        models["function"], feeds, plugin=runtime.plugin("openvino"), with_library=True
    )
    assert counts["CPUExecutionProvider"] > 0 and counts["OpenVINOExecutionProvider"] > 1


def test_every_runtime_here_is_in_the_matrix():
    tested = {name for name, r in targets.RUNTIMES.items() if r.tested_here}
    assert tested == {"ort-cpu", *P.FOR}
    assert set(P.RUNNER_OF) == {"ort-cpu", *P.FOR}

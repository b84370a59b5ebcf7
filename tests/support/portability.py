"""The portability matrix: onnxnorm's outputs of the fusion tests' decoders, in every target
and every ``--for`` form, opened and run on every runtime that installs from PyPI and runs on a
CPU (``onnxnorm.deploy.runners``). What each cell is expected to do is :data:`EXPECTED`, the
one place of that fact: ``tests/runtime/test_portability.py`` checks every cell against it,
and ``tools/runtimes_page.py`` writes docs/runtimes.md from it.

A cell is (decoder, file, runner). The files: the ``original`` export (norms decomposed), the
``function`` and ``fused`` targets of the fused model, and one file per ``--for`` runtime that
runs here. The runners: those of ``onnxnorm.deploy.runners``, and ``openvino+ext`` (OpenVINO
with onnxnorm's frontend extension).
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from pathlib import Path

import numpy as np
import onnx

from onnxnorm import targets

#: the decoders: the fusion tests' families (onnxnorm.nn.decoder, norms spelled out as Hugging
#: Face writes them): RMSNorm ones (Llama, Gemma 2, Qwen3), LayerNorm ones (GPT-2, DeepNet),
#: two hybrids (Qwen3-Next: L2 norms; Mamba2: gated norms), a quantized one (static QDQ) and
#: one in float16 (Gemma 2's rounding order: the scale in float32)
DECODERS = (
    *("llama", "gemma2", "qwen3", "gpt2", "deepnet"),
    *("qwen3_next", "mamba2", "llama_qdq", "gemma2_fp16"),
)
#: the runtimes whose ``--for`` files are in the matrix: those that run here (ort-cpu's form is
#: the function target's)
FOR = tuple(r.name for r in targets.RUNTIMES.values() if r.tested_here and r.name != "ort-cpu")
FILES = ("original", "function", "fused", *(f"for {r}" for r in FOR))
RUNNERS = ("ort", "ort-plain", "ort-openvino", "openvino", "openvino+ext", "tract", "reference")
#: the runner that runs each ``--for`` runtime's file
RUNNER_OF = {runtime: runner for runner, runtime in targets.RUNTIME_OF.items()}

#: why a runner refuses a file, by what it reads of it
_NO_ONNXNORM = "reads no onnxnorm op"
_NO_LOCAL_FUNCTIONS = "does not inline model-local functions"
_NO_BODY = "an onnxnorm op without a body needs the onnxnorm library"
_NO_CONTRIB = "reads no ONNX Runtime contrib op"
_SHORT_CALL = (
    "onnx 1.23's evaluator calls no model-local function with an optional input left out "
    "(neither omitted nor given as an empty name)"
)


#: the norm family of each decoder's norms (all of its norms but the hybrids' gated and L2)
NORMS = {d: "layer" if d in ("gpt2", "deepnet") else "rms" for d in DECODERS}
#: the opset of the decoders' exports: LayerNormalization is a standard op there, RMSNormalization
#: is not
OPSET = 18


def expected(decoder: str, file: str, runner: str) -> str:
    """ "ok" (loads, runs, parity with the original on the same runtime), or why the runner
    refuses the file."""
    if file.startswith("for ") and runner == "reference":
        family = NORMS[decoder]
        forms = targets.RUNTIMES[file.removeprefix("for ")].forms[family]
        standard = family == "layer" or OPSET >= 23
        first = next(f for f in forms if f != "standard" or standard)
        return _NO_CONTRIB if first == "contrib" else "ok"
    if file in ("original",) or file.startswith("for "):
        return "ok"
    if runner in ("ort", "openvino+ext"):
        return "ok"
    if file == "fused":
        if runner in ("openvino", "tract"):
            return _NO_ONNXNORM
        return _NO_BODY
    # the function target: ONNX Runtime inlines the bodies (the OpenVINO provider then takes
    # the whole graph); OpenVINO and tract read no function of a model
    if runner == "reference":
        return _SHORT_CALL
    if runner in ("ort-plain", "ort-openvino"):
        return "ok"
    return _NO_LOCAL_FUNCTIONS if runner == "tract" else _NO_ONNXNORM


EXPECTED = {(d, f, r): expected(d, f, r) for d in DECODERS for f in FILES for r in RUNNERS}


@dataclasses.dataclass
class Cell:
    decoder: str
    file: str
    runner: str
    #: "ok", or the first line of the runtime's error
    outcome: str
    max_error: float | None = None
    placement: dict = dataclasses.field(default_factory=dict)


def _decoder_model(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The decoder exported (dynamo, dynamic batch and sequence), and feeds for it."""
    import torch

    from onnxnorm.nn import decoder, families
    from onnxnorm.nn.exporter import quiet_export

    family = name.split("_")[0]
    config = families.decoder_config(
        family, hidden=64, heads=4, intermediate=128, layers=2, impl="decomposed"
    )
    torch.manual_seed(0)
    model = decoder.build(config).eval()
    x = decoder.example_input(config, 2, 8)
    if name.endswith("_fp16"):
        model, x = model.half(), x.half()
    with quiet_export(), torch.no_grad():
        proto = torch.onnx.export(model, (x,), dynamo=True, input_names=["x"]).model_proto
    feeds = {"x": x.numpy()}
    if name == "llama_qdq":
        from onnxnorm.testing.hf.quantization import quantize

        with tempfile.TemporaryDirectory() as folder:
            source, quantized = Path(folder, "f.onnx"), Path(folder, "q.onnx")
            onnx.save(proto, source)
            calibration = [
                {"x": np.random.default_rng(i).standard_normal(feeds["x"].shape).astype(np.float32)}
                for i in range(4)
            ]
            quantize(source, quantized, "static", calibration)
            proto = onnx.load(quantized)
    return proto, feeds


@functools.cache
def files(name: str) -> tuple[dict[str, onnx.ModelProto], dict[str, np.ndarray]]:
    """Every file of :data:`FILES` for decoder ``name``, and its feeds."""
    from onnxnorm.fusion import fuse
    from onnxnorm.fusion.lowering import lower

    original, feeds = _decoder_model(name)
    fused = fuse(original, "function").model
    out = {"original": original, "function": fused, "fused": lower(fused, "fused")}
    for runtime in FOR:
        out[f"for {runtime}"] = lower(fused, runtime=runtime)
    return out, feeds


@functools.cache
def reference_outputs(name: str, runner: str = "ort-plain") -> list[np.ndarray] | None:
    """The original decoder's outputs on ``runner`` (None: it does not run it)."""
    from onnxnorm.deploy import runners

    models, feeds = files(name)
    try:
        return runners.open_runner(runner.removesuffix("+ext"), models["original"]).run(feeds)
    except Exception:  # noqa: BLE001 - a runtime that refuses the original
        return None


def run_cell(name: str, file: str, runner: str) -> Cell:
    """One cell: the file opened and run on the runner, its outputs against the original's on
    the same runner (on ONNX Runtime's CPU provider where the runner refuses the original)."""
    from onnxnorm.deploy import runners

    models, feeds = files(name)
    base = runner.removesuffix("+ext")
    try:
        opened = runners.open_runner(base, models[file], extension=runner.endswith("+ext"))
        outputs = opened.run(feeds)
    except Exception as error:  # noqa: BLE001 - the runtime's refusal is the cell's outcome
        first = str(error).strip().splitlines()
        return Cell(name, file, runner, " ".join(first[:1]) or type(error).__name__)
    expected_outputs = reference_outputs(name, runner) or reference_outputs(name)
    assert expected_outputs is not None
    error = max(
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
        for a, b in zip(outputs, expected_outputs)
    )
    return Cell(name, file, runner, "ok", error, dict(opened.placement))

"""The targets an onnxnorm model is written for, defined once: ``onnxnorm.export(mode=...)``
and ``onnxnorm export --mode``, ``onnxnorm.fusion.fuse(target=...)`` and ``onnxnorm fuse
--target`` take these names (how each is written: ``onnxnorm/fusion/lowering.py``). It
imports nothing at import time, so that registering a command that offers them stays cheap.

The runtimes a model can be written for instead (``--for``: each norm in the form that runtime
runs best) are defined here too, with the evidence behind each choice."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: target -> what a model written for it holds
TARGETS = {
    "function": "onnxnorm nodes with their ONNX function bodies, which any ONNX runtime runs",
    "fused": "onnxnorm nodes without bodies, for ONNX Runtime with the onnxnorm library",
    "ort": "ONNX Runtime's own norm ops where exact, else the nearest exact equivalent",
    "onnx": "standard ONNX ops only",
}
DEFAULT = "function"


def check(target: object, what: str = "target") -> str:
    """``target`` if it names a target, else :class:`onnxnorm.errors.UnknownTarget` (an
    OnnxNormError and a ValueError) in one line: the one check every entry point makes."""
    if target not in TARGETS:
        from onnxnorm.errors import UnknownTarget

        raise UnknownTarget(f"unknown {what} {target!r}; supported: {', '.join(TARGETS)}")
    return target


def help_text() -> str:
    """The targets and what they hold, in one line for a command-line option's help."""
    return "; ".join(
        f"{name}: {text}" + (" (default)" if name == DEFAULT else "")
        for name, text in TARGETS.items()
    )


# -- the runtimes an output is written for (``--for``) --------------------------------------
#
# A runtime's form of each norm family, in order of preference: the first form the node can be
# written in (its opset, its types, its attributes) is the one written. The forms:
#   attention   the norm written into the attention op that reads it: a per-head Q/K RMSNorm
#               before com.microsoft GroupQueryAttention becomes its q_norm_weight /
#               k_norm_weight where that is exact (``fusion/gqa_writer.py``); a norm anywhere
#               else takes the next form
#   library     onnxnorm's op with its function body (the onnxnorm library serves the provider)
#   contrib     ONNX Runtime's own op (LayerNormalization / SimplifiedLayerNormalization in the
#               ONNX domain, com.microsoft Skip*LayerNormalization and GatedRMSNorm)
#   standard    ONNX's op: LayerNormalization (opset >= 17), RMSNormalization (opset >= 23)
#   decomposed  plain ops spelled as the runtimes' own fusions recognise them
#               (x * 1 / sqrt(mean(x^2) + eps) * w; (x - mean) / sqrt(var + eps) * w + b)
#   body        the catalogue's function body, inlined
# The families: "layer" and "rms" (with their Skip, Sandwich and quantized ops), "gated"
# (GatedRMSNorm) and "l2" (L2Norm). The evidence of each row is the test that checks it, or
# the upstream source and version where no machine here runs the runtime.
FORMS = ("attention", "library", "contrib", "standard", "decomposed", "body")
FAMILIES = ("layer", "rms", "gated", "l2")
# The rotary ops (RMSNormRotary, LayerNormRotary, L2NormRotary: the Q/K norm and the rotary
# embedding) are a family of their own, outside FAMILIES (the norm families; the runtimes page
# gives the rotary forms a column of their own): the library's runtimes keep the op (with its
# body, which runs where the library has no kernel of it), "onnx" writes ONNX's norm op and
# RotaryEmbedding where the opset has them and they are exact (standard; checked in plain ONNX
# Runtime by tests/fusion/test_rotary_lowering.py), and the other runtimes the function body, the
# form that each is known to run (nothing here shows them reading either RotaryEmbedding).
ROTARY = "rotary"


@dataclass(frozen=True)
class Runtime:
    """One runtime (and execution provider) an output can be written for."""

    name: str
    title: str
    #: family -> forms in order of preference
    forms: Mapping[str, tuple[str, ...]]
    #: why these forms: the test that checks them, or the upstream source and version
    evidence: str
    #: the runtime runs here (from PyPI, on a CPU): the portability tests cover it
    tested_here: bool = True
    #: the runner of ``onnxnorm.deploy.runners`` that runs this form here (None: none does)
    runner: str | None = None

    @property
    def keeps_ops(self) -> bool:
        """Whether some norm stays an onnxnorm op (the library serves this runtime)."""
        return any("library" in forms for forms in self.forms.values())


def _lowered(layer: tuple[str, ...], rms: tuple[str, ...] | None = None) -> dict:
    """The forms of a runtime the onnxnorm library does not serve: LayerNorm's as given, RMSNorm's
    the same unless given; GatedRMSNorm as its body (of the runtimes here only ONNX Runtime's
    CPU and CUDA providers have an op of it, and they run the library); L2Norm spelled out
    (no runtime has an op with its epsilon); the rotary ops as their body."""
    return {
        "layer": layer,
        "rms": rms or layer,
        "gated": ("body",),
        "l2": ("decomposed", "body"),
        ROTARY: ("body",),
    }


_LIBRARY = dict.fromkeys((*FAMILIES, ROTARY), ("library",))
#: ONNX Runtime's ops first (the providers that have kernels of them but not of onnxnorm's)
_CONTRIB_FIRST = ("contrib", "decomposed", "body")
#: ONNX's ops where the opset has them, else ONNX Runtime's (runtimes that read both)
_STANDARD_FIRST = ("standard", "contrib", "decomposed", "body")
#: ONNX's ops where the opset has them, else plain ops (runtimes that read ONNX's ops only)
_STANDARD_ONLY = ("standard", "decomposed", "body")
_MATRIX = "tests/runtime/test_portability.py"

RUNTIMES = {
    r.name: r
    for r in (
        Runtime(
            "ort-cpu",
            "ONNX Runtime, CPU provider, with the onnxnorm library",
            _LIBRARY,
            f"the library's CPU kernels for every op ({_MATRIX})",
            runner="ort",
        ),
        Runtime(
            "ort-cuda",
            "ONNX Runtime, CUDA provider, with the onnxnorm library",
            {**_LIBRARY, "rms": ("attention", "library")},
            "the library's CUDA kernels for every op (tests/cuda/, tools/gpu_check.sh); the Q/K "
            "norms of GroupQueryAttention in its q_norm_weight / k_norm_weight, which ONNX "
            "Runtime's CUDA kernel computes as the norm (its schema and source, 1.31.1's CUDA "
            "provider; tests/fusion/test_rotary_gqa.py, tools/gpu_check.sh)",
            tested_here=False,
        ),
        Runtime(
            "ort-openvino",
            "ONNX Runtime with the OpenVINO plugin execution provider (onnxruntime-ep-openvino)",
            _lowered(_CONTRIB_FIRST),
            f"the provider takes ONNX Runtime's norm ops whole, and refuses onnxnorm's ({_MATRIX})",
            runner="ort-openvino",
        ),
        Runtime(
            "openvino",
            "OpenVINO (its ONNX frontend, openvino.Core().read_model)",
            _lowered(_STANDARD_FIRST),
            "the compiled model's MVN and RMS layers, and no onnxnorm op read by the frontend "
            f"without onnxnorm's extension ({_MATRIX})",
            runner="openvino",
        ),
        Runtime(
            "webgpu",
            "ONNX Runtime, WebGPU provider",
            _lowered(_CONTRIB_FIRST),
            "ONNX Runtime's onnxruntime/contrib_ops/webgpu/bert/layer_norm.cc and "
            "skip_layer_norm.cc (main, 2026): WebGPU kernels of LayerNormalization, "
            "SimplifiedLayerNormalization and the Skip forms (tools/gpu_check.sh runs them)",
            tested_here=False,
        ),
        Runtime(
            "tensorrt",
            "TensorRT (its ONNX parser; ONNX Runtime's TensorRT providers)",
            _lowered(_STANDARD_ONLY, rms=("decomposed", "body")),
            "onnx-tensorrt's docs/operators.md (commit 96e7811, 2024-06): LayerNormalization is "
            "parsed (its Y alone), RMSNormalization is not listed, so RMS norms are written as "
            "the plain ops TensorRT fuses (tools/gpu_check.sh)",
            tested_here=False,
        ),
        Runtime(
            "tract",
            "tract (sonos/tract, its Python package)",
            _lowered(_STANDARD_FIRST),
            f"tract 0.23 runs both standard ops and ONNX Runtime's, not onnxnorm's ({_MATRIX})",
            runner="tract",
        ),
        Runtime(
            "onnx",
            "any ONNX runtime: standard ONNX ops only",
            {**_lowered(_STANDARD_ONLY), ROTARY: ("standard", "body")},
            f"onnx's reference evaluator and ONNX Runtime without the library ({_MATRIX})",
            runner="ort-plain",
        ),
    )
}


#: runner of ``onnxnorm.deploy.runners`` -> the runtime whose form it runs best
RUNTIME_OF = {r.runner: r.name for r in RUNTIMES.values() if r.runner}


def check_runtime(runtime: object) -> str:
    """``runtime`` if it names a runtime of :data:`RUNTIMES`, else UnknownTarget."""
    if runtime not in RUNTIMES:
        from onnxnorm.errors import UnknownTarget

        raise UnknownTarget(f"unknown runtime {runtime!r}; supported: {', '.join(RUNTIMES)}")
    return runtime


def add_runtime_option(parser: Any) -> None:
    """``--for RUNTIME`` on an argparse parser (``onnxnorm fuse``, ``export``, ``lower``): each
    norm written in the form that runtime runs best, in place of one target."""
    parser.add_argument(
        "--for", dest="runtime", choices=RUNTIMES, metavar="RUNTIME", help=runtime_help_text()
    )


def runtime_help_text() -> str:
    """The runtimes, in one line for the ``--for`` option's help."""
    return (
        "write each norm in the form this runtime runs fastest and exactly, instead of one "
        "--target: " + "; ".join(f"{r.name}: {r.title}" for r in RUNTIMES.values())
    )

"""onnxnorm's fusion beside ONNX Runtime's transformers optimizer and onnxscript's
ort_fusions on one model: each tool run as its users run it, the norms and residual adds held in
single norm ops counted, parity checked against the original in ONNX Runtime.

Used by the tests that hold onnxnorm to at least what the other tools fuse
(tests/nn/test_encoders.py, tests/fusion/test_pipelines.py, tests/fusion/test_wild_models.py)
and by the page writers tools/fusion_page.py and tools/pipelines_page.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx

from onnxnorm.ops import catalogue

#: ORT's optimizer needs a model type; these are its closest ones for each family
ORT_MODEL_TYPE = {
    "bert": "bert",
    "gpt2": "gpt2",
    "t5": "t5",
    "gpt_neox": "gpt_neox",
    "qwen3": "qwen3",
    "phi3": "phi",
    "bert_encoder": "bert",
    "vit": "vit",
    "clip_text": "clip",
    "clip_vision": "clip",
    "whisper_encoder": "bert",
}


def count(model: onnx.ModelProto, standard_counts: bool = True) -> tuple[int, int]:
    """(norms, residual adds) held in single norm ops of the model's main graph.

    A LayerNormalization the exporter wrote is already one op: it counts as fused for every
    tool (the question is whether each norm ends as one op), so the columns compare like with
    like."""
    norms = adds = 0
    for node in model.graph.node:
        n, a = catalogue.norms_held(node.domain, node.op_type, len([o for o in node.output if o]))
        norms += n
        adds += a
    return norms, adds


def run_onnxnorm(model, path):
    """onnxnorm's fusion of ``model`` (target function); ``path``, the same model's file, unused."""
    from onnxnorm.fusion import fuse

    fused, _ = fuse(model, "function")
    return fused


def run_ort(model, path, name):
    """ORT's transformers optimizer on the file ``path`` (``model`` saved), with the model type
    closest to the corpus family ``name``."""
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(
        str(path),
        model_type=ORT_MODEL_TYPE.get(name, "gpt2"),
        num_heads=0,
        hidden_size=0,
        opt_level=0,
    )
    return optimized.model


def run_onnxscript(model, path):
    """onnxscript's ``optimize_for_ort`` on the file ``path`` (``model`` saved)."""
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    ir_model = ir.load(str(path))  # as its users call it
    optimized, _ = optimize_for_ort(ir_model)
    return ir.serde.serialize_model(optimized)


def parity(original, optimized, sizes=None) -> str:
    """ "ok (max abs error)", "MISMATCH (...)" or "does not run (why)": the optimized model
    against the original in ONNX Runtime, on generated inputs (``sizes``: named dims)."""
    from onnxnorm.fusion.verify import verify

    try:
        checks = verify(original, optimized, sizes=sizes)
    except Exception as error:  # noqa: BLE001 - reported in the table
        return f"does not run ({str(error).strip().splitlines()[0][:110]})"
    worst = max(c.max_abs for c in checks)
    return f"{'ok' if all(c.ok for c in checks) else 'MISMATCH'} ({worst:.1e})"


def optimize_file(tool: str, path: Path, family: str, out: Path) -> None:
    """ORT's transformers optimizer or onnxscript's ``optimize_for_ort`` on the file ``path``,
    the result saved to ``out`` as their users save it."""
    if tool == "ort":
        from onnxruntime.transformers.optimizer import optimize_model

        optimize_model(
            str(path),
            model_type=ORT_MODEL_TYPE.get(family, "gpt2"),
            num_heads=0,
            hidden_size=0,
            opt_level=0,
        ).save_model_to_file(str(out))
    else:
        onnx.save(run_onnxscript(None, path), out)


def count_all(model: onnx.ModelProto) -> tuple[int, int]:
    """:func:`count` over every graph, the branches of a merged decoder's If included."""
    from onnxnorm.ops.functions import all_graphs

    norms = adds = 0
    for graph in all_graphs(model.graph):
        for node in graph.node:
            outputs = len([o for o in node.output if o])
            n, a = catalogue.norms_held(node.domain, node.op_type, outputs)
            norms, adds = norms + n, adds + a
    return norms, adds


def versions() -> str:
    """The versions of the tools compared (and of torch, transformers and Python), for a page's
    header."""
    import onnxruntime
    import onnxscript
    import torch
    import transformers

    return (
        f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}, onnxscript "
        f"{onnxscript.__version__}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, Python {sys.version.split()[0]}"
    )

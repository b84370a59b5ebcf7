"""The variants ``onnxnorm bench e2e`` compares: each a model file made by the tool a user runs
(:data:`~.config.VARIANTS`; of a quantized export, :data:`~.config.QUANT_VARIANTS`),
made once into a folder with a record beside it, so a ``--keep`` folder is used again; and what
a model holds (its node counts, the nodes that compute a norm)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from onnxnorm.bench.common import quietly, short_error
from onnxnorm.bench.e2e.config import (
    CALIBRATION_PROMPTS,
    NORM_CLASSES,
    QUANT_VARIANTS,
    QUANTIZERS,
    Config,
)
from onnxnorm.bench.e2e.models import export, export_onnxnorm
from onnxnorm.bench.timing import clock
from onnxnorm.ops import catalogue
from onnxnorm.testing.hf import past_names

#: op types whose kernels count as norm time in the profile: those of catalogue.NORM_OPS, the one
#: table of the ops of any domain that compute a norm (onnxnorm's quantized forms among them)
NORM_OPS = frozenset(op_type for _, op_type in catalogue.NORM_OPS)


def make_variants(
    model, config: Config, folder: Path, names: list[str], log: Callable[[str], None] = print
) -> dict[str, dict[str, Any]]:
    """Writes every variant's model into ``folder``: name -> {"path", "library", "prepare_s",
    node counts} or {"error"} where the tool fails. What a variant's ``<name>.json`` in
    ``folder`` records (an earlier run's, see ``--keep``) is used as it is."""
    import onnx

    from onnxnorm.fusion import fuse

    source = folder / "export.onnx"
    exported: list = []

    def plain():
        if not exported:
            started = clock()
            exported.append(export(model, config))
            onnx.save(exported[0], source)
            log(f"  exported in {clock() - started:.0f} s")
        return exported[0]

    def ort_optimizer(path):
        from onnxruntime.transformers.optimizer import optimize_model

        plain()
        optimize_model(
            str(source), model_type="gpt2", num_heads=0, hidden_size=0, opt_level=0
        ).save_model_to_file(str(path))

    def onnxscript(path):
        import onnx_ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort

        plain()
        optimized, _ = optimize_for_ort(ir.load(str(source)))
        ir.save(optimized, str(path))

    def unrotated(path):
        from onnxnorm.fusion import without_stages

        with without_stages("rotary"):
            onnx.save(fuse(plain(), "fused")[0], path)

    makers = {
        "export": lambda path: plain(),
        "ort-optimizer": ort_optimizer,
        "onnxscript": onnxscript,
        "onnxnorm-ort": lambda path: onnx.save(fuse(plain(), "ort")[0], path),
        "onnxnorm-fused": lambda path: onnx.save(fuse(plain(), "fused")[0], path),
        "onnxnorm-fused-norotary": unrotated,
        "onnxnorm-export": lambda path: onnx.save(export_onnxnorm(model, config), path),
    }
    paths = {name: source if name == "export" else folder / f"{name}.onnx" for name in names}
    library = ("onnxnorm-fused", "onnxnorm-fused-norotary", "onnxnorm-export")
    return _make(folder, names, makers, paths, library, "", log)


def _make(
    folder: Path,
    names: list[str],
    makers: dict[str, Callable[[Path], Any]],
    paths: dict[str, Path],
    library: tuple[str, ...],
    prefix: str,
    log: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """Makes each variant's model with its maker (unless ``folder`` holds its record,
    ``<prefix><name>.json``, from an earlier run): name -> {"path", "library", "prepare_s",
    node counts} or {"error"}."""
    import onnx

    variants: dict[str, dict[str, Any]] = {}
    for name in names:
        record = folder / f"{prefix}{name}.json"
        if record.is_file():
            variants[name] = json.loads(record.read_text())
            continue
        path = paths[name]
        started = clock()
        try:
            quietly(lambda: makers[name](path))  # noqa: B023 - called in this iteration
        except Exception as error:  # noqa: BLE001 - a tool's failure is a result
            variants[name] = {"error": f"{type(error).__name__}: {short_error(error)}"}
            log(f"  {prefix}{name}: fails ({variants[name]['error']})")
        else:
            variants[name] = {
                "path": str(path),
                "library": name in library,
                "prepare_s": clock() - started,
                **node_counts(onnx.load(path, load_external_data=False)),
            }
        record.write_text(json.dumps(variants[name]))
    return variants


def calibration_feeds(config: Config, dtype: str = "float32") -> list[dict[str, np.ndarray]]:
    """Static quantization's calibration data: prefills of ``CALIBRATION_PROMPTS`` prompts of
    the benchmark's length with other pseudo-random ids than its prompt, the cache empty."""
    feeds = []
    for i in range(CALIBRATION_PROMPTS):
        ids = np.random.default_rng(100 + i).integers(3, config.vocab, (1, config.prompt))
        feed = {
            "input_ids": ids.astype(np.int64),
            "attention_mask": np.ones((1, config.prompt), np.int64),
        }
        feed.update(
            {
                name: np.zeros((1, config.kv_heads, 0, config.head_dim), dtype)
                for name in past_names(config.layers)
            }
        )
        feeds.append(feed)
    return feeds


def quantize(
    source: Path, destination: Path, quantization: str, config: Config, dtype: str = "float32"
) -> None:
    """``source`` quantized by ONNX Runtime's tool (``QUANTIZATIONS``: the MatMuls, static
    quantization calibrated on :func:`calibration_feeds`) into ``destination`` (written under
    another name first, so a killed run leaves no half model there)."""
    from onnxnorm.testing import hf

    partial = destination.with_name(f".{destination.stem}.partial.onnx")
    feeds = calibration_feeds(config, dtype) if quantization == "static" else None
    hf.quantize(source, partial, quantization, feeds)
    os.replace(partial, destination)


def make_quantized(
    model,
    config: Config,
    folder: Path,
    quantization: str,
    names: list[str],
    dtype: str = "float32",
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """Writes the variants of the quantized export into ``folder`` (``QUANT_VARIANTS``), as
    :func:`make_variants` does: the float export (``export.onnx``, shared by the
    quantizations), ``<quantization>.onnx``, ``<quantization>-<variant>.onnx`` and their
    records ``<quantization>-<variant>.json``."""
    import onnx

    from onnxnorm.fusion import fuse

    source, quantized = folder / "export.onnx", folder / f"{quantization}.onnx"

    def plain():
        if not source.is_file():
            started = clock()
            partial = folder / ".export.partial.onnx"
            onnx.save(export(model, config), partial)
            os.replace(partial, source)
            log(f"  exported in {clock() - started:.0f} s")

    def quantized_model(path=None):
        if not quantized.is_file():
            plain()
            started = clock()
            quantize(source, quantized, quantization, config, dtype)
            log(f"  {quantization} quantization in {clock() - started:.0f} s")

    def ort_optimizer(path):
        from onnxruntime.transformers.optimizer import optimize_model

        quantized_model()
        optimize_model(
            str(quantized), model_type="gpt2", num_heads=0, hidden_size=0, opt_level=0
        ).save_model_to_file(str(path))

    def fused(target):
        def make(path):
            quantized_model()
            onnx.save(fuse(onnx.load(quantized), target)[0], path)

        return make

    makers = {
        "quantized": quantized_model,
        "ort-optimizer": ort_optimizer,
        "onnxnorm-ort": fused("ort"),
        "onnxnorm-fused": fused("fused"),
    }
    paths = {
        name: quantized if name == "quantized" else folder / f"{quantization}-{name}.onnx"
        for name in names
    }
    return _make(folder, names, makers, paths, ("onnxnorm-fused",), f"{quantization}-", log)


def quantized_variants(variants: list[str]) -> list[str]:
    """The variants of a quantized group: the quantized model as it is, and those of
    ``QUANT_VARIANTS`` that ``--variants`` names."""
    return ["quantized"] + [v for v in QUANT_VARIANTS if v != "quantized" and v in variants]


def node_counts(model) -> dict[str, Any]:
    """Nodes of the main graph, its norm ops by type (onnxnorm's quantized forms among them)
    and ONNX's quantizers by type (those left outside a norm op)."""
    norms: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in NORM_OPS:
            key = f"{node.domain or 'ai.onnx'}.{node.op_type}"
            norms[key] = norms.get(key, 0) + 1
    quantizers: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in QUANTIZERS and node.domain in ("", "ai.onnx"):
            quantizers[node.op_type] = quantizers.get(node.op_type, 0) + 1
    return {"nodes": len(model.graph.node), "norm_ops": norms, "quantizers": quantizers}


def norm_node_names(model) -> set[str]:
    """Names of the nodes that compute a norm: norm ops, the exporter's nodes recorded as
    coming from a norm module (the decomposed norms), and quantizers of a norm's output."""
    names = set()
    for node in model.graph.node:
        if node.op_type in NORM_OPS:
            names.add(node.name)
            continue
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.class_hierarchy" and any(
                part.strip(" '\"").endswith(NORM_CLASSES)
                for part in prop.value.strip("[]").split(",")
            ):
                names.add(node.name)
                break
    # a quantizer that reads a norm's output (through a Cast to float32 in a half-precision
    # graph): the part of norm(+quantize) that the unfused graph runs as a node of its own
    outputs = {o: node for node in model.graph.node for o in node.output}

    def from_norm(value: str) -> bool:
        producer = outputs.get(value)
        if producer is not None and producer.op_type == "Cast":
            producer = outputs.get(producer.input[0])
        return producer is not None and bool(producer.name) and producer.name in names

    names |= {
        node.name
        for node in model.graph.node
        if node.op_type in QUANTIZERS and node.input and from_norm(node.input[0])
    }
    return names

"""The ``genai_config.json`` of an onnxruntime-genai model folder: reading it, the ONNX models it
names, and the sizes it gives a decoder's inputs. A file format, below both the genai pipeline
(``onnxnorm.genai``, which re-exports these names) and ``onnxnorm fuse --verify``, which sizes
the inputs of a model that sits in such a folder."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from onnxnorm.errors import OnnxNormError

CONFIG = "genai_config.json"


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``genai_config.json`` of ``folder``; one-line errors for a folder that has none."""
    folder = Path(folder)
    if not folder.exists():
        raise OnnxNormError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise OnnxNormError(
            f"{folder}: not a folder (an onnxruntime-genai model folder holds "
            f"{CONFIG} and the ONNX models it names)"
        )
    path = folder / CONFIG
    if not path.is_file():
        raise OnnxNormError(f"{folder}: no {CONFIG}, not an onnxruntime-genai model folder")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise OnnxNormError(f"{path}: not readable as JSON ({error})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise OnnxNormError(f'{path}: has no "model" section')
    return config


def components(config: dict[str, Any]) -> Iterator[tuple[str, dict, dict]]:
    """(key path, the dict naming an ONNX file, the session options that apply to it) for
    every ONNX model the config names (the decoder, and the embedding, vision, speech or
    encoder models and pipeline stages of other models). A dict without session options of
    its own uses its nearest enclosing one's (the decoder's), as onnxruntime-genai does."""

    def walk(node: Any, key: str, options: dict | None):
        if isinstance(node, dict):
            own = node.get("session_options")
            if isinstance(own, dict):
                options = own
            name = node.get("filename")
            if isinstance(name, str) and name.endswith(".onnx"):
                yield key, node, options
            for child_key, child in node.items():
                if child_key != "session_options":
                    yield from walk(child, f"{key}.{child_key}" if key else child_key, options)
        elif isinstance(node, list):
            for i, child in enumerate(node):
                yield from walk(child, f"{key}[{i}]", options)

    yield from walk(config["model"], "model", None)


def dim_sizes(config: dict[str, Any], model, past: int | None = None) -> dict[str, int]:
    """Sizes for the symbolic dims of a genai decoder's inputs that generated inputs cannot
    guess: the KV cache's head size (from the config), batch 1 (GroupQueryAttention takes
    several new tokens after a past for one sequence only) and the past length: ``past``, or
    by default the sliding window where the config has one (the cache must cover it)."""
    sizes: dict[str, int] = {}
    decoder = config.get("model", {}).get("decoder", {})
    head = decoder.get("head_size")
    window = decoder.get("sliding_window")
    if past is None and isinstance(window, dict) and window.get("window_size"):
        past = int(window["window_size"])
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if "past" in value.name and len(dims) == 4:
            if dims[0].dim_param:
                sizes[dims[0].dim_param] = 1
            if head and dims[3].dim_param:
                sizes[dims[3].dim_param] = int(head)
            if past is not None and dims[2].dim_param:
                sizes[dims[2].dim_param] = past
    return sizes


__all__ = ["CONFIG", "components", "dim_sizes", "read_config"]

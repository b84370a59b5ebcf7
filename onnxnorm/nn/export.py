"""``onnxnorm.export``: torch.onnx.export (dynamo) with one onnxnorm node per norm module."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Iterator

import onnx
import torch

from onnxnorm._io import OnnxNormError, save_model
from onnxnorm.nn.functional import TRANSLATION_TABLE
from onnxnorm.ops import functions

#: the export targets implemented so far (DESIGN.md section 4)
MODES = ("function", "fused")


@contextlib.contextmanager
def quiet_export(quiet: bool = True) -> Iterator[None]:
    """Silences what torch.onnx.export prints (progress lines, warnings, log records)."""
    if not quiet:
        yield
        return
    loggers = [logging.getLogger(name) for name in ("torch", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def export(model: torch.nn.Module, args: tuple[Any, ...], path: str | os.PathLike | None = None,
           *, mode: str = "function", opset_version: int = 18,
           dynamic_shapes: Any = None, input_names: list[str] | None = None,
           output_names: list[str] | None = None, verbose: bool = False) -> onnx.ModelProto:
    """Exports ``model`` with ``torch.onnx.export(dynamo=True)``; every onnxnorm module becomes
    one node of the ``onnxnorm`` domain.

    mode ``"function"`` (default) attaches each node's ONNX function body, so that the file runs
    in any ONNX runtime (ORT with the onnxnorm library registered runs the fused kernel instead);
    ``"fused"`` leaves the bodies out (the library is then required). The model is written to
    ``path`` (atomically) when given, and returned.
    """
    if mode not in MODES:
        raise OnnxNormError(f"unknown export mode {mode!r}; supported: {', '.join(MODES)}")
    if opset_version < functions.MIN_OPSET:
        raise OnnxNormError(f"opset_version must be >= {functions.MIN_OPSET}, got {opset_version}")
    if not isinstance(model, torch.nn.Module):
        raise OnnxNormError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(args, tuple):
        args = (args,)
    with quiet_export(not verbose):
        program = torch.onnx.export(
            model, args, dynamo=True, opset_version=opset_version,
            custom_translation_table=TRANSLATION_TABLE, dynamic_shapes=dynamic_shapes,
            input_names=input_names, output_names=output_names, verbose=verbose,
        )
    proto = program.model_proto
    if mode == "function":
        functions.attach_functions(proto)
    else:
        functions.strip_functions(proto)
    if path is not None:
        save_model(proto, Path(path))
    return proto

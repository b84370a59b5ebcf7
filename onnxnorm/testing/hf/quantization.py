"""ONNX Runtime's quantization of an exported model, as the pipelines' tests and benchmarks
quantize a decoder: :func:`quantize` (dynamic, or static in QDQ format on calibration feeds).
Importing this module loads none of onnxruntime's quantization tools.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def quantize(
    source: str | Path,
    destination: str | Path,
    kind: str,
    feeds: Iterable[dict] | None = None,
    *,
    matmul_only: bool = True,
    **options: Any,
) -> None:
    """``source`` quantized by ONNX Runtime's tools into ``destination``: ``kind`` "dynamic"
    (``quantize_dynamic``) or "static" (``quantize_static`` in QDQ format, calibrated on
    ``feeds``, input name -> array dicts); the MatMuls only (``matmul_only``, as a decoder is
    quantized) or every op the tool takes. ``options`` go to the tool as they are
    (``activation_type``, ``weight_type``, ``calibrate_method``, ...)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        quantize_dynamic,
        quantize_static,
    )

    ops = ["MatMul"] if matmul_only else None
    if kind == "dynamic":
        quantize_dynamic(str(source), str(destination), op_types_to_quantize=ops, **options)
        return
    if kind != "static":
        raise ValueError(f"kind must be 'dynamic' or 'static', got {kind!r}")
    if feeds is None:
        raise ValueError("static quantization needs calibration feeds")
    calibration = feeds

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(calibration)

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(
        str(source),
        str(destination),
        Feeds(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=ops,
        **options,
    )

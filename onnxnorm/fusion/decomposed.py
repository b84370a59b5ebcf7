"""The ``decomposed`` form of a norm (``onnxnorm.targets``, ``--for``): the normalization in
plain ONNX ops, spelled as the runtimes' own fusions recognise it, for the runtimes that have
no norm op of their own at the model's opset.

- RMS: ``x * (1 / sqrt(mean(x^2) + eps))``, the square a Pow of 2: OpenVINO's RMS fusion
  (``x * 1/Sqrt(ReduceMean(x^2, axes) + eps) * gamma``) turns it into one RMS layer.
- Layer: ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)``: OpenVINO's MVN fusion.
- L2: ``x / sqrt(sum(x^2) + eps)``.

Each takes X in float32 (the statistics are float32 whatever X's type) and the number of
normalized trailing dims; the Scale, Bias and the rounding to X's type follow it, written by
the lowering with the catalogue's own arithmetic, as for the other forms. No Flatten and no
Reshape: the reductions run over the trailing axes themselves, so runtimes that analyse
shapes symbolically (tract) keep every dim.
"""

from __future__ import annotations

from onnxnorm.ops.opsets import OpsetWriter


def _axes(count: int) -> list[int]:
    return list(range(-count, 0))


def _square(b: OpsetWriter, x: str) -> str:
    return b("Pow", x, b.scalar(2.0))


def _inverse_root(b: OpsetWriter, value: str, eps: float) -> str:
    return b("Div", b.scalar(1.0), b("Sqrt", b("Add", value, b.scalar(eps))))


def norm(b: OpsetWriter, kind: str, xf: str, count: int, eps: float) -> str:
    """The normalized value of ``xf`` (float32) over its last ``count`` dims: ``kind`` is
    "rms", "layer" or "l2"."""
    axes = _axes(count)
    if kind == "rms":
        return b("Mul", xf, _inverse_root(b, b.reduce("ReduceMean", _square(b, xf), axes), eps))
    if kind == "layer":
        centred = b("Sub", xf, b.reduce("ReduceMean", xf, axes))
        variance = b.reduce("ReduceMean", _square(b, centred), axes)
        return b("Div", centred, b("Sqrt", b("Add", variance, b.scalar(eps))))
    if kind == "l2":
        total = b.reduce("ReduceSum", _square(b, xf), axes)
        return b("Div", xf, b("Sqrt", b("Add", total, b.scalar(eps))))
    raise ValueError(f"no decomposed form of a {kind!r} norm")

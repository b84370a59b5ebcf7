"""Refusing hostile or broken models in one line, before anything reads their weights.

:func:`check` is the door every model passes once (``onnxnorm._io.open_model`` for a file,
``onnxnorm.fusion.fuse`` for a model in memory), made of two checks:

- :func:`check_external_data` (``external.py``): every external-data reference names a regular
  file inside the model's folder (no absolute path, no ``..``, no symbolic link leading out, no
  FIFO or device), and its offset and length lie inside that file and match the tensor's
  declared shape. Only ``stat`` is called on the file, so a refused file is never opened.
- :func:`check_model` (``graphs.py``): tensors hold the data their shapes declare (a shape of
  10^12 elements over a few bytes is refused without allocating: ``tensors.py``); every graph
  is a graph: no value produced twice, no input read that nothing provides (a dangling input, a
  missing initializer), no cycle; every node's domain is imported; the attributes of norm ops
  are in range (axis inside the input's rank; onnxnorm ops by the catalogue's rules:
  ``attributes.py``).

Both raise :class:`ModelProblem` with the problem in one line; :func:`check` raises it as the
user's ``OnnxNormError``.

As lenient as ONNX Runtime, as strict as it for what is hostile. Where ONNX Runtime loads and
runs a sloppy model, :func:`check_model` does not refuse it but returns the :class:`Repair` that
mends it without changing what it computes, and :func:`apply_repairs` applies them to the pass's
own copy of the model (the report lists them; ``repairs.py``):

- the default domain imported under its other name, ``ai.onnx`` (nodes may use either name):
  read as ``""``;
- a node of a domain ONNX Runtime knows (``com.microsoft``, ``ai.onnx.ml``, ``onnxnorm``, ...)
  that the model does not import: imported at the version ONNX Runtime assumes, its newest;
  the default domain likewise, where the model imports another domain but not it (ONNX
  Runtime reads it at its newest ONNX opset; a model that imports no domain at all it refuses);
- a value produced twice by Constant nodes, or by a Constant and an initializer, or two
  initializers of one name, all holding the same value: one of them kept (``duplicates.py``).
  (ONNX Runtime takes the last one it meets; holding different values, the model means two
  things and is refused.)

A norm attribute that ONNX Runtime accepts although no norm can use it (a negative or NaN
epsilon of ONNX's or ONNX Runtime's ops) is left to the fusion rules, which leave that norm as
it is and say why; an onnxnorm op's attributes are checked as the native library checks them.
tests/validate/test_hostile.py runs ONNX Runtime's own loader on every refused and every mended
case.
"""

from __future__ import annotations

import os

import onnx

from onnxnorm._validate.external import check_external_data
from onnxnorm._validate.graphs import check_model
from onnxnorm._validate.repairs import (
    DEFAULT_ALIAS,
    ModelProblem,
    Repair,
    apply_repairs,
    dropped_initializers,
    graphs,
)

__all__ = [
    "DEFAULT_ALIAS",
    "ModelProblem",
    "Repair",
    "apply_repairs",
    "check",
    "check_external_data",
    "check_model",
    "dropped_initializers",
    "graphs",
]


def check(
    model: onnx.ModelProto,
    folder: str | os.PathLike,
    *,
    own: str | os.PathLike | None = None,
    where: str = "",
) -> list[Repair]:
    """The door every model passes once, before any of its weights is read:
    :func:`check_external_data` and :func:`check_model`, a refusal raised as the user's
    one-line :class:`~onnxnorm.errors.OnnxNormError` (prefixed with ``where``, e.g. the file's
    path); returns the repairs for the pass to make."""
    from onnxnorm.errors import OnnxNormError

    try:
        check_external_data(model, folder, own=own)
        return check_model(model, folder)
    except ModelProblem as problem:
        raise OnnxNormError(f"{where}: {problem}" if where else str(problem)) from None

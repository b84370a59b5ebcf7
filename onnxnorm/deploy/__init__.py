"""Running onnxnorm's outputs beyond ONNX Runtime with the library: the runtimes a model can be
written for are defined in :mod:`onnxnorm.targets` (``RUNTIMES``, the ``--for`` choices, with
the evidence of each); here are what uses them.

- :mod:`onnxnorm.deploy.runners`: open a model on one runtime (ONNX Runtime with and without
  the library, on a plugin execution provider, OpenVINO, tract, onnx's reference evaluator)
  and run it, with where its nodes ran: what the portability tests and ``onnxnorm bench e2e
  --runtime`` run.
- :mod:`onnxnorm.deploy.openvino`: the OpenVINO frontend extension that reads onnxnorm's ops.
- ``onnxnorm lower MODEL -o OUT --for RUNTIME`` (:mod:`onnxnorm.deploy.cli`): an onnxnorm
  file rewritten for another runtime.

Nothing is imported until used: a runtime's package is needed only when it is run.
"""

from __future__ import annotations

from onnxnorm import _lazy

__getattr__, __dir__ = _lazy.names(
    __name__,
    {"RUNNERS": "runners", "open_runner": "runners", "Runner": "runners"},
    globals(),
    submodules=("runners", "openvino"),
)

"""onnxnorm's fusion inside Olive workflows (olive-ai, ``pip install 'onnxnorm[olive]'``).

- :class:`OnnxNormFusion`, an Olive pass: a workflow step ``{"type": "OnnxNormFusion",
  "target": "fused", "verify": true}`` fuses the norms of the ONNX model before it
  (``onnxnorm.fusion.fuse``), checks parity in ONNX Runtime when ``verify`` is set, and puts
  the fusion report (found, fused, skipped with the reason) in the output model's attributes
  under ``"onnxnorm"``.
- :class:`OnnxNormFuse`, a surgeon for Olive's ``GraphSurgeries`` pass: ``{"surgeon":
  "OnnxNormFuse", "target": "ort"}`` among the surgeries does the same on the graph there.

Olive finds a pass through its package configuration (``olive_config.json``), which a
workflow may replace as a whole (``olive run --package-config``, ``olive.workflows.run(...,
package_config=...)``); a surgeon through the classes defined so far. :func:`package_config`
is Olive's own configuration with :class:`OnnxNormFusion` added, and ``onnxnorm olive run
workflow.json`` runs a workflow with both known (``onnxnorm olive package-config`` writes the
configuration for ``olive run``). ``import onnxnorm.olive`` is cheap; the first use of a name
below imports Olive and ``onnxnorm.olive.passes``, which defines the pass and the surgeon in
Olive's registries, as any Olive pass module does; nothing registers the onnxnorm library
anywhere but in the sessions of an :class:`OnnxNormModelHandler`.

Targets (``onnxnorm.targets``): ``function`` and ``ort`` and ``onnx`` models run in any ONNX
Runtime session, Olive's evaluation included. A ``fused`` model holds onnxnorm nodes without
function bodies: the pass returns it as an :class:`OnnxNormModelHandler` (model type
``OnnxNormModel``), whose sessions register the onnxnorm library, so that Olive's evaluators
run it; a ``fused`` model from the surgeon is a plain ``ONNXModel``, which runs only where the
library is registered (``onnxnorm.runtime.register``).
"""

from __future__ import annotations

from typing import Any

from onnxnorm import targets
from onnxnorm.errors import OnnxNormError, UnknownTarget

#: the names a workflow config uses: the pass's ``type`` and the surgery's ``surgeon``
PASS = "OnnxNormFusion"
SURGEON = "OnnxNormFuse"
#: the key of the fusion report (and the verify results) in the output model's attributes
ATTRIBUTE = "onnxnorm"


class OliveSettingError(OnnxNormError, ValueError):
    """A bad setting of the pass or the surgeon, or a failed verify; a ValueError, which Olive's
    engine passes on to the caller instead of recording a failed run."""


def check_target(target: Any, where: str = PASS) -> str:
    """``target`` if it names an onnxnorm target, else :class:`OliveSettingError` in one line."""
    try:
        return targets.check(target)
    except UnknownTarget as error:
        raise OliveSettingError(f"{where}: {error}") from None


#: the names ``onnxnorm.olive.passes`` defines, loaded on first use (they import Olive)
_NAMES = ("OnnxNormFuse", "OnnxNormFusion", "OnnxNormModelHandler", "package_config")


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module 'onnxnorm.olive' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module("onnxnorm.olive.passes"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))


__all__ = ["ATTRIBUTE", "PASS", "SURGEON", "OliveSettingError", "check_target", *_NAMES]

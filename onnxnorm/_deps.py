"""Optional dependencies: one place that says which extra provides what, and the one-line error
a user sees when it is missing.

onnxnorm needs one ONNX Runtime distribution, chosen with an extra (``onnxnorm[cpu]``:
onnxruntime, ``onnxnorm[gpu]``: onnxruntime-gpu; both provide the module ``onnxruntime``);
torch and transformers come with ``onnxnorm[torch]``, matplotlib with ``onnxnorm[bench]``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from onnxnorm.errors import MissingDependency  # re-exported: its home before onnxnorm.errors

#: module -> (pip extra, what installing it means)
EXTRAS = {
    "onnxruntime": (
        "cpu",
        "pip install 'onnxnorm[cpu]' (onnxruntime) or 'onnxnorm[gpu]' (onnxruntime-gpu)",
    ),
    "torch": ("torch", "pip install 'onnxnorm[torch]'"),
    "transformers": ("torch", "pip install 'onnxnorm[torch]'"),
    "matplotlib": ("bench", "pip install 'onnxnorm[bench]'"),
    "onnxruntime_genai": ("genai", "pip install 'onnxnorm[genai]'"),
    "olive": ("olive", "pip install 'onnxnorm[olive]'"),
    "pytriton": ("serve", "pip install 'onnxnorm[serve]'"),
}


def message(module: str, purpose: str) -> str:
    return f"{purpose} needs {module}, which is not installed: {EXTRAS[module][1]}"


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, purpose: str) -> ModuleType:
    """Imports ``module`` or raises :class:`MissingDependency` naming ``purpose`` and the extra
    that provides it."""
    if not available(module):
        raise MissingDependency(message(module, purpose), name=module)
    return importlib.import_module(module)


def _print_missing(kind, error, traceback) -> None:
    if issubclass(kind, MissingDependency):
        print(f"onnxnorm: error: {error}", file=sys.stderr)
    else:
        sys.__excepthook__(kind, error, traceback)


def require_runtime() -> None:
    """Called by ``import onnxnorm``: without ONNX Runtime it raises MissingDependency, and a
    program that does not catch it (``onnxnorm ...`` on the command line, a script) prints that
    one line instead of a traceback (only where the default exception hook is in place)."""
    if available("onnxruntime"):
        return
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _print_missing
    raise MissingDependency(message("onnxruntime", "onnxnorm"), name="onnxruntime")

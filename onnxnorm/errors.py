"""The errors onnxnorm raises, and the one way it quotes another library's error.

- :class:`OnnxNormError`: bad input or a bad setting, with a message for the user (the command
  line prints it as it is, in one line, and exits 1).
- :class:`UnknownTarget`: a target (export mode, fusion target) that is not one of
  :data:`onnxnorm.targets.TARGETS`; also a ``ValueError``, as it was before it had a name.
- :class:`MissingDependency`: an optional dependency is not installed (also an
  ``ImportError``); the message says which extra provides it.
- :class:`OutputDoesNotLoad`: the fusion pass made a model that ONNX Runtime does not load
  although it loads the input: a bug of onnxnorm, never written (the command line's exit 2).

Imports nothing, so that every module, the command line's registration included, can use it.
"""

from __future__ import annotations


class OnnxNormError(Exception):
    """An error for the user: the message says what is wrong and is printed as it is."""


class UnknownTarget(OnnxNormError, ValueError):
    """A target name that onnxnorm does not know."""


class MissingDependency(ImportError):
    """An optional dependency is not installed; the message says what needs it and how to
    install it, in one line."""


class OutputDoesNotLoad(RuntimeError):
    """The fused model does not load in ONNX Runtime although the input does: a bug of the pass
    (the command line's exit status 2), never written."""


def first_line(error: BaseException, fallback: str | None = None) -> str:
    """The first line of ``error``'s message, stripped: how onnxnorm quotes the errors of
    onnx, ONNX Runtime, torch and the others inside its own one-line messages. An empty message
    gives ``fallback``, or the error's type name."""
    text = str(error).strip()
    if text:
        return text.splitlines()[0].strip()
    return fallback if fallback is not None else type(error).__name__

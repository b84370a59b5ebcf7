"""The ``onnxnorm`` command line (also ``python -m onnxnorm``).

Each subcommand lives with its concern (``onnxnorm/<concern>/cli.py``) and provides
``register(subparsers)``; registering must stay cheap and work without the optional
dependencies (no torch import), the command's ``run`` imports what it needs. Errors meant for the
user are :class:`OnnxNormError` and, for a missing optional dependency,
:class:`onnxnorm.errors.MissingDependency`: one line on stderr and exit status 1, never a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from onnxnorm.errors import MissingDependency, OnnxNormError

#: command -> (module that registers it, one-line help), in the order ``--help`` lists them
COMMANDS = {
    "export": ("onnxnorm.nn.cli", "export a model with one onnxnorm node per norm"),
    "fuse": ("onnxnorm.fusion.cli", "replace norm patterns with fused onnxnorm ops"),
    "lower": ("onnxnorm.deploy.cli", "rewrite an onnxnorm model for another runtime or target"),
    "genai": ("onnxnorm.genai.cli", "fuse the norms of an onnxruntime-genai model folder"),
    "olive": ("onnxnorm.olive.cli", "run an Olive workflow with onnxnorm's pass and surgeon"),
    "triton": ("onnxnorm.serve.cli", "write a Triton Inference Server model repository"),
    "bench": ("onnxnorm.bench.cli", "benchmarks: onnxnorm against ORT, torch and a memory copy"),
}


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the full arguments of ``command`` only: the other commands are listed
    by name and help, so that ``onnxnorm fuse`` never imports torch."""
    top = argparse.ArgumentParser(
        prog="onnxnorm",
        description="Normalization layers of LLMs as fused ONNX / ONNX Runtime ops.",
    )
    top.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    commands = top.add_subparsers(dest="command", required=True)
    for name, (module, text) in COMMANDS.items():
        if name == command:
            importlib.import_module(module).register(commands)
        else:
            commands.add_parser(name, help=text)
    return top


def _command(argv: Sequence[str]) -> str | None:
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser(_command(argv)).parse_args(argv)
    try:
        return args.run(args)
    except (OnnxNormError, MissingDependency) as error:
        print(f"onnxnorm: error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # a bug, not bad input: say so in one line unless --debug
        if args.debug:
            raise
        print(
            f"onnxnorm: internal error: {type(error).__name__}: {error} "
            "(rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``onnxnorm`` command line (also ``python -m onnxnorm``).

Each subcommand lives with its concern (``onnxnorm/<concern>/cli.py``) and provides
``register(subparsers)``; registering must stay cheap (no torch import), the command's ``run``
imports what it needs. Errors meant for the user are :class:`OnnxNormError`: one line on
stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from onnxnorm._io import OnnxNormError

#: modules that register a subcommand, in the order ``--help`` lists them
COMMANDS = ("onnxnorm.nn.cli", "onnxnorm.fusion.cli", "onnxnorm.bench.cli")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="onnxnorm", description="Normalization layers of LLMs as fused ONNX / ONNX Runtime ops.")
    top.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    commands = top.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        importlib.import_module(module).register(commands)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except OnnxNormError as error:
        print(f"onnxnorm: error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # a bug, not bad input: say so in one line unless --debug
        if args.debug:
            raise
        print(f"onnxnorm: internal error: {type(error).__name__}: {error} "
              "(rerun with --debug for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

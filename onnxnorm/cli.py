"""The ``onnxnorm`` command line (also ``python -m onnxnorm``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from onnxnorm._io import OnnxNormError


def _fuse(args: argparse.Namespace) -> int:
    from onnxnorm import fusion
    from onnxnorm._io import load_model, save_model

    model = load_model(args.input)
    fused, report = fusion.fuse(model, target=args.target)
    print(report)
    if args.json:
        text = json.dumps(report.to_dict(), indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    save_model(fused, args.output)
    print(f"wrote {args.output}")
    return 0


def parser() -> argparse.ArgumentParser:
    from onnxnorm.fusion import TARGETS

    top = argparse.ArgumentParser(
        prog="onnxnorm", description="Normalization layers of LLMs as fused ONNX / ONNX Runtime ops.")
    top.add_argument("--debug", action="store_true", help="show tracebacks of unexpected errors")
    commands = top.add_subparsers(dest="command", required=True)
    fuse = commands.add_parser(
        "fuse", help="replace decomposed norm patterns with fused onnxnorm ops",
        description="Find decomposed RMSNorm patterns in an exported ONNX model and replace each "
                    "with one onnxnorm node. The input file is never modified.")
    fuse.add_argument("input", help="the ONNX model to read")
    fuse.add_argument("-o", "--output", required=True, help="where to write the fused model")
    fuse.add_argument("--target", choices=TARGETS, default="function",
                      help="function: onnxnorm nodes with their ONNX function bodies (runs "
                           "anywhere; default); fused: without bodies (needs the library)")
    fuse.add_argument("--json", metavar="PATH", help="also write the fusion report as JSON "
                                                     "('-' for standard output)")
    fuse.set_defaults(run=_fuse)
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

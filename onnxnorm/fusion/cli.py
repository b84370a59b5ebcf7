"""``onnxnorm fuse``."""

from __future__ import annotations

import argparse
import json


def register(commands: argparse._SubParsersAction) -> None:
    from onnxnorm.fusion.pipeline import TARGETS

    fuse = commands.add_parser(
        "fuse", help="replace decomposed norm patterns with fused onnxnorm ops",
        description="Find decomposed norm patterns in an exported ONNX model and replace each "
                    "with one onnxnorm node. The input file is never modified.")
    fuse.add_argument("input", help="the ONNX model to read")
    fuse.add_argument("-o", "--output", required=True, help="where to write the fused model")
    fuse.add_argument("--target", choices=TARGETS, default="function",
                      help="function: onnxnorm nodes with their ONNX function bodies (runs "
                           "anywhere; default); fused: without bodies (needs the library); ort: ORT's own ops; onnx: standard ONNX ops only")
    fuse.add_argument("--json", metavar="PATH", help="also write the fusion report as JSON "
                                                     "('-' for standard output)")
    fuse.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from onnxnorm._io import load_model, save_model
    from onnxnorm.fusion.pipeline import fuse

    model = load_model(args.input)
    fused, report = fuse(model, target=args.target)
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

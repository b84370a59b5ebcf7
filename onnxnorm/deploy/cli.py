"""``onnxnorm lower MODEL -o OUT --for RUNTIME``: an onnxnorm file (``onnxnorm export`` or
``onnxnorm fuse`` output) rewritten for another runtime (``--for``) or target (``--target``)."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    from onnxnorm.targets import TARGETS, add_runtime_option, help_text

    lower = commands.add_parser(
        "lower",
        help="rewrite an onnxnorm model for another runtime or target",
        description="Rewrite the onnxnorm nodes of a model for a runtime (--for: each norm in "
        "the form that runtime runs best) or a target (--target). Nothing else of the model "
        "changes; the input file is never modified. Each node's form, and why where it is "
        "not the runtime's first choice, is printed.",
    )
    lower.add_argument("input", help="the ONNX model with onnxnorm nodes")
    lower.add_argument("-o", "--output", required=True, help="where to write the model")
    add_runtime_option(lower)
    lower.add_argument("--target", choices=TARGETS, help=help_text())
    lower.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import collections

    from onnxnorm._io import open_model, save_model
    from onnxnorm.errors import OnnxNormError
    from onnxnorm.fusion.lowering import lower_with_notes
    from onnxnorm.targets import DEFAULT

    if (args.runtime is None) == (args.target is None):
        raise OnnxNormError("give one of --for RUNTIME and --target TARGET")
    opened = open_model(args.input)
    lowered, notes = lower_with_notes(opened.model, args.target or DEFAULT, runtime=args.runtime)
    save_model(lowered, args.output, source=opened.path)
    written = f"for {args.runtime}" if args.runtime else f"to {args.target}"
    forms = collections.Counter(note.emitted for note in notes)
    for emitted, count in forms.most_common():
        print(f"{count} node(s) -> {emitted}")
    for note in notes:
        if note.reason:
            print(f"lowered {written}: {note}")
    print(f"wrote {args.output}")
    return 0

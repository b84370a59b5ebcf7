"""``onnxnorm bench fuse``: its options and its run. Registering imports nothing heavy."""

from __future__ import annotations

import argparse

from onnxnorm.bench.common import choices_list

#: the tools timed, in the order the table lists them
TOOLS = ("onnxnorm", "onnxscript", "ort")
#: ``onnxnorm fuse --data`` modes that can be timed on a model with external data
DATA = ("copy", "reflink", "link", "reference")
#: the decoders built when no --model is given
CASES = ("inline", "external")


def _size(text: str) -> tuple[int, int]:
    """``LAYERSxHIDDEN``, e.g. ``12x2048``."""
    layers, _, hidden = text.lower().partition("x")
    if not (layers.isdigit() and hidden.isdigit()) or int(layers) < 1 or int(hidden) < 64:
        raise argparse.ArgumentTypeError(f"{text}: give LAYERSxHIDDEN, e.g. 12x2048 (hidden >= 64)")
    if int(hidden) % 64:
        raise argparse.ArgumentTypeError(f"{text}: the hidden size must be a multiple of 64")
    return int(layers), int(hidden)


def register(subcommands: argparse._SubParsersAction) -> None:
    """Registers ``onnxnorm bench fuse``."""
    fuse = subcommands.add_parser(
        "fuse",
        help="the fusion pass on a whole file: onnxnorm fuse vs onnxscript and ORT's optimizer",
        description="Times onnxnorm fuse, onnxscript's optimize_for_ort and ONNX Runtime's "
        "transformers optimizer loading, optimizing and saving the same model file, each run "
        "in a fresh interpreter, on a decoder with its weights inside the file and one with "
        "its weights in external data (onnxnorm once per --data mode); prints the medians.",
    )
    fuse.add_argument(
        "--cases",
        type=choices_list(CASES),
        default=list(CASES),
        help="comma-separated decoders to build and time: inline (weights inside the file), "
        "external (weights in external data) (default: both)",
    )
    fuse.add_argument(
        "--inline-size",
        type=_size,
        default=(8, 1024),
        metavar="LxH",
        help="layers x hidden of the inline decoder (default 8x1024: 392 MiB)",
    )
    fuse.add_argument(
        "--external-size",
        type=_size,
        default=(12, 2048),
        metavar="LxH",
        help="layers x hidden of the external-data decoder (default 12x2048: 2.47 GB)",
    )
    fuse.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="PATH",
        help="time this model file instead of building decoders (repeatable); its folder must "
        "be writable (outputs are written beside it, then removed)",
    )
    fuse.add_argument(
        "--tools",
        type=choices_list(TOOLS),
        default=list(TOOLS),
        help="comma-separated tools: onnxnorm, onnxscript, ort (default: all)",
    )
    fuse.add_argument(
        "--data",
        type=choices_list(DATA),
        default=["copy", "link", "reference"],
        help="comma-separated onnxnorm fuse --data modes timed on a model with external data "
        "(default: copy,link,reference; reflink where the file system clones)",
    )
    fuse.add_argument("--target", default=None, help="onnxnorm fuse --target (default: its own)")
    fuse.add_argument("--repeats", type=int, default=3, help="runs of each tool (default 3)")
    fuse.add_argument(
        "--folder",
        metavar="DIR",
        help="build the decoders in DIR and keep them (reused when there); default: a "
        "temporary folder, removed at the end",
    )
    fuse.add_argument(
        "--memory-limit",
        type=float,
        metavar="GIB",
        help="the address space each run may take (RLIMIT_AS): a tool that needs more fails "
        "with an out-of-memory error in its row instead of waking the kernel's OOM killer on a "
        "shared machine (default: no limit)",
    )
    fuse.add_argument("--json", metavar="PATH", help="write the results as JSON")
    fuse.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``onnxnorm bench fuse``: bad arguments are one-line errors before anything runs."""
    from pathlib import Path

    from onnxnorm._deps import require
    from onnxnorm._io import OnnxNormError, check_input, check_output

    if args.repeats < 1:
        raise OnnxNormError("--repeats must be at least 1")
    if args.memory_limit is not None and args.memory_limit <= 0:
        raise OnnxNormError("--memory-limit must be more than 0 GiB")
    for path in args.model:
        check_input(path)
    if args.json:
        check_output(args.json)
    if args.folder and Path(args.folder).exists() and not Path(args.folder).is_dir():
        raise OnnxNormError(f"--folder {args.folder}: not a folder")
    if args.target is not None:
        from onnxnorm import targets

        targets.check(args.target)
    if "onnxscript" in args.tools:
        require("onnxscript", "onnxnorm bench fuse (the onnxscript contender)")
    if not args.model:
        require("torch", "onnxnorm bench fuse (exporting the decoders)")
    from onnxnorm.bench.fuse import measure

    measure.run(
        models=[Path(p) for p in args.model],
        cases=args.cases,
        sizes={"inline": args.inline_size, "external": args.external_size},
        tools=args.tools,
        data=args.data,
        target=args.target,
        repeats=args.repeats,
        folder=Path(args.folder) if args.folder else None,
        json_path=args.json,
        memory_limit=args.memory_limit,
    )
    return 0

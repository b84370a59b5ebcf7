"""``onnxnorm fuse``."""

from __future__ import annotations

import argparse
import json
import sys

from onnxnorm.targets import add_runtime_option


def add_fusion_options(
    parser: argparse.ArgumentParser,
    *,
    output_help: str,
    verify_help: str,
    verify_default: bool | None = False,
) -> None:
    """The options ``onnxnorm fuse`` and ``onnxnorm genai`` share: the output, the target,
    --verify (``verify_default`` None: --verify/--no-verify, the default decided by the
    command), --overwrite, --strict-precision, --upgrade-opset and --json."""
    from onnxnorm.targets import DEFAULT, TARGETS, help_text

    parser.add_argument("-o", "--output", required=True, help=output_help)
    parser.add_argument("--target", choices=TARGETS, default=DEFAULT, help=help_text())
    if verify_default is None:
        parser.add_argument(
            "--verify", action=argparse.BooleanOptionalAction, default=None, help=verify_help
        )
    else:
        parser.add_argument("--verify", action="store_true", help=verify_help)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the output folder if it exists (a single output file is always replaced)",
    )
    parser.add_argument(
        "--strict-precision",
        action="store_true",
        help="leave norms whose statistics the original computes in float16/"
        "bfloat16 as they are (by default they are fused with float32 "
        "statistics, as onnxnorm's ops compute them, and the report says "
        "so)",
    )
    parser.add_argument(
        "--upgrade-opset",
        action="store_true",
        help="where the model's ONNX opset is too old for an onnxnorm node's "
        "function body or lowering (bfloat16 below opset 13, quantizers "
        "below 10/11, float8 below 19), convert the model to the oldest "
        "opset that has them with onnx's version converter (by default "
        "such a node keeps no body and needs the onnxnorm library; the "
        "report says why)",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="also write the report as JSON ('-' for standard output)"
    )


def write_json(result: dict, path: str | None) -> None:
    """The report as JSON to ``path`` ('-': standard output), when a path is given."""
    if not path:
        return
    text = json.dumps(result, indent=2)
    if path == "-":
        print(text)
    else:
        with open(path, "w") as f:
            f.write(text + "\n")


def register(commands: argparse._SubParsersAction) -> None:
    fuse = commands.add_parser(
        "fuse",
        help="replace norm patterns with fused onnxnorm ops",
        description="Find the norms of an exported ONNX model (decomposed, or single ops of "
        "ONNX or ONNX Runtime), fuse each with its residual add where exact, and "
        "write them for a target. The input file is never modified; the output is "
        "written atomically (with external data when the input has it or is over "
        "2 GB). Given a folder (an Optimum export: model.onnx, or encoder_model."
        "onnx, decoder_model.onnx, decoder_with_past_model.onnx and decoder_model_"
        "merged.onnx), it writes a copy of the folder with every .onnx file fused "
        "and verified and the other files copied.",
    )
    fuse.add_argument("input", help="the ONNX model, or the folder of ONNX models, to read")
    add_fusion_options(
        fuse,
        output_help="where to write the fused model (for a folder: the folder to write)",
        verify_default=None,
        verify_help="run the original and the fused model in onnxruntime on generated inputs, "
        "print the max abs/rel error per output; exit 3 (output not kept) when over "
        "tolerance. Default: on for a folder (each file; a merged decoder in both "
        "branches), off for a file",
    )
    add_runtime_option(fuse)
    add_data_option(fuse)
    fuse.set_defaults(run=run)


def add_data_option(parser: argparse.ArgumentParser) -> None:
    """``--data MODE``: how a model file's output gets the input's unchanged external data
    (``onnxnorm._io.DATA_MODES``; the choices are spelled here so that ``--help`` imports
    nothing)."""
    parser.add_argument(
        "--data",
        choices=("copy", "reflink", "link", "reference"),
        default="copy",
        help="how the output gets the weights the pass leaves unchanged, for an input with "
        "external data: 'copy' (default) writes OUTPUT.data, a file of its own that starts as "
        "a clone of the input's data file where the file system shares extents (XFS, btrfs: "
        "copy on write, no byte copied), else as a copy; 'reflink' the same, refused where the "
        "file system cannot clone; 'link' makes OUTPUT.linked.data, a hard link to the "
        "input's data file (same file system; the same file under two names: never write "
        "either in place; onnx's loader refuses a data file with several links, the input's "
        "too while the link exists, ONNX Runtime reads them); 'reference' names the input's "
        "data file where it is, which must lie in the output's folder or below (deleting, "
        "moving or rewriting the input then breaks the output). With 'link' and 'reference' "
        "only the new tensors are written, to OUTPUT.data. The input's files are never "
        "written",
    )


def run(args: argparse.Namespace) -> int:
    """``onnxnorm fuse FILE -o OUT``: :func:`onnxnorm.fusion.files.fuse_file`."""
    from pathlib import Path

    from onnxnorm._io import check_output
    from onnxnorm.errors import OnnxNormError
    from onnxnorm.fusion.files import CannotVerify, fuse_file

    if Path(args.input).is_dir():
        return run_folder(args)
    if args.json and args.json != "-":
        check_output(args.json, inputs=[args.input, args.output])
    try:
        result = fuse_file(
            args.input,
            args.output,
            target=args.target,
            runtime=args.runtime,
            strict_precision=args.strict_precision,
            upgrade=args.upgrade_opset,
            verify=bool(args.verify),
            data=args.data,
        )
    except CannotVerify as error:
        raise OnnxNormError(f"--verify {error}") from None
    for note in result.notes:
        print(f"note: {note}")
    print(result.report)
    for check in result.checks or ():
        print(f"verify: {check}")
    answer = result.report.to_dict()
    answer["input_notes"] = result.notes
    if result.checks is not None:
        answer["verify"] = [vars(c) for c in result.checks]
    write_json(answer, args.json)
    if not result.kept:
        print(
            "onnxnorm: verify failed: the fused model's outputs differ beyond tolerance; "
            f"{args.output} not kept",
            file=sys.stderr,
        )
        return 3
    where = result.written.describe() if result.written is not None else ""
    if where:
        print(f"data: {where}")
    print(f"wrote {args.output}")
    return 0


def run_folder(args: argparse.Namespace) -> int:
    """``onnxnorm fuse DIR -o OUT_DIR``: :func:`onnxnorm.fusion.folder.fuse_folder`."""
    from onnxnorm._io import check_output
    from onnxnorm.errors import OnnxNormError
    from onnxnorm.fusion.folder import fuse_folder, onnx_files

    if args.data != "copy":
        raise OnnxNormError(
            f"--data {args.data} applies to a model file; a folder's output is a folder of its "
            "own, with every file copied (--data copy)"
        )
    onnx_files(args.input)
    if args.json and args.json != "-":
        check_output(args.json)
    report = fuse_folder(
        args.input,
        args.output,
        target=args.target,
        runtime=args.runtime,
        verify=args.verify is not False,
        overwrite=args.overwrite,
        strict_precision=args.strict_precision,
        upgrade=args.upgrade_opset,
    )
    print(report)
    write_json(report.to_dict(), args.json)
    if not report.written:
        failed = ", ".join(f.name for f in report.files if not f.ok)
        print(
            f"onnxnorm: verify failed: outputs over tolerance in {failed}; {args.output} not "
            "written",
            file=sys.stderr,
        )
        return 3
    print(f"wrote {args.output}")
    return 0

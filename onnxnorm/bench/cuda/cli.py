"""``onnxnorm bench cuda`` and ``python -m onnxnorm.bench.cuda``: the options (one definition
for both) and the runs. Registering imports nothing heavy."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from onnxnorm.bench import common
from onnxnorm.bench.cuda.cases import DEFAULT_DTYPES, DTYPES

DESCRIPTION = (
    "CUDA kernel bandwidth: the onnxnorm CUDA kernels against a device-to-device copy, torch "
    "and ONNX Runtime's CUDA ops."
)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--library", help="the CUDA library (default: the installed one)")
    parser.add_argument(
        "--reps",
        type=int,
        default=30,
        help="timed repetitions of each kernel and copy (default 30)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--dtypes",
        type=common.choices_list(DTYPES),
        help=f"comma-separated, of {', '.join(DTYPES)} (default {','.join(DEFAULT_DTYPES)})",
    )
    which.add_argument("--dtype", choices=DTYPES, help="one dtype (as --dtypes D)")
    parser.add_argument(
        "--no-ort",
        action="store_true",
        help="leave out ONNX Runtime's CUDA ops (n/a in their columns)",
    )
    parser.add_argument("--json", help="write the rows and the environment here")


def dtypes_of(args: argparse.Namespace) -> list[str]:
    """The dtypes to measure: --dtypes, else --dtype, else DEFAULT_DTYPES."""
    if args.dtypes:
        return list(args.dtypes)
    return [args.dtype] if args.dtype else list(DEFAULT_DTYPES)


def register(subcommands: argparse._SubParsersAction) -> None:
    """Registers ``onnxnorm bench cuda``."""
    cuda = subcommands.add_parser(
        "cuda",
        help="CUDA kernels' bandwidth against a device-to-device copy (needs a GPU)",
        description=DESCRIPTION + " Drives the CUDA library's C launcher on torch CUDA tensors "
        "(onnxruntime-gpu only for ORT's own ops) and prints a markdown table per dtype with "
        "each op's targets.",
    )
    add_options(cuda)
    cuda.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``onnxnorm bench cuda``: what is missing is a one-line error."""
    from pathlib import Path

    from onnxnorm._deps import require
    from onnxnorm._io import OnnxNormError, check_output

    if args.reps < 1:
        raise OnnxNormError("--reps must be at least 1")
    if args.library and not Path(args.library).is_file():
        raise OnnxNormError(f"--library {args.library}: no such file")
    if args.json:
        check_output(args.json)
    torch = require("torch", "onnxnorm bench cuda")
    if not torch.cuda.is_available():
        raise OnnxNormError("onnxnorm bench cuda: torch sees no CUDA device")
    from onnxnorm.bench.cuda import runner

    runner.report(args.library, dtypes_of(args), args.reps, args.json, ort=not args.no_ort)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m onnxnorm.bench.cuda`` (tools/gpu_check.sh runs it)."""
    parser = argparse.ArgumentParser(prog="python -m onnxnorm.bench.cuda", description=DESCRIPTION)
    add_options(parser)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("onnxnorm.bench.cuda: torch sees no CUDA device", file=sys.stderr)
        return 2
    from onnxnorm.bench.cuda import runner

    runner.report(args.library, dtypes_of(args), args.reps, args.json, ort=not args.no_ort)
    return 0

"""``onnxnorm bench cuda`` and ``python -m onnxnorm.bench.cuda``: the options (one definition
for both) and the runs. Registering imports nothing heavy."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

DTYPES = ("float32", "float16", "bfloat16")
DESCRIPTION = "CUDA kernel bandwidth: the onnxnorm CUDA kernels against a device-to-device copy."


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--library", help="the CUDA library (default: the installed one)")
    parser.add_argument(
        "--reps",
        type=int,
        default=30,
        help="timed repetitions of each kernel and copy (default 30)",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--json", help="write the bandwidth rows here")


def register(subcommands: argparse._SubParsersAction) -> None:
    """Registers ``onnxnorm bench cuda``."""
    cuda = subcommands.add_parser(
        "cuda",
        help="CUDA kernels' bandwidth against a device-to-device copy (needs a GPU)",
        description=DESCRIPTION + " Drives the CUDA library's C launcher on torch CUDA tensors "
        "(no onnxruntime-gpu needed) and prints a markdown table with "
        "each op's target.",
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
    from onnxnorm.bench import cuda_bandwidth as bandwidth

    bandwidth.report(args.library, args.dtype, args.reps, args.json)
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
    from onnxnorm.bench import cuda_bandwidth as bandwidth

    bandwidth.report(args.library, args.dtype, args.reps, args.json)
    return 0

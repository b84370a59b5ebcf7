"""``onnxnorm bench``: the benchmarks, each a subcommand that registers itself from its own
module (``onnxnorm/bench/<name>/cli.py``: ``register(subcommands)`` adds its options and sets
``run``), the way the top-level commands do. Registering imports nothing heavy (no torch, no
onnx), so every ``--help`` stays fast; a command's ``run`` imports what it measures with."""

from __future__ import annotations

import argparse
import importlib

#: subcommand -> the module that registers it, in the order ``onnxnorm bench --help`` lists them
SUBCOMMANDS = {
    "kernels": "onnxnorm.bench.kernels.cli",  # the CPU kernels against ORT, torch and a copy
    "e2e": "onnxnorm.bench.e2e.cli",  # generation with a KV cache, end to end
    "cuda": "onnxnorm.bench.cuda.cli",  # the CUDA kernels' bandwidth, on a GPU machine
    "fuse": "onnxnorm.bench.fuse.cli",  # the fusion pass on a file against onnxscript and ORT
}


def register(commands: argparse._SubParsersAction) -> None:
    """Registers ``onnxnorm bench`` and its subcommands."""
    bench = commands.add_parser(
        "bench",
        help="benchmarks: onnxnorm against ORT, torch and a memory copy",
        description="Benchmarks that print markdown tables of medians and ratios.",
    )
    subcommands = bench.add_subparsers(dest="bench", required=True)
    for module in SUBCOMMANDS.values():
        importlib.import_module(module).register(subcommands)

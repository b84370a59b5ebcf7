"""``onnxnorm bench kernels``: its options and its run. Registering imports nothing heavy (the
ops are read from the catalogue only when ``--ops`` is given or the command runs)."""

from __future__ import annotations

import argparse

from onnxnorm.bench.common import choices_list
from onnxnorm.bench.kernels.cases import ALL_SHAPES, DTYPES, QUANT_TYPE, QUANT_ZERO_POINTS, SHAPES


def _ops() -> tuple[str, ...]:
    from onnxnorm.ops import catalogue

    return tuple(catalogue.ALL_OPS)


def register(subcommands: argparse._SubParsersAction) -> None:
    """Registers ``onnxnorm bench kernels``."""
    kernels = subcommands.add_parser(
        "kernels",
        help="CPU kernels vs ORT's built-in ops, the decomposed graph, torch and a copy",
        description="Times every onnxnorm op on the CPU against ONNX Runtime's built-in ops for "
        "the same math, the graph torch.onnx.export writes, torch eager and a memory "
        "copy of the same bytes, in one run with interleaved repetitions; prints "
        "medians and ratios.",
    )
    kernels.add_argument(
        "--ops", type=choices_list(_ops), default=None, help="comma-separated ops (default: all)"
    )
    kernels.add_argument(
        "--shapes",
        type=choices_list(ALL_SHAPES),
        default=None,
        help=f"comma-separated shapes from {', '.join(SHAPES)} (the ops without shapes of their "
        f"own), {', '.join(s for s in ALL_SHAPES if s not in SHAPES)} (GatedRMSNorm's, "
        "L2Norm's and the rotary ops', from the models that have them); each op runs those it "
        "has (default: all)",
    )
    kernels.add_argument(
        "--dtypes",
        type=choices_list(DTYPES),
        default=list(DTYPES),
        help="comma-separated dtypes (default: float32,float16,bfloat16)",
    )
    kernels.add_argument(
        "--quant-type",
        choices=tuple(QUANT_ZERO_POINTS),
        default=QUANT_TYPE,
        help="the type the static quantized ops (<Norm>QuantizeLinear) quantize "
        "to, by their zero point's type; ORT's QuantizeLinear after its "
        "norm quantizes to the same (default int8)",
    )
    kernels.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    kernels.add_argument(
        "--repeats", type=int, default=9, help="interleaved repetitions (default 9)"
    )
    kernels.add_argument(
        "--min-sample",
        type=float,
        default=0.002,
        help="each timed sample loops until it lasts this many seconds (default 0.002)",
    )
    kernels.add_argument(
        "--warmup",
        type=float,
        default=0.01,
        help="before each timed sample, run the same contender untimed for this "
        "many seconds (default 0.01)",
    )
    kernels.add_argument(
        "--compare-library",
        metavar="NAME=PATH",
        action="append",
        default=[],
        help="also time this other build of libonnxnorm_ops.so (a copy of an "
        "older one, say) in the same run, as contender onnxnorm@NAME; "
        "repeatable",
    )
    kernels.add_argument("--json", metavar="PATH", help="write the results as JSON")
    kernels.add_argument("--plot", metavar="PATH", help="draw a PNG plot of the ratios")
    kernels.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``onnxnorm bench kernels``: bad arguments are one-line errors before anything runs."""
    import os

    from onnxnorm._deps import require
    from onnxnorm._io import OnnxNormError, check_output

    if args.threads < 1 or args.repeats < 1:
        raise OnnxNormError("--threads and --repeats must be at least 1")
    if args.warmup < 0:
        raise OnnxNormError("--warmup must be 0 or more")
    compare = {}
    for item in args.compare_library:
        name, _, path = item.partition("=")
        if not name or not path or not os.path.isfile(path):
            raise OnnxNormError(f"--compare-library {item}: give NAME=PATH of a library file")
        compare[name] = path
    for path in (args.json, args.plot):
        if path:
            check_output(path)
    if args.plot:
        require("matplotlib", "onnxnorm bench kernels --plot")
    require("torch", "onnxnorm bench kernels")  # the torch eager contender
    from onnxnorm.bench.kernels import measure

    ops = list(_ops()) if args.ops is None else args.ops
    measure.run(
        ops,
        args.shapes,
        args.dtypes,
        threads=args.threads,
        repeats=args.repeats,
        min_sample=args.min_sample,
        json_path=args.json,
        plot_path=args.plot,
        warmup=args.warmup,
        compare=compare,
        quant_type=args.quant_type,
    )
    return 0

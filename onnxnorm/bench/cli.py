"""``onnxnorm bench``: benchmarks (``onnxnorm bench kernels``: the CPU kernels; ``onnxnorm bench
e2e``: generation with a KV cache, end to end; the CUDA kernels' bandwidth is
``python -m onnxnorm.bench.cuda``, on a GPU machine)."""

from __future__ import annotations

import argparse


def _csv(choices):
    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)}; choose from {', '.join(choices)}")
        return values
    return parse


def register(commands: argparse._SubParsersAction) -> None:
    from onnxnorm.ops import catalogue

    shapes = ("1x1x4096", "1x128x4096", "4x512x4096", "1x2048x8192", "qk-1x512x32x128")
    dtypes = ("float32", "float16", "bfloat16")
    bench = commands.add_parser("bench", help="benchmarks: onnxnorm against ORT, torch and a memory copy",
                                description="Benchmarks that print markdown tables of medians and ratios.")
    which = bench.add_subparsers(dest="bench", required=True)
    kernels = which.add_parser(
        "kernels", help="CPU kernels vs ORT's built-in ops, the decomposed graph, torch and a copy",
        description="Times every onnxnorm op on the CPU against ONNX Runtime's built-in ops for the same "
                    "math, the graph torch.onnx.export writes, torch eager and a memory copy of the same "
                    "bytes, in one run with interleaved repetitions; prints medians and ratios.")
    kernels.add_argument("--ops", type=_csv(tuple(catalogue.OPS)), default=list(catalogue.OPS),
                         help="comma-separated ops (default: all)")
    kernels.add_argument("--shapes", type=_csv(shapes), default=list(shapes),
                         help=f"comma-separated shapes from {', '.join(shapes)} (default: all)")
    kernels.add_argument("--dtypes", type=_csv(dtypes), default=list(dtypes),
                         help="comma-separated dtypes (default: float32,float16,bfloat16)")
    quant_types = tuple(t[len("tensor("):-1] for t in catalogue.QUANT_TYPES)
    kernels.add_argument("--quant-type", choices=quant_types, default="int8",
                         help="the type the static quantized ops (<Norm>QuantizeLinear) quantize to, "
                              "by their zero point's type; ORT's QuantizeLinear after its norm quantizes "
                              "to the same (default int8)")
    kernels.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    kernels.add_argument("--repeats", type=int, default=9, help="interleaved repetitions (default 9)")
    kernels.add_argument("--min-sample", type=float, default=0.002,
                         help="each timed sample loops until it lasts this many seconds (default 0.002)")
    kernels.add_argument("--warmup", type=float, default=0.01,
                         help="before each timed sample, run the same contender untimed for this many seconds "
                              "(default 0.01)")
    kernels.add_argument("--compare-library", metavar="NAME=PATH", action="append", default=[],
                         help="also time this other build of libonnxnorm_ops.so (a copy of an older one, say) "
                              "in the same run, as contender onnxnorm@NAME; repeatable")
    kernels.add_argument("--json", metavar="PATH", help="write the results as JSON")
    kernels.add_argument("--plot", metavar="PATH", help="draw a PNG plot of the ratios")
    kernels.set_defaults(run=_run_kernels)

    from onnxnorm.bench import e2e

    e2e.add_parser(which)


def _run_kernels(args: argparse.Namespace) -> int:
    from onnxnorm._deps import require
    from onnxnorm._io import OnnxNormError, check_output

    if args.threads < 1 or args.repeats < 1:
        raise OnnxNormError("--threads and --repeats must be at least 1")
    if args.warmup < 0:
        raise OnnxNormError("--warmup must be 0 or more")
    import os

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
    from onnxnorm.bench import kernels

    kernels.run(args.ops, args.shapes, args.dtypes, threads=args.threads, repeats=args.repeats,
                min_sample=args.min_sample, json_path=args.json, plot_path=args.plot, warmup=args.warmup,
                compare=compare, quant_type=args.quant_type)
    return 0

"""``onnxnorm bench e2e``: its options and its run. Registering imports nothing heavy (the
choices and defaults come from ``config``); running says in one line what is missing."""

from __future__ import annotations

import argparse

from onnxnorm.bench.common import choices_list
from onnxnorm.bench.e2e.config import (
    DEFAULT_FAMILIES,
    DEFAULT_VARIANTS,
    DEVICES,
    DTYPES,
    FAMILIES,
    GENAI_CHOICES,
    GENAI_PRECISIONS,
    QUANTIZATIONS,
    RUNTIME_RUNNERS,
    VARIANTS,
    Config,
    check_keep,
)


def register(subcommands: argparse._SubParsersAction) -> None:
    """Registers ``onnxnorm bench e2e``."""
    e2e = subcommands.add_parser(
        "e2e",
        help="generation with a KV cache: every way of fusing a decoder's norms, end to end",
        description="Exports a Llama-style and a Gemma-2-style decoder (random weights) with "
        "their KV cache, makes every variant (the export as it is, ORT's transformers "
        "optimizer, onnxscript's ort_fusions, onnxnorm fuse --target ort / fused, "
        "onnxnorm.export --mode fused) and generates greedily with each in one run "
        "in lockstep beside a control (a second session of the first variant); the "
        "same through onnxruntime-genai before and after onnxnorm genai; with "
        "--quantize, the same decoder quantized by ORT's quantize_dynamic / "
        "quantize_static, as it is and after onnxnorm fuse. Prints prefill and "
        "per-token latency, tokens/s, node counts, the share of norm kernels, peak "
        "memory and whether the tokens agree. With --runtime, instead: the export "
        "against onnxnorm's output --for each runtime, on that runtime.",
    )
    e2e.add_argument(
        "--models",
        type=choices_list(FAMILIES),
        default=list(DEFAULT_FAMILIES),
        help="comma-separated decoders: llama, gemma2, qwen3 (its Q/K norms and rotary) "
        "(default: llama,gemma2)",
    )
    e2e.add_argument(
        "--dtypes",
        type=choices_list(DTYPES),
        default=list(DTYPES),
        help="comma-separated dtypes of the exported decoders (default: float32,float16)",
    )
    e2e.add_argument(
        "--variants",
        type=choices_list(tuple(VARIANTS)),
        default=list(DEFAULT_VARIANTS),
        help="comma-separated variants (default: all but onnxnorm-fused-norotary, which "
        "measures the rotary op against the same fusion without it)",
    )
    e2e.add_argument(
        "--quantize",
        type=choices_list(("none",) + tuple(QUANTIZATIONS)),
        default=["none"],
        help="comma-separated quantizations of the exported decoder to measure, "
        "each a group of its own: none (the float export and its --variants), "
        "dynamic (quantize_dynamic), static (quantize_static, QDQ, calibrated "
        "on generated prompts); the quantized model as it is, after ORT's "
        "optimizer and after onnxnorm fuse --target ort / fused "
        "(default: none)",
    )
    e2e.add_argument(
        "--genai",
        type=choices_list(GENAI_CHOICES + ("none",)),
        default=list(GENAI_PRECISIONS),
        help="comma-separated model builder precisions (fp32, fp16, int4) for the "
        "onnxruntime-genai rows, or none (default: fp32,int4)",
    )
    e2e.add_argument(
        "--devices",
        type=choices_list(DEVICES + ("auto",)),
        default=["auto"],
        help="cpu, cuda, cuda-graph (onnxruntime-gpu; CUDA graphs apply to the "
        "genai rows) or auto: the CPU, and both CUDA rows where onnxruntime "
        "offers the CUDA provider (default)",
    )
    e2e.add_argument(
        "--runtime",
        type=choices_list(tuple(RUNTIME_RUNNERS)),
        metavar="RUNNERS",
        help="instead of the generation groups: on each of these comma-separated runners ("
        + ", ".join(f"{r} with --for {t}" for r, t in RUNTIME_RUNNERS.items())
        + "), the export as it is (its norms decomposed) against onnxnorm's output written "
        "--for that runtime and the function file, with the same inputs: a prefill (batch 1, "
        "--prompt tokens, the cache empty) and one decode step (1 token after a cache of "
        "--prompt positions), each a single forward run timed on its own, not the generation "
        "loop (--new-tokens, --variants, --quantize, --genai and --devices do not apply); the "
        "ratio output / original, the outputs' largest difference and where the nodes ran; a "
        "runner that cannot run here is a row that says why",
    )
    e2e.add_argument("--layers", type=int, default=Config.layers, help="decoder layers (default 8)")
    e2e.add_argument("--hidden", type=int, default=Config.hidden, help="hidden size (default 1024)")
    e2e.add_argument(
        "--vocab", type=int, default=Config.vocab, help="vocabulary size (default 2048)"
    )
    e2e.add_argument(
        "--prompt", type=int, default=Config.prompt, help="prompt tokens (default 512)"
    )
    e2e.add_argument(
        "--new-tokens", type=int, default=Config.new_tokens, help="tokens to generate (default 128)"
    )
    e2e.add_argument(
        "--repeats",
        type=int,
        default=Config.repeats,
        help="repetitions of every variant's generation (default 5)",
    )
    e2e.add_argument(
        "--threads", type=int, default=Config.threads, help="intra-op threads (default 2)"
    )
    e2e.add_argument(
        "--keep",
        metavar="FOLDER",
        help="write the models into this folder and keep them; a later run with the "
        "same folder and sizes uses them again (their making is not timed)",
    )
    e2e.add_argument(
        "--prepare-only",
        action="store_true",
        help="with --keep: make the models, measure nothing (a busy machine can make "
        "them; the measuring run wants a quiet one)",
    )
    e2e.add_argument("--json", metavar="PATH", help="write the results as JSON")
    e2e.add_argument("--plot", metavar="PATH", help="draw a PNG plot of the latencies")
    e2e.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``onnxnorm bench e2e``: bad arguments are one-line errors before anything is made."""
    from onnxnorm._deps import require
    from onnxnorm._io import OnnxNormError, check_output

    config = Config(
        layers=args.layers,
        hidden=args.hidden,
        vocab=args.vocab,
        prompt=args.prompt,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        threads=args.threads,
    )
    config.check()
    genai = [] if "none" in args.genai else args.genai
    if "none" in args.genai and len(args.genai) > 1:
        raise OnnxNormError("--genai none cannot be combined with precisions")
    if not args.quantize:
        raise OnnxNormError("--quantize needs one or more of none, " + ", ".join(QUANTIZATIONS))
    if args.prepare_only and not args.keep:
        raise OnnxNormError("--prepare-only needs --keep FOLDER (where the models are kept)")
    if args.keep:
        check_keep(args.keep, config)
    for path in (args.json, args.plot):
        if path:
            check_output(path)
    if args.runtime is not None and not args.runtime:
        raise OnnxNormError("--runtime needs one or more of " + ", ".join(RUNTIME_RUNNERS))
    if args.plot and args.runtime:
        raise OnnxNormError("--plot draws the generation groups; --runtime prints tables only")
    if args.plot:
        require("matplotlib", "onnxnorm bench e2e --plot")
    require("torch", "onnxnorm bench e2e")
    require("transformers", "onnxnorm bench e2e")
    if args.runtime:
        return _runtimes(args, config)
    if genai:
        require(
            "onnxruntime_genai",
            "onnxnorm bench e2e (the onnxruntime-genai rows; --genai none leaves them out)",
        )
    devices = ["cpu", "cuda", "cuda-graph"] if "auto" in args.devices else args.devices
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("torch").setLevel(logging.ERROR)
    from onnxnorm.bench.e2e import runner

    runner.run(
        args.models,
        args.dtypes,
        args.variants,
        config,
        devices,
        genai,
        json_path=args.json,
        plot_path=args.plot,
        keep=args.keep,
        prepare_only=args.prepare_only,
        quantize=tuple(dict.fromkeys(args.quantize)),
    )
    return 0


def _runtimes(args: argparse.Namespace, config: Config) -> int:
    """``--runtime``: the original export against onnxnorm's output on each runner."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("torch").setLevel(logging.ERROR)
    from onnxnorm.bench.e2e.runtimes import run_runtimes

    run_runtimes(
        args.models,
        args.dtypes,
        list(dict.fromkeys(args.runtime)),
        config,
        json_path=args.json,
        keep=args.keep,
        prepare_only=args.prepare_only,
    )
    return 0

"""``onnxnorm export``: a model family's reference decoder or a local Hugging Face model to ONNX,
with one node per norm (or per residual add fused with a norm) in the chosen target. Registering
the command imports neither torch nor transformers; running it says in one line when they are
missing."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from onnxnorm._deps import require
from onnxnorm._io import check_output
from onnxnorm.errors import OnnxNormError, first_line
from onnxnorm.nn import families
from onnxnorm.targets import DEFAULT, TARGETS, add_runtime_option, help_text

DTYPES = ("float32", "float16", "bfloat16")
WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)


def register(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export",
        help="export a model with one onnxnorm node per norm",
        description="Export a model with torch.onnx.export (dynamo), every norm (and every "
        "residual add fused with a norm) as one node of the chosen target. MODEL is "
        f"a model family ({', '.join(families.BY_KEY)}: a small random decoder "
        "normalized like that family; the hybrids' linear-attention and state-space cores are "
        "simplified stand-ins around their real norms), 'decoder' (the configurable decoder), "
        "or a Hugging Face model given as a local directory (config.json, with or "
        "without weights) or a config .json file. Nothing is downloaded: without "
        "weights the model gets random ones.",
    )
    export.add_argument("model", help="family name, 'decoder', or a local directory / config.json")
    export.add_argument("-o", "--output", required=True, help="where to write the ONNX model")
    export.add_argument("--mode", choices=TARGETS, default=DEFAULT, help=help_text())
    add_runtime_option(export)
    export.add_argument(
        "--opset",
        type=int,
        default=18,
        help="ONNX opset (default 18; 23 gives RMSNormalization in --mode onnx)",
    )
    export.add_argument("--batch", type=int, default=2, help="batch size of the example input")
    export.add_argument("--seq", type=int, default=8, help="sequence length of the example input")
    export.add_argument(
        "--static",
        action="store_true",
        help="fixed batch and sequence sizes (default: dynamic axes)",
    )
    export.add_argument("--dtype", choices=DTYPES, default="float32")
    export.add_argument(
        "--external-data",
        action="store_true",
        help="write the weights to OUTPUT.data (automatic above 2 GB)",
    )
    group = export.add_argument_group("family and 'decoder' sizes")
    group.add_argument("--hidden", type=int, default=64)
    group.add_argument("--heads", type=int, default=4)
    group.add_argument("--intermediate", type=int, default=None, help="default: 2 x hidden")
    group.add_argument("--layers", type=int, default=2)
    group.add_argument(
        "--vocab",
        type=int,
        default=None,
        help="vocabulary size: the model takes token ids (default: hidden states)",
    )
    group.add_argument("--norm", choices=("rms", "layer"), help="'decoder': the norm kind")
    group.add_argument("--position", help="'decoder': pre, post, sandwich, deepnorm or reordered")
    group.add_argument(
        "--mixer",
        choices=families.MIXERS,
        help="'decoder': the token mixer (default attention; gated_deltanet and mamba2 are the "
        "hybrids' linear mixers, with their gated and L2 norms)",
    )
    export.add_argument(
        "--json",
        metavar="PATH",
        help="also write what was converted and exported as JSON ('-' for stdout)",
    )
    export.set_defaults(run=run)


def _reference_model(args: argparse.Namespace) -> tuple[Any, tuple, str]:
    from onnxnorm.nn import decoder

    sizes = dict(
        hidden=args.hidden,
        heads=args.heads,
        layers=args.layers,
        vocab=args.vocab,
        intermediate=args.intermediate or 2 * args.hidden,
    )
    try:
        if args.model == "decoder":
            chosen = (("norm", args.norm), ("position", args.position), ("mixer", args.mixer))
            extra = {k: v for k, v in chosen if v}
            config = decoder.DecoderConfig(**sizes, **extra)
            label = "configurable decoder"
        else:
            if args.norm or args.position or args.mixer:
                raise OnnxNormError(
                    "--norm, --position and --mixer are for MODEL 'decoder'; a family fixes them"
                )
            family = families.get(args.model)
            config = families.decoder_config(family, **sizes)
            label = f"{family.name}-style decoder"
    except KeyError as error:
        raise OnnxNormError(
            f"{args.model}: not a directory or .json file, and {error.args[0]}"
        ) from None
    except ValueError as error:
        raise OnnxNormError(f"bad decoder configuration: {error}") from None
    _check_fits(decoder.size_in_parameters(config), label)
    model = decoder.build(config)
    x = decoder.example_input(config, args.batch, args.seq)
    return model, (x,), f"{label}: {config}"


class _Logits:
    """Builds a wrapper module that calls a Hugging Face model without cache and returns its
    logits (or last hidden state), so that the export has tensors in and one tensor out."""

    @staticmethod
    def wrap(model: Any, seq2seq: bool) -> Any:
        import torch

        class Logits(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, decoder_input_ids=None):
                kwargs = {"use_cache": False}
                if decoder_input_ids is not None:
                    kwargs["decoder_input_ids"] = decoder_input_ids
                out = self.inner(input_ids=input_ids, **kwargs)
                return out.logits if hasattr(out, "logits") else out.last_hidden_state

        return Logits(model)


def _available_memory() -> int | None:
    """Bytes of memory available now (Linux: MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _check_fits(parameters: int, label: str) -> None:
    """Refuses, before any weight is allocated, a model whose float32 weights alone exceed the
    memory available (a config with absurd sizes would otherwise be built until the system
    kills the process)."""
    available = _available_memory()
    size = 4 * parameters
    if available is not None and size > available:
        raise OnnxNormError(
            f"{label}: {parameters:,} weights need {size / 2**30:.1f} GiB, more "
            f"than the {available / 2**30:.1f} GiB of memory available; choose "
            "smaller sizes"
        )


def _hf_model(args: argparse.Namespace) -> tuple[Any, tuple, str]:
    path = Path(args.model)
    if path.is_dir() and not (path / "config.json").is_file():
        raise OnnxNormError(f"{path}: no config.json in this directory")
    if path.is_file() and path.suffix != ".json":
        raise OnnxNormError(f"{path}: expected a Hugging Face model directory or a config .json")
    transformers = require("transformers", "exporting a Hugging Face model")
    import torch

    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as error:  # noqa: BLE001 - a config transformers cannot read: say why in one line
        raise OnnxNormError(
            f"{path}: not a readable Hugging Face config ({first_line(error)})"
        ) from None
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    classes = (
        [transformers.AutoModelForSeq2SeqLM] if seq2seq else [transformers.AutoModelForCausalLM]
    ) + [transformers.AutoModel]
    has_weights = path.is_dir() and any((path / name).is_file() for name in WEIGHT_FILES)
    model, problems = None, []
    for cls in classes:
        try:
            if not has_weights:
                with torch.device("meta"):  # its size first, nothing allocated
                    shape = cls.from_config(config, attn_implementation="eager")
                _check_fits(
                    sum(p.numel() for p in shape.parameters()), f"{path}: {type(shape).__name__}"
                )
                del shape
            # eager attention: some models' SDPA paths do not trace (T5 in transformers 5.24)
            if has_weights:
                model = cls.from_pretrained(
                    str(path), local_files_only=True, attn_implementation="eager"
                )
            else:
                torch.manual_seed(0)
                model = cls.from_config(config, attn_implementation="eager")
            break
        except (ValueError, KeyError, OSError, RuntimeError, TypeError) as error:
            # RuntimeError, TypeError: sizes torch cannot make tensors of (negative, not ints)
            problems.append(first_line(error))
    if model is None:
        raise OnnxNormError(
            f"{path}: transformers cannot build a model of type "
            f"{getattr(config, 'model_type', '?')!r} ({problems[-1]})"
        )
    model.eval()
    vocab = int(getattr(config, "vocab_size", 0) or 100)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (args.batch, args.seq), generator=generator)
    inputs = (ids, ids.clone()) if seq2seq else (ids,)
    weights = "its weights" if has_weights else "random weights"
    return _Logits.wrap(model, seq2seq), inputs, f"Hugging Face {type(model).__name__} ({weights})"


def run(args: argparse.Namespace) -> int:
    torch = require("torch", "onnxnorm export")

    from onnxnorm.nn.converter import convert
    from onnxnorm.nn.exporter import count_norm_nodes, export

    for name in ("batch", "seq", "hidden", "heads", "layers"):
        if getattr(args, name) < 1:
            raise OnnxNormError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not args.static and (args.batch < 2 or args.seq < 2):
        raise OnnxNormError(
            "with dynamic axes --batch and --seq must be >= 2 (torch.export "
            "specializes example sizes of 1); use --static for fixed sizes"
        )
    check_output(args.output)
    if args.json and args.json != "-":
        check_output(args.json, inputs=[args.output])
    path = Path(args.model)
    if path.exists():
        model, inputs, label = _hf_model(args)
    elif args.model.endswith(".json") or "/" in args.model:
        raise OnnxNormError(f"{args.model}: no such file or directory")
    else:
        model, inputs, label = _reference_model(args)
    dtype = getattr(torch, args.dtype)
    model = model.to(dtype)
    inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
    print(f"model: {label}")

    report = convert(model)
    print("convert: " + str(report).replace("\n", "\n  "))
    proto = export(
        model,
        inputs,
        args.output,
        mode=args.mode,
        runtime=args.runtime,
        opset_version=args.opset,
        dynamic=not args.static,
        external_data=args.external_data or None,
    )
    counts = count_norm_nodes(proto)
    print(
        f"export: {'for ' + args.runtime if args.runtime else 'mode ' + args.mode}, "
        f"opset {args.opset}, norm nodes: "
        + ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))
    )
    print(f"wrote {args.output}")
    if args.json:
        text = json.dumps(
            {
                "model": label,
                "mode": args.mode,
                "runtime": args.runtime,
                "opset": args.opset,
                "convert": report.to_dict(),
                "norm_nodes": counts,
                "output": str(args.output),
            },
            indent=2,
        )
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0

"""``onnxnorm genai``: an onnxruntime-genai model folder with its norms as onnxnorm ops and the
onnxnorm library registered in its genai_config.json. Registering the command imports nothing
optional; ``--verify`` needs onnxruntime-genai and says so in one line when it is missing."""

from __future__ import annotations

import argparse

#: the prompt and length of --verify's greedy generation
VERIFY_PROMPT = [1, 5, 9, 33, 17, 4, 77, 100]
VERIFY_TOKENS = 32


def register(commands: argparse._SubParsersAction) -> None:
    from onnxnorm.fusion.cli import add_fusion_options

    genai = commands.add_parser(
        "genai",
        help="fuse the norms of an onnxruntime-genai model folder",
        description="Write a copy of an onnxruntime-genai model folder (made by its model "
        "builder: genai_config.json, model.onnx, tokenizer files) whose norms are "
        "onnxnorm ops and whose genai_config.json registers the onnxnorm library "
        "(copied into the folder: onnxruntime-genai loads custom-op libraries from "
        "the model's folder), so that onnxruntime-genai runs onnxnorm's kernels. The "
        "input folder is never modified.",
    )
    genai.add_argument("input", help="the model folder to read (holds genai_config.json)")
    add_fusion_options(
        genai,
        output_help="the folder to write",
        verify_help="run both folders in onnxruntime-genai (greedy generation of "
        f"{VERIFY_TOKENS} tokens from a fixed prompt) and fail (exit 3, output "
        "removed) when the tokens differ; needs onnxruntime-genai",
    )
    genai.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import shutil
    import sys
    from pathlib import Path

    from onnxnorm._deps import require
    from onnxnorm._io import check_output
    from onnxnorm.fusion.cli import write_json
    from onnxnorm.genai import convert, read_config

    read_config(args.input)
    if args.json and args.json != "-":
        check_output(args.json)
    if args.verify:
        require("onnxruntime_genai", "onnxnorm genai --verify")
    report = convert(
        args.input,
        args.output,
        target=args.target,
        overwrite=args.overwrite,
        strict_precision=args.strict_precision,
        upgrade=args.upgrade_opset,
    )
    print(report)
    result = report.to_dict()
    status = 0
    if args.verify:
        want = _generate(args.input, "the original folder", args.output)
        have = _generate(args.output, "the fused folder", args.output)
        same = want == have
        print(
            f"verify: greedy generation of {len(want)} tokens "
            f"{'identical' if same else 'DIFFERS'} (original {want[:8]}..., "
            f"fused {have[:8]}...)"
        )
        result["verify"] = {"original": want, "fused": have, "identical": same}
        if not same:
            print(
                f"onnxnorm: verify failed: the tokens differ; {args.output} not kept",
                file=sys.stderr,
            )
            shutil.rmtree(Path(args.output))
            status = 3
    write_json(result, args.json)
    if status == 0:
        print(f"wrote {args.output}")
    return status


def _generate(folder, what: str, output) -> list[int]:
    import shutil

    from onnxnorm.errors import OnnxNormError, first_line
    from onnxnorm.genai import generate

    try:
        return generate(folder, VERIFY_PROMPT, VERIFY_TOKENS)
    except RuntimeError as error:  # onnxruntime-genai's own message says what failed
        shutil.rmtree(output, ignore_errors=True)
        raise OnnxNormError(
            f"--verify could not run {what} in onnxruntime-genai: "
            f"{first_line(error, 'failed')}; {output} not kept"
        ) from None

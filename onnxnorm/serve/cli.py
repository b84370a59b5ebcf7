"""``onnxnorm triton``: a Triton Inference Server model repository for its ONNX Runtime backend.
Registering the command imports nothing optional; writing a repository needs onnx and the built
onnxnorm library only (no Triton)."""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    triton = commands.add_parser(
        "triton",
        help="write a Triton Inference Server model repository",
        description="Write a Triton Inference Server model repository for its ONNX Runtime "
        "backend: REPO/NAME/config.pbtxt (platform onnxruntime_onnx, the model's "
        "inputs and outputs, dynamic batching where the first dim is a free batch "
        "dim, CPU or GPU instances, the onnxnorm library as a custom-op library), "
        "REPO/NAME/1/model.onnx with its external data, and the onnxnorm library "
        "copied into REPO/NAME. Then: tritonserver --model-repository REPO. The input "
        "is never modified.",
    )
    triton.add_argument(
        "input", help="an ONNX model, or a folder whose .onnx files become one model each"
    )
    triton.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="REPO",
        help="the model repository (created where missing; may hold other models)",
    )
    triton.add_argument(
        "--name",
        help="the model's name (default: the file's name without "
        ".onnx; a model.onnx takes its folder's name)",
    )
    triton.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        metavar="N",
        help="the most requests stacked into one run (default: 8 where every "
        "input and output has a free first dim, else 0; 0: no batching)",
    )
    triton.add_argument(
        "--instances",
        type=int,
        default=1,
        metavar="N",
        help="model instances (sessions) per device (default 1)",
    )
    triton.add_argument(
        "--gpu",
        action="store_true",
        help="GPU instances (KIND_GPU: ONNX Runtime's CUDA provider), with the "
        "onnxnorm CUDA library beside the CPU one",
    )
    triton.add_argument(
        "--served-from",
        metavar="DIR",
        help="the repository's absolute path on the server, where the config "
        "finds the library (default: REPO's absolute path here; e.g. "
        "/models when a container mounts REPO there)",
    )
    triton.add_argument(
        "--overwrite", action="store_true", help="replace REPO/NAME where it exists"
    )
    triton.add_argument(
        "--json",
        metavar="PATH",
        help="also write what was written as JSON ('-' for standard output)",
    )
    triton.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from onnxnorm._io import check_output
    from onnxnorm.fusion.cli import write_json
    from onnxnorm.serve.triton import write_repository

    if args.json and args.json != "-":
        check_output(args.json)
    report = write_repository(
        args.input,
        args.output,
        name=args.name,
        max_batch_size=args.max_batch_size,
        instances=args.instances,
        gpu=args.gpu,
        served_from=args.served_from,
        overwrite=args.overwrite,
    )
    print(report)
    write_json(report.to_dict(), args.json)
    return 0

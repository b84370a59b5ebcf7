"""Serving onnxnorm models with Triton Inference Server.

- ``onnxnorm triton MODEL -o REPO`` (:func:`onnxnorm.serve.triton.write_repository`): a model
  repository for Triton's own ONNX Runtime backend, the onnxnorm library named in each config.
- :func:`bind`: a model bound to PyTriton (``pip install 'onnxnorm[serve]'``), which runs
  Triton's server and hands each batch of requests to a Python function: here an ONNX Runtime
  session of this process with the onnxnorm library registered, so the fused kernels run in
  the process that calls :func:`bind`::

      from pytriton.triton import Triton, TritonConfig
      import onnxnorm.serve

      with Triton(config=TritonConfig(http_port=8000, grpc_port=8001)) as triton:
          onnxnorm.serve.bind(triton, "decoder", "decoder_fused.onnx")
          triton.serve()

- ``python -m onnxnorm.serve [NAME=]MODEL ...``: the same from the command line (:func:`main`).

Where the first dim of every input and output is free, requests are batched (Triton's dynamic
batcher stacks requests of the same shape, one session run per batch); elsewhere each request
runs alone. Importing this module imports neither PyTriton nor Triton's client.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from onnxnorm.errors import OnnxNormError
from onnxnorm.serve.signature import Signature, TensorSpec, signature

#: max_batch_size for a model with a free batch dim when none is given (as onnxnorm triton)
DEFAULT_MAX_BATCH_SIZE = 8
#: the environment variable that gives PyTriton's access token (for the endpoints it protects:
#: statistics, model repository, shared memory, trace, logging)
ENV_ACCESS_TOKEN = "ONNXNORM_TRITON_ACCESS_TOKEN"


@dataclasses.dataclass
class Binding:
    """What :func:`bind` bound: the model's name, its ONNX Runtime session (shared by the
    instances), its signature and max_batch_size (0: no batching)."""

    name: str
    session: Any
    signature: Signature
    max_batch_size: int


def _numpy_dtype(spec: TensorSpec):
    import numpy as np

    if spec.triton_type == "BF16":
        raise OnnxNormError(
            f"{spec.name!r} is bfloat16, which PyTriton does not carry; serve "
            "the model with Triton's ONNX Runtime backend (onnxnorm triton)"
        )
    if spec.triton_type == "STRING":
        return np.bytes_
    return np.dtype(spec.numpy_dtype).type


def _tensors(specs: Sequence[TensorSpec], batched: bool) -> list:
    from pytriton.model_config import Tensor

    return [
        Tensor(name=s.name, dtype=_numpy_dtype(s), shape=tuple(s.dims[1:] if batched else s.dims))
        for s in specs
    ]


class RequestFailed(RuntimeError):
    """ONNX Runtime refused a request (or the batch it was stacked into): Triton answers it, and
    every request of that batch, with this error and goes on serving."""


def infer_function(session: Any, sig: Signature, batched: bool, name: str = "model"):
    """The function PyTriton calls with a list of requests: with ``batched``, the requests whose
    inputs have the same shapes and types run as one batch (stacked along the first dim, the
    outputs split back by rows), else each request runs alone. A run that ONNX Runtime refuses
    raises :class:`RequestFailed` with its message's first line."""
    import numpy as np

    from onnxnorm.errors import first_line

    names = [o.name for o in sig.outputs]

    def run(feeds: dict, count: int) -> list:
        try:
            return session.run(names, feeds)
        except Exception as error:  # noqa: BLE001 - ORT's errors have no common base class
            raise RequestFailed(
                f"model {name!r}: ONNX Runtime failed on {count} request(s): {first_line(error)}"
            ) from None

    def infer(requests):
        responses: list = [None] * len(requests)
        groups: dict = {}
        for i, request in enumerate(requests):
            key = (
                tuple((n, a.shape[1:], a.dtype.str) for n, a in sorted(request.items()))
                if batched
                else i
            )
            groups.setdefault(key, []).append(i)
        for members in groups.values():
            if len(members) == 1:
                outputs = run(dict(requests[members[0]].items()), 1)
                responses[members[0]] = dict(zip(names, outputs))
                continue
            first = requests[members[0]]
            feeds = {n: np.concatenate([requests[i][n] for i in members]) for n in first}
            outputs = run(feeds, len(members))
            rows = np.cumsum([len(next(iter(requests[i].values()))) for i in members])[:-1]
            parts = [np.split(out, rows) for out in outputs]
            for j, i in enumerate(members):
                responses[i] = {n: part[j] for n, part in zip(names, parts)}
        return responses

    return infer


def bind(
    triton: Any,
    name: str,
    model: str | os.PathLike,
    *,
    max_batch_size: int | None = None,
    instances: int = 1,
    providers: Sequence[Any] | None = None,
    options: Any = None,
    max_queue_delay_us: int = 0,
    strict: bool = False,
) -> Binding:
    """Binds the ONNX model ``model`` to the PyTriton server ``triton`` (a
    ``pytriton.triton.Triton``) as ``name``: one ONNX Runtime session in this process, with the
    onnxnorm library registered (:func:`onnxnorm.runtime.session`; ``providers`` and
    ``options`` as there), serves ``instances`` model instances. ``max_batch_size``: None
    batches up to 8 requests where the model has a free batch dim, 0 never;
    ``max_queue_delay_us``: how long Triton's dynamic batcher waits for more requests."""
    from onnxnorm import runtime
    from onnxnorm._deps import require
    from onnxnorm._io import load_model

    require("pytriton", "onnxnorm.serve.bind")
    from pytriton.model_config import DynamicBatcher, ModelConfig

    if instances < 1:
        raise OnnxNormError(f"instances must be 1 or more, got {instances}")
    sig = signature(load_model(model, load_weights=False))
    if max_batch_size is None:
        max_batch_size = DEFAULT_MAX_BATCH_SIZE if sig.batch else 0
    elif max_batch_size and not sig.batch:
        raise OnnxNormError(
            f"{model}: max_batch_size {max_batch_size} needs a free batch dim "
            f"first in every input and output, but {sig.why_not}"
        )
    session = runtime.session(model, options, providers)
    batched = max_batch_size > 0
    config = ModelConfig(
        batching=batched,
        max_batch_size=max_batch_size,
        batcher=DynamicBatcher(max_queue_delay_microseconds=max_queue_delay_us),
    )
    infer = infer_function(session, sig, batched, name)
    triton.bind(
        model_name=name,
        infer_func=[infer] * instances if instances > 1 else infer,
        inputs=_tensors(sig.inputs, batched),
        outputs=_tensors(sig.outputs, batched),
        config=config,
        strict=strict,
    )
    return Binding(name, session, sig, max_batch_size)


def _model_args(items: Sequence[str]) -> list[tuple[str, str]]:
    from pathlib import Path

    from onnxnorm.serve.triton import MODEL_NAME_PATTERN, triton_model_name

    models = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = triton_model_name(Path(item)), item
        if not MODEL_NAME_PATTERN.fullmatch(name):
            raise OnnxNormError(
                f"model name {name!r}: use letters, digits, '_', '.' and '-' (not first)"
            )
        models.append((name, path))
    names = [n for n, _ in models]
    if len(set(names)) != len(names):
        raise OnnxNormError(f"two models have the same name: {names}")
    return models


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m onnxnorm.serve [NAME=]MODEL ...``: serves ONNX models with PyTriton until
    interrupted (SIGINT or SIGTERM: the server stops, exit status 0)."""
    import argparse
    import json
    import signal
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m onnxnorm.serve",
        description="Serve ONNX models with onnxnorm's kernels through PyTriton (Triton "
        "Inference Server with a Python backend; pip install 'onnxnorm[serve]'). "
        "Stops on SIGINT or SIGTERM.",
    )
    parser.add_argument(
        "models",
        nargs="+",
        metavar="[NAME=]MODEL",
        help="an ONNX model, served as NAME (default: its file name)",
    )
    parser.add_argument(
        "--address",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1; 0.0.0.0 for all)",
    )
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002, help="0: no metrics endpoint")
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        metavar="N",
        help="default: 8 for models with a free batch dim, else 0",
    )
    parser.add_argument(
        "--unbatched",
        action="append",
        default=[],
        metavar="NAME",
        help="serve NAME without batching (max_batch_size 0); repeatable",
    )
    parser.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=0,
        help="how long the dynamic batcher waits for more requests",
    )
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--cuda", action="store_true", help="run on the GPU (onnxruntime-gpu)")
    parser.add_argument("--log-verbose", type=int, default=0, help="Triton's log verbosity")
    parser.add_argument(
        "--ready-file",
        metavar="PATH",
        help="once every model is loaded, also write the line printed then "
        "(JSON: addresses, models, library, process id) to PATH",
    )
    args = parser.parse_args(argv)
    from onnxnorm.errors import MissingDependency

    try:
        return _serve(args, json, signal, sys)
    except (OnnxNormError, MissingDependency) as error:
        print(f"onnxnorm.serve: error: {error}", file=sys.stderr)
        return 1


def _serve(args, json, signal, sys) -> int:
    from onnxnorm import runtime
    from onnxnorm._deps import require

    require("pytriton", "python -m onnxnorm.serve")
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    models = _model_args(args.models)
    unknown = set(args.unbatched) - {n for n, _ in models}
    if unknown:
        raise OnnxNormError(f"--unbatched names no served model: {', '.join(sorted(unknown))}")
    config = TritonConfig(
        http_address=args.address,
        http_port=args.http_port,
        grpc_address=args.address,
        grpc_port=args.grpc_port,
        allow_metrics=args.metrics_port > 0,
        metrics_port=args.metrics_port or None,
        metrics_address=args.address if args.metrics_port else None,
        log_verbose=args.log_verbose,
        exit_timeout_secs=10,
    )
    token = os.environ.get(ENV_ACCESS_TOKEN) or None
    security = TritonSecurityConfig(access_token=token) if token else None

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    providers = runtime.CUDA_PROVIDERS if args.cuda else None
    with Triton(config=config, security_config=security) as triton:
        bound = [
            bind(
                triton,
                name,
                path,
                instances=args.instances,
                providers=providers,
                max_batch_size=0 if name in args.unbatched else args.max_batch_size,
                max_queue_delay_us=args.max_queue_delay_us,
            )
            for name, path in models
        ]
        triton.connect()  # loads the models: ready once this returns
        line = json.dumps(
            {
                "ready": True,
                "pid": os.getpid(),
                "http": f"{args.address}:{args.http_port}",
                "grpc": f"{args.address}:{args.grpc_port}",
                "library": str(runtime.library_path()),
                "models": {
                    b.name: {
                        "max_batch_size": b.max_batch_size,
                        "inputs": [s.name for s in b.signature.inputs],
                        "outputs": [s.name for s in b.signature.outputs],
                    }
                    for b in bound
                },
            }
        )
        print(line, flush=True)
        if args.ready_file:  # whole or absent: written beside, then renamed
            partial = f"{args.ready_file}.partial"
            with open(partial, "w") as f:
                f.write(line + "\n")
            os.replace(partial, args.ready_file)
        triton.serve()
    print(json.dumps({"stopped": True}), flush=True)
    return 0

"""The onnxnorm demo: export a small Llama-style decoder, fuse its RMSNorms (and the residual adds
before them), export it directly with onnxnorm.export too, run it in ONNX Runtime with and without
the onnxnorm library, print parity and a timing table.

    python -m models.demo [--out DIR] [--hidden 512] [--layers 2] [--seq 128] [--repeat 30]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import onnxnorm
from onnxnorm import fusion, ops, runtime
from onnxnorm._io import load_model, save_model
from onnxnorm.nn import decoder, families
from onnxnorm.nn.exporter import count_norm_nodes, quiet_export


def _export_decomposed(model: torch.nn.Module, x: torch.Tensor, path: Path) -> None:
    with quiet_export():
        torch.onnx.export(
            model,
            (x,),
            path,
            dynamo=True,
            input_names=["hidden_states"],
            dynamic_shapes=({0: "batch", 1: "sequence"},),
        )


def _median_ms(sess: ort.InferenceSession, feeds: dict, repeat: int) -> float:
    sess.run(None, feeds)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for the ONNX files (default: a temp dir)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)

    # the Llama family's norms, spelled out in torch ops as Hugging Face writes them
    config = families.decoder_config(
        "llama",
        hidden=args.hidden,
        heads=max(1, args.hidden // 64),
        intermediate=int(args.hidden * 2.6875),
        layers=args.layers,
        impl="decomposed",
    )
    model = decoder.build(config)
    x = torch.randn(1, args.seq, args.hidden)
    with torch.no_grad():
        expected = model(x).numpy()
    feeds = {"hidden_states": x.numpy()}

    with contextlib.ExitStack() as stack:
        out = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        out.mkdir(parents=True, exist_ok=True)
        decomposed, fused_path = out / "llama_decomposed.onnx", out / "llama_fused.onnx"
        direct = out / "llama_onnxnorm_export.onnx"
        print(
            f"1. export: {config.layers}-layer Llama-style decoder, hidden {config.hidden}, "
            f"{model.count_norms()} RMSNorm modules -> {decomposed}"
        )
        _export_decomposed(model, x, decomposed)

        print(f"2. fuse -> {fused_path}")
        fused, report = fusion.fuse(load_model(decomposed))
        print("   " + str(report).replace("\n", "\n   "))
        save_model(fused, fused_path)

        print(
            f"3. onnxnorm.export (convert=True: each decomposed norm -> onnxnorm.nn.RMSNorm) "
            f"-> {direct}"
        )
        proto = onnxnorm.export(model, (x,), direct, convert=True, input_names=["hidden_states"])
        print(
            "   norm nodes: "
            + ", ".join(f"{n} {op}" for op, n in sorted(count_norm_nodes(proto).items()))
        )

        print("4. run in ONNX Runtime (CPU), compare with torch eager")
        cases = [
            ("decomposed graph, plain ORT", decomposed, False),
            ("fused, plain ORT (function bodies)", fused_path, False),
            ("fused, ORT + onnxnorm library", fused_path, True),
            ("onnxnorm.export, ORT + onnxnorm library", direct, True),
        ]
        rows = []
        for label, path, with_library in cases:
            ran = runtime.executed_ops(path, feeds, with_library=with_library)
            threads = ort.SessionOptions()  # one per session: the library registers once
            threads.intra_op_num_threads = 2
            sess = runtime.session(path, threads, with_library=with_library)
            error = float(np.abs(sess.run(None, feeds)[0] - expected).max())
            kernels = sum(ran.get(op, 0) for op in ops.OPS)
            rows.append((label, error, _median_ms(sess, feeds, args.repeat), kernels))

    base = rows[0][2]
    print()
    print(
        f"| model | max abs error vs torch | median ms (batch 1, seq {args.seq}) "
        "| vs decomposed | onnxnorm kernels run |"
    )
    print("|---|---:|---:|---:|---:|")
    for label, error, ms, kernels in rows:
        print(f"| {label} | {error:.2e} | {ms:.3f} | {base / ms:.2f}x | {kernels} |")
    print(f"\nORT {ort.__version__}, torch {torch.__version__}, library {runtime.library_path()}")
    worst = max(row[1] for row in rows)
    if worst > 1e-4:
        print(f"PARITY FAILED: max abs error {worst:.2e} > 1e-4")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

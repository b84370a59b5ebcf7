"""A whole run of ``onnxnorm bench cuda``: every float op and the hybrid norms for each dtype on
the first GPU, each row printed as it is measured, each dtype's table and summary, the JSON of
the rows and the machine."""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Sequence
from typing import Any

from onnxnorm import _native
from onnxnorm.bench import common
from onnxnorm.bench.cuda import clock, measure
from onnxnorm.bench.cuda.cases import DEFAULT_DTYPES
from onnxnorm.bench.cuda.table import markdown_head, markdown_row, summary


def environment(kernels: _native.Kernels | None = None) -> dict[str, Any]:
    """The run's machine and versions (the JSON's ``environment``)."""
    import torch

    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            device=torch.cuda.get_device_name(0),
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
        )
    try:
        import onnxruntime as ort

        env["onnxruntime"] = ort.__version__
        env["onnxruntime_providers"] = ort.get_available_providers()
    except ImportError as error:
        env["onnxruntime"] = f"n/a: {common.short_error(error)}"
    if kernels is not None:
        env["library"] = str(kernels.path)
        env["library_build"] = kernels.build_info()
    return env


def report(
    library: str | os.PathLike | None = None,
    dtypes: str | Sequence[str] = DEFAULT_DTYPES,
    reps: int = 30,
    json_path: str | None = None,
    ort: bool = True,
) -> list[dict[str, Any]]:
    """Measures every float op with the CUDA library at ``library`` (default: the installed
    one) on the first GPU for each of ``dtypes`` (GatedRMSNorm and L2Norm at HYBRID_SHAPES),
    printing each row as it is measured and each dtype's table when done, and writing the rows
    and the environment as JSON (after each dtype) where asked. Everything runs on one torch
    stream, which ORT's sessions are given too."""
    import torch

    if isinstance(dtypes, str):
        dtypes = [d.strip() for d in dtypes.split(",") if d.strip()]
    kernels = _native.Kernels(library)
    env = environment(kernels)
    device = env.get("device", "no CUDA device")
    print(
        f"# {kernels.path} ({kernels.build_info()}) on {device}, torch {torch.__version__} "
        f"(CUDA {env['torch_cuda']}), onnxruntime {env['onnxruntime']}",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        flush = clock.flusher()
        for dtype in dtypes:
            print(f"\n## {dtype} on {device}\n", flush=True)
            print("\n".join(markdown_head()), flush=True)

            def show(row: dict[str, Any]) -> None:
                print(markdown_row(row), flush=True)

            rows = measure.bench(
                kernels, dtype=dtype, reps=reps, flush=flush, stream=stream.cuda_stream,
                ort=ort, on_row=show,
            )  # fmt: skip
            rows += measure.bench_hybrid(kernels, dtype=dtype, reps=reps, flush=flush, on_row=show)
            results += rows
            print(f"\n{dtype}: {summary(rows)}", flush=True)
            if json_path:
                common.write_json(json_path, dict(device=device, environment=env, results=results))
    return results

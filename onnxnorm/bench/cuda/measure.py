"""The CUDA kernels' bandwidth: each float op at each shape against a device-to-device copy of
the same shape, measured in the same run, and against its contenders (:mod:`.contenders`);
decode shapes (1 to 64 rows) in microseconds per call, back to back; and the norms of hybrid
models (GatedRMSNorm, L2Norm) at their models' shapes, for one decoded token and a 512-token
prefill. A row is a dict (the JSON's), judged against its targets by :func:`judge`; a kernel
that fails is a row with its error, and the run goes on."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from onnxnorm import _native
from onnxnorm.bench import common
from onnxnorm.bench.cuda import clock, contenders
from onnxnorm.bench.cuda.cases import (
    BENCH_SHAPES,
    DECODE_US,
    HYBRID_SHAPES,
    QK_TARGET,
    TARGETS,
)
from onnxnorm.ops import catalogue

#: the ops of BENCH_SHAPES (GatedRMSNorm and L2Norm have HYBRID_SHAPES)
DEFAULT_OPS = [
    op for op, spec in catalogue.FLOAT_OPS.items() if not spec.gated and spec.norm != "l2"
]


def _torch_dtype(dtype: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


def _bytes(inputs: dict[str, Any], y, s) -> int:
    """What one call reads (every input given) and writes (Y, and Sum when not None)."""
    moved = sum(t.numel() * t.element_size() for t in inputs.values())
    return moved + y.numel() * y.element_size() * (2 if s is not None else 1)


def _measure(
    kernels: _native.Kernels,
    op: str,
    dtype: str,
    label: str,
    inputs: dict[str, Any],
    y,
    s,
    attrs: dict[str, Any],
    copy_gbs: float,
    flush,
    reps: int,
    target: float | None,
    *,
    decode: bool = False,
) -> dict[str, Any]:
    """Times one launch of op on inputs (writing y, and s for Sum when not None) and returns its
    result row: the bytes it reads and writes per second, against copy_gbs and target (% of copy,
    or None; :func:`judge` says whether it was met); ``decode``: back to back, without flushing L2
    (:func:`clock.back_to_back_ms`)."""
    args = kernels.args(op, inputs, y, s, **attrs)
    kernels.launch(args)  # warm-up, and errors surface here
    clock.synchronize(y)
    handle = None
    if decode and y.is_cuda:  # the stream looked up once: less host time per call
        import torch

        handle = torch.cuda.current_stream().cuda_stream

    def launch() -> None:
        if handle is None:
            kernels.launch(args)
        else:
            kernels.launch(args, handle)

    ms = clock.time_ms("onnxnorm", launch, flush, reps, decode)
    moved = _bytes(inputs, y, s)
    gbs = moved / ms / 1e6
    pct = 100 * gbs / copy_gbs
    return dict(
        op=op,
        dtype=dtype,
        shape=label,
        kernel=kernels.kernel_name(args),
        bytes=moved,
        ms=ms,
        us=1000 * ms,
        gbs=gbs,
        copy_gbs=copy_gbs,
        pct_of_copy=pct,
        target=target,
    )


def _failed_row(op, dtype, label, inputs, y, s, copy_gbs, target, error) -> dict[str, Any]:
    """The row of a kernel that failed: its error, no time (the run goes on)."""
    row = dict(op=op, dtype=dtype, shape=label, kernel="", bytes=_bytes(inputs, y, s))
    row.update(us=None, ms=None, copy_gbs=copy_gbs, target=target)
    row["error"] = common.short_error(error)
    return row


def judge(row: dict[str, Any]) -> dict[str, Any]:
    """Fills ``row["targets"]``: each target that applies, with whether it was met and why
    (% of copy against ``target``; decode rows: at most DECODE_US microseconds; where ORT ran:
    faster than ORT), and ``row["met"]``: all met (None: no target applies)."""
    targets = []
    us = row.get("us")
    if us is not None:
        if row.get("target") is not None:
            targets.append(
                dict(
                    target=f">= {row['target']}% of copy",
                    met=row["pct_of_copy"] >= row["target"],
                    detail=f"{row['pct_of_copy']:.1f}%",
                )
            )
        if row.get("kind") == "decode":
            targets.append(
                dict(target=f"<= {DECODE_US:g} us", met=us <= DECODE_US, detail=f"{us:.2f} us")
            )
        if row.get("ort_us") is not None:
            targets.append(
                dict(
                    target="faster than ORT",
                    met=us < row["ort_us"],
                    detail=f"{row['ort_speedup']:.2f}x, ORT {row['ort_us']:.1f} us",
                )
            )
    row["targets"] = targets
    row["met"] = all(t["met"] for t in targets) if targets else None
    return row


def _copy_target(op: str, kind: str) -> float | None:
    spec = catalogue.get(op)
    if kind == "qk":
        return QK_TARGET if spec.residual == "none" else None
    return TARGETS.get(op) if kind == "rows" else None


def _blank(row: dict[str, Any]) -> dict[str, Any]:
    """The contenders' keys of a row, none measured yet."""
    for key in ("torch", "ort"):
        row.setdefault(f"{key}_us", None)
        row.setdefault(f"{key}_speedup", None)
        row.setdefault(f"{key}_note", None)
    row.setdefault("ort_op", None)
    return row


def bench(
    kernels: _native.Kernels,
    ops: Iterable[str] | None = None,
    dtype: str = "bfloat16",
    reps: int = 30,
    shapes=None,
    *,
    device: str = "cuda",
    flush: Callable[[], None] | None = None,
    stream: int | None = None,
    ort: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Measures each op (default: DEFAULT_OPS) at each shape (default BENCH_SHAPES) on
    ``device`` against the copy, torch and ONNX Runtime's ops (``ort``: where it offers CUDA;
    ``stream``: the handle of torch's current stream, for ORT's session); returns the rows
    (GB/s, % of copy, contenders' microseconds, targets judged), each also given to ``on_row``
    as soon as it is measured. A failure is that row's note, and the run goes on."""
    import torch

    tdt = _torch_dtype(dtype)
    if flush is None:
        flush = clock.flusher() if device == "cuda" else (lambda: None)
    ort_reason = "skipped (--no-ort)" if not ort else contenders.ort_unavailable(device)
    if ort_reason is None:
        ort_reason = contenders.ort_probe(device, stream)
    results = []
    for label, rows, cols, kind in shapes or BENCH_SHAPES:
        decode = kind == "decode"
        src = torch.randn(rows, cols, device=device, dtype=tdt)
        copy_gbs = clock.copy_gbs(src, flush, reps, decode)
        residual = torch.randn_like(src)
        for op in ops or DEFAULT_OPS:
            spec = catalogue.get(op)
            inputs = contenders.bench_inputs(op, src, residual)
            y = torch.empty_like(src)
            s = torch.empty_like(src) if spec.has_residual else None
            target = _copy_target(op, kind)
            try:
                row = _measure(
                    kernels, op, dtype, label, inputs, y, s, {}, copy_gbs, flush, reps, target,
                    decode=decode,
                )  # fmt: skip
            except Exception as error:  # noqa: BLE001 - one failed kernel must not end the run
                row = _failed_row(op, dtype, label, inputs, y, s, copy_gbs, target, error)
            row["kind"] = kind
            _blank(row)
            if row["us"] is not None:
                contenders.contend_torch(row, op, inputs, y, flush, reps, decode)
                if ort_reason is None:
                    contenders.contend_ort(
                        row, op, dtype, inputs, y, s, flush, reps, decode, stream
                    )
                else:
                    row["ort_note"] = ort_reason
            results.append(judge(row))
            if on_row:
                on_row(row)
            del inputs, y, s
        del src, residual
        if device == "cuda":
            torch.cuda.empty_cache()
    return results


def bench_hybrid(
    kernels: _native.Kernels,
    dtype: str = "bfloat16",
    reps: int = 30,
    shapes=None,
    *,
    flush: Callable[[], None] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Measures GatedRMSNorm and L2Norm at HYBRID_SHAPES (default), as :func:`bench` does (no
    targets, no contenders)."""
    import torch

    tdt = _torch_dtype(dtype)
    flush = flush or clock.flusher()
    results = []
    for label, op, shape, group, scale_shape, gate in shapes or HYBRID_SHAPES:
        x = torch.randn(*shape, device="cuda", dtype=tdt)
        copy_gbs = clock.copy_gbs(x, flush, reps)
        inputs = {"X": x}
        attrs = {}
        if scale_shape is not None:
            inputs["Scale"] = torch.randn(*scale_shape, device="cuda", dtype=tdt)
            attrs["group_size"] = group
        if gate is not None:
            inputs["Gate"] = torch.randn_like(x)
            attrs.update(activation=gate[0], norm_before_gate=gate[1])
        y = torch.empty_like(x)
        try:
            row = _measure(
                kernels, op, dtype, label, inputs, y, None, attrs, copy_gbs, flush, reps, None
            )
        except Exception as error:  # noqa: BLE001 - one failed kernel must not end the run
            row = _failed_row(op, dtype, label, inputs, y, None, copy_gbs, None, error)
        row["kind"] = "hybrid"
        results.append(judge(_blank(row)))
        if on_row:
            on_row(row)
        del x, inputs, y
    torch.cuda.empty_cache()
    return results

"""The CUDA kernels' bandwidth: each float op at each shape against a device-to-device copy of
the same shape, measured in the same run (see the package's docstring), and against the same math
in torch (``F.rms_norm`` / ``F.layer_norm``) and in ONNX Runtime's own CUDA ops where
onnxruntime-gpu is present; decode shapes (1 to 64 rows) in microseconds per call, back to back;
and the norms of hybrid models (GatedRMSNorm, L2Norm) at their models' shapes, for one decoded
token and a 512-token prefill.

A contender that cannot run (no onnxruntime-gpu, an ORT op without a CUDA kernel for the dtype, a
torch function missing) is a row's "n/a" with its reason, never the end of the run."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from onnxnorm import _native
from onnxnorm.bench import common, kernels_graphs, timing
from onnxnorm.ops import catalogue

#: (label, rows, cols, kind): kind "rows" (the copy targets of TARGETS), "qk" (Q/K-norm rows:
#: QK_TARGET for the ops without a residual) or "decode" (microseconds per call, back to back,
#: target DECODE_US)
BENCH_SHAPES = [
    ("4096x4096", 4096, 4096, "rows"),
    ("4096x8192", 4096, 8192, "rows"),
    ("Q/K 16384x32 heads x128", 16384 * 32, 128, "qk"),
    ("Q/K 4096x8 heads x256", 4096 * 8, 256, "qk"),
    ("Q/K 4096x32 heads x64", 4096 * 32, 64, "qk"),
    ("decode 1x4096", 1, 4096, "decode"),
    ("decode 8x4096", 8, 4096, "decode"),
    ("decode 64x4096", 64, 4096, "decode"),
]
#: percent of the copy bandwidth (4096 x 4096 and 4096 x 8192; Q/K-norm shapes: QK_TARGET)
TARGETS = {"RMSNorm": 90, "SkipRMSNorm": 90, "LayerNorm": 85, "SkipLayerNorm": 85}
QK_TARGET = 75
#: the most microseconds one call of a decode shape may take (every op)
DECODE_US = 5.0
#: launches between the two CUDA events of one decode sample
DECODE_CALLS = 200
#: what a run measures unless told otherwise
DEFAULT_DTYPES = ("bfloat16", "float16")
#: the ops of BENCH_SHAPES (GatedRMSNorm and L2Norm have HYBRID_SHAPES)
DEFAULT_OPS = [
    op for op, spec in catalogue.FLOAT_OPS.items() if not spec.gated and spec.norm != "l2"
]
#: the norms of hybrid models, for 1 token (decode) and 512 (prefill): (label, op, X's shape,
#: group_size, Scale's shape, (activation, norm_before_gate) of a Gate). Qwen3-Next's gated norm
#: of its linear attention's output (16 heads of 128 normalized each, one head's Scale, SiLU after
#: the norm); Mamba2's (8 groups of its 4096 channels, a Scale of all of them, SiLU before the
#: norm); the L2 norm of q and k of gated delta-rule attention (16 heads of 128).
HYBRID_SHAPES = [
    (f"{name} [{t}, {dims}]{tail}", op, (t, *shape), group, scale, gate)
    for t in (1, 512)
    for name, op, shape, dims, tail, group, scale, gate in (
        ("Qwen3-Next gated", "GatedRMSNorm", (2048,), "16x128", " g128", 128, (128,), (0, 1)),
        ("Mamba2 gate first", "GatedRMSNorm", (4096,), "4096", " 8 groups", 512, (4096,), (0, 0)),
        ("L2 q/k", "L2Norm", (16, 128), "16, 128", "", 0, None, None),
    )
]
#: GPU cycles of busy waiting after each flush (torch.cuda._sleep, about 50 us on an H100/H200):
#: the host queues the timed call meanwhile, so that its launch overhead (ctypes, torch's
#: dispatcher, ORT's Run) falls outside the events; the spin touches no memory
SPIN_CYCLES = 100_000


def _synchronize(t) -> None:
    """Waits for the GPU where ``t`` (a tensor) is on one."""
    import torch

    if t.is_cuda:
        torch.cuda.synchronize()


def _back_to_back_ms(fn: Callable[[], None], reps: int, calls: int = DECODE_CALLS) -> float:
    """Median milliseconds per call of ``fn`` launched ``calls`` times back to back between two
    CUDA events on torch's current stream (L2 not flushed: decode's weights and rows stay in it),
    over min(reps, 10) samples, at least 3. Where the host issues calls more slowly than the GPU
    runs them, this is the host's rate: what a decode step pays per call."""
    import torch

    times = []
    for _ in range(max(3, min(reps, 10))):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def _time(who: str, fn: Callable[[], None], flush, reps: int, decode: bool) -> float:
    """Milliseconds per call of ``fn`` for contender ``who`` ("copy", "onnxnorm", "torch" or
    "ort"): each contender of a row the same way, back to back for a decode shape, else
    :func:`timing.cuda_ms` with ``flush`` before each repetition. (The tests replace this.)"""
    if decode:
        return _back_to_back_ms(fn, reps)
    return timing.cuda_ms(fn, flush, reps)


def _copy_gbs(src, flush, reps: int, decode: bool = False) -> float:
    """The copy bound of ``src``'s shape in GB/s: read X, write Y (the bytes RMSNorm moves)."""
    import torch

    dst = torch.empty_like(src)
    ms = _time("copy", lambda: dst.copy_(src), flush, reps, decode)
    return 2 * src.numel() * src.element_size() / ms / 1e6


def _flusher():
    """A call that writes more than L2 holds, then keeps the GPU busy a while without touching
    memory: every repetition after it starts from memory, its launch queued in time."""
    import torch

    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 64 << 20) or (64 << 20)
    flush_buf = torch.empty(max(4 * l2, 256 << 20) // 4, dtype=torch.float32, device="cuda")
    spin = getattr(torch.cuda, "_sleep", None)

    def flush() -> None:
        flush_buf.zero_()
        if spin is not None:
            spin(SPIN_CYCLES)

    return flush


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
    (:func:`_back_to_back_ms`)."""
    args = kernels.args(op, inputs, y, s, **attrs)
    kernels.launch(args)  # warm-up, and errors surface here
    _synchronize(y)
    handle = None
    if decode and y.is_cuda:  # the stream looked up once: less host time per call
        import torch

        handle = torch.cuda.current_stream().cuda_stream

    def launch() -> None:
        if handle is None:
            kernels.launch(args)
        else:
            kernels.launch(args, handle)

    ms = _time("onnxnorm", launch, flush, reps, decode)
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


def bench_inputs(op: str, x, residual=None) -> dict[str, Any]:
    """The inputs every contender of ``op`` reads, by catalogue name, in the order of
    :func:`kernels_graphs.input_names` (the order of the torch contender's arguments): X, the
    Residual of the residual ops (``residual`` or a new one), and each weight of the math of ORT's
    ops (the RMS ops without Bias, as LLMs and ORT's SimplifiedLayerNormalization have them)."""
    import torch

    inputs = {}
    for name in kernels_graphs.input_names(op):
        if name == "X":
            inputs[name] = x
        elif name == "Residual":
            inputs[name] = residual if residual is not None else torch.randn_like(x)
        else:
            inputs[name] = torch.randn(x.shape[-1], device=x.device, dtype=x.dtype)
    return inputs


def _max_diff(a, b) -> float:
    """The largest difference between the first 64 rows of ``a`` and ``b`` (float32): that a
    contender computed what the onnxnorm kernel did (the JSON's ``*_max_diff``)."""
    n = min(64, a.shape[0])
    return float((a[:n].float() - b[:n].float()).abs().max().item())


def torch_call(op: str, inputs: dict[str, Any]) -> Callable[[], Any]:
    """``op`` in torch on ``inputs``: ``F.rms_norm`` / ``F.layer_norm``; the Skip ops as
    ``s = x + r; y = norm(s)``, the Sandwich ops as ``s = r + norm(x); y = norm(s)`` (writing s
    is the Sum output). Returns the call (Y, or (Y, Sum))."""
    import torch.nn.functional as F

    from onnxnorm.bench.kernels_contenders import torch_fn

    spec = catalogue.get(op)
    if spec.norm == "rms" and not hasattr(F, "rms_norm"):
        raise RuntimeError(f"torch {_torch_version()} has no torch.nn.functional.rms_norm")
    fn = torch_fn(op, decomposed=False)
    args = list(inputs.values())
    return lambda: fn(*args)


def _torch_version() -> str:
    import torch

    return torch.__version__


def ort_unavailable(device: str = "cuda") -> str | None:
    """Why ONNX Runtime's contender cannot run on ``device`` ("cuda": onnxruntime offers no
    CUDAExecutionProvider), or None when it can."""
    try:
        import onnxruntime as ort
    except ImportError as error:
        return f"onnxruntime not importable: {common.short_error(error)}"
    from onnxnorm import runtime

    if device == "cuda" and runtime.CUDA_PROVIDER not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} offers no {runtime.CUDA_PROVIDER} (not -gpu)"
    return None


def ort_call(
    label: str,
    op: str,
    dtype: str,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    stream: int | None = None,
) -> Callable[[], None]:
    """ORT's built-in model ``label`` (:data:`kernels_graphs.ORT_BUILTINS`) of ``op`` in a
    session on the tensors' device, bound by IO binding to ``inputs`` (by catalogue name) and
    ``outputs`` ("y", "sum"): ORT reads and writes the torch tensors' memory, no copies. On CUDA
    the session has the CUDA execution provider alone (CPU fallback disabled: an op without a CUDA
    kernel for the dtype fails here), runs on ``stream`` (user_compute_stream: torch's stream of
    the benchmark) and returns from Run without synchronizing (run option
    disable_synchronize_execution_providers), so that CUDA events time its kernels as they time
    the others. Returns the call, run once."""
    import onnxruntime as ort

    from onnxnorm import runtime

    x = inputs["X"]
    on_gpu = x.is_cuda
    model = kernels_graphs.ort_builtin_model(label, dtype, tuple(x.shape), x.shape[-1])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    run_options = ort.RunOptions()
    if on_gpu:
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        cuda_options = {"device_id": str(x.device.index or 0)}
        if stream:  # (0, the legacy default stream, is "none given" to ORT)
            cuda_options["user_compute_stream"] = str(stream)
        providers = [(runtime.CUDA_PROVIDER, cuda_options)]
        run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
    else:
        providers = ["CPUExecutionProvider"]
    sess = runtime.session(model, options, providers, with_library=False)
    if on_gpu and runtime.CUDA_PROVIDER not in sess.get_providers():
        raise RuntimeError(f"the session has {sess.get_providers()}: the CUDA EP did not load")
    names = kernels_graphs.input_names(op)
    arrays = {names[name]: t for name, t in inputs.items() if name in names}
    arrays.update(outputs)
    element_type = kernels_graphs.onnx_type(dtype)  # (an ONNX type: bfloat16 has no numpy one)
    binding = sess.io_binding()
    sides = [(sess.get_inputs(), binding.bind_input), (sess.get_outputs(), binding.bind_output)]
    for args, bind in sides:
        for arg in args:
            t = arrays[arg.name]
            device_id = t.device.index or 0
            bind(arg.name, t.device.type, device_id, element_type, list(t.shape), t.data_ptr())

    def call() -> None:
        sess.run_with_iobinding(binding, run_options)

    call()
    return call


def ort_probe(device: str = "cuda", stream: int | None = None) -> str | None:
    """Why ORT's contender cannot run although onnxruntime offers the provider (its CUDA EP does
    not load, say), found by one float32 LayerNormalization on a row of 64; None when it ran. One
    probe instead of a failed session per row."""
    import torch

    x = torch.ones(1, 64, device=device)
    inputs = bench_inputs("LayerNorm", x)
    try:
        ort_call("LayerNormalization-17", "LayerNorm", "float32", inputs, {"y": x.clone()}, stream)
        _synchronize(x)
    except Exception as error:  # noqa: BLE001 - the reason is every ORT cell's n/a
        return f"ORT's LayerNormalization float32 probe failed: {common.short_error(error)}"
    return None


def _returns_early(fn: Callable[[], None], flush) -> bool | None:
    """Whether ``fn`` returns before the GPU has run it (None off the GPU): queued behind a
    flush, its stream still busy when it returns. False for ORT: its Run synchronized, and its
    times include that wait."""
    import torch

    if not torch.cuda.is_available():
        return None
    flush()
    fn()
    busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return busy


def _contend_torch(row, op, inputs, y, flush, reps, decode) -> None:
    try:
        call = torch_call(op, inputs)
        out = call()
        _synchronize(y)
        ms = _time("torch", call, flush, reps, decode)
    except Exception as error:  # noqa: BLE001 - a contender that cannot run is an n/a row
        row["torch_note"] = common.short_error(error)
        return
    row["torch_us"] = 1000 * ms
    row["torch_speedup"] = row["torch_us"] / row["us"]
    row["torch_max_diff"] = _max_diff(out[0] if isinstance(out, tuple) else out, y)


def _contend_ort(row, op, dtype, inputs, y, s, flush, reps, decode, stream) -> None:
    """Every ORT built-in of ``op``; the row's ORT time is the fastest that ran."""
    import torch

    tried: dict[str, dict[str, Any]] = {}
    for label in kernels_graphs.ORT_BUILTINS.get(op, []):
        outputs = {"y": torch.empty_like(y)}
        if s is not None:
            outputs["sum"] = torch.empty_like(s)
        try:
            call = ort_call(label, op, dtype, inputs, outputs, stream)
            _synchronize(y)
            ms = _time("ort", call, flush, reps, decode)
            early = None if decode else _returns_early(call, flush)
        except Exception as error:  # noqa: BLE001 - a contender that cannot run is an n/a row
            tried[label] = {"error": common.short_error(error)}
            continue
        tried[label] = {
            "us": 1000 * ms,
            "max_diff": _max_diff(outputs["y"], y),
            "returns_before_gpu": early,
        }
    row["ort"] = tried
    ran = {label: t for label, t in tried.items() if "us" in t}
    if ran:
        best = min(ran, key=lambda label: ran[label]["us"])
        row["ort_op"] = best
        row["ort_us"] = ran[best]["us"]
        row["ort_speedup"] = row["ort_us"] / row["us"]
    else:
        reasons = [f"{label}: {t['error']}" for label, t in tried.items()]
        row["ort_note"] = "; ".join(reasons) or f"ONNX Runtime has no op for {op}"


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
        flush = _flusher() if device == "cuda" else (lambda: None)
    ort_reason = "skipped (--no-ort)" if not ort else ort_unavailable(device)
    if ort_reason is None:
        ort_reason = ort_probe(device, stream)
    results = []
    for label, rows, cols, kind in shapes or BENCH_SHAPES:
        decode = kind == "decode"
        src = torch.randn(rows, cols, device=device, dtype=tdt)
        copy_gbs = _copy_gbs(src, flush, reps, decode)
        residual = torch.randn_like(src)
        for op in ops or DEFAULT_OPS:
            spec = catalogue.get(op)
            inputs = bench_inputs(op, src, residual)
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
                _contend_torch(row, op, inputs, y, flush, reps, decode)
                if ort_reason is None:
                    _contend_ort(row, op, dtype, inputs, y, s, flush, reps, decode, stream)
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
    flush = flush or _flusher()
    results = []
    for label, op, shape, group, scale_shape, gate in shapes or HYBRID_SHAPES:
        x = torch.randn(*shape, device="cuda", dtype=tdt)
        copy_gbs = _copy_gbs(x, flush, reps)
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


COLUMNS = [
    ("op", "l"),
    ("dtype", "l"),
    ("shape", "l"),
    ("kernel", "l"),
    ("time (us)", "r"),
    ("GB/s", "r"),
    ("copy GB/s", "r"),
    ("% of copy", "r"),
    ("torch (us)", "r"),
    ("vs torch", "r"),
    ("ORT CUDA (us)", "r"),
    ("vs ORT", "r"),
    ("targets", "l"),
    ("met?", "l"),
]


def _cell(text: str, width: int = 90) -> str:
    """``text`` fit for a markdown cell: one line, no column bar, at most ``width`` characters."""
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= width else text[: width - 3] + "..."


def _contender_cells(r: dict[str, Any], key: str) -> list[str]:
    if r.get(f"{key}_us") is not None:
        us = f"{r[f'{key}_us']:.1f}"
        if key == "ort" and r.get("ort_op"):
            us += f" ({r['ort_op']})"
        return [us, f"{r[f'{key}_speedup']:.2f}x"]
    note = r.get(f"{key}_note")
    return [_cell(f"n/a: {note}") if note else "-", "-"]


def markdown_head() -> list[str]:
    """The table's head: its row of names and the rule under it."""
    return [
        common.table_row(name for name, _ in COLUMNS),
        common.table_rule("".join(align for _, align in COLUMNS)),
    ]


def markdown_row(r: dict[str, Any]) -> str:
    """One result row of the table (a row of :func:`bench`, :func:`bench_hybrid`)."""
    if r.get("us") is None:
        measured = [_cell(f"n/a: {r.get('error', 'not measured')}"), "-", "-", "-"]
    else:
        measured = [
            f"{r['us']:.2f}" if r["us"] < 10 else f"{r['us']:.1f}",
            f"{r['gbs']:.0f}",
            f"{r['copy_gbs']:.0f}",
            f"{r['pct_of_copy']:.1f}%",
        ]
    targets = "; ".join(
        f"{t['target']}: {'met' if t['met'] else 'MISSED'} ({t['detail']})"
        for t in r.get("targets") or []
    )
    met = r.get("met")
    return common.table_row(
        [r["op"], r["dtype"], r["shape"], (r.get("kernel") or "-").split("/")[-1]]
        + measured
        + _contender_cells(r, "torch")
        + _contender_cells(r, "ort")
        + [targets or "-", "-" if met is None else ("yes" if met else "**no**")]
    )


def markdown(results: list[dict[str, Any]], device: str = "") -> str:
    lines = [f"CUDA kernels on {device}" if device else "CUDA kernels", ""]
    lines += markdown_head()
    lines += [markdown_row(r) for r in results]
    return "\n".join(lines)


def summary(results: list[dict[str, Any]]) -> str:
    """One line: how many rows with targets met them all, and which missed what."""
    judged = [r for r in results if r.get("met") is not None]
    missed = [
        f"{r['op']} {r['shape']} ({', '.join(t['target'] for t in r['targets'] if not t['met'])})"
        for r in judged
        if not r["met"]
    ]
    failed = [f"{r['op']} {r['shape']}" for r in results if r.get("us") is None]
    line = f"{sum(r['met'] for r in judged)} of {len(judged)} rows with targets met them all"
    if missed:
        line += "; missed: " + "; ".join(missed)
    if failed:
        line += "; not measured: " + "; ".join(failed)
    return line


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
        flush = _flusher()
        for dtype in dtypes:
            print(f"\n## {dtype} on {device}\n", flush=True)
            print("\n".join(markdown_head()), flush=True)

            def show(row: dict[str, Any]) -> None:
                print(markdown_row(row), flush=True)

            rows = bench(
                kernels, dtype=dtype, reps=reps, flush=flush, stream=stream.cuda_stream,
                ort=ort, on_row=show,
            )  # fmt: skip
            rows += bench_hybrid(kernels, dtype=dtype, reps=reps, flush=flush, on_row=show)
            results += rows
            print(f"\n{dtype}: {summary(rows)}", flush=True)
            if json_path:
                common.write_json(json_path, dict(device=device, environment=env, results=results))
    return results

"""The contenders of a CUDA kernel's row: torch (``F.rms_norm`` / ``F.layer_norm``, the residual
add written out) and ONNX Runtime's own ops for the same math (the kernels benchmark's
:data:`~onnxnorm.bench.kernels.graphs.ORT_BUILTINS`) in a session on the CUDA provider, bound to
the torch tensors' memory. A contender that cannot run (no onnxruntime-gpu, an ORT op without a
CUDA kernel for the dtype, a torch function missing) is the row's "n/a" with its reason, never
the end of the run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onnxnorm.bench import common
from onnxnorm.bench.cuda import clock
from onnxnorm.bench.kernels import graphs
from onnxnorm.ops import catalogue


def bench_inputs(op: str, x, residual=None) -> dict[str, Any]:
    """The inputs every contender of ``op`` reads, by catalogue name, in the order of
    :func:`graphs.input_names` (the order of the torch contender's arguments): X, the
    Residual of the residual ops (``residual`` or a new one), and each weight of the math of ORT's
    ops (the RMS ops without Bias, as LLMs and ORT's SimplifiedLayerNormalization have them)."""
    import torch

    inputs = {}
    for name in graphs.input_names(op):
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

    from onnxnorm.bench.kernels.contenders import torch_fn

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
    """ORT's built-in model ``label`` (:data:`graphs.ORT_BUILTINS`) of ``op`` in a
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
    model = graphs.ort_builtin_model(label, dtype, tuple(x.shape), x.shape[-1])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    run_options = ort.RunOptions()
    providers: list[str | tuple[str, dict[str, str]]]
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
    names = graphs.input_names(op)
    arrays = {names[name]: t for name, t in inputs.items() if name in names}
    arrays.update(outputs)
    element_type = graphs.onnx_type(dtype)  # (an ONNX type: bfloat16 has no numpy one)
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
        clock.synchronize(x)
    except Exception as error:  # noqa: BLE001 - the reason is every ORT cell's n/a
        return f"ORT's LayerNormalization float32 probe failed: {common.short_error(error)}"
    return None


def contend_torch(row, op, inputs, y, flush, reps, decode) -> None:
    """torch's ``op`` on the row's inputs, timed as the kernel was: the row's ``torch_*`` keys,
    or its ``torch_note`` where it cannot run."""
    try:
        call = torch_call(op, inputs)
        out = call()
        clock.synchronize(y)
        ms = clock.time_ms("torch", call, flush, reps, decode)
    except Exception as error:  # noqa: BLE001 - a contender that cannot run is an n/a row
        row["torch_note"] = common.short_error(error)
        return
    row["torch_us"] = 1000 * ms
    row["torch_speedup"] = row["torch_us"] / row["us"]
    row["torch_max_diff"] = _max_diff(out[0] if isinstance(out, tuple) else out, y)


def contend_ort(row, op, dtype, inputs, y, s, flush, reps, decode, stream) -> None:
    """Every ORT built-in of ``op``; the row's ORT time is the fastest that ran."""
    import torch

    tried: dict[str, dict[str, Any]] = {}
    for label in graphs.ORT_BUILTINS.get(op, []):
        outputs = {"y": torch.empty_like(y)}
        if s is not None:
            outputs["sum"] = torch.empty_like(s)
        try:
            call = ort_call(label, op, dtype, inputs, outputs, stream)
            clock.synchronize(y)
            ms = clock.time_ms("ort", call, flush, reps, decode)
            early = None if decode else clock.returns_early(call, flush)
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

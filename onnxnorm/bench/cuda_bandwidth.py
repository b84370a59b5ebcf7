"""The CUDA kernels' bandwidth: each float op at each shape against a device-to-device copy of
the same shape, measured in the same run (see the package's docstring); and the norms of hybrid
models (GatedRMSNorm, L2Norm) at their models' shapes, for one decoded token and a 512-token
prefill."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from onnxnorm import _native
from onnxnorm.bench import common, timing
from onnxnorm.ops import catalogue

#: (label, rows, cols, is Q/K)
BENCH_SHAPES = [
    ("4096x4096", 4096, 4096, False),
    ("4096x8192", 4096, 8192, False),
    ("Q/K 16384x32 heads x128", 16384 * 32, 128, True),
    ("Q/K 4096x8 heads x256", 4096 * 8, 256, True),
    ("Q/K 4096x32 heads x64", 4096 * 32, 64, True),
]
#: percent of the copy bandwidth (bfloat16, 4096 x 4096 and 4096 x 8192; Q/K-norm shapes: 75%)
TARGETS = {"RMSNorm": 90, "SkipRMSNorm": 90, "LayerNorm": 85, "SkipLayerNorm": 85}
QK_TARGET = 75
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


def _copy_gbs(src, flush, reps: int) -> float:
    """The copy bound of ``src``'s shape in GB/s: read X, write Y (the bytes RMSNorm moves)."""
    import torch

    dst = torch.empty_like(src)
    ms = timing.cuda_ms(lambda: dst.copy_(src), flush, reps)
    return 2 * src.numel() * src.element_size() / ms / 1e6


def _flusher():
    """A call that writes more than L2 holds: every repetition after it starts from memory."""
    import torch

    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 64 << 20) or (64 << 20)
    flush_buf = torch.empty(max(4 * l2, 256 << 20) // 4, dtype=torch.float32, device="cuda")
    return flush_buf.zero_


def _torch_dtype(dtype: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


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
) -> dict[str, Any]:
    """Times one launch of op on inputs (writing y, and s for Sum when not None) and returns its
    result row: the bytes it reads and writes per second, against copy_gbs and target (% of copy,
    or None)."""
    import torch

    args = kernels.args(op, inputs, y, s, **attrs)
    kernels.launch(args)  # warm-up, and errors surface here
    torch.cuda.synchronize()
    ms = timing.cuda_ms(lambda: kernels.launch(args), flush, reps)
    moved = sum(t.numel() * t.element_size() for t in inputs.values())
    moved += y.numel() * y.element_size() * (2 if s is not None else 1)
    gbs = moved / ms / 1e6
    pct = 100 * gbs / copy_gbs
    return dict(
        op=op,
        dtype=dtype,
        shape=label,
        kernel=kernels.kernel_name(args),
        ms=ms,
        gbs=gbs,
        copy_gbs=copy_gbs,
        pct_of_copy=pct,
        target=target,
        met=None if target is None else pct >= target,
    )


def bench(
    kernels: _native.Kernels,
    ops: Iterable[str] | None = None,
    dtype: str = "bfloat16",
    reps: int = 30,
    shapes=None,
) -> list[dict[str, Any]]:
    """Measures each op (default: DEFAULT_OPS) at each shape; returns rows with GB/s and % of
    copy."""
    import torch

    tdt = _torch_dtype(dtype)
    flush = _flusher()
    results = []
    for label, rows, cols, qk in shapes or BENCH_SHAPES:
        src = torch.randn(rows, cols, device="cuda", dtype=tdt)
        copy_gbs = _copy_gbs(src, flush, reps)
        # (the quantized ops: the float ops' kernels with another epilogue)
        for op in ops or DEFAULT_OPS:
            spec = catalogue.get(op)
            inputs = {"X": src}
            if spec.has_residual:
                inputs["Residual"] = torch.randn_like(src)
            for name in spec.optional_inputs:
                if name != "XBias":
                    inputs[name] = torch.randn(cols, device="cuda", dtype=tdt)
            y = torch.empty_like(src)
            s = torch.empty_like(src) if spec.has_residual else None
            target = (
                QK_TARGET if qk and spec.residual == "none" else (None if qk else TARGETS.get(op))
            )
            results.append(
                _measure(kernels, op, dtype, label, inputs, y, s, {}, copy_gbs, flush, reps, target)
            )
            del y, s
        del src
        torch.cuda.empty_cache()
    return results


def bench_hybrid(
    kernels: _native.Kernels, dtype: str = "bfloat16", reps: int = 30, shapes=None
) -> list[dict[str, Any]]:
    """Measures GatedRMSNorm and L2Norm at HYBRID_SHAPES (default), as :func:`bench` does (no
    targets)."""
    import torch

    tdt = _torch_dtype(dtype)
    flush = _flusher()
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
        results.append(
            _measure(kernels, op, dtype, label, inputs, y, None, attrs, copy_gbs, flush, reps, None)
        )
        del x, inputs, y
    torch.cuda.empty_cache()
    return results


def markdown(results: list[dict[str, Any]], device: str = "") -> str:
    lines = [
        f"CUDA kernels on {device}" if device else "CUDA kernels",
        "",
        common.table_row(
            [
                "op",
                "dtype",
                "shape",
                "kernel",
                "time (us)",
                "GB/s",
                "copy GB/s",
                "% of copy",
                "target",
                "met?",
            ]
        ),
        common.table_rule("llllrrrrrl"),
    ]
    for r in results:
        target = f"{r['target']}%" if r["target"] is not None else "-"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(
            common.table_row(
                [
                    r["op"],
                    r["dtype"],
                    r["shape"],
                    r["kernel"].split("/")[-1],
                    f"{1000 * r['ms']:.1f}",
                    f"{r['gbs']:.0f}",
                    f"{r['copy_gbs']:.0f}",
                    f"{r['pct_of_copy']:.1f}%",
                    target,
                    met,
                ]
            )
        )
    return "\n".join(lines)


def report(
    library: str | os.PathLike | None = None,
    dtype: str = "bfloat16",
    reps: int = 30,
    json_path: str | None = None,
) -> list[dict[str, Any]]:
    """Measures every float op with the CUDA library at ``library`` (default: the installed
    one) on the first GPU (GatedRMSNorm and L2Norm at HYBRID_SHAPES), prints the table, writes
    the rows as JSON where asked."""
    import torch

    kernels = _native.Kernels(library)
    device = torch.cuda.get_device_name(0)
    print(
        f"# {kernels.path} ({kernels.build_info()}) on {device}, torch {torch.__version__}",
        flush=True,
    )
    results = bench(kernels, dtype=dtype, reps=reps)
    results += bench_hybrid(kernels, dtype=dtype, reps=reps)
    print(markdown(results, device))
    if json_path:
        common.write_json(json_path, dict(device=device, results=results))
    return results

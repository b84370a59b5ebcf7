"""``onnxnorm bench kernels``' measurement: :func:`bench_case` times every contender of one row
in one process with interleaved repetitions, :func:`run` every row and prints the tables."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from onnxnorm.bench import common, timing
from onnxnorm.bench.kernels import graphs, rotary
from onnxnorm.bench.kernels.cases import QUANT_TYPE, QUANT_ZERO_POINTS, Y_SCALE, Result, op_shapes
from onnxnorm.bench.kernels.contenders import decomposed_model, ort_runner, threaded_copy, torch_fn
from onnxnorm.bench.kernels.report import (
    comparison_table,
    dtype_cell,
    environment,
    markdown_table,
    plot,
    us,
)
from onnxnorm.ops import catalogue


def bench_case(
    op: str,
    shape_name: str,
    dtype: str,
    threads: int,
    repeats: int,
    min_sample: float,
    rng: np.random.Generator,
    log: Callable[[str], None] = lambda s: None,
    warmup: float = 0.01,
    compare: dict[str, str] | None = None,
    quant_type: str = QUANT_TYPE,
) -> Result:
    """One row: ``op`` on ``shape_name`` in ``dtype`` (a static quantized op quantizing to
    ``quant_type``), every contender timed (a rotary op's: module ``rotary``'s)."""
    import torch

    case = op_shapes(op, [shape_name])[shape_name]
    shape, attrs, scale_shape = case.x, case.attrs, case.scale
    d = shape[-1]
    np_type = graphs.np_dtype(dtype)
    spec = catalogue.get(op)
    arrays = rotary.make_arrays(op, case, dtype, rng) if spec.rotary else {}
    for name in [] if spec.rotary else graphs.input_names(op).values():
        if name == "ys":
            arrays[name] = np.array(Y_SCALE, np_type)
        elif name == "yz":
            arrays[name] = graphs.zero_point(quant_type)
        elif name in ("x", "r", "g"):
            arrays[name] = rng.standard_normal(shape, np.float32).astype(np_type)
        else:
            base = 1.0 if name.startswith("s") else 0.0
            w = base + 0.1 * rng.standard_normal(scale_shape or (d,), np.float32)
            arrays[name] = w.astype(np_type)

    keep: list = []
    fns: dict[str, Callable[[], None]] = {}
    times: dict[str, float | None] = {}
    notes: dict[str, str] = {}

    def add(name, make):
        try:
            fns[name] = make()
        except Exception as error:  # noqa: BLE001 - the competitor lacks this dtype (or op)
            times[name] = None
            notes[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
            log(f"  {name}: n/a ({notes[name]})")

    def model():
        return graphs.onnxnorm_model(op, dtype, shape, d, quant_type, attrs, scale_shape)

    def timed(nbytes: int, quantized: str | None = None) -> Result:
        """Every contender added, timed against a copy of ``nbytes``."""
        return _time(
            op,
            shape_name,
            dtype,
            fns,
            times,
            notes,
            nbytes,
            threads,
            repeats,
            min_sample,
            warmup,
            keep,
            quantized,
        )

    if spec.rotary:
        torch.set_num_threads(threads)
        rotary.add_contenders(op, dtype, case, arrays, add, threads, keep, compare)
        # Q and K read, QOut and KOut written: a copy of Q and K
        return timed(arrays["q"].nbytes + arrays["k"].nbytes)
    add("onnxnorm", lambda: ort_runner(model(), arrays, threads, True, keep))
    for name, path in (compare or {}).items():  # other builds of the library, for before/after
        add(
            f"onnxnorm@{name}",
            lambda path=path: ort_runner(model(), arrays, threads, False, keep, library=path),
        )
    for label in graphs.ORT_BUILTINS[op]:
        add(
            "ort:" + label,
            lambda label=label: ort_runner(
                graphs.ort_builtin_model(label, dtype, shape, d, quant_type, attrs, scale_shape),
                arrays,
                threads,
                False,
                keep,
            ),
        )
    quantized = catalogue.get(op).quantize != "none"
    if not quantized:
        add(
            "decomposed",
            lambda: ort_runner(
                decomposed_model(op, dtype, arrays, attrs), arrays, threads, False, keep
            ),
        )
    two_inputs = spec.has_residual or spec.gated
    floor_shape = (2 * shape[0], *shape[1:]) if two_inputs else shape
    add(
        "floor",
        lambda: ort_runner(
            graphs.ort_floor_model(op, dtype, shape),
            arrays,
            threads,
            False,
            keep,
            output_shape=floor_shape,
        ),
    )

    torch.set_num_threads(threads)
    bfloat16 = graphs.np_dtype("bfloat16")
    tensors = (
        [
            torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
            if a.dtype == bfloat16
            else torch.from_numpy(a)
            for a in arrays.values()
        ]
        if not quantized
        else []
    )
    eager = torch_fn(op, decomposed=False, attrs=attrs)

    def make_torch():
        with torch.inference_mode():
            eager(*tensors)

        def call():
            with torch.inference_mode():
                eager(*tensors)

        return call

    if not quantized:
        add("torch", make_torch)

    # the tensor bytes the op reads and writes, X's size each, moved as a copy (which writes as
    # much as it reads): X [Residual] [Gate] read, Y [Sum] written
    moved = 2 + 2 * spec.has_residual + spec.gated
    nbytes = moved * arrays["x"].nbytes // 2
    return timed(nbytes, quant_type if spec.quantize == "static" else None)


def _time(
    op: str,
    shape_name: str,
    dtype: str,
    fns: dict[str, Callable[[], None]],
    times: dict[str, float | None],
    notes: dict[str, str],
    nbytes: int,
    threads: int,
    repeats: int,
    min_sample: float,
    warmup: float,
    keep: list,
    quant_type: str | None = None,
) -> Result:
    """Times ``fns`` and a copy of ``nbytes`` (the bytes the op reads, copied: it writes as many)
    interleaved; the row, with the contenders that did not run (``times``, ``notes``)."""
    source = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)
    fns["copy:numpy"] = lambda: np.copyto(target, source)
    pool = ThreadPoolExecutor(threads - 1) if threads > 1 else None
    if pool is not None:
        fns["copy:threads"] = threaded_copy(pool, threads, source, target)

    try:
        medians, fastest = timing.interleaved(fns, repeats, min_sample, warmup)
    finally:
        if pool is not None:
            pool.shutdown()
    times.update(medians)
    best: dict[str, float | None] = {**dict.fromkeys(times), **fastest}
    for t in (times, best):
        t["copy"] = min(v for k, v in t.items() if k.startswith("copy:") and v is not None)
    keep.clear()  # the sessions and their buffers
    return Result(op, shape_name, dtype, times, notes, best, quant_type)


def run(
    ops: list[str],
    shapes: list[str] | None,
    dtypes: list[str],
    threads: int = 2,
    repeats: int = 9,
    min_sample: float = 0.002,
    json_path: str | None = None,
    plot_path: str | None = None,
    verbose: bool = True,
    warmup: float = 0.01,
    compare: dict[str, str] | None = None,
    quant_type: str = QUANT_TYPE,
) -> list[Result]:
    """Times every op, dtype and shape (the static quantized ops quantizing to ``quant_type``;
    ``shapes``: names of SHAPES and OP_SHAPES, each op taking those it has; None: each op's
    own), prints the table, writes the JSON and the plot where asked; returns the rows."""
    if quant_type not in QUANT_ZERO_POINTS:
        raise ValueError(
            f"unknown quant_type {quant_type!r}; choose from {', '.join(QUANT_ZERO_POINTS)}"
        )
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("torch").setLevel(logging.ERROR)
    log = print if verbose else (lambda s: None)
    rng = np.random.default_rng(0)
    env = environment(threads, warmup)
    env["quant_type"] = quant_type
    log(
        f"# onnxnorm bench kernels — {env['date']}, {env['cpu']}, {env['cores']} cores, "
        f"{threads} threads, onnxruntime {env['onnxruntime']}, torch {env['torch']}, "
        f"kernels {env['isa']}, load average {env['load_average']}"
    )
    results = []
    for op in ops:
        for dtype in dtypes:
            for shape in op_shapes(op, shapes):
                start = timing.clock()
                result = bench_case(
                    op,
                    shape,
                    dtype,
                    threads,
                    repeats,
                    min_sample,
                    rng,
                    log,
                    warmup,
                    compare,
                    quant_type,
                )
                results.append(result)
                name, best = result.best_ort()
                log(
                    f"{op} {shape} {dtype_cell(result)}: onnxnorm {us(result.onnxnorm)} µs, "
                    f"{name} {us(best)} µs ({timing.clock() - start:.1f} s)"
                )
    env["load_average_after"] = common.load_average()
    log(f"# load average at the end {env['load_average_after']}")
    table = markdown_table(results)
    print(table)
    if compare:
        env["compare_libraries"] = dict(compare)
        print()
        print(comparison_table(results, list(compare)))
    if json_path:
        common.write_json(
            json_path, {"environment": env, "results": [r.to_dict() for r in results]}
        )
    if plot_path:
        plot(results, plot_path)
    return results

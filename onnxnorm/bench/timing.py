"""How the benchmarks time: one clock, samples interleaved so that a load that comes and goes
on the machine falls on every contender alike, medians with their spread, and the paired
ratios of two contenders timed in the same repetitions (ratios within one run, never absolute
numbers across runs: docs/design.md)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence

#: the clock of every CPU-side measurement (monotonic, the finest the OS has)
clock = time.perf_counter


def spread(values: Iterable[float], prefix: str = "") -> dict[str, float]:
    """``{"median", "min", "max"}`` of ``values`` (keys prefixed with ``prefix``)."""
    values = list(values)
    return {
        f"{prefix}median": statistics.median(values),
        f"{prefix}min": min(values),
        f"{prefix}max": max(values),
    }


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``b[i] / a[i]`` for each repetition ``i`` in which ``a`` took time: how many times as
    fast as ``b`` ``a`` ran in each (above 1: ``a`` is faster). Pairs taken in the same
    repetition share its machine state, which a ratio of two medians would not."""
    return [y / x for x, y in zip(a, b) if x]


def interleaved(
    fns: dict[str, Callable[[], None]], repeats: int, min_sample: float, warmup: float = 0.0
) -> tuple[dict[str, float], dict[str, float]]:
    """(median, minimum) seconds per call of each function over ``repeats`` repetitions, each
    timing every function once in an order rotated by one per repetition; a sample loops until
    it lasts ``min_sample`` seconds. Each timed sample follows ``warmup`` seconds (at least one
    call) of the same function, untimed: the first milliseconds of memory traffic after another
    contender ran, or after a pause, run slower (docs/benchmarks.md), and a sample should see
    the state a loop of calls keeps."""
    numbers = {}
    for name, fn in fns.items():
        start = clock()
        fn()
        once = clock() - start
        numbers[name] = max(1, min(10000, math.ceil(min_sample / max(once, 1e-7))))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            fn, number = fns[name], numbers[name]
            start = clock()
            fn()
            while clock() - start < warmup:
                fn()
            start = clock()
            for _ in range(number):
                fn()
            samples[name].append((clock() - start) / number)
    return (
        {name: statistics.median(values) for name, values in samples.items()},
        {name: min(values) for name, values in samples.items()},
    )


def cuda_ms(fn: Callable[[], None], before: Callable[[], None], reps: int) -> float:
    """Median milliseconds of ``fn`` on the GPU over ``reps`` repetitions, by CUDA events
    around it on torch's current stream; ``before`` runs untimed ahead of each (the bandwidth
    benchmark flushes L2 there)."""
    import torch

    times = []
    for _ in range(reps):
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)

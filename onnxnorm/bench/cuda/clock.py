"""How ``onnxnorm bench cuda`` times a call: CUDA events around each launch with L2 flushed
before it (:func:`onnxnorm.bench.timing.cuda_ms`), or, for a decode shape, many launches back to
back between two events; the copy bound of a shape, timed the same way. torch is imported on
use."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from onnxnorm.bench import timing
from onnxnorm.bench.cuda.cases import DECODE_CALLS

#: GPU cycles of busy waiting after each flush (torch.cuda._sleep, about 50 us on an H100/H200):
#: the host queues the timed call meanwhile, so that its launch overhead (ctypes, torch's
#: dispatcher, ORT's Run) falls outside the events; the spin touches no memory
SPIN_CYCLES = 100_000


def synchronize(t) -> None:
    """Waits for the GPU where ``t`` (a tensor) is on one."""
    import torch

    if t.is_cuda:
        torch.cuda.synchronize()


def back_to_back_ms(fn: Callable[[], None], reps: int, calls: int = DECODE_CALLS) -> float:
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


def time_ms(who: str, fn: Callable[[], None], flush, reps: int, decode: bool) -> float:
    """Milliseconds per call of ``fn`` for contender ``who`` ("copy", "onnxnorm", "torch" or
    "ort"): each contender of a row the same way, back to back for a decode shape, else
    :func:`timing.cuda_ms` with ``flush`` before each repetition. (The tests replace this.)"""
    if decode:
        return back_to_back_ms(fn, reps)
    return timing.cuda_ms(fn, flush, reps)


def copy_gbs(src, flush, reps: int, decode: bool = False) -> float:
    """The copy bound of ``src``'s shape in GB/s: read X, write Y (the bytes RMSNorm moves)."""
    import torch

    dst = torch.empty_like(src)
    ms = time_ms("copy", lambda: dst.copy_(src), flush, reps, decode)
    return 2 * src.numel() * src.element_size() / ms / 1e6


def flusher():
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


def returns_early(fn: Callable[[], None], flush) -> bool | None:
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

"""What the benchmarks share: comma-separated options, the JSON file, markdown table rows, the
machine a run measured on, a tool's output silenced and its failure as one line. Imports nothing
heavy: the commands' options use it."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import logging
import os
import platform
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any


def choices_list(
    choices: Sequence[str] | Callable[[], Sequence[str]],
) -> Callable[[str], list[str]]:
    """An argparse ``type``: a comma-separated list of ``choices``, or of what ``choices()``
    returns, called only when the option is given (the ops come from the catalogue, which
    imports onnx: too slow for ``--help``)."""

    def parse(text: str) -> list[str]:
        known = tuple(choices() if callable(choices) else choices)
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in known]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(bad)}; choose from {', '.join(known)}"
            )
        return values

    return parse


def write_json(path: str | os.PathLike, data: Any) -> None:
    """``data`` as the benchmarks write their ``--json``: one space of indent, a final newline."""
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def table_row(cells: Iterable[Any]) -> str:
    """``| a | b |``: a row of a markdown table."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def table_rule(align: str) -> str:
    """The rule under a markdown table's head, a column per letter: ``l`` left-aligned, ``r``
    right-aligned (``"lr"``: ``|---|---:|``)."""
    return "|" + "".join("---:|" if a == "r" else "---|" for a in align)


def short_error(error: BaseException) -> str:
    """The first line of ``error``'s message that is not blank, at most 200 characters (the
    error's type name when it has none): a tool's failure as a result, in a table cell."""
    for line in str(error).strip().splitlines():
        if line.strip():
            return line.strip()[:200]
    return type(error).__name__


def quietly(fn: Callable[[], Any]) -> Any:
    """``fn()`` with its output, warnings and logging (below errors) silenced: the tools print a
    great deal, and the benchmark's log says what matters."""
    logging.disable(logging.WARNING)
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            return fn()
    finally:
        logging.disable(logging.NOTSET)


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages of the machine (None where the OS has none): a run
    records them before and after, since a busy machine moves every number."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(threads: int, warmup: float | None = None) -> dict[str, Any]:
    """The machine, the versions and the library of a run (the JSON's ``environment``);
    ``warmup``: the kernels benchmark's seconds before each sample, recorded where given."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from onnxnorm import _native, runtime

    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average": load_average(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads": threads,
    }
    if warmup is not None:
        env["warmup_seconds"] = warmup
    env.update(
        {
            "onnxruntime": ort.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
            "library": str(runtime.library_path()),
            "isa": _native.active_isa(),
        }
    )
    return env

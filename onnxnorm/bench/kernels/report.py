"""``onnxnorm bench kernels``' report: the markdown tables, the plot, the JSON read back, and
the run's environment."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from onnxnorm.bench import common
from onnxnorm.bench.common import table_row, table_rule
from onnxnorm.bench.kernels.cases import Result


def environment(threads: int, warmup: float = 0.01) -> dict[str, Any]:
    """The machine, versions and library of a run (:func:`onnxnorm.bench.common.environment`)."""
    return common.environment(threads, warmup)


def us(seconds: float | None) -> str:
    """Seconds as microseconds in a table cell ("n/a": not measured)."""
    return "n/a" if seconds is None else f"{seconds * 1e6:,.1f}"


def dtype_cell(r: Result) -> str:
    """X's type, and for the static quantized ops Y's: "float16 -> float8e4m3fn"."""
    return f"{r.dtype} -> {r.quant_type}" if r.quant_type else r.dtype


#: the columns of :func:`markdown_table`
COLUMNS = (
    "op",
    "shape",
    "dtype",
    "onnxnorm µs",
    "fastest ORT built-in",
    "ORT µs",
    "onnxnorm / ORT",
    "(best-of)",
    "ORT floor µs",
    "onnxnorm / floor",
    "decomposed µs",
    "torch µs",
    "copy µs",
    "% of copy bandwidth",
    "targets",
)


def markdown_table(results: list[Result]) -> str:
    """A row per op, shape and dtype: onnxnorm's median time beside ORT's fastest built-in op,
    ORT's floor and the copy bound, the ratios, and the targets it misses."""
    lines = [table_row(COLUMNS), table_rule("l" * len(COLUMNS))]
    for r in results:
        name, best = r.best_ort()
        mine = r.onnxnorm
        copy = r.times.get("copy")
        floor = r.times.get("floor")
        _, best_ort = r.best_ort(r.best)
        mine_best = r.best.get("onnxnorm")
        lines.append(
            table_row(
                [
                    r.op,
                    r.shape,
                    dtype_cell(r),
                    us(mine),
                    name[4:] if name else "none",
                    us(best),
                    f"{mine / best:.2f}x" if mine and best else "n/a",
                    f"{mine_best / best_ort:.2f}x" if mine_best and best_ort else "n/a",
                    us(floor),
                    f"{mine / floor:.2f}x" if mine and floor else "n/a",
                    us(r.times.get("decomposed")),
                    us(r.times.get("torch")),
                    us(copy),
                    f"{100 * copy / mine:.0f}%" if mine and copy else "n/a",
                    r.verdict(),
                ]
            )
        )
    return "\n".join(lines)


def comparison_table(results: list[Result], names: list[str]) -> str:
    """onnxnorm against other builds of the library (--compare-library) in the same run: median
    times, and the ratios to ORT's fastest built-in and to the copy bound."""
    head = ["op", "shape", "dtype"] + [
        f"{n}{column}" for n in [*names, "this build"] for column in (" µs", " / ORT", " % of copy")
    ]
    lines = [table_row(head), table_rule("l" * len(head))]
    for r in results:
        _, best = r.best_ort()
        copy = r.times.get("copy")
        cells = [r.op, r.shape, dtype_cell(r)]
        for key in [*(f"onnxnorm@{n}" for n in names), "onnxnorm"]:
            t = r.times.get(key)
            cells += [
                us(t),
                f"{t / best:.2f}x" if t and best else "n/a",
                f"{100 * copy / t:.0f}%" if t and copy else "n/a",
            ]
        lines.append(table_row(cells))
    return "\n".join(lines)


def plot(results: list[Result], path: str) -> None:
    """A PNG of each contender's time over onnxnorm's, a panel per op (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from onnxnorm.ops import catalogue

    ops = [op for op in catalogue.ALL_OPS if any(r.op == op for r in results)]
    contenders = ["best ORT built-in", "decomposed", "torch", "floor", "copy"]
    colors = {
        "best ORT built-in": "#d62728",
        "decomposed": "#9467bd",
        "torch": "#ff7f0e",
        "floor": "#1f77b4",
        "copy": "#7f7f7f",
    }
    fig, axes = plt.subplots(len(ops), 1, figsize=(14, 3.2 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        rows = [r for r in results if r.op == op]
        short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
        labels = [
            f"{'Q/K-norm' if r.shape.startswith('qk') else r.shape}\n{short.get(r.dtype, r.dtype)}"
            for r in rows
        ]
        x = np.arange(len(rows))
        width = 0.8 / len(contenders)
        for k, c in enumerate(contenders):
            values = []
            for r in rows:
                t = r.best_ort()[1] if c == "best ORT built-in" else r.times.get(c)
                values.append(t / r.onnxnorm if t and r.onnxnorm else np.nan)
            ax.bar(
                x + (k - (len(contenders) - 1) / 2) * width, values, width, label=c, color=colors[c]
            )
        ax.axhline(1.0, color="black", lw=1)
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("time / onnxnorm time")
        ax.set_title(
            f"onnxnorm::{op}: above 1 = slower than onnxnorm "
            "(floor and copy: below 1 = the bounds)",
            fontsize=9,
        )
        ax.grid(axis="y", which="both", alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", fontsize=9, ncol=len(contenders))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (3.2 * len(ops))))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_results(path: str) -> list[Result]:
    """The results of a run from its JSON file (to redraw the plot or the table)."""
    with open(path) as f:
        data = json.load(f)
    return [
        Result(
            r["op"],
            r["shape"],
            r["dtype"],
            r["median_seconds"],
            r.get("notes", {}),
            r.get("best_seconds") or {},
            r.get("quant_type"),
        )
        for r in data["results"]
    ]

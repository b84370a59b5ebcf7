"""The markdown table of ``onnxnorm bench cuda``: a row per op and shape (time, GB/s, % of
copy, each contender, each target met or missed) and a summary line of the targets."""

from __future__ import annotations

from typing import Any

from onnxnorm.bench import common

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

"""``onnxnorm bench e2e``'s report: a table per group, an overview per engine, the plot, the
JSON file (written after every group), and the run's environment."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from onnxnorm.bench import common
from onnxnorm.bench.common import table_row, table_rule
from onnxnorm.bench.e2e.config import (
    GENAI_VARIANTS,
    QUANT_VARIANTS,
    QUANTIZATIONS,
    VARIANTS,
    Config,
)


def environment(config: Config) -> dict[str, Any]:
    """The machine, versions and library of a run (:func:`onnxnorm.bench.common.environment`),
    the generation loop, and the versions of the tools that make the variants."""
    env = common.environment(config.threads)
    env["loop"] = (
        "IO binding, outputs in ORT's buffers, present bound as the next past; "
        "greedy numpy argmax on the last row of logits"
    )
    for module in ("transformers", "onnx", "onnxscript", "onnxruntime_genai"):
        try:
            env[module] = __import__(module).__version__
        except ImportError:
            env[module] = None
    return env


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def _share(s: dict[str, Any]) -> str:
    share = s.get("norm_share")
    if not share:
        return "n/a"
    return f"{100 * share['all']:.1f}% ({100 * share['decode']:.1f}%)"


def _norm_ops(s: dict[str, Any]) -> str:
    ops = s.get("norm_ops") or {}
    if not ops:
        return "0"
    by_count = sorted(ops.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{n} {k.split('.', 1)[1]}" for k, n in by_count)


#: the columns of a group's table (:func:`markdown`)
COLUMNS = (
    "variant",
    "nodes",
    "norm ops",
    "prefill ms",
    "decode ms/token (median)",
    "p90",
    "tokens/s",
    "generation s (min-max)",
    "norm kernels (decode)",
    "peak RSS MiB",
    "same tokens",
    "target",
)


def markdown(groups: list[dict[str, Any]], config: Config) -> str:
    """One table per group (model, dtype, engine, device) and the gains of onnxnorm's
    variants with their spread."""
    lines = []
    for g in groups:
        lines += [f"#### {_title(g)}", "", table_row(COLUMNS), table_rule("lrlrrrrllrll")]
        for name, s in g["variants"].items():
            if "prefill_ms" not in s:  # the row says why, its other cells empty
                reason = (s.get("error") or "")[:140].replace("|", "/")
                ops = _norm_ops(s) if "nodes" in s else ""
                lines.append(
                    table_row([name, s.get("nodes", ""), ops, f"n/a: {reason}"])
                    + " |" * (len(COLUMNS) - 4)
                )
                continue
            same = (
                "yes"
                if s.get("tokens_identical")
                else f"NO (from token {s.get('first_difference')})"
            )
            lo, hi = s["generation_s_range"]
            peak = s.get("peak_rss_mib")
            lines.append(
                table_row(
                    [
                        name,
                        s["nodes"],
                        _norm_ops(s),
                        _ms(s["prefill_ms"]),
                        _ms(s["decode_ms_median"]),
                        _ms(s["decode_ms_p90"]),
                        f"{s['tokens_per_s']:.1f}",
                        f"{s['generation_s']:.2f} ({lo:.2f}-{hi:.2f})",
                        _share(s),
                        "n/a" if peak is None else f"{peak:,.0f}",
                        same,
                        g["targets"].get(name, ""),
                    ]
                )
            )
        lines.append("")
        for mine, over in g["gains"].items():
            lines.append(
                f"- {mine} speed-up, decode steps: {_ratios(over, 'decode_')}; "
                f"whole generation: {_ratios(over)}"
            )
        c = g.get("control")
        if c:
            lines.append(
                f"- control, {c['variant']} over a second session of itself, decode "
                f"steps: {_ratio(c, 'decode_')}; whole generation: {_ratio(c)}"
                + ("" if c["same_tokens"] else "; NOT the same tokens")
            )
        lines.append("")
    return "\n".join(lines)


def _ratio(v: dict[str, float], key: str = "") -> str:
    """``1.012x (0.990-1.030)``: a ratio's median (min-max); ``key``: ``decode_`` or ``""``."""
    if f"{key}median" not in v:
        return "n/a"
    return f"{v[key + 'median']:.3f}x ({v[key + 'min']:.3f}-{v[key + 'max']:.3f})"


def _ratios(over: dict[str, dict[str, float]], key: str = "") -> str:
    return ", ".join(f"{other} {_ratio(v, key)}" for other, v in over.items())


def plot(groups: list[dict[str, Any]], path: str) -> None:
    """A PNG of each group's decode and prefill latencies, a bar per variant (onnxnorm's green)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(groups),
        2,
        figsize=(12, 2.2 + 1.6 * len(groups) + 0.4 * max(len(g["variants"]) for g in groups)),
        squeeze=False,
    )
    for (left, right), g in zip(axes, groups):
        names = [n for n, s in g["variants"].items() if "prefill_ms" in s]
        y = np.arange(len(names))
        for ax, key, label in (
            (left, "decode_ms_median", "decode ms/token (median; bar: p90)"),
            (right, "prefill_ms", "prefill ms (median; bar: min-max)"),
        ):
            rows = [g["variants"][n] for n in names]
            values = [s[key] for s in rows]
            if key == "decode_ms_median":
                err = [[0] * len(names), [s["decode_ms_p90"] - v for s, v in zip(rows, values)]]
            else:
                err = [
                    [v - s["prefill_ms_range"][0] for s, v in zip(rows, values)],
                    [s["prefill_ms_range"][1] - v for s, v in zip(rows, values)],
                ]
            colors = [
                "tab:green" if n.startswith(("onnxnorm", "genai+")) else "tab:gray" for n in names
            ]
            ax.barh(y, values, xerr=err, color=colors)
            ax.set_yticks(y, names)
            ax.invert_yaxis()
            ax.set_xlabel(label)
        left.set_title(_title(g), loc="left", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _title(g: dict[str, Any]) -> str:
    quantized = f", {g['quantization']} 8-bit quantization" if g.get("quantization") else ""
    return f"{g['family']}, {g['dtype']}{quantized}, {g['engine']}, {g['device']}"


def _column(g: dict[str, Any]) -> str:
    quantized = f" {g['quantization']} 8-bit" if g.get("quantization") else ""
    return f"{g['family']} {g.get('precision', g['dtype'])}{quantized} ({g['device']})"


def overview(groups: list[dict[str, Any]]) -> str:
    """One table per engine: a row per variant, a column per group; each cell the tokens per
    second of the whole generation and the median decode step. Below, the decode speed-up of
    the fastest onnxnorm variant over the fastest other one, and the control's (the group's
    first variant over a second session of itself), median (min-max) of the repetitions."""
    lines = []
    for engine in dict.fromkeys(g["engine"] for g in groups):
        mine = [g for g in groups if g["engine"] == engine]
        names = list(dict.fromkeys(n for g in mine for n in g["variants"]))
        lines += [
            table_row([engine, *(_column(g) for g in mine)]),
            table_rule("l" + "r" * len(mine)),
        ]
        for name in names:
            cells = []
            for g in mine:
                s = g["variants"].get(name, {})
                cells.append(
                    f"{s['tokens_per_s']:.1f} tok/s, {s['decode_ms_median']:.1f} ms"
                    if s.get("decode_ms_median")
                    else "n/a"
                )
            lines.append(table_row([name, *cells]))
        cells = [
            "n/a" if (best := _best_pair(g)) is None else _ratio(best, "decode_") for g in mine
        ]
        lines.append(table_row(["fastest onnxnorm vs fastest other, decode", *cells]))
        cells = [_ratio(c, "decode_") if (c := g.get("control")) else "n/a" for g in mine]
        lines += [table_row(["control: the first variant vs itself, decode", *cells]), ""]
    return "\n".join(lines)


def _best_pair(g: dict[str, Any]) -> dict[str, float] | None:
    """The gain of the group's fastest onnxnorm variant over its fastest other one (by median
    decode time)."""
    timed = {n: s["decode_s"] for n, s in g["variants"].items() if s.get("decode_s")}
    mine = [n for n in timed if n in g["gains"]]
    others = [n for n in timed if n not in g["gains"]]
    if not mine or not others:
        return None
    return g["gains"][min(mine, key=lambda n: timed[n])][min(others, key=lambda n: timed[n])]


def write_json(
    path: str | None,
    env: dict[str, Any],
    config: Config,
    groups: list[dict[str, Any]],
    complete: bool = False,
) -> None:
    """Writes the results so far (after every group, so that a long run leaves what it
    measured; ``"complete": false`` until the last group is in)."""
    if not path:
        return
    common.write_json(
        path,
        {
            "complete": complete,
            "environment": env,
            "config": dataclasses.asdict(config),
            "variants": {**VARIANTS, **GENAI_VARIANTS},
            "quantizations": QUANTIZATIONS,
            "quantized_variants": QUANT_VARIANTS,
            "groups": groups,
        },
    )

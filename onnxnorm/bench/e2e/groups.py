"""A group of ``onnxnorm bench e2e``: the variants of one model, dtype, engine and device, timed
in one process beside a control, and what their numbers say: a :class:`Row` per variant, the
paired ratios between them (:func:`gains`), the control's noise and each onnxnorm variant's
verdict."""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from onnxnorm.bench import timing
from onnxnorm.bench.common import short_error
from onnxnorm.bench.e2e.config import (
    GENAI_VARIANTS,
    ONNXNORM_VARIANTS,
    QUANT_ONNXNORM_VARIANTS,
    Config,
)
from onnxnorm.bench.e2e.genai import GenaiGenerator
from onnxnorm.bench.e2e.generation import Generator
from onnxnorm.bench.e2e.memory import peak_memory
from onnxnorm.bench.e2e.models import hf_model
from onnxnorm.bench.e2e.profiling import profile_genai, profile_ort
from onnxnorm.bench.e2e.variants import make_quantized, make_variants, quantized_variants


@dataclasses.dataclass
class Row:
    """One variant of one group: its samples and what was measured beside them."""

    variant: str
    info: dict[str, Any]
    prefill: list[float] = dataclasses.field(default_factory=list)
    steps: list[list[float]] = dataclasses.field(default_factory=list)
    tokens: list[int] | None = None
    tokens_stable: bool = True
    error: str | None = None

    @property
    def totals(self) -> list[float]:
        """Seconds of each repetition's whole generation."""
        return [p + sum(s) for p, s in zip(self.prefill, self.steps)]

    def summary(self) -> dict[str, Any]:
        """The row as the JSON and the tables give it: what the variant's model holds, and the
        medians, spreads and tokens of its generations (or why it has none)."""
        out: dict[str, Any] = {k: v for k, v in self.info.items() if k != "path"}
        if self.error or not self.prefill:
            out["error"] = self.error or out.get("error")
            return out
        decode = [t for rep in self.steps for t in rep]
        totals = self.totals
        decode_s = statistics.median([sum(s) for s in self.steps]) if decode else None
        out.update(
            {
                "prefill_ms": 1e3 * statistics.median(self.prefill),
                "prefill_ms_range": [1e3 * min(self.prefill), 1e3 * max(self.prefill)],
                "decode_ms_median": 1e3 * statistics.median(decode) if decode else None,
                "decode_ms_p90": 1e3 * float(np.percentile(decode, 90)) if decode else None,
                "generation_s": statistics.median(totals),
                "decode_s": decode_s,
                "generation_s_range": [min(totals), max(totals)],
                "tokens_per_s": len(self.tokens or []) / statistics.median(totals),
                "decode_tokens_per_s": (len(decode) / len(self.steps)) / decode_s
                if decode_s is not None
                else None,
                "generation_s_samples": totals,
                "tokens": self.tokens,
                "tokens_stable": self.tokens_stable,
            }
        )
        return out


#: the suffix of the control: a second session of a group's first variant (the export, the
#: quantized model, genai's folder), timed like every variant and compared with the first
CONTROL = " (again)"


def interleave(
    rows: dict[str, Row],
    make: Mapping[str, Callable[[], Any]],
    config: Config,
    prompt: list[int],
    log: Callable[[str], None],
    lockstep: bool = True,
) -> None:
    """``repeats`` times: opens every variant's generator anew, in a shuffled order (seeded,
    new every repetition), generates once untimed with each (a short warm-up), then every
    variant generates; with ``lockstep``, step k (the prefill, then each token) of every
    variant runs before step k + 1 of any, in a shuffled order new every step (so that no
    variant always runs after the same one): a load that comes and goes on the machine falls
    on every variant alike. Without it, each variant generates whole in turn (in a shuffled
    order): for sessions whose threads keep spinning after a run, where the next variant's step
    would compete with them. The sessions are opened anew because the order of opening shows:
    of sessions of one model in one process, the one opened last decoded fastest (1-6 %)."""
    order = random.Random(0)
    for rep in range(config.repeats):
        generators: dict[str, Any] = {}
        for name in order.sample(list(make), len(make)):
            if rows[name].error:  # a variant that could not run is not tried again
                continue
            try:
                generators[name] = make[name]()
                generators[name].generate(prompt, min(4, config.new_tokens))
            except Exception as error:  # noqa: BLE001 - a variant that cannot run is a result
                rows[name].error = f"does not run: {type(error).__name__}: {short_error(error)}"
                log(f"  {name}: {rows[name].error}")
                generators.pop(name, None)
        names = list(generators)
        made: dict[str, list[tuple[int, float]]] = {name: [] for name in names}
        if lockstep:
            running = {name: generators[name].steps(prompt, config.new_tokens) for name in names}
            while running:
                for name in order.sample(names, len(names)):
                    if name not in running:
                        continue
                    step = next(running[name], None)
                    if step is None:
                        del running[name]
                    else:
                        made[name].append(step)
        else:
            for name in order.sample(names, len(names)):
                made[name] = list(generators[name].steps(prompt, config.new_tokens))
        generators.clear()
        for name, steps in made.items():
            tokens = [token for token, _ in steps]
            row = rows[name]
            if row.tokens is not None and tokens != row.tokens:
                row.tokens_stable = False
            row.tokens = tokens
            row.prefill.append(steps[0][1])
            row.steps.append([seconds for _, seconds in steps[1:]])
        log(
            f"  repetition {rep + 1}/{config.repeats}: "
            + ", ".join(f"{n} {rows[n].totals[-1]:.2f} s" for n in made)
        )


def paired(a: Row, b: Row) -> dict[str, float]:
    """How much faster ``a`` is than ``b`` (above 1: ``a`` is faster), from the repetitions,
    in each of which both generated: the ratios of their generation times (b / a) as
    ``median``, ``min``, ``max``; of their decode steps' total times as ``decode_median``,
    ``decode_min``, ``decode_max``; ``step_median``: the median over every step of every
    repetition of the ratio of the two step times."""
    out = timing.spread(timing.paired_ratios(a.totals, b.totals))
    decode = timing.paired_ratios([sum(s) for s in a.steps], [sum(s) for s in b.steps])
    if decode:
        steps = [r for sa, sb in zip(a.steps, b.steps) for r in timing.paired_ratios(sa, sb)]
        out.update(timing.spread(decode, "decode_"), step_median=statistics.median(steps))
    return out


def gains(rows: dict[str, Row], mine: tuple[str, ...]) -> dict[str, dict[str, dict[str, float]]]:
    """For each of ``mine``: its speed-up over each other variant (:func:`paired`)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in mine:
        a = rows.get(name)
        if a is None or not a.prefill:
            continue
        out[name] = {
            other: paired(a, b) for other, b in rows.items() if other != name and b.prefill
        }
    return out


def noise(control: dict[str, float] | None) -> float | None:
    """The timing's own noise in a group: how far from 1 the control's per-repetition ratios
    of decode times to its twin reach (0.012: 1.2 %)."""
    if not control or "decode_min" not in control:
        return None
    return max(abs(control["decode_max"] - 1), abs(1 - control["decode_min"]))


def verdict(
    summary: dict[str, dict[str, Any]],
    gain: dict[str, dict[str, dict[str, float]]],
    mine: tuple[str, ...],
    spread: float | None = None,
) -> dict[str, str]:
    """Per onnxnorm variant, against the fastest other (non-onnxnorm) variant by median decode
    time, from the per-repetition ratios of decode times (the prefill, one step, is reported
    apart): "met" when their median is at least 1; else "within noise" when it is short of 1
    by no more than ``spread`` (:func:`noise`), else "MISSED"; each with the median and
    min-max."""
    others = [(s["decode_s"], n) for n, s in summary.items() if n not in mine and s.get("decode_s")]
    out = {}
    for name in mine:
        if name not in gain or not others:
            continue
        who = min(others)[1]
        g = gain[name].get(who, {})
        if "decode_median" not in g:
            continue
        ratio = f"{g['decode_median']:.3f}x {who} ({g['decode_min']:.3f}-{g['decode_max']:.3f})"
        if g["decode_median"] >= 1:
            out[name] = f"met: {ratio}"
        elif spread is not None and 1 - g["decode_median"] <= spread:
            out[name] = f"within noise: {ratio}"
        else:
            out[name] = f"MISSED: {ratio}"
    return out


def run_group(
    rows: dict[str, Row],
    make: Mapping[str, Callable[[], Any]],
    profile: Mapping[str, Callable[[], dict]],
    memory: Mapping[str, Callable[[], dict]],
    config: Config,
    prompt: list[int],
    mine: tuple[str, ...],
    log: Callable[[str], None],
    lockstep: bool = True,
) -> dict[str, Any]:
    """Times the group's variants and a control (:data:`CONTROL`) (``lockstep``: see
    :func:`interleave`), profiles them, measures their memory, compares their tokens with
    the first variant's."""
    first = next(iter(make), None)
    twin = f"{first}{CONTROL}"
    if first is not None:
        rows = {**rows, twin: Row(twin, {})}
        make = {**make, twin: make[first]}
    interleave(rows, make, config, prompt, log, lockstep)
    control = rows.pop(twin, None)
    if first is not None and control is not None and control.prefill and rows[first].prefill:
        control_gain = {
            **paired(rows[first], control),
            "same_tokens": control.tokens == rows[first].tokens,
        }
    else:
        control_gain = None
    for name, fn in profile.items():
        if rows[name].prefill:
            try:
                rows[name].info["norm_share"] = fn()
            except Exception as error:  # noqa: BLE001
                rows[name].info["norm_share_error"] = short_error(error)
    for name, fn in memory.items():
        if rows[name].prefill:
            try:
                rows[name].info.update(fn())
            except Exception as error:  # noqa: BLE001
                rows[name].info["memory_error"] = short_error(error)
    summary = {name: row.summary() for name, row in rows.items()}
    reference = next((r.tokens for r in rows.values() if r.tokens is not None), None)
    for name, row in rows.items():
        if row.tokens is not None and reference is not None:
            summary[name]["tokens_identical"] = row.tokens == reference and row.tokens_stable
            if row.tokens != reference:
                summary[name]["first_difference"] = next(
                    (i for i, (x, y) in enumerate(zip(row.tokens, reference)) if x != y),
                    min(len(row.tokens), len(reference)),
                )
    gain = gains(rows, mine)
    return {
        "timing": "lockstep" if lockstep else "whole generations",
        "variants": summary,
        "gains": gain,
        "control": None if control_gain is None else {"variant": first, **control_gain},
        "targets": verdict(summary, gain, mine, noise(control_gain)),
        "tokens_identical": all(
            s.get("tokens_identical", True) for s in summary.values() if "tokens" in s
        ),
    }


def ort_group(
    family: str,
    dtype: str,
    device: str,
    config: Config,
    variants: list[str],
    folder: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The float export's variants (``--variants``), made in ``folder`` and timed."""
    model = hf_model(family, config, dtype)
    built = make_variants(model, config, folder, variants, log)
    result = _ort_rows(built, variants, config, device, folder, ONNXNORM_VARIANTS, log)
    return {"engine": "onnxruntime", "family": family, "dtype": dtype, "device": device, **result}


def quantized_group(
    family: str,
    dtype: str,
    device: str,
    config: Config,
    quantization: str,
    variants: list[str],
    folder: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The quantized export's variants (``QUANT_VARIANTS``); the tokens are compared with the
    quantized model's as it is, and the gains are those of onnxnorm's fused forms over it."""
    names = quantized_variants(variants)
    built = make_quantized(
        hf_model(family, config, dtype), config, folder, quantization, names, dtype, log
    )
    result = _ort_rows(built, names, config, device, folder, QUANT_ONNXNORM_VARIANTS, log)
    return {
        "engine": "onnxruntime",
        "family": family,
        "dtype": dtype,
        "quantization": quantization,
        "device": device,
        **result,
    }


def _ort_rows(
    built: dict[str, dict[str, Any]],
    variants: list[str],
    config: Config,
    device: str,
    folder: Path,
    mine: tuple[str, ...],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """:func:`run_group` of ORT variants (their models made): each generates with its own
    :class:`~.generation.Generator`."""
    prompt = config.prompt_ids()
    rows = {name: Row(name, built[name], error=built[name].get("error")) for name in variants}
    ready = [n for n in variants if "path" in built[n]]
    make = {
        n: partial(Generator, built[n]["path"], built[n]["library"], config, device) for n in ready
    }
    profile = {n: partial(profile_ort, built[n], config, prompt, device, folder) for n in ready}
    memory = {
        n: partial(peak_memory, "ort", built[n]["path"], built[n]["library"], config, device)
        for n in ready
    }
    return run_group(rows, make, profile, memory, config, prompt, mine, log)


def genai_group(
    family: str,
    precision: str,
    device: str,
    config: Config,
    found: dict[str, dict],
    folder: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The model builder's folder of ``precision`` and its ``onnxnorm genai`` copy (``found``:
    :func:`~.genai.genai_folders`), generating with genai's own loop."""
    prompt = config.prompt_ids()
    rows = {
        v: Row(v, dict(found[f"{precision} {v}"]), error=found[f"{precision} {v}"].get("error"))
        for v in GENAI_VARIANTS
    }
    ready = [v for v in GENAI_VARIANTS if "path" in rows[v].info]
    path = {v: rows[v].info["path"] for v in ready}
    make = {v: partial(GenaiGenerator, path[v], config) for v in ready}
    profile = {v: partial(profile_genai, path[v], config, prompt, folder) for v in ready}
    memory = {v: partial(peak_memory, "genai", path[v], True, config, device) for v in ready}
    # genai's sessions keep their threads spinning after a run (no option stops that): its
    # variants take turns by whole generations
    result = run_group(
        rows, make, profile, memory, config, prompt, ("genai+onnxnorm",), log, lockstep=False
    )
    dtype = {
        "fp32": "float32",
        "fp16": "float16",
        "int4": "int4 (MatMulNBits), float32",
    }[precision]
    return {
        "engine": "onnxruntime-genai",
        "family": family,
        "dtype": dtype,
        "precision": precision,
        "device": device,
        **result,
    }

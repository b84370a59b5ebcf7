"""``onnxnorm bench e2e --runtime``: on each runtime, the decoder as exported against onnxnorm's
output written ``--for`` that runtime, run with the same inputs.

For each decoder and dtype, the export the rest of the benchmark measures (``export.onnx`` of
:func:`~.variants.make_variants`: ``torch.onnx.export(dynamo=True)``, its norms decomposed) is
the *original*. ``onnxnorm.fusion.fuse(original).model`` is the *function* file (onnxnorm ops
with their function bodies), and ``onnxnorm.fusion.lowering.lower(function, runtime=R)`` the
output *for* R, the runtime of the runner (:data:`~.config.RUNTIME_RUNNERS`: ``ort`` ->
``ort-cpu``, ``ort-plain`` -> ``onnx``, ...). On each runner of :mod:`onnxnorm.deploy.runners`
the original, the output for R, the function file (where the runner reads onnxnorm's ops; on
OpenVINO through onnxnorm's extension where it is installed) and a second instance of the
original (the control, whose ratio to the first is the timing's own noise) are opened side by
side and run on two shapes of one forward pass:

- ``prefill``: batch 1, ``prompt`` tokens, the KV cache empty;
- ``decode``: 1 token after a cache of ``prompt`` positions (the present keys and values of
  the original's prefill in ONNX Runtime, and the token its last logits pick).

Each is a single forward run timed on its own (not the generation loop of the ORT groups,
whose IO binding keeps the cache in ORT's buffers: the runners take and give numpy arrays).
Every repetition times each model once per shape, in an order rotated by one per repetition,
after one untimed run of its own (the last model's threads and caches); a sample repeats the
run until it lasts :data:`MIN_SAMPLE` seconds. A row gives the median milliseconds, the ratio
output / original (below 1: onnxnorm's output is faster) as the median (min-max) of the
per-repetition ratios, the largest absolute difference of any output from the original's on the
same runner (both shapes), and where the nodes ran (ONNX Runtime: nodes per provider;
OpenVINO: the RMS and MVN layers of the compiled model; tract says nothing). A runner that
cannot run here (:func:`onnxnorm.deploy.runners.unavailable`) gives a row with its reason.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.metadata
import importlib.util
import json
import math
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxnorm.bench import common, timing
from onnxnorm.bench.common import quietly, table_row, table_rule
from onnxnorm.bench.e2e.config import RUNTIME_RUNNERS, STAMP, Config, stamp
from onnxnorm.bench.e2e.models import hf_model
from onnxnorm.bench.e2e.report import environment
from onnxnorm.bench.e2e.variants import make_variants, node_counts
from onnxnorm.testing.hf import past_names

#: the shortest timed sample, seconds: a run shorter than this is repeated within the sample (a
#: decode step of the default decoder, ~20 ms, 10 times: at 0.05 s, 3 runs, the control's
#: decode ratios spread over +-20-30 % on 2 shared cores)
MIN_SAMPLE = 0.2
#: the most runs in one sample (the tiniest models)
MAX_RUNS = 2000
#: the smallest difference a ratio must show to be called one, whatever the control's noise
NOISE_FLOOR = 0.01
#: the models each row times, as the JSON names them: the export as it is, onnxnorm's output
#: written for the runner's runtime, and the function file (onnxnorm ops with their bodies)
MODELS = ("original", "for", "function")
#: the second instance of the original, timed beside the others: the noise
CONTROL = "original (again)"
#: the two forward runs timed
SHAPES = ("prefill", "decode")
#: the packages whose versions the JSON records beside the environment of the ORT groups
PACKAGES = ("openvino", "onnxruntime-ep-openvino", "tract")


def make_runtime_models(
    family: str,
    dtype: str,
    config: Config,
    folder: Path,
    runtimes: Sequence[str],
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """The models of a group, written into ``folder`` (where an earlier run's files are used as
    they are): "original" (the benchmark's export), "function" (it fused) and each runtime of
    ``runtimes`` (the function file lowered for it); each {"path", node counts} or {"error"}."""
    import onnx

    from onnxnorm.fusion import fuse
    from onnxnorm.fusion.lowering import lower

    made = make_variants(hf_model(family, config, dtype), config, folder, ["export"], log)
    models: dict[str, dict[str, Any]] = {"original": made["export"]}
    if "error" in made["export"]:
        return models
    function_path = folder / "runtimes-function.onnx"
    function = None
    if function_path.is_file():
        function = onnx.load(function_path)
    else:
        try:
            function = quietly(lambda: fuse(onnx.load(made["export"]["path"])).model)
        except Exception as error:  # noqa: BLE001 - the pass failing is a result
            models["function"] = {"error": f"fuse fails: {describe(error)}"}
            log(f"  {models['function']['error']}")
            return models
        onnx.save(function, function_path)
    models["function"] = {"path": str(function_path), **node_counts(function)}
    for runtime in dict.fromkeys(runtimes):
        path = folder / f"runtimes-for-{runtime}.onnx"
        try:
            if not path.is_file():
                onnx.save(quietly(lambda: lower(function, runtime=runtime)), path)  # noqa: B023
            models[runtime] = {
                "path": str(path),
                **node_counts(onnx.load(path, load_external_data=False)),
            }
        except Exception as error:  # noqa: BLE001 - a lowering failing is a result
            models[runtime] = {"error": f"lower(runtime={runtime!r}) fails: {describe(error)}"}
            log(f"  {models[runtime]['error']}")
    return models


def runtime_feeds(path: str, config: Config, dtype: str) -> dict[str, dict[str, np.ndarray]]:
    """The inputs of both shapes, the same for every model and runner: the benchmark's prompt
    with an empty cache (prefill), and one token after it with the cache the original's prefill
    gives in ONNX Runtime, the token its last logits pick (decode)."""
    import onnxruntime as ort

    pasts = past_names(config.layers)
    float_type = np.float16 if dtype == "float16" else np.float32
    ids = np.asarray([config.prompt_ids()], np.int64)
    empty = np.zeros((1, config.kv_heads, 0, config.head_dim), float_type)
    prefill = {"input_ids": ids, "attention_mask": np.ones_like(ids), **dict.fromkeys(pasts, empty)}
    options = ort.SessionOptions()
    options.intra_op_num_threads = config.threads
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    if not set(pasts) <= inputs:
        from onnxnorm.errors import OnnxNormError

        raise OnnxNormError(f"{path}: the export has no KV-cache inputs ({pasts[0]}, ...)")
    logits, *present = session.run(None, prefill)
    token = int(np.argmax(logits[0, -1]))
    decode = {
        "input_ids": np.asarray([[token]], np.int64),
        "attention_mask": np.ones((1, config.prompt + 1), np.int64),
        **dict(zip(pasts, present)),
    }
    return {"prefill": prefill, "decode": decode}


def describe(error: BaseException) -> str:
    """An error of another runtime in one line that says what failed: the first two lines of its
    message that are neither blank nor a heading ending in a colon (OpenVINO's first lines name
    the C++ source that threw), at most 300 characters."""
    lines = [line.strip() for line in str(error).splitlines()]
    said = [line for line in lines if line and not line.endswith(":")][:2]
    return (" ".join(said) or type(error).__name__)[:300]


def extension(runner: str, model: str) -> bool:
    """Whether ``model`` is read on ``runner`` through onnxnorm's OpenVINO frontend extension:
    the function file on OpenVINO, where :mod:`onnxnorm.deploy.openvino` is installed."""
    return (
        model == "function"
        and runner == "openvino"
        and importlib.util.find_spec("onnxnorm.deploy.openvino") is not None
    )


def _open(runner: str, path: str, config: Config, extension: bool) -> Any:
    from onnxnorm.deploy import runners

    return quietly(
        lambda: runners.open_runner(runner, path, threads=config.threads, extension=extension)
    )


def _outputs(opened: Any, feeds: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, Any]:
    """Each shape's outputs by name (the first runs: the placement is read after them)."""
    return {
        shape: dict(zip(opened.output_names, opened.run(feed))) for shape, feed in feeds.items()
    }


def max_abs_diff(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]) -> float:
    """The largest absolute difference between any output of ``b`` and the same output of
    ``a``, over both shapes (computed in float64; NaN where one is NaN and the other is not)."""
    worst = 0.0
    for shape, outputs in a.items():
        for name, want in outputs.items():
            got = b[shape].get(name)
            if got is None or np.shape(got) != np.shape(want):
                return math.inf
            if np.size(want):
                diff = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
                worst = max(worst, float(np.max(diff)))
                if np.isnan(diff).any() and not np.array_equal(
                    np.isnan(np.asarray(got, np.float64)), np.isnan(np.asarray(want, np.float64))
                ):
                    return math.nan
    return worst


def time_models(
    opened: Mapping[str, Any], feeds: Mapping[str, Mapping[str, np.ndarray]], repeats: int
) -> dict[str, dict[str, list[float]]]:
    """Seconds per run: model -> shape -> a sample per repetition. Each repetition times every
    shape of every model, the models in an order rotated by one per repetition, each sample
    after one untimed run of its own and of as many runs as last :data:`MIN_SAMPLE` (counted
    from one run first)."""
    numbers = {}
    for name, model in opened.items():
        for shape, feed in feeds.items():
            start = timing.clock()
            model.run(feed)
            once = timing.clock() - start
            numbers[name, shape] = max(1, min(MAX_RUNS, math.ceil(MIN_SAMPLE / max(once, 1e-7))))
    samples: dict[str, dict[str, list[float]]] = {name: {s: [] for s in feeds} for name in opened}
    names = list(opened)
    for rep in range(repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for shape, feed in feeds.items():
            for name in order:
                run, number = opened[name].run, numbers[name, shape]
                run(feed)
                start = timing.clock()
                for _ in range(number):
                    run(feed)
                samples[name][shape].append((timing.clock() - start) / number)
    return samples


def _placement(runner: str, counts: Mapping[str, int]) -> dict[str, int]:
    """What a runner's placement says, as the table gives it: ONNX Runtime's nodes per provider
    (without the ``ExecutionProvider`` suffix); of OpenVINO's compiled model, its RMS and MVN
    layers and all its layers; nothing for tract."""
    if runner == "openvino":
        return {
            "RMS": counts.get("RMS", 0),
            "MVN": counts.get("MVN", 0),
            "layers": sum(counts.values()),
        }
    return {k.removesuffix("ExecutionProvider"): v for k, v in sorted(counts.items())}


def _placement_text(placement: Mapping[str, int] | None) -> str:
    if not placement:
        return "n/a"
    return ", ".join(f"{k} {v}" for k, v in placement.items())


def why(runner: str, original: Mapping[str, Any], output: Mapping[str, Any]) -> str:
    """What the placement of the original and of the output says about their difference."""
    before, after = original.get("placement") or {}, output.get("placement") or {}
    if runner == "openvino":
        return (
            f"compiled model: RMS {before['RMS']} -> {after['RMS']}, MVN {before['MVN']} -> "
            f"{after['MVN']}, layers {before['layers']} -> {after['layers']}"
        )
    if runner == "tract" or not before:
        return (
            f"no placement from {runner}; the ONNX graph: {original['nodes']} -> "
            f"{output['nodes']} nodes"
        )
    if runner == "ort-openvino":
        if set(before) == set(after) == {"OpenVINO"}:
            return (
                f"the OpenVINO EP takes both whole ({before['OpenVINO']} -> {after['OpenVINO']} "
                "partitions): OpenVINO's own compilation decides"
            )
        return f"nodes per provider: {_placement_text(before)} -> {_placement_text(after)}"
    runs, ran = sum(before.values()), sum(after.values())
    if runs == ran:
        return f"ORT runs {runs} nodes in both"
    return f"ORT runs {ran} nodes, not {runs} ({_placement_text(after)})"


def verdict(ratios: Mapping[str, Mapping[str, float]], noise: Mapping[str, float]) -> str:
    """``faster``, ``SLOWER`` or ``same`` over all shapes (SLOWER where any shape is, faster
    where one is and none slower), each shape's word and median ratio after it: a median ratio
    further from 1 than the noise (:data:`NOISE_FLOOR` at least) is a difference."""
    words = {}
    for shape, ratio in ratios.items():
        spread = max(NOISE_FLOOR, noise.get(shape, 0.0))
        words[shape] = (
            "faster"
            if ratio["median"] < 1 - spread
            else "SLOWER"
            if ratio["median"] > 1 + spread
            else "same"
        )
    head = next((w for w in ("SLOWER", "faster") if w in words.values()), "same")
    detail = ", ".join(f"{shape} {ratios[shape]['median']:.3f}x {w}" for shape, w in words.items())
    return f"{head} ({detail})"


def runtime_row(
    runner: str,
    models: Mapping[str, Mapping[str, Any]],
    feeds: Mapping[str, Mapping[str, np.ndarray]],
    config: Config,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """One runner's row: each model's times, its ratios to the original, its largest difference
    from the original's outputs and its placement; the control's ratios (the noise) and the
    verdict. A runner that cannot run here, or cannot run the original, is a row with why."""
    from onnxnorm.deploy import runners

    runtime = RUNTIME_RUNNERS[runner]
    row: dict[str, Any] = {"runner": runner, "for": runtime, "title": runners.RUNNERS[runner][0]}
    reason = runners.unavailable(runner)
    if reason:
        row["error"] = f"unavailable here: {reason}"
        log(f"  {runner}: {row['error']}")
        return row
    paths = {
        "original": models["original"],
        "for": models.get(runtime, {"error": "not made"}),
        "function": models.get("function", {"error": "not made"}),
        CONTROL: models["original"],
    }
    opened, outputs, results = {}, {}, {}
    for name, made in paths.items():
        results[name] = {k: v for k, v in made.items() if k != "path"}
        if "error" in made:
            continue
        try:
            if extension(runner, name):
                results[name]["extension"] = True
            opened[name] = _open(runner, made["path"], config, extension(runner, name))
            outputs[name] = quietly(lambda: _outputs(opened[name], feeds))  # noqa: B023
        except Exception as error:  # noqa: BLE001 - a model the runner refuses is a result
            opened.pop(name, None)
            results[name] = {**results[name], "error": f"does not run: {describe(error)}"}
            log(f"  {runner} {name}: {results[name]['error']}")
            continue
        results[name]["placement"] = _placement(runner, opened[name].placement)
    if "original" not in opened:
        row["error"] = f"the original {results['original'].get('error', 'does not run')}"
        return row
    samples = time_models(opened, feeds, config.repeats)
    for name in opened:
        r = results[name]
        for shape in SHAPES:
            r[f"{shape}_ms"] = 1e3 * float(np.median(samples[name][shape]))
            r[f"{shape}_ms_samples"] = [1e3 * s for s in samples[name][shape]]
        if name != "original":
            r["max_abs_diff"] = max_abs_diff(outputs["original"], outputs[name])
            r["ratio"] = {
                shape: timing.spread(
                    timing.paired_ratios(samples["original"][shape], samples[name][shape])
                )
                for shape in SHAPES
            }
    control = results.pop(CONTROL)
    row["models"] = results
    if "ratio" in control:
        row["control"] = control["ratio"]
        row["noise"] = {
            shape: max(abs(r["max"] - 1), abs(1 - r["min"]))
            for shape, r in control["ratio"].items()
        }
    output = results["for"]
    if "ratio" in output:
        row["verdict"] = verdict(output["ratio"], row.get("noise", {}))
        row["why"] = why(runner, results["original"], output)
    opened.clear()  # the sessions closed before the next runner opens its own
    gc.collect()
    return row


def runtime_group(
    family: str,
    dtype: str,
    names: Sequence[str],
    config: Config,
    folder: Path,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The rows of one decoder and dtype: every runner of ``names``, in turn."""
    models = make_runtime_models(
        family, dtype, config, folder, [RUNTIME_RUNNERS[n] for n in names], log
    )
    group: dict[str, Any] = {
        "family": family,
        "dtype": dtype,
        "models": {m: {k: v for k, v in made.items() if k != "path"} for m, made in models.items()},
        "rows": [],
    }
    if "error" in models["original"]:
        group["error"] = f"the export fails: {models['original']['error']}"
        return group
    feeds = runtime_feeds(models["original"]["path"], config, dtype)
    for name in names:
        log(f"  {name} (--for {RUNTIME_RUNNERS[name]}):")
        group["rows"].append(runtime_row(name, models, feeds, config, log))
    return group


#: the columns of a group's table (:func:`runtimes_markdown`)
COLUMNS = (
    "runner",
    "--for",
    "prefill ms: original",
    "prefill: --for (ratio)",
    "prefill: function (ratio)",
    "decode ms: original",
    "decode: --for (ratio)",
    "decode: function (ratio)",
    "max abs diff: --for, function",
    "placement: original -> --for",
    "noise (control): prefill, decode",
    "verdict: why",
)


def _cell(model: Mapping[str, Any], shape: str) -> str:
    if "error" in model:
        return "n/a: " + model["error"][:100].replace("|", "/")
    ms = model.get(f"{shape}_ms")
    if ms is None:
        return "n/a"
    ratio = model.get("ratio", {}).get(shape)
    if ratio is None:
        return f"{ms:,.2f}"
    return f"{ms:,.2f} ({ratio['median']:.3f}x, {ratio['min']:.3f}-{ratio['max']:.3f})"


def _diff(model: Mapping[str, Any]) -> str:
    return "n/a" if "max_abs_diff" not in model else f"{model['max_abs_diff']:.1e}"


def _norm_ops(model: Mapping[str, Any]) -> str:
    if "error" in model:
        return "n/a"
    ops = sorted((model.get("norm_ops") or {}).items(), key=lambda kv: -kv[1])
    return (", ".join(f"{n} {k}" for k, n in ops) or "no norm op") + f" ({model['nodes']} nodes)"


def runtimes_markdown(groups: Sequence[Mapping[str, Any]]) -> str:
    """One table per decoder and dtype, a row per runner; below it, what each model holds."""
    lines = []
    for g in groups:
        lines += [
            f"#### {g['family']}, {g['dtype']}: the export and onnxnorm's output --for each"
            " runtime",
            "",
        ]
        if "error" in g:
            lines += [g["error"], ""]
            continue
        lines += [table_row(COLUMNS), table_rule("llrrrrrrllll")]
        for row in g["rows"]:
            if "models" not in row:
                reason = row["error"][:200].replace("|", "/")
                lines.append(
                    table_row([row["runner"], row["for"], f"n/a: {reason}"])
                    + " |" * (len(COLUMNS) - 3)
                )
                continue
            m = row["models"]
            noise = row.get("noise")
            lines.append(
                table_row(
                    [
                        row["runner"],
                        row["for"],
                        _cell(m["original"], "prefill"),
                        _cell(m["for"], "prefill"),
                        _cell(m["function"], "prefill"),
                        _cell(m["original"], "decode"),
                        _cell(m["for"], "decode"),
                        _cell(m["function"], "decode"),
                        f"{_diff(m['for'])}, {_diff(m['function'])}",
                        f"{_placement_text(m['original'].get('placement'))} -> "
                        f"{_placement_text(m['for'].get('placement'))}",
                        "n/a"
                        if not noise
                        else ", ".join(f"±{100 * noise[s]:.1f}%" for s in SHAPES),
                        f"{row['verdict']}: {row['why']}" if "verdict" in row else "n/a",
                    ]
                )
            )
        lines.append("")
        models = g["models"]
        lines.append(f"- original (the export): {_norm_ops(models['original'])}")
        if "function" in models:
            lines.append(f"- function (fuse): {_norm_ops(models['function'])}")
        for runtime in dict.fromkeys(r["for"] for r in g["rows"]):
            if runtime in models:
                lines.append(f"- --for {runtime}: {_norm_ops(models[runtime])}")
        read = [
            r["runner"]
            for r in g["rows"]
            if r.get("models", {}).get("function", {}).get("extension")
        ]
        if read:
            lines.append(
                f"- the function file on {', '.join(read)}: read through onnxnorm's OpenVINO "
                "extension"
            )
        lines.append("")
    return "\n".join(lines)


def versions() -> dict[str, str | None]:
    """The versions of the runtimes' packages beyond ONNX Runtime (None: not installed)."""
    found: dict[str, str | None] = {}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def _write(
    path: str | None, env: dict[str, Any], config: Config, groups: list, complete: bool = False
) -> None:
    if path:
        common.write_json(
            path,
            {
                "complete": complete,
                "environment": env,
                "config": {
                    k: v for k, v in dataclasses.asdict(config).items() if k != "new_tokens"
                },
                "runtimes": dict(RUNTIME_RUNNERS),
                "shapes": {
                    "prefill": f"batch 1, {config.prompt} tokens, the cache empty",
                    "decode": f"1 token after a cache of {config.prompt} positions",
                },
                "groups": groups,
            },
        )


def run_runtimes(
    families: Sequence[str],
    dtypes: Sequence[str],
    names: Sequence[str],
    config: Config,
    json_path: str | None = None,
    keep: str | None = None,
    prepare_only: bool = False,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every decoder and dtype on every runner of ``names``; prints the tables and writes the
    JSON (after every group). ``keep``: the models' folder, used again by a later run of the
    same sizes (the ORT groups' exports too); ``prepare_only``: make them, measure nothing."""
    env = {**environment(config), **versions()}
    env["loop"] = "single forward runs (prefill; one decode step), numpy in and out, per runner"
    log(
        f"# onnxnorm bench e2e --runtime {','.join(names)} — {env['date']}, {env['cpu']}, "
        f"{env['cores']} cores, {config.threads} threads, onnxruntime {env['onnxruntime']}, "
        + ", ".join(f"{p} {v}" for p, v in versions().items())
        + f", load average {env['load_average']}"
    )
    root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="onnxnorm-e2e-runtimes-"))
    root.mkdir(parents=True, exist_ok=True)
    (root / STAMP).write_text(json.dumps(stamp(config)))
    groups: list[dict[str, Any]] = []
    try:
        for family in families:
            for dtype in dtypes:
                log(f"{family} {dtype}, each runtime:")
                folder = root / f"{family}-{dtype}-cpu"  # the ORT groups' folder: one export
                folder.mkdir(exist_ok=True)
                if prepare_only:
                    make_runtime_models(
                        family, dtype, config, folder, [RUNTIME_RUNNERS[n] for n in names], log
                    )
                    continue
                groups.append(runtime_group(family, dtype, names, config, folder, log))
                _write(json_path, env, config, groups)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    if prepare_only:
        log(f"# the models are in {root}")
        return groups
    env["load_average_after"] = common.load_average()
    log(f"# load average at the end {env['load_average_after']}")
    print(runtimes_markdown(groups))
    _write(json_path, env, config, groups, complete=True)
    return groups

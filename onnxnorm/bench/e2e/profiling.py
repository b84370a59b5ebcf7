"""The share of node time ``onnxnorm bench e2e``'s variants spend in norm kernels, from one
generation per variant under ORT's profiler (the peak memory is :mod:`.memory`'s)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from onnxnorm.bench.e2e.config import PROFILED_TOKENS, Config
from onnxnorm.bench.e2e.genai import GenaiGenerator
from onnxnorm.bench.e2e.generation import Generator
from onnxnorm.bench.e2e.variants import NORM_OPS, norm_node_names


def norm_share(events: list[dict], names: set[str]) -> dict[str, float]:
    """The share of node time in norm kernels, overall and in the decode steps (every run
    after the first), from ORT's profile events."""
    runs = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )
    first_end = runs[0][1] if runs else float("inf")
    totals = {"all": [0.0, 0.0], "decode": [0.0, 0.0]}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        node = e["name"][: -len("_kernel_time")]
        is_norm = e.get("args", {}).get("op_name") in NORM_OPS or node in names
        for key in ("all", "decode") if e["ts"] > first_end else ("all",):
            totals[key][0] += e["dur"] if is_norm else 0
            totals[key][1] += e["dur"]
    return {key: (norm / total if total else float("nan")) for key, (norm, total) in totals.items()}


def profile_ort(
    variant: dict[str, Any], config: Config, prompt: list[int], device: str, folder: Path
) -> dict[str, float]:
    """Norm share of an ORT variant (:func:`norm_share`) over its first ``PROFILED_TOKENS``."""
    import onnx

    generator = Generator(
        variant["path"], variant["library"], config, device, profile=str(folder / "profile")
    )
    generator.generate(prompt, min(config.new_tokens, PROFILED_TOKENS))
    path = generator.session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    return norm_share(events, norm_node_names(onnx.load(variant["path"], load_external_data=False)))


def profile_genai(folder: str, config: Config, prompt: list[int], work: Path) -> dict[str, float]:
    """Norm share of a genai folder: a copy whose decoder session writes ORT's profile (genai
    takes the prefix relative to the working directory)."""
    copy = work / f"profiled-{Path(folder).name}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(folder, copy)
    path = copy / "genai_config.json"
    genai_config = json.loads(path.read_text())
    genai_config["model"]["decoder"]["session_options"]["enable_profiling"] = "genai_profile"
    path.write_text(json.dumps(genai_config, indent=4))
    here = os.getcwd()
    os.chdir(copy)
    try:
        generator = GenaiGenerator(str(copy), config)
        generator.generate(prompt, min(config.new_tokens, PROFILED_TOKENS))
        del generator
        import gc

        gc.collect()
    finally:
        os.chdir(here)
    profiles = sorted(copy.glob("genai_profile*.json"))
    if not profiles:
        raise RuntimeError("onnxruntime-genai wrote no profile")
    with open(profiles[-1]) as f:
        events = json.load(f)
    shutil.rmtree(copy, ignore_errors=True)
    return norm_share(events, set())

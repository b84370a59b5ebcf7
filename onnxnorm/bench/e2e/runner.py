"""``onnxnorm bench e2e``'s run: every group of every decoder, dtype and device in turn, the
models made in a folder (a ``--keep`` folder is used again), the report at the end."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onnxnorm.bench import common
from onnxnorm.bench.e2e.config import STAMP, Config, stamp
from onnxnorm.bench.e2e.genai import genai_folders
from onnxnorm.bench.e2e.groups import genai_group, ort_group, quantized_group
from onnxnorm.bench.e2e.models import hf_model
from onnxnorm.bench.e2e.report import environment, markdown, overview, plot, write_json
from onnxnorm.bench.e2e.variants import make_quantized, make_variants, quantized_variants


def run(
    families: list[str],
    dtypes: list[str],
    variants: list[str],
    config: Config,
    devices: list[str],
    genai: list[str],
    json_path: str | None = None,
    plot_path: str | None = None,
    keep: str | None = None,
    prepare_only: bool = False,
    log: Callable[[str], None] = print,
    quantize: tuple[str, ...] = ("none",),
) -> list[dict[str, Any]]:
    """Measures every group and prints the tables. ``keep``: the folder where the models are
    written and kept (models an earlier run made there are used again); ``prepare_only``: make
    the models there, measure nothing; ``quantize``: ``none`` (the float export's variants)
    and / or quantizations of ``QUANTIZATIONS`` (a group each)."""
    import onnxruntime as ort

    os.environ.setdefault("OMP_NUM_THREADS", str(config.threads))
    env = environment(config)
    log(
        f"# onnxnorm bench e2e — {env['date']}, {env['cpu']}, {env['cores']} cores, "
        f"{config.threads} threads, onnxruntime {env['onnxruntime']}, torch {env['torch']}, "
        f"transformers {env['transformers']}, load average {env['load_average']}"
    )
    providers = ort.get_available_providers()
    usable = []
    for device in devices:
        if device.startswith("cuda") and "CUDAExecutionProvider" not in providers:
            log(
                f"# {device}: skipped, this onnxruntime has no CUDAExecutionProvider "
                f"(install onnxruntime-gpu on a machine with a GPU)"
            )
            continue
        usable.append(device)
    groups: list[dict[str, Any]] = []
    root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="onnxnorm-e2e-"))
    root.mkdir(parents=True, exist_ok=True)
    (root / STAMP).write_text(json.dumps(stamp(config)))

    def measured(group: dict[str, Any]) -> None:  # the JSON after every group
        groups.append(group)
        write_json(json_path, env, config, groups)

    def folder_of(name: str) -> Path:
        folder = root / name
        folder.mkdir(exist_ok=True)
        return folder

    def done(folder: Path) -> None:  # its models are not kept
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)

    try:
        for family in families:
            for device in usable:
                for dtype in dtypes:
                    if device == "cuda-graph":
                        continue  # ORT's CUDA graphs need fixed shapes; this loop's past grows
                    if "none" in quantize:
                        log(f"{family} {dtype} onnxruntime {device}:")
                        folder = folder_of(f"{family}-{dtype}-{device}")
                        if prepare_only:
                            make_variants(
                                hf_model(family, config, dtype), config, folder, variants, log
                            )
                        else:
                            measured(
                                ort_group(family, dtype, device, config, variants, folder, log)
                            )
                        done(folder)
                    # the quantizations share one folder: one float export for all of them
                    folder = root / f"{family}-{dtype}-{device}-quantized"
                    for quantization in (q for q in quantize if q != "none"):
                        log(f"{family} {dtype} {quantization} 8-bit onnxruntime {device}:")
                        folder_of(folder.name)
                        if prepare_only:
                            make_quantized(
                                hf_model(family, config, dtype),
                                config,
                                folder,
                                quantization,
                                quantized_variants(variants),
                                dtype,
                                log,
                            )
                        else:
                            measured(
                                quantized_group(
                                    family,
                                    dtype,
                                    device,
                                    config,
                                    quantization,
                                    variants,
                                    folder,
                                    log,
                                )
                            )
                    done(folder)
                if genai:
                    log(f"{family} onnxruntime-genai {device}:")
                    folder = folder_of(f"{family}-genai-{device}")
                    found = genai_folders(
                        hf_model(family, config), config, genai, folder, device, log
                    )
                    for precision in genai if not prepare_only else ():
                        measured(genai_group(family, precision, device, config, found, folder, log))
                    done(folder)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    if prepare_only:
        log(f"# the models are in {root}")
        return groups
    env["load_average_after"] = common.load_average()
    log(f"# load average at the end {env['load_average_after']}")
    print(markdown(groups, config))
    print(overview(groups))
    write_json(json_path, env, config, groups, complete=True)
    if plot_path:
        plot(groups, plot_path)
    return groups

"""The same decoders through onnxruntime-genai: its model builder's folders (fp32, int4) before
and after ``onnxnorm genai``, generating with genai's own loop (:class:`GenaiGenerator`)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from onnxnorm.bench.common import quietly, short_error
from onnxnorm.bench.e2e.config import GENAI_VARIANTS, Config
from onnxnorm.bench.e2e.generation import collect
from onnxnorm.bench.timing import clock


def genai_folders(
    model,
    config: Config,
    precisions: list[str],
    folder: Path,
    device: str,
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """The model builder's folders of ``model`` (saved with save_pretrained) and their
    ``onnxnorm genai`` copies: "<precision> <variant>" -> {"path", ...} or {"error"}."""
    import onnx

    from onnxnorm.bench.e2e.variants import node_counts  # (it imports onnx: not for the child)
    from onnxnorm.genai import convert
    from onnxnorm.testing import hf

    record = folder / "genai.json"  # what an earlier run with --keep made here
    found: dict[str, dict[str, Any]] = json.loads(record.read_text()) if record.is_file() else {}
    todo = [p for p in precisions if any(f"{p} {v}" not in found for v in GENAI_VARIANTS)]
    checkpoint = folder / "hf"
    if todo:
        if getattr(model.config, "sliding_window", None):
            # onnxruntime-genai's KV cache holds the generation's length, and its CPU attention
            # wants the window within it; a window of that length still covers every sequence
            model.config.sliding_window = config.max_length
        quietly(lambda: hf.save_checkpoint(model, checkpoint))
    provider = "cuda" if device.startswith("cuda") else "cpu"
    for precision in todo:
        built = folder / f"genai-{precision}"
        shutil.rmtree(built, ignore_errors=True)
        try:
            quietly(lambda: hf.genai_build(checkpoint, built, precision, provider))  # noqa: B023 - called in this iteration
            config_path = built / "genai_config.json"
            genai_config = json.loads(config_path.read_text())
            options = genai_config["model"]["decoder"]["session_options"]
            options["intra_op_num_threads"] = config.threads
            options["inter_op_num_threads"] = 1
            if device == "cuda-graph":
                options["provider_options"] = [{"cuda": {"enable_cuda_graph": "1"}}]
            config_path.write_text(json.dumps(genai_config, indent=4))
        except Exception as error:  # noqa: BLE001 - the builder's failure is a result
            for variant in GENAI_VARIANTS:
                found[f"{precision} {variant}"] = {"error": f"model builder: {short_error(error)}"}
            log(f"  genai {precision}: the model builder fails ({short_error(error)})")
            record.write_text(json.dumps(found))
            continue
        fused = folder / f"genai-{precision}-onnxnorm"
        shutil.rmtree(fused, ignore_errors=True)
        converted: Path | None = fused
        try:
            quietly(lambda: convert(built, fused))  # noqa: B023 - called in this iteration
        except Exception as error:  # noqa: BLE001
            found[f"{precision} genai+onnxnorm"] = {
                "error": f"onnxnorm genai: {short_error(error)}"
            }
            converted = None
        for variant, path in (("genai", built), ("genai+onnxnorm", converted)):
            if path is None:
                continue
            proto = onnx.load(path / "model.onnx", load_external_data=False)
            found[f"{precision} {variant}"] = {"path": str(path), **node_counts(proto)}
        record.write_text(json.dumps(found))
    return {key: value for key, value in found.items() if key.split()[0] in precisions}


class GenaiGenerator:
    """Greedy generation with onnxruntime-genai's own loop: ``append_tokens`` runs the prompt,
    the first ``generate_next_token`` picks the first token from its logits, each further one
    runs the model on the last token and picks the next."""

    def __init__(self, folder: str, config: Config):
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(og.Config(folder))
        self.config = config

    def generate(self, prompt: list[int], new_tokens: int) -> tuple[list[int], float, list[float]]:
        """(tokens, prefill seconds, seconds of each further step)."""
        return collect(self.steps(prompt, new_tokens))

    def steps(self, prompt: list[int], new_tokens: int) -> Iterator[tuple[int, float]]:
        """Generates one token per ``next()``: (the token, the seconds its step took)."""
        og = self.og
        params = og.GeneratorParams(self.model)
        # the KV cache always holds the whole generation's length (a shorter one would be
        # smaller than Gemma 2's window, which the CPU attention refuses); the loop stops early
        length = max(self.config.max_length, len(prompt) + new_tokens)
        params.set_search_options(max_length=length, min_length=length, do_sample=False)
        generator = og.Generator(self.model, params)
        started = clock()
        generator.append_tokens(np.asarray([prompt], np.int32))
        generator.generate_next_token()
        yield int(generator.get_next_tokens()[0]), clock() - started
        for _ in range(new_tokens - 1):
            if generator.is_done():
                break
            started = clock()
            generator.generate_next_token()
            yield int(generator.get_next_tokens()[0]), clock() - started

"""onnxruntime-genai model folders: fuse their norms into onnxnorm ops, and register the onnxnorm
library in their ``genai_config.json`` so that onnxruntime-genai runs onnxnorm's kernels.

A folder made by onnxruntime-genai's model builder holds ``genai_config.json``, one ONNX model
per component (``model.onnx`` for a decoder, with its external data), the tokenizer and other
processing files. :func:`convert` writes a copy of the folder in which

- every ONNX model the config names is fused (``onnxnorm.fusion``), its com.microsoft
  SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization / LayerNormalization ops
  becoming onnxnorm ops (or, with ``target="ort"`` / ``"onnx"``, those ops lowered again);
- where the models hold onnxnorm nodes, the onnxnorm library is copied into the folder and
  named in the session options of each component that needs it (``custom_ops_library``):
  onnxruntime-genai loads a custom-op library only from a trusted folder, the model's own among
  them, so the folder carries its own copy (with the CUDA library, where it is built, when a
  session names the CUDA provider);
- every other file is copied as it is.

Nothing here imports onnxruntime_genai: converting a folder needs onnx and onnxnorm only;
running the result (:func:`generate`) needs onnxruntime-genai (``onnxnorm[genai]``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from onnxnorm._genai_config import (
    CONFIG,
    components,
    dim_sizes as dim_sizes,  # part of this package's API
    read_config,
)
from onnxnorm._io import check_output_folder
from onnxnorm.errors import OnnxNormError


@dataclasses.dataclass
class Component:
    """One ONNX model of a genai folder: its config key path, file and fusion report."""

    key: str
    filename: str
    report: Any = None  # onnxnorm.fusion.FusionReport
    needs_library: bool = False

    def __str__(self) -> str:
        lines = [f"{self.key} ({self.filename}):"]
        lines += [f"  {line}" for line in str(self.report).splitlines()]
        return "\n".join(lines)


@dataclasses.dataclass
class GenaiReport:
    """What :func:`convert` did: one entry per component, and the library it registered."""

    components: list[Component]
    library: str | None = None

    @property
    def norms(self) -> int:
        return sum(c.report.norms for c in self.components)

    @property
    def residual_adds(self) -> int:
        return sum(c.report.residual_adds for c in self.components)

    def to_dict(self) -> dict[str, Any]:
        return {
            "library": self.library,
            "norms": self.norms,
            "residual_adds": self.residual_adds,
            "components": [
                {
                    "key": c.key,
                    "filename": c.filename,
                    "custom_ops_library": c.needs_library,
                    "report": c.report.to_dict(),
                }
                for c in self.components
            ],
        }

    def __str__(self) -> str:
        lines = [str(c) for c in self.components]
        if self.library:
            lines.append(
                f"registered {self.library} as custom_ops_library of "
                + ", ".join(c.key for c in self.components if c.needs_library)
            )
        return "\n".join(lines)


def _libraries(cuda: bool) -> list[Path]:
    """The onnxnorm library to register and, for a folder whose sessions run on CUDA, the CUDA
    library beside it where it is built (the CPU library registers the CUDA kernels when that
    file sits next to it)."""
    from onnxnorm import runtime

    found = [runtime.library_path("cpu")]
    if cuda:
        with contextlib.suppress(OnnxNormError):  # not built: CPU kernels only
            found.append(runtime.library_path("cuda"))
    return found


def _uses_cuda(options: dict | None) -> bool:
    providers = (options or {}).get("provider_options") or []
    return any(isinstance(p, dict) and "cuda" in p for p in providers)


def convert(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    target: str = "function",
    overwrite: bool = False,
    strict_precision: bool = False,
    upgrade: bool = False,
    progress=None,
) -> GenaiReport:
    """Writes to ``output`` a copy of the onnxruntime-genai model folder ``source`` whose norms
    are fused (``target``: see :data:`onnxnorm.targets.TARGETS`; ``strict_precision``,
    ``upgrade``: see :func:`onnxnorm.fusion.fuse`) and whose ``genai_config.json`` registers
    the onnxnorm library where the models hold onnxnorm nodes. ``source`` is never modified;
    ``output`` must not exist unless ``overwrite``. The folder is built beside ``output`` under
    a temporary name and renamed into place."""
    from onnxnorm import targets
    from onnxnorm._io import copy_rest, write_folder
    from onnxnorm.fusion.files import fuse_file

    targets.check(target)
    source, output = Path(source), Path(output)
    config = read_config(source)
    check_output_folder(source, output, overwrite)
    found = list(components(config))
    if not found:
        raise OnnxNormError(f'{source / CONFIG}: names no ONNX model (no "filename")')
    for key, entry, _ in found:
        if not (source / entry["filename"]).is_file():
            raise OnnxNormError(f"{source}: {key} names {entry['filename']}, which is not there")

    results: list[Component] = []
    library = None

    def build(work: Path) -> bool:
        nonlocal library
        skip = {(source / CONFIG).resolve()}
        for key, entry, _options in found:
            name = entry["filename"]
            if progress:
                progress(f"fusing {key} ({name})")
            fused = fuse_file(
                source / name,
                work / name,
                target=target,
                strict_precision=strict_precision,
                upgrade=upgrade,
                name=name,
                make_folder=True,
            )
            results.append(Component(key, name, fused.report, fused.uses_onnxnorm))
            skip |= fused.data_files | {(source / name).resolve()}
        copy_rest(source, work, skip)
        needing = [c for c in results if c.needs_library]
        if needing:
            files = _libraries(
                any(
                    _uses_cuda(options)
                    for key, _, options in found
                    if any(c.key == key for c in needing)
                )
            )
            library = files[0].name
            for key, entry, options in found:
                if not any(c.key == key for c in needing):
                    continue
                if options is None:
                    options = entry.setdefault("session_options", {})
                present = options.get("custom_ops_library")
                if present and present != library:
                    raise OnnxNormError(
                        f"{source / CONFIG}: {key} already registers the custom-op library "
                        f"{present}; onnxruntime-genai takes one library per session"
                    )
                options["custom_ops_library"] = library
            for file in files:
                shutil.copy2(file, work / file.name)
        (work / CONFIG).write_text(json.dumps(config, indent=4) + "\n")
        return True

    write_folder(output, build)
    return GenaiReport(results, library)


def generate(folder: str | os.PathLike, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy generation with onnxruntime-genai from the model folder ``folder``: the
    ``new_tokens`` token ids after ``prompt`` (fewer where the model emits its end token)."""
    import numpy as np

    from onnxnorm._deps import require

    og = require("onnxruntime_genai", "running an onnxruntime-genai model")
    model = og.Model(og.Config(str(folder)))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    tokens: list[int] = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens
